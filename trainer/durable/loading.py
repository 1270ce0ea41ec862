"""Loading the newest durable checkpoint every rank can read and verify.

All ranks try the same candidates in the same order and agree on each through one all-reduce,
so no rank can resume from a different step than another. Rank 0 surveys the manifests (its
work grows with the world, once per restore); every other rank reads only the shards it needs:
its own at the same world size, else the rows it owns of the shards that overlap them.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from trainer.accounting.events import EventLog
from trainer.durable.state import overlapping_ranks, restore
from trainer.durable.store import (CheckpointError, CheckpointStore, RestoreError, ShardFile,
                                   step_dir_name)


class Loader:
    """One rank's view of the checkpoint directory for a restore."""

    def __init__(self, store: CheckpointStore, rank: int, world_size: int, device: torch.device,
                 events: EventLog, keepalive: Callable[[], None], log: Callable[[str], None]):
        self.store, self.rank, self.world_size, self.device = store, rank, world_size, device
        self.events, self.keepalive, self.log = events, keepalive, log

    def _candidates(self) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
        """(step, saved world size) of every committed checkpoint that passes the cheap checks,
        newest first, and (step, why) of those that fail them: rank 0 reads the manifests and
        checks their shards' sizes (its work per checkpoint grows with the world, once per
        restore), every rank gets the two short lists."""
        found = None
        if self.rank == 0:
            good, bad = self.store.survey()
            found = ([(step, m["world_size"]) for step, _, m in good], bad)
        box = [found]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _shards_for(self, step: int, saved_world: int, model) -> list[ShardFile]:
        """The saved shards this rank needs, read through their markers: its own, whole, at the
        same world size; else only the rows it owns of the shards that overlap them."""
        if saved_world == self.world_size:
            shard = self.store.open_shard(step, self.rank)
            shard.load_all()
            return [shard]
        shards = []
        for r in overlapping_ranks(model, saved_world):
            shards.append(self.store.open_shard(step, r))
            self.keepalive()
        return shards

    def _first_failure(self, failed: bool, err: str) -> Optional[str]:
        """Every rank: None if no rank failed to load the candidate, else the lowest failed
        rank's reason, the same on every rank. One MIN all-reduce of one number (as the old
        yes-or-no vote), and on a failure one broadcast of one line from that rank."""
        first = torch.tensor([self.rank if failed else self.world_size], device=self.device)
        dist.all_reduce(first, op=dist.ReduceOp.MIN)
        rank = int(first.item())
        if rank == self.world_size:
            return None
        box = [err if self.rank == rank else None]
        dist.broadcast_object_list(box, src=rank)
        return f"rank {rank}: {box[0]}"

    def load(self, model, optimizer, required: bool,
             allow_fresh_start: bool = False) -> Optional[dict]:
        """Load the newest checkpoint every rank can read and verify; its meta, or None if the
        directory holds no committed checkpoint. Committed checkpoints of which none can be
        restored stop the run (`RestoreError`), unless `allow_fresh_start`: then they are set
        aside and training starts from step 0."""
        if self.rank == 0:
            for step in self.store.commit_complete():
                self.log(f"committed checkpoint step {step}: all shards had landed before the fault")
        dist.barrier()
        candidates, skipped = self._candidates()
        reasons = [f"{step_dir_name(step)}: {why}" for step, why in skipped]
        for step, saved_world in candidates:
            t0 = time.time()
            shards, err = None, ""
            try:
                shards = self._shards_for(step, saved_world, model)
                restore(model, optimizer, shards)
            except (CheckpointError, OSError, KeyError, ValueError) as exc:
                shards, err = None, str(exc)
            why = self._first_failure(shards is None, err)
            if why is None:
                meta = shards[0].meta  # step, data cursor and RNG are the same in every shard
                nbytes = sum(s.bytes for s in shards)
                for s in shards:
                    s.close()
                self.events.emit("ckpt_load", step=step, tier="durable", bytes=nbytes,
                                 seconds=time.time() - t0, saved_world_size=saved_world,
                                 shards_read=len(shards))
                if self.rank == 0:
                    self.store.discard_after(step)
                return meta
            if self.rank == 0:
                self.log(f"skipping checkpoint {self.store.root / step_dir_name(step)}: {why}")
            reasons.append(f"{step_dir_name(step)}: {why}")
        return self._nothing_restored(reasons, required, allow_fresh_start)

    def _nothing_restored(self, reasons: list[str], required: bool,
                          allow_fresh_start: bool) -> None:
        """No checkpoint was restored; `reasons` names each committed one and why it failed.
        An empty directory starts from step 0. Damaged checkpoints stop the run, on every rank
        with the same line, and stay where they are, so the next run refuses them again;
        with `allow_fresh_start` each is set aside as `step_NNNNNNNN.skipped` and training
        starts from step 0."""
        root = self.store.root
        if not reasons and not required:
            if self.rank == 0:
                self.store.discard_after(-1)  # partial ones of a run that never committed
            return None
        if not reasons:
            raise RestoreError(f"no complete checkpoint in {root} (--resume required)")
        what = f"no committed checkpoint in {root} can be restored ({'; '.join(reasons)})"
        if required:
            raise RestoreError(f"{what} (--resume required)")
        if not allow_fresh_start:
            raise RestoreError(f"{what}; refusing to start from step 0, which would discard "
                               "their work: repair or remove them, or pass --allow_fresh_start "
                               "true to train from step 0 with each set aside as "
                               "step_NNNNNNNN.skipped")
        if self.rank == 0:
            self.store.discard_after(-1)
            self.log(f"{what}; starting from step 0 (--allow_fresh_start true), each set aside "
                     "as step_NNNNNNNN.skipped")
        return None
