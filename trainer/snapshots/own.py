"""A rank's own snapshot slots, and the thread that commits them.

Each rank copies its shard into one of two slots (double buffering) every --snapshot_interval
steps; a third keeps the step last sent to a peer, and another the step a durable checkpoint is
being written from, so two slots always alternate and the newest complete snapshot is never the
one being overwritten (a snapshot due while the last copy is still in flight waits for it).
A thread waits for each copy and writes the slot's header as soon as it lands, so a process
killed one step later still leaves the previous step.

"Own", not "local": the replica slots a peer sends are on this node too; these hold this rank's
shard (`config.contract.own_slots` counts them).
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch

# The tiers' host-memory rule is part of the contract with the manifests (config/contract.py).
from config.contract import PEER_SLOTS, own_slots, snapshot_bytes
from trainer.atomic import read_json
from trainer.errors import ConfigError
from trainer.buffers import DeviceStage, HostBuffer, Layout, host_copy_stream
from trainer.snapshots.slot import PendingCopy, Slot, buffers, own_files, stamp

COMMIT_POLL_S = 0.001  # how often the committer looks at a running copy
SLOW_SNAPSHOT_ENV = "NVRX_EKS_SLOW_SNAPSHOT_S"  # fault-injection knob: widens the copy window


class NodeSpaceError(ConfigError):
    """A node directory too small for its ranks' snapshot buffers: node by node, so each rank
    that meets it says it, with its path."""

    same_on_every_rank = False


class OwnSlots:
    def __init__(self, root: Path, *, rank: int, world_size: int, local_world_size: int,
                 device: torch.device, peer: bool, durable: bool, budget_gib: float,
                 log: Callable[[str], None] = print, device_share: float = 0.0):
        self.root = Path(root)
        self.rank, self.world_size = rank, world_size
        self.local_world_size = local_world_size
        # An index, always: the committer thread selects the device, and "cuda" alone names none.
        self.device = torch.device("cuda", torch.cuda.current_device()) \
            if device.type == "cuda" and device.index is None else device
        self.peer = peer  # a slot is kept for the peer tier
        self.durable = durable
        self.budget_gib = budget_gib
        self.log = log
        self.slots: list[Slot] = []
        self._stream = host_copy_stream(self.device)
        self.device_share = device_share  # of each snapshot's bytes, staged in device memory
        self._stage: Optional[DeviceStage] = None
        self._lock = threading.Lock()  # pins and commits change on several threads
        self._copies: "queue.Queue[Optional[tuple[Slot, tuple]]]" = queue.Queue()
        self._committer: Optional[threading.Thread] = None
        self.stats = {"count": 0, "blocking_seconds": 0.0, "skipped": 0, "waits": 0}
        self._pin_after_first_step: list[HostBuffer] = []

    # -- buffers -----------------------------------------------------------------------------
    def allocate(self, layout: Layout) -> None:
        """Check the budget and map the own slots (once per process); errors before training."""
        need = snapshot_bytes(layout.total_bytes, self.peer, self.durable)
        if self.budget_gib and need > self.budget_gib * 2**30:
            own = own_slots(self.peer, self.durable)
            kinds = f"{own} own + {PEER_SLOTS} peer replicas" if self.peer else f"{own} own"
            raise ConfigError(
                f"--memory_budget_gib {self.budget_gib:g} cannot hold the snapshot buffers: "
                f"{need // layout.total_bytes} shards of {layout.total_bytes / 2**30:.2f} GiB "
                f"({kinds}) need {need / 2**30:.2f} GiB per rank")
        if self.slots and self.slots[0].buffer.layout == layout:
            return
        self._check_space(need)
        pin = self.device.type == "cuda"
        files = [own_files(self.root, self.rank, i) for i in range(own_slots(self.peer, self.durable))]
        # A predecessor's slots (a relaunch): only the newest snapshot's is pinned before the
        # restore; the others after the first step (`take`), not beside NCCL's start.
        left = all(f.is_file() and f.stat().st_size >= layout.total_bytes for f, _ in files)
        bufs = HostBuffer.open_all([buf for buf, _ in files], layout, pin and not left)
        self.slots = [Slot(buf, header) for buf, (_, header) in zip(bufs, files)]
        for slot in self.slots:  # adopt what a previous process of this rank left (node tier)
            h = read_json(slot.header)
            if h and h.get("world_size") == self.world_size and Layout.from_json(h["layout"]) == layout:
                slot.step, slot.meta = h["step"], h["meta"]
            else:
                slot.invalidate()
        if pin and left:
            newest = self.newest() or self.slots[0]
            HostBuffer.open(newest.buffer.path, layout, pin=True)
            self._pin_after_first_step = [s.buffer for s in self.slots if s is not newest]

    def _check_space(self, need: int) -> None:
        """The slots of every rank on this node must fit the node directory: a memory file
        system that runs out while the slots are first touched kills the process with SIGBUS,
        at a point that names nothing. Files a previous process left are reused, not added."""
        node_need = need * self.local_world_size
        present = sum(f.stat().st_size for f in buffers(self.root) if f.is_file())
        free = shutil.disk_usage(self.root).free
        if node_need - present > free:
            raise NodeSpaceError(
                f"{self.root}: the snapshot buffers of the node's "
                f"{self.local_world_size} rank(s) need {node_need / 2**30:.1f} GiB and "
                f"{(free + present) / 2**30:.1f} GiB is available; use fewer tiers, or a node "
                "directory on a larger file system")

    # -- taking snapshots --------------------------------------------------------------------
    def pin(self, slot: Slot) -> None:
        with self._lock:
            slot.pins += 1

    def unpin(self, slot: Slot) -> None:
        with self._lock:
            slot.pins -= 1

    @property
    def stage(self) -> Optional[DeviceStage]:
        """The device-memory stage of `--snapshot_staging device|split`, once made."""
        return self._stage

    @property
    def committer_running(self) -> bool:
        """Whether the thread that commits landed copies is alive."""
        return self._committer is not None and self._committer.is_alive()

    def newest(self) -> Optional[Slot]:
        done = [s for s in self.slots if s.step >= 0]
        return max(done, key=lambda s: s.step) if done else None

    def free_slot(self) -> Optional[Slot]:
        """A slot to overwrite. The newest complete snapshot only while a pinned slot still holds
        an older complete one: a crash during the copy must leave some snapshot to resume from."""
        newest = self.newest()
        free = [s for s in self.slots
                if s.pins == 0 and s.pending is None and not s.buffer.pin_pending]
        others = [s for s in free if s is not newest]
        if others:
            return others[0]
        older = any(s.step >= 0 for s in self.slots if s is not newest)
        return free[0] if free and older else None

    def take(self, step: int, tensors: dict[str, torch.Tensor], meta: dict) -> Optional[Slot]:
        """Start copying this step's shard into a free slot (asynchronously on CUDA)."""
        t0 = time.perf_counter()
        layout = Layout.of(tensors)
        self.allocate(layout)
        if self._pin_after_first_step:
            HostBuffer.pin_later(self._pin_after_first_step)
            self._pin_after_first_step = []
        slot = self.free_slot()
        in_flight = any(s.pending is not None for s in self.slots)
        if slot is None and not in_flight:  # every slot is being read: skip, recovery uses what exists
            self.stats["skipped"] += 1
            return None
        # Through the stage: the optimizer waits for the device-to-device copy alone, which runs
        # beside the next forward pass, and needs no slot yet; the copy to the host follows it
        # on the host-copy stream. Straight to the host: the optimizer waits for those copies.
        stage = self._device_stage(layout)
        staged = stage.fill(tensors) if stage is not None else None
        if slot is None:
            # The last copy is still in flight and the newest complete snapshot is the only
            # other slot: wait for the copy instead of overwriting it. A blocking wait, so that
            # a device that hangs meanwhile stays a hang to the progress timeouts.
            self.stats["waits"] += 1
            self.poll(wait=True)
            slot = self.free_slot()
            if slot is None:  # every slot is being read after all
                if staged is not None:
                    torch.cuda.current_stream(self.device).wait_event(staged)
                self.stats["skipped"] += 1
                return None
        slot.invalidate()
        direct = [n for n in slot.buffer.views if stage is None or n not in stage.views]
        copied = slot.buffer.stage(tensors, self._stream, wait=False, names=direct) \
            if direct else None
        guards = (copied, staged)
        if stage is not None:
            copied = stage.drain(slot.buffer, self._stream)
            slot.staged_from = stage.fill_id
        slot.guards = tuple(g for g in guards if g is not None)
        if copied is None:  # on the host: complete already
            if SLOW_SNAPSHOT_ENV in os.environ:
                time.sleep(float(os.environ[SLOW_SNAPSHOT_ENV]))
            slot.commit(step, meta, self._header_extra())
        else:
            pending = PendingCopy(step, meta, copied)
            slot.pending = pending
            self._commit_when_copied(slot, pending)
        self.stats["count"] += 1
        self.stats["blocking_seconds"] += time.perf_counter() - t0
        return slot

    def _device_stage(self, layout: Layout) -> Optional[DeviceStage]:
        """The device-memory stage (`--snapshot_staging device` or `split`), made at the first
        snapshot; without the device memory for it, snapshots copy to the host directly."""
        if self._stage is not None and self._stage.layout == layout:
            return self._stage
        self._stage = None
        start = layout.suffix_start(self.device_share)
        if start < layout.total_bytes:
            try:
                self._stage = DeviceStage(layout, self.device, start)
            except torch.cuda.OutOfMemoryError:
                self.device_share = 0.0
                self.log(f"rank {self.rank}: no device memory for a "
                         f"{(layout.total_bytes - start) / 2**30:.1f} GiB snapshot stage; "
                         "snapshots are copied to host memory directly")
        return self._stage

    def fence(self) -> None:
        """Before the optimizer changes the state: its kernels wait for the pending copies
        straight to the host and into the device stage (on the GPU, without blocking the CPU);
        the stage's own copy to the host may still run."""
        for slot in self.slots:
            if slot.pending is not None:
                for event in slot.guards:
                    torch.cuda.current_stream(self.device).wait_event(event)

    def _commit_when_copied(self, slot: Slot, pending: PendingCopy) -> None:
        """Hand the copy to the committer thread, which writes the header once it is on host."""
        if self._committer is None or not self._committer.is_alive():
            self._committer = threading.Thread(target=self._commit_copies, daemon=True,
                                               name="snapshot-commit")
            self._committer.start()
        self._copies.put((slot, pending))

    def _commit_copies(self) -> None:
        torch.cuda.set_device(self.device)
        while (item := self._copies.get()) is not None:
            slot, pending = item
            try:
                # Polled: cudaEventSynchronize spin-waits inside the driver, on a thread beside
                # the one that launches the next step's kernels, for the whole copy.
                while not pending.copied.query():
                    time.sleep(COMMIT_POLL_S)
            except RuntimeError:  # a broken CUDA context: recover_pending decides
                continue
            self._commit_pending(slot, pending)

    def _commit_pending(self, slot: Slot, pending: PendingCopy) -> None:
        with self._lock:
            if slot.pending is pending:  # not committed or abandoned meanwhile
                slot.pending = None
                slot.commit(pending.step, pending.meta, self._header_extra())

    def poll(self, wait: bool = False) -> None:
        """Commit the slots whose copy has finished; with `wait`, block until they all have."""
        for slot in self.slots:
            pending = slot.pending
            if pending is None:
                continue
            if wait:
                pending.copied.synchronize()
            elif not pending.copied.query():
                continue
            self._commit_pending(slot, pending)

    def commit_landed(self, wait_s: float) -> None:
        """Commit every copy that lands within `wait_s` (a failed process about to exit)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.poll()
            except RuntimeError:  # a broken CUDA context: nothing more will land
                return
            if all(s.pending is None for s in self.slots) or time.monotonic() > deadline:
                return
            time.sleep(0.001)

    def discard_from(self, step: int) -> None:
        """Invalidate this rank's snapshots of `step` and later (copies in flight included)."""
        self.poll(wait=True)
        for slot in self.slots:
            if slot.step >= step:
                slot.invalidate()

    def _header_extra(self) -> dict:
        return stamp(self.rank, self.world_size)

    # -- recovery ----------------------------------------------------------------------------
    def recover_pending(self) -> None:
        """After a fault: a copy that has finished on the device is a complete snapshot (the
        optimizer waited for it), so it is committed; one still running is abandoned."""
        for slot in self.slots:
            pending = slot.pending
            if pending is None:
                continue
            try:
                done = pending.copied.query()
            except RuntimeError:  # a broken CUDA context: trust nothing it was doing
                done = False
            if done:
                self._commit_pending(slot, pending)
            else:
                with self._lock:
                    slot.pending = None

    def staged_views(self, step: int) -> dict[str, torch.Tensor]:
        """The device stage's tensors where it still holds this rank's snapshot of `step` (the
        slot of `step` was drained from its last fill), else none. An in-process restore reads
        them instead of the slot's copies: device to device, instead of 15 GB over PCIe."""
        slot = self.holding(step)
        stage = self._stage
        if slot is None or stage is None or slot.staged_from != stage.fill_id:
            return {}
        return stage.read_views()

    def holding(self, step: int) -> Optional[Slot]:
        """The slot that holds `step` complete, if any."""
        return next((s for s in self.slots if s.step == step), None)

    def receiving(self) -> Slot:
        """An emptied slot to receive this rank's shard into, from a rank that holds it."""
        slot = self.free_slot() or self.slots[0]
        slot.invalidate()
        return slot

    def close(self, delete: bool) -> None:
        """Stop the committer and unmap the slots; with `delete`, their files too."""
        if self._committer is not None:
            self._copies.put(None)
            self._committer.join(timeout=10)
            self._committer = None
        for slot in self.slots:
            slot.close(delete)
        self.slots = []
        self._stage = None
