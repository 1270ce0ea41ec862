"""Snapshot tiers: the newest state of every rank in host memory, on its node, and on a peer.

Each rank copies its shard into one of two slots (double buffering) every --snapshot_interval
steps; a third keeps the step last sent to a peer, and another the step a durable checkpoint is
being written from, so two slots always alternate and the newest complete snapshot is never the
one being overwritten (a snapshot due while the last copy is still in flight waits for it). A
slot is a file-backed shared buffer in the node-local directory (/dev/shm or the instance-store
NVMe), so it serves two tiers at once:
- memory: after an in-process restart the very same mapped buffer is read back (no I/O);
- node:   after a process restart (ft_launcher) the new process maps the files again.
The peer tier sends a snapshot, in the background over a separate gloo group, to the same local
rank on the next node, which keeps it in two replica slots: a lost node's ranks pull
their shards back from there instead of reading the durable store.

A slot's header (JSON beside it) is removed before the slot is overwritten and written as soon as
the copy (or the receive) is complete, by a thread that waits for the copy, so a torn snapshot is
never visible and a process killed one step later still leaves the previous step. Recovery picks the
newest step that every rank can obtain from some tier, agreed through one all-gather.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

# The tiers' host-memory rule is part of the contract with the manifests (config/contract.py).
from config.contract import PEER_SLOTS, own_slots
from config.contract import snapshot_bytes
from trainer.atomic import read_json, write_json_atomic
from trainer.config import ConfigError
from trainer.accounting.events import EventLog
from trainer.durable.staging import DeviceStage, HostBuffer, Layout, host_copy_stream

_CHUNK = 256 << 20  # peer transfers go in pieces: bounded gloo messages, steady progress
COMMIT_POLL_S = 0.001  # how often the committer looks at a running copy
SLOW_SNAPSHOT_ENV = "NVRX_EKS_SLOW_SNAPSHOT_S"  # fault-injection knob: widens the copy window


@dataclass
class Slot:
    """One snapshot buffer and what it holds."""

    buffer: HostBuffer
    header: Path
    step: int = -1              # committed snapshot step; -1 while empty or being rewritten
    meta: Optional[dict] = None
    pins: int = 0               # readers (a durable write, a peer send) that need it unchanged
    pending: Optional[tuple[int, dict, object]] = None  # (step, meta, cuda event) until copied
    guards: tuple = ()          # while pending: the events the optimizer must wait for

    def invalidate(self) -> None:
        self.header.unlink(missing_ok=True)
        self.step, self.meta = -1, None

    def commit(self, step: int, meta: dict, extra: dict) -> None:
        write_json_atomic(self.header, {"step": step, "meta": meta,
                                        "layout": self.buffer.layout.to_json(), **extra})
        self.step, self.meta = step, meta


def warm_slots(root: Path, rank: int, pin: bool) -> None:
    """A restarted process: map and pin the slots its predecessor left, newest snapshot first,
    in the background while the process group and the model are built (HostBuffer.warm)."""
    found = [(f, read_json(f.with_suffix(".json"))) for f in Path(root).glob(f"rank{rank:05d}.slot*.buf")]
    layouts = [Layout.from_json(h["layout"]) for _, h in found if h and "layout" in h]
    if not layouts:
        return
    found = [(f, h) for f, h in found if f.stat().st_size >= layouts[0].total_bytes]
    found.sort(key=lambda fh: fh[1].get("step", -1) if fh[1] else -1, reverse=True)
    HostBuffer.warm([(f, layouts[0]) for f, _ in found], pin)


class Snapshotter:
    def __init__(self, root: Path, *, rank: int, world_size: int, local_world_size: int,
                 device: torch.device, tiers: tuple[str, ...], budget_gib: float,
                 durable: bool, events: EventLog, log: Callable[[str], None] = print,
                 device_share: float = 0.0):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size = rank, world_size
        self.local_world_size = local_world_size
        # An index, always: the committer thread selects the device, and "cuda" alone names none.
        self.device = torch.device("cuda", torch.cuda.current_device()) \
            if device.type == "cuda" and device.index is None else device
        self.peer_enabled = "peer" in tiers and world_size > local_world_size
        self.keep_files = "node" in tiers or self.peer_enabled
        self.durable = durable
        self.budget_gib = budget_gib
        self.events = events
        self.log = log
        self.slots: list[Slot] = []
        self.replicas: list[Slot] = []
        self._stream = host_copy_stream(self.device)
        self.device_share = device_share  # of each snapshot's bytes, staged in device memory
        self._stage: Optional[DeviceStage] = None
        self._peer_group = None
        self._peer_thread: Optional[threading.Thread] = None
        self._peer_error: Optional[BaseException] = None
        self._exchanged: Optional[Slot] = None  # our last snapshot that a peer also holds
        self._lock = threading.Lock()  # pins and commits change on several threads
        self._copies: "queue.Queue[Optional[tuple[Slot, tuple]]]" = queue.Queue()
        self._committer: Optional[threading.Thread] = None
        self.stats = {"count": 0, "blocking_seconds": 0.0, "skipped": 0, "waits": 0,
                      "peer_sends": 0, "peer_seconds": 0.0}
        if "peer" in tiers and not self.peer_enabled:
            log("peer tier off: every rank is on one node, so there is no other node to hold a replica")

    # -- peers -------------------------------------------------------------------------------
    @property
    def successor(self) -> int:
        """Who holds this rank's replica: the same local rank on the next node."""
        return (self.rank + self.local_world_size) % self.world_size

    @property
    def predecessor(self) -> int:
        return (self.rank - self.local_world_size) % self.world_size

    def attach(self, timeout_s: float) -> None:
        """Per attempt, after the process group is up: a gloo group for host-to-host copies
        between nodes (none on one node: every shard is already local). Its rendezvous is
        bounded like any collective, so a peer that failed before joining cannot hold this
        rank (or its next attempt) for long."""
        if self.world_size > self.local_world_size:
            self._peer_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    # -- buffers -----------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self.root / name

    def allocate(self, layout: Layout) -> None:
        """Check the budget and map the own slots (once per process); errors before training."""
        need = snapshot_bytes(layout.total_bytes, self.peer_enabled, self.durable)
        if self.budget_gib and need > self.budget_gib * 2**30:
            own = own_slots(self.peer_enabled, self.durable)
            kinds = f"{own} own + {PEER_SLOTS} peer replicas" if self.peer_enabled else f"{own} own"
            raise ConfigError(
                f"--memory_budget_gib {self.budget_gib:g} cannot hold the snapshot buffers: "
                f"{need // layout.total_bytes} shards of {layout.total_bytes / 2**30:.2f} GiB "
                f"({kinds}) need {need / 2**30:.2f} GiB per rank")
        if self.slots and self.slots[0].buffer.layout == layout:
            return
        self._check_space(need)
        pin = self.device.type == "cuda"
        names = [f"rank{self.rank:05d}.slot{i}" for i in range(own_slots(self.peer_enabled, self.durable))]
        buffers = HostBuffer.open_all([self._path(f"{n}.buf") for n in names], layout, pin)
        self.slots = [Slot(buf, self._path(f"{n}.json")) for buf, n in zip(buffers, names)]
        for slot in self.slots:  # adopt what a previous process of this rank left (node tier)
            h = read_json(slot.header)
            if h and h.get("world_size") == self.world_size and Layout.from_json(h["layout"]) == layout:
                slot.step, slot.meta = h["step"], h["meta"]
            else:
                slot.invalidate()

    def _check_space(self, need: int) -> None:
        """The slots of every rank on this node must fit the node directory: a memory file
        system that runs out while the slots are first touched kills the process with SIGBUS,
        at a point that names nothing. Files a previous process left are reused, not added."""
        node_need = need * self.local_world_size
        present = sum(f.stat().st_size for f in self.root.glob("*.buf") if f.is_file())
        free = shutil.disk_usage(self.root).free
        if node_need - present > free:
            raise ConfigError(
                f"{self.root}: the snapshot buffers of the node's "
                f"{self.local_world_size} rank(s) need {node_need / 2**30:.1f} GiB and "
                f"{(free + present) / 2**30:.1f} GiB is available; use fewer tiers, or a node "
                "directory on a larger file system")

    def _replica_slots(self, layout: Layout) -> list[Slot]:
        if not self.replicas or self.replicas[0].buffer.layout != layout:
            src = self.predecessor
            self.replicas = [Slot(HostBuffer.open(self._path(f"replica.of{src:05d}.slot{i}.buf"),
                                                  layout, pin=False),
                                  self._path(f"replica.of{src:05d}.slot{i}.json"))
                             for i in range(PEER_SLOTS)]
        return self.replicas

    # -- taking snapshots --------------------------------------------------------------------
    def pin(self, slot: Slot) -> None:
        with self._lock:
            slot.pins += 1

    def unpin(self, slot: Slot) -> None:
        with self._lock:
            slot.pins -= 1

    def newest(self) -> Optional[Slot]:
        done = [s for s in self.slots if s.step >= 0]
        return max(done, key=lambda s: s.step) if done else None

    def _free_slot(self) -> Optional[Slot]:
        """A slot to overwrite. The newest complete snapshot only while a pinned slot still holds
        an older complete one: a crash during the copy must leave some snapshot to resume from."""
        newest = self.newest()
        free = [s for s in self.slots if s.pins == 0 and s.pending is None]
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
        slot = self._free_slot()
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
            slot = self._free_slot()
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
        slot.guards = tuple(g for g in guards if g is not None)
        if copied is None:  # on the host: complete already
            if SLOW_SNAPSHOT_ENV in os.environ:
                time.sleep(float(os.environ[SLOW_SNAPSHOT_ENV]))
            slot.commit(step, meta, self._header_extra())
        else:
            pending = (step, meta, copied)
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

    def _commit_when_copied(self, slot: Slot, pending: tuple) -> None:
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
                while not pending[2].query():
                    time.sleep(COMMIT_POLL_S)
            except RuntimeError:  # a broken CUDA context: recover_pending decides
                continue
            self._commit_pending(slot, pending)

    def _commit_pending(self, slot: Slot, pending: tuple) -> None:
        with self._lock:
            if slot.pending is pending:  # not committed or abandoned meanwhile
                slot.pending = None
                slot.commit(pending[0], pending[1], self._header_extra())

    def poll(self, wait: bool = False) -> None:
        """Commit the slots whose copy has finished; with `wait`, block until they all have."""
        for slot in self.slots:
            pending = slot.pending
            if pending is None:
                continue
            if wait:
                pending[2].synchronize()
            elif not pending[2].query():
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
        return {"rank": self.rank, "world_size": self.world_size, "saved_at": time.time()}

    # -- peer replication --------------------------------------------------------------------
    def maybe_replicate(self, slot: Optional[Slot]) -> None:
        """At a snapshot step: if every rank finished its last exchange (and took this step's
        snapshot), send it to the successor. One all-reduce decides, so every pair exchanges
        the same step, and each rank keeps its copy of that step until the next exchange.
        """
        if not self.peer_enabled or self._peer_group is None:
            return
        if self._peer_error is not None:
            raise RuntimeError(f"peer replication failed: {self._peer_error}")
        idle = self._peer_thread is None or not self._peer_thread.is_alive()
        flag = torch.tensor([1 if idle and slot is not None else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not int(flag.item()):
            return
        self.poll(wait=True)  # the step's copy must be complete before it is sent
        self.pin(slot)
        self._peer_thread = threading.Thread(target=self._exchange, args=(slot,), daemon=True,
                                             name="peer-replication")
        self._peer_thread.start()

    def _exchange(self, slot: Slot) -> None:
        """Send our snapshot to the successor; receive the predecessor's into a replica slot."""
        t0 = time.time()
        try:
            header = {"step": slot.step, "meta": slot.meta, "layout": slot.buffer.layout.to_json(),
                      **self._header_extra()}
            theirs = self._swap_objects(header)
            replicas = self._replica_slots(Layout.from_json(theirs["layout"]))
            target = min(replicas, key=lambda s: s.step)  # keep the newer replica valid
            target.invalidate()
            self._swap_tensor(slot.buffer.flat, target.buffer.flat)
            write_json_atomic(target.header, theirs)
            target.step, target.meta = theirs["step"], theirs["meta"]
            self.stats["peer_sends"] += 1
            self.stats["peer_seconds"] += time.time() - t0
            with self._lock:  # `slot` now matches our successor's newest replica: keep it
                previous, self._exchanged = self._exchanged, slot
                if previous is not None:
                    previous.pins -= 1
        except BaseException as exc:  # surfaced on the training thread at the next snapshot
            self._peer_error = exc
            self.unpin(slot)

    def _swap_objects(self, obj: dict) -> dict:
        data = json.dumps(obj).encode()
        size = torch.tensor([len(data)], dtype=torch.int64)
        their_size = torch.empty(1, dtype=torch.int64)
        self._sendrecv(size, their_size)
        buf = torch.empty(int(their_size.item()), dtype=torch.uint8)
        self._sendrecv(torch.frombuffer(bytearray(data), dtype=torch.uint8), buf)
        return json.loads(bytes(buf.numpy()))

    def _swap_tensor(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        n = max(send.numel(), recv.numel())
        for off in range(0, n, _CHUNK):
            self._sendrecv(send[off:off + _CHUNK], recv[off:off + _CHUNK])

    def _sendrecv(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        ops = []
        if send.numel():
            ops.append(dist.isend(send.contiguous(), self.successor, group=self._peer_group))
        if recv.numel():
            ops.append(dist.irecv(recv, self.predecessor, group=self._peer_group))
        for op in ops:
            op.wait()

    def settle(self) -> None:
        """Wait for a running exchange (an attempt ends); its replica stays valid if complete."""
        if self._peer_thread is not None:
            self._peer_thread.join(timeout=60)
        self._peer_thread, self._peer_error = None, None
        self._peer_group = None

    # -- recovery ----------------------------------------------------------------------------
    def recover_pending(self) -> None:
        """After a fault: a copy that has finished on the device is a complete snapshot (the
        optimizer waited for it), so it is committed; one still running is abandoned."""
        for slot in self.slots:
            pending = slot.pending
            if pending is None:
                continue
            try:
                done = pending[2].query()
            except RuntimeError:  # a broken CUDA context: trust nothing it was doing
                done = False
            if done:
                self._commit_pending(slot, pending)
            else:
                with self._lock:
                    slot.pending = None

    def inventory(self) -> dict[int, dict[int, dict]]:
        """Every snapshot on this node, own or replica, by the rank it belongs to and its step.

        Ranks may land on other nodes after a restart, so a rank offers whatever its node holds.
        """
        out: dict[int, dict[int, dict]] = {}
        for header in sorted(self.root.glob("*.json")):
            h = read_json(header)
            if not h or h.get("world_size") != self.world_size or "rank" not in h:
                continue
            buf = header.with_suffix(".buf")
            if buf.is_file() and buf.stat().st_size >= h["layout"]["total_bytes"]:
                out.setdefault(int(h["rank"]), {})[int(h["step"])] = {
                    "path": str(buf), "meta": h["meta"], "layout": h["layout"],
                    "replica": header.name.startswith("replica.")}
        return out

    def choose(self, inventories: list[dict]) -> Optional[int]:
        """The newest step for which every rank's shard exists on some node."""
        have: dict[int, set[int]] = {}
        for inv in inventories:
            for rank, steps in inv.items():
                for step in steps:
                    have.setdefault(step, set()).add(rank)
        full = [step for step, ranks in have.items() if len(ranks) == self.world_size]
        return max(full) if full else None

    @staticmethod
    def holders(step: int, inventories: list[dict]) -> dict[int, int]:
        """Who provides each rank's shard: the rank itself when its node has it, else the lowest
        rank whose node does."""
        out = {}
        for rank in range(len(inventories)):
            if step in inventories[rank].get(rank, {}):
                out[rank] = rank
            else:
                out[rank] = min(h for h, inv in enumerate(inventories) if step in inv.get(rank, {}))
        return out

    def restore_shard(self, step: int, inventories: list[dict], fresh: bool) -> tuple[torch.Tensor, dict, str]:
        """This rank's snapshot of `step` as a flat host tensor, its meta, and the tier it came
        from; a rank whose node lost it receives it from a holder. Every rank calls this."""
        holders = self.holders(step, inventories)
        ops, keep_alive = [], []
        for rank, holder in holders.items():
            if holder == self.rank and rank != self.rank:  # serve a rank that lost its node
                entry = inventories[self.rank][rank][step]
                flat = self._map(entry)
                keep_alive.append(flat)
                ops.append(("send", rank, flat))
        mine = holders[self.rank]
        if mine == self.rank:
            entry = inventories[self.rank][self.rank][step]
            own = next((s for s in self.slots if s.step == step), None)
            if own is not None:  # the mapped, pinned slot: read at host-to-device speed
                flat, tier = own.buffer.flat, ("node" if fresh else "memory")
            else:
                flat, tier = self._map(entry), ("peer" if entry["replica"] else "node")
            meta = entry["meta"]
        else:
            entry = inventories[mine][self.rank][step]
            slot = self._free_slot() or self.slots[0]
            slot.invalidate()
            flat, tier, meta = slot.buffer.flat, "peer", entry["meta"]
            ops.append(("recv", mine, flat))
            keep_alive.append(slot)
        for off in range(0, max([t.numel() for _, _, t in ops] or [0]), _CHUNK):
            works = [(dist.isend if kind == "send" else dist.irecv)(t[off:off + _CHUNK], peer,
                                                                     group=self._peer_group)
                     for kind, peer, t in ops if off < t.numel()]
            for w in works:
                w.wait()
        if mine != self.rank:
            slot.commit(step, meta, self._header_extra())
        return flat, meta, tier

    def _map(self, entry: dict) -> torch.Tensor:
        from trainer.durable.staging import map_file

        return map_file(Path(entry["path"]), entry["layout"]["total_bytes"], writable=False)

    def forget_others(self, local_ranks: range) -> None:
        """After a restore: drop node files of ranks that now live elsewhere (call on one local
        rank, after a barrier)."""
        keep = {f"rank{r:05d}." for r in local_ranks}
        keep |= {f"replica.of{(r - self.local_world_size) % self.world_size:05d}." for r in local_ranks}
        for f in self.root.iterdir():
            if f.is_file() and not any(f.name.startswith(k) for k in keep):
                f.unlink(missing_ok=True)

    def close(self, remove: bool = False) -> None:
        """Unmap the buffers; their files stay for the node tier unless `remove`."""
        self.settle()
        if self._committer is not None:
            self._copies.put(None)
            self._committer.join(timeout=10)
            self._committer = None
        for slot in self.slots + self.replicas:
            gone = remove or not self.keep_files
            slot.buffer.close(unlink=gone)
            if gone:
                slot.header.unlink(missing_ok=True)
        self.slots, self.replicas = [], []
        self._stage = None
