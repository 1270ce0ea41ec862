"""The snapshot tiers of one rank, put together where their parts meet: a snapshot is taken into
an own slot and then replicated over the peer link; a restore agrees on a step, then reads an own
slot or receives into one. Everything else the caller asks of the own slots directly (`own`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist

from trainer.accounting.events import EventLog
from trainer.distributed import default_group_store
from trainer.snapshots import agreement
from trainer.snapshots.own import OwnSlots
from trainer.snapshots.peer import PeerLink
from trainer.snapshots.slot import Slot


def _restore_prefix(store: dist.Store, rank: int) -> str:
    """Store keys of this restore only: a launcher's store outlives its workers' attempts."""
    if rank == 0:
        store.add("snapshots/restores", 1)
    dist.barrier()
    return f"snapshots/{store.add('snapshots/restores', 0)}"


class Restored(NamedTuple):
    """This rank's shard of the agreed step, as a flat host tensor, and where it came from."""

    step: int
    flat: torch.Tensor
    meta: dict
    tier: str  # memory, node or peer
    staged: dict[str, torch.Tensor]  # tensors to read from the device stage instead of `flat`


class Snapshotter:
    def __init__(self, root: Path, *, rank: int, world_size: int, local_world_size: int,
                 device: torch.device, tiers: tuple[str, ...], budget_gib: float,
                 durable: bool, events: EventLog, log: Callable[[str], None] = print,
                 device_share: float = 0.0):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size = rank, world_size
        self.local_world_size = local_world_size
        self.peer_enabled = "peer" in tiers and world_size > local_world_size
        self.files_outlive = "node" in tiers or self.peer_enabled
        self.events = events
        self.own = OwnSlots(self.root, rank=rank, world_size=world_size,
                            local_world_size=local_world_size, device=device,
                            peer=self.peer_enabled, durable=durable, budget_gib=budget_gib,
                            log=log, device_share=device_share)
        # Also without the peer tier: a restore may move shards between nodes.
        self.peer = PeerLink(self.root, rank=rank, world_size=world_size,
                             local_world_size=local_world_size, device=self.own.device,
                             pin=self.own.pin, unpin=self.own.unpin)
        if "peer" in tiers and not self.peer_enabled:
            log("peer tier off: every rank is on one node, so there is no other node to hold a replica")

    @property
    def stats(self) -> dict:
        return {**self.own.stats, **self.peer.stats}

    def begin_attempt(self, timeout_s: float) -> None:
        """A new attempt, in this process or a new one: the failed attempt's exchange ends (or
        is abandoned), its landed copies are committed, and the peer link is rebuilt on the
        new process group."""
        self.peer.finish_exchange()
        self.own.recover_pending()
        self.peer.attach(timeout_s)

    def snapshot(self, step: int, tensors: dict[str, torch.Tensor], meta: dict) -> Optional[Slot]:
        """Take this step's snapshot and, where the peer tier is due, send it to the successor.

        One all-reduce decides whether to send, so every pair exchanges the same step, and each
        rank keeps its copy of that step until the next exchange."""
        slot = self.own.take(step, tensors, meta)
        if self.peer_enabled and self.peer.due(slot is not None):
            self.own.poll(wait=True)  # the step's copy must be complete before it is sent
            self.peer.send(slot)
        return slot

    def restore(self, newer_than: Optional[int], fresh: bool) -> Optional[Restored]:
        """Every rank: agree on the newest step whose every shard some node holds and, if it is
        newer than `newer_than` (the durable tier's), get this rank's shard of it. `fresh`: this
        process has just started, so an own slot counts as the node tier, not memory. Per rank,
        a fixed number of store operations and collectives of fixed size (`agreement`)."""
        store = default_group_store()
        prefix = _restore_prefix(store, self.rank)
        mine = agreement.served(self.root, self.rank, self.local_world_size, self.world_size)
        agreement.publish(store, prefix, mine)
        dist.barrier()
        available = agreement.lookup(store, prefix, self.rank)
        step = agreement.agree(available, self.rank, self.own.device)
        if step is None or (newer_than is not None and newer_than > step):
            return None
        flat, meta, tier = agreement.restore_shard(step, available, mine, store, prefix, fresh,
                                                   rank=self.rank, world_size=self.world_size,
                                                   own=self.own, link=self.peer)
        dist.barrier()  # every transfer is done: node files of ranks now elsewhere can go
        if self.rank % self.local_world_size == 0:
            first = self.rank - self.rank % self.local_world_size
            agreement.forget_others(self.root, range(first, first + self.local_world_size),
                                    local_world_size=self.local_world_size,
                                    world_size=self.world_size)
        staged = self.own.staged_views(step) if tier == "memory" else {}
        return Restored(step, flat, meta, tier, staged)

    def close(self, delete: bool = False) -> None:
        """Unmap the buffers; their files stay for the node tier unless `delete`."""
        gone = delete or not self.files_outlive
        self.peer.close(gone)
        self.own.close(gone)
