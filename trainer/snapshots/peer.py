"""The peer link: this rank's gloo group for host-to-host copies between nodes.

The peer tier sends a snapshot, in the background, to the same local rank on the next node,
which keeps it in two replica slots: a lost node's ranks pull their shards back from there
instead of reading the durable store. Every pair exchanges the same step, and each rank keeps
its own copy of that step until the next exchange, so survivors and replicas always share one
complete step. A restore's transfers go over the same group.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from config.contract import PEER_SLOTS
from trainer.buffers import HostBuffer, Layout
from trainer.snapshots.slot import Slot, replica_files, stamp

_CHUNK = 256 << 20  # transfers go in pieces: bounded gloo messages, steady progress
LAZY_INIT_ENV = "TORCH_GLOO_LAZY_INIT"


def predecessor(rank: int, local_world_size: int, world_size: int) -> int:
    """Whose replica `rank` holds: the same local rank on the previous node."""
    return (rank - local_world_size) % world_size


def lazy_gloo_group(timeout_s: float):
    """A gloo group over every rank whose pairs connect on first use: a rank talks to its
    successor, its predecessor and, in a restore, the holder of its shard, so connecting the
    full mesh up front (N - 1 connections per rank, at every attempt) would be all waste."""
    before = os.environ.get(LAZY_INIT_ENV)
    os.environ[LAZY_INIT_ENV] = "1"  # read when the group is made
    try:
        return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    finally:
        if before is None:
            os.environ.pop(LAZY_INIT_ENV, None)
        else:
            os.environ[LAZY_INIT_ENV] = before


class PeerLink:
    """`pin` and `unpin` keep a slot unchanged while it is sent, and after that for as long as
    the successor's newest replica is its copy."""

    def __init__(self, root: Path, *, rank: int, world_size: int, local_world_size: int,
                 device: torch.device, pin: Callable[[Slot], None], unpin: Callable[[Slot], None]):
        self.root = Path(root)
        self.rank, self.world_size = rank, world_size
        self.local_world_size = local_world_size
        self.device = device
        self._pin, self._unpin = pin, unpin
        self.replicas: list[Slot] = []
        self._group = None
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._exchanged: Optional[Slot] = None  # our last snapshot that a peer also holds
        self.stats = {"peer_sends": 0, "peer_seconds": 0.0}

    @property
    def successor(self) -> int:
        """Who holds this rank's replica: the same local rank on the next node."""
        return (self.rank + self.local_world_size) % self.world_size

    @property
    def predecessor(self) -> int:
        return predecessor(self.rank, self.local_world_size, self.world_size)

    def attach(self, timeout_s: float) -> None:
        """Per attempt, after the process group is up: a gloo group for host-to-host copies
        between nodes (none on one node: every shard is already local). Its rendezvous is
        bounded like any collective, so a peer that failed before joining cannot hold this
        rank (or its next attempt) for long."""
        if self.world_size > self.local_world_size:
            self._group = lazy_gloo_group(timeout_s)

    # -- replication -------------------------------------------------------------------------
    def due(self, ready: bool) -> bool:
        """Whether to send now: every rank finished its last exchange and is `ready` (took this
        step's snapshot). One all-reduce decides, so every pair exchanges the same step. Raises
        what the last exchange failed with."""
        if self._group is None:
            return False
        if self._error is not None:
            raise RuntimeError(f"peer replication failed: {self._error}")
        idle = self._thread is None or not self._thread.is_alive()
        flag = torch.tensor([1 if idle and ready else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(int(flag.item()))

    def send(self, slot: Slot) -> None:
        """In the background, exchange `slot` (its copy complete) for the predecessor's."""
        self._pin(slot)
        self._thread = threading.Thread(target=self._exchange, args=(slot,), daemon=True,
                                        name="peer-replication")
        self._thread.start()

    def _exchange(self, slot: Slot) -> None:
        """Send our snapshot to the successor; receive the predecessor's into a replica slot."""
        t0 = time.time()
        try:
            header = slot.header_for(slot.step, slot.meta, stamp(self.rank, self.world_size))
            theirs = self._swap_objects(header)
            replicas = self._replica_slots(Layout.from_json(theirs["layout"]))
            target = min(replicas, key=lambda s: s.step)  # keep the newer replica valid
            target.invalidate()
            self._swap_tensor(slot.buffer.flat, target.buffer.flat)
            target.adopt(theirs)
            self.stats["peer_sends"] += 1
            self.stats["peer_seconds"] += time.time() - t0
            # `slot` now matches our successor's newest replica: keep it (only this thread,
            # one exchange at a time, changes `_exchanged`)
            previous, self._exchanged = self._exchanged, slot
            if previous is not None:
                self._unpin(previous)
        except BaseException as exc:  # surfaced on the training thread at the next snapshot
            self._error = exc
            self._unpin(slot)

    def _replica_slots(self, layout: Layout) -> list[Slot]:
        if not self.replicas or self.replicas[0].buffer.layout != layout:
            files = [replica_files(self.root, self.predecessor, i) for i in range(PEER_SLOTS)]
            self.replicas = [Slot(HostBuffer.open(buf, layout, pin=False), header)
                             for buf, header in files]
        return self.replicas

    def _swap_objects(self, obj: dict) -> dict:
        data = json.dumps(obj).encode()
        size = torch.tensor([len(data)], dtype=torch.int64)
        their_size = torch.empty(1, dtype=torch.int64)
        self._swap_tensor(size, their_size)
        buf = torch.empty(int(their_size.item()), dtype=torch.uint8)
        self._swap_tensor(torch.frombuffer(bytearray(data), dtype=torch.uint8), buf)
        return json.loads(bytes(buf.numpy()))

    def _swap_tensor(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        self.transfer([("send", self.successor, send), ("recv", self.predecessor, recv)])

    # -- transfers ---------------------------------------------------------------------------
    def transfer(self, ops: list[tuple[str, int, torch.Tensor]]) -> None:
        """Run ("send" | "recv", peer rank, flat tensor) operations together, piece by piece."""
        for off in range(0, max([t.numel() for _, _, t in ops] or [0]), _CHUNK):
            works = [(dist.isend if kind == "send" else dist.irecv)(t[off:off + _CHUNK], peer,
                                                                     group=self._group)
                     for kind, peer, t in ops if off < t.numel()]
            for w in works:
                w.wait()

    def finish_exchange(self) -> None:
        """Wait for a running exchange (an attempt ends); its replica stays valid if complete."""
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._thread, self._error = None, None
        self._group = None

    def close(self, delete: bool) -> None:
        """Finish the exchange, and unmap the replica slots; with `delete`, their files too."""
        self.finish_exchange()
        for slot in self.replicas:
            slot.close(delete)
        self.replicas = []
