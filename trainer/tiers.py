"""The tiers that make a fault cost little, as the loop sees them: snapshots in host memory, on
the node and on a peer, and durable checkpoints; and the choice of where to resume from.

The loop sees one object: it calls `after_step` every step, `fence` before the optimizer step,
and `restore` once per attempt. Both tiers outlive an in-process restart (`ProcessState`).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch.distributed as dist

from trainer.accounting.events import EventLog
from trainer.buffers import Layout
from trainer.config import STAGED_SHARE, TrainConfig
from trainer.durable.lease import Lease, existing_lineage, lineage_id
from trainer.durable import run_settings
from trainer.durable.manager import CheckpointManager, warm_staging
from trainer.durable.state import TensorShard, local_tensors, restore, shard_layout
from trainer.errors import ConfigError
from trainer.faults.inject import at_point
from trainer.distributed import DistEnv
from trainer.hooks import ProcessState
from trainer.node_dir import HUGE_PAGE, node_root, page_bytes, snapshots_dir
from trainer.phases import run_phase
from trainer.snapshots import Snapshotter, warm_slots
from trainer.snapshots.cadence import Cadence

MetaFn = Callable[[int], dict]


def _nothing() -> None:
    pass


class Tiers:
    def __init__(self, cfg: TrainConfig, env: DistEnv, events: EventLog, process: ProcessState,
                 keepalive: Callable[[], None], log: Callable[[str], None]):
        self.cfg, self.env, self.events, self.log = cfg, env, events, log
        self.keepalive = keepalive
        self.fresh = process.snapshots is None  # no snapshotter survived: this is a new process
        if cfg.checkpoint_dir and not process.leased:  # before any rank touches the node
            if env.rank == 0:
                process.lease = Lease(cfg.checkpoint_dir, warn=log)
                process.lease.acquire()
                run_settings.record(cfg)  # checked before launch: these are now the run's
            dist.barrier()
            process.leased = True
        self.node_root = node_root(cfg.node_dir, cfg.checkpoint_dir, lineage_id(cfg.checkpoint_dir)) \
            if cfg.checkpoint_dir else None
        if process.checkpoints is not None:
            process.checkpoints.rejoin(env.rank, env.world_size, keepalive)
        elif cfg.checkpoint_dir:
            writer, process.writer = process.writer, None
            process.checkpoints = CheckpointManager(
                cfg.checkpoint_dir, rank=env.rank, world_size=env.world_size, device=env.device,
                use_async=cfg.use_async_checkpoint, retain=cfg.keep_checkpoints,
                timeout_s=cfg.checkpoint_timeout, events=events, node_root=self.node_root,
                keepalive=keepalive, log=print, writer=writer)
        self.checkpoints: Optional[CheckpointManager] = process.checkpoints
        if cfg.tiers and process.snapshots is None:
            process.snapshots = Snapshotter(
                snapshots_dir(self.node_root), rank=env.rank, world_size=env.world_size,
                local_world_size=env.local_world_size, device=env.device, tiers=cfg.tiers,
                budget_gib=cfg.memory_budget_gib, durable=cfg.checkpoint_interval > 0,
                events=events, log=log, device_share=STAGED_SHARE[cfg.snapshot_staging])
        self.snapshots: Optional[Snapshotter] = process.snapshots
        if self.snapshots is not None:
            self.snapshots.begin_attempt(cfg.collective_timeout(env.device.type))
        self.cadence: Optional[Cadence] = None  # once the attempt's first step is known
        self.page_kib: Optional[int] = None  # the snapshot slots' page size (`prepare`)
        # Before the optimizer changes the state, its kernels wait for the snapshot copies.
        self.fence: Callable[[], None] = self.snapshots.own.fence \
            if self.snapshots is not None and env.device.type == "cuda" else _nothing

    @staticmethod
    def warm(cfg: TrainConfig, env: DistEnv) -> None:
        """First thing in a restarted process: pin the host buffers its predecessor left (the
        snapshot slots, or without tiers the staging buffer) in the background, while the
        process group and the model are built: pinning gigabytes takes seconds, which must not
        sit on the restart's critical path."""
        lineage = existing_lineage(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if lineage is None:
            return
        root, pin = node_root(cfg.node_dir, cfg.checkpoint_dir, lineage), env.device.type == "cuda"
        if cfg.tiers:
            warm_slots(snapshots_dir(root), env.rank, pin)
        elif cfg.checkpoint_interval:
            warm_staging(root, env.rank, pin)

    # -- resume ------------------------------------------------------------------------------
    def prepare(self, model, optimizer) -> dict[str, float]:
        """Map the snapshot buffers (a budget too small fails here, before training starts),
        then start the background writer so the first checkpoint pays no process start.
        Returns the seconds of each, for the restart breakdown."""
        t0 = time.perf_counter()
        layout = Layout.of(local_tensors(model, optimizer))
        pages = {}
        if self.snapshots is not None:
            self.snapshots.own.allocate(layout)
            pages = self._pages([slot.buffer for slot in self.snapshots.own.slots])
        elif self.checkpoints is not None and self.cfg.checkpoint_interval:
            self.checkpoints.prepare(layout)  # with tiers, checkpoints are written from snapshot slots
        t1 = time.perf_counter()
        if self.checkpoints is not None:
            self.checkpoints.start_writer()
        return {"map_pin_s": t1 - t0, "writer_s": time.perf_counter() - t1, **pages}

    def _pages(self, buffers: list) -> dict:
        """The node directory's page size and what pinning the snapshot slots took, for the
        event log and results.json; once per process, a warning where a CUDA rank's slots sit
        on base pages, which double a restart (pinning 8 GiB: 1.3 s on 4 KiB pages, 0.2 s on
        2 MiB pages, on an H200 host)."""
        root = snapshots_dir(self.node_root)
        self.page_kib = page_bytes(root) // 1024
        pin_s = round(sum(b.pin_s for b in buffers), 4)
        if self.fresh and self.env.device.type == "cuda" and self.page_kib < HUGE_PAGE // 1024:
            self.log(f"warning: the snapshot slots in {root} are on {self.page_kib} KiB pages: "
                     f"pinning them took {pin_s:.2f} s and is paid again at every process "
                     "restart; put --node_dir on a tmpfs with huge pages (mount -t tmpfs -o "
                     "huge=always), as the GPU nodes' /dev/shm is (docs/snapshots.md)")
        return {"page_kib": self.page_kib, "pin_s": pin_s}

    def restore(self, model, optimizer) -> Optional[dict]:
        """Resume from the newest state every rank can obtain: snapshot tiers, then durable."""
        if self.checkpoints is None or self.cfg.resume == "never":
            if self.checkpoints is not None and self.checkpoints.store.latest_step() is not None:
                raise ConfigError(f"--resume never, but {self.cfg.checkpoint_dir} already holds "
                                 "checkpoints; use a new --checkpoint_dir")
            return None
        meta = self._restore_snapshot(model, optimizer)
        if meta is None:
            meta = self.checkpoints.restore(model, optimizer, required=self.cfg.resume == "required",
                                            allow_fresh_start=self.cfg.allow_fresh_start)
            if meta is not None:
                self.log(f"resumed from the step-{meta['step']} checkpoint in "
                         f"{self.cfg.checkpoint_dir}")
        if meta is not None:
            self.checkpoints.resumed_at(int(meta["step"]))
        return meta

    def _restore_snapshot(self, model, optimizer) -> Optional[dict]:
        if self.snapshots is None:
            return None
        t0 = time.time()
        got = self.snapshots.restore(self.checkpoints.store.latest_step(), self.fresh)
        if got is None:
            return None
        layout = Layout.of(local_tensors(model, optimizer))
        views = {**layout.views(got.flat), **got.staged}
        restore(model, optimizer, [TensorShard(views, shard_layout(model))])
        self.events.emit("snapshot_load", step=got.step, tier=got.tier, bytes=layout.total_bytes,
                         staged_bytes=sum(t.numel() * t.element_size() for t in got.staged.values()),
                         seconds=time.time() - t0)
        self.log(f"resumed from the step-{got.step} snapshot ({got.tier} tier)")
        return got.meta

    # -- every step --------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Training starts after `step`: the snapshot cadence counts from here."""
        if self.snapshots is not None:
            self.cadence = Cadence(self.cfg.snapshot_interval, step, self.env.device, self.log)

    def observe(self, step: int, dt: float, snapshot_s: float) -> None:
        """A reported step's time and the seconds its snapshot took (0: none was taken)."""
        if self.cadence is not None:
            self.cadence.observe(step, dt, snapshot_s, snapshot_s > 0)

    def saves_durably(self, step: int) -> bool:
        """Whether `after_step(step)` writes a durable checkpoint (the final one is `finish`'s)."""
        cfg = self.cfg
        return self.checkpoints is not None and bool(cfg.checkpoint_interval) \
            and step % cfg.checkpoint_interval == 0 and step < cfg.max_steps

    def discard_snapshots_from(self, step: int) -> None:
        """A diverged step: its snapshots and any after it must never be resumed from."""
        if self.snapshots is not None:
            self.snapshots.own.discard_from(step)

    def after_step(self, step: int, model, optimizer, meta: MetaFn) -> tuple[float, float]:
        """Snapshot and checkpoint as due; returns the seconds the loop was blocked, and of
        those the seconds taking the snapshot."""
        t0 = time.perf_counter()
        snapshot_s = 0.0
        cfg = self.cfg
        durable_due = self.saves_durably(step)
        if self.checkpoints is not None:
            self.checkpoints.poll()
        slot = None
        if self.snapshots is not None:
            self.snapshots.own.poll()
            if self.cadence.due(step) or durable_due or step == cfg.max_steps:
                t1 = time.perf_counter()
                slot = self.snapshots.snapshot(step, local_tensors(model, optimizer), meta(step))
                snapshot_s = time.perf_counter() - t1
        if durable_due:  # a sync write, or a drain of the last one: long calls, see phases
            run_phase("checkpoint", lambda: self._durable(step, model, optimizer, meta, slot),
                      cfg.checkpoint_timeout, self.keepalive, self.env.device)
        return time.perf_counter() - t0, snapshot_s

    def _durable(self, step: int, model, optimizer, meta: MetaFn, slot, final: bool = False) -> None:
        if slot is None:  # no snapshot to write from: the manager stages its own copy
            self.checkpoints.save(step, model, optimizer, meta(step), final=final)
            return
        own = self.snapshots.own
        own.poll(wait=True)  # the slot's copy must be complete before it is written
        own.pin(slot)
        self.checkpoints.save(step, model, optimizer, slot.meta, final=final, source=slot.buffer,
                              on_written=lambda: own.unpin(slot))

    def seconds_to_save(self, step: int) -> Optional[float]:
        """The expected write time of a checkpoint of `step` after the one in flight; None when
        there is nothing to write (no durable tier, or `step` is saved already)."""
        if self.checkpoints is None or self.checkpoints.last_saved_step == step:
            return None
        return self.checkpoints.seconds_to_save()

    def finish(self, step: int, model, optimizer, meta: MetaFn,
               save: Optional[bool] = None) -> None:
        """The last checkpoint (`save`; default: --final_checkpoint), committed, from a snapshot
        slot where tiers are on: the newest one if it holds `step`, else one taken now. Nothing
        is released here: should a peer fail now, the re-entered attempt still finds every
        tier as it was, so it never rewinds."""
        if self.snapshots is not None:
            self.snapshots.own.poll(wait=True)
        if self.checkpoints is not None:
            if self.checkpoints.last_saved_step != step and \
                    (self.cfg.final_checkpoint if save is None else save):
                slot = self._slot_of(step, model, optimizer, meta)
                self._durable(step, model, optimizer, meta, slot, final=True)
            at_point("final", step, self.env.rank, self.cfg.checkpoint_dir, self.events)
            self.checkpoints.finish()

    def _slot_of(self, step: int, model, optimizer, meta: MetaFn):
        """A snapshot slot holding `step`, or None without tiers (or with every slot in use)."""
        if self.snapshots is None:
            return None
        newest = self.snapshots.own.newest()
        if newest is not None and newest.step == step:
            return newest
        return self.snapshots.snapshot(step, local_tensors(model, optimizer), meta(step))

    @staticmethod
    def release(process: ProcessState, failed: bool) -> None:
        """At process exit: stop the writer (at once after a failure) and unmap the buffers;
        after a complete run, free the node's memory too. A writer left running would hold
        the interpreter's exit forever."""
        if process.checkpoints is not None:
            process.checkpoints.close(failed=failed)
        if process.writer is not None:  # never taken: the run ended before its tiers
            process.writer.close(abort=True)
            process.writer = None
        if process.snapshots is not None:
            process.snapshots.close(delete=not failed)
        if process.lease is not None and not failed:
            process.lease.release()

    @staticmethod
    def abandon(process: ProcessState, wait_s: float = 2.0) -> None:
        """A failed process that exits without tearing down: snapshot copies that land within
        `wait_s` are committed (the newest state survives for the node tier), the writer is
        killed. Nothing waits on another rank."""
        if process.snapshots is not None:
            process.snapshots.own.commit_landed(wait_s)
        if process.checkpoints is not None:
            process.checkpoints.close(failed=True)
        if process.writer is not None:
            process.writer.close(abort=True)

    def stats(self) -> dict:
        out = {}
        if self.checkpoints is not None:
            out["checkpoint"] = self.checkpoints.stats.to_json()
        if self.snapshots is not None:
            out["snapshots"] = dict(self.snapshots.stats)
        if self.page_kib is not None:
            out["node_dir_page_kib"] = self.page_kib
        if self.cadence is not None and self.cadence.figures:
            out["snapshot_cadence"] = self.cadence.figures
        return out
