"""Firing faults for real: exception, hang (a Python-level stall), sigkill, segfault (a real
SIGSEGV), oom (a real allocation failure) and node (the whole node is lost: its launcher,
every rank on it and its node-local memory, `node_loss`), at scheduled steps or at named
points of set-up and tear-down.

Each fault fires once: before firing, the rank creates a marker file on the checkpoint storage,
so a rollback that replays the step - after an in-process restart, a launcher restart or a
whole-job restart - finds the marker and trains on.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import time
from pathlib import Path
from typing import Optional, Sequence

from trainer.accounting.events import EventLog
from trainer.faults.node_loss import lose_node, register_rank, unregister_rank
from trainer.faults.schedule import Fault


class InjectedFault(RuntimeError):
    """The exception an `exception` fault raises."""


def _hang() -> None:
    """A Python-level hang: the rank stops making progress but stays alive."""
    while True:
        time.sleep(0.5)


def _segfault() -> None:
    ctypes.string_at(0)  # a real SIGSEGV from reading address 0


def _oom(device_type: str) -> None:
    """A real allocation failure: the device (or, on CPU, an address-space limit) runs out."""
    import torch

    if device_type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        torch.empty(free + (1 << 30), dtype=torch.uint8, device="cuda")  # OutOfMemoryError
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), hard))
    try:
        bytearray(1 << 30)  # MemoryError
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class FaultInjector:
    """Fires this rank's scheduled faults (and optional random ones) at the start of a step."""

    def __init__(self, faults: Sequence[Fault], rank: int, record_dir: Optional[Path],
                 events: EventLog, device_type: str, probability: float = 0.0,
                 types: Sequence[str] = (), weights: Optional[Sequence[float]] = None,
                 node_root: Optional[Path] = None):
        self.mine = {f.step: f for f in faults if f.rank == rank}
        self.rank = rank
        self.record_dir = Path(record_dir) / "faults" if record_dir else None
        self.events = events
        self.device_type = device_type
        self.probability = probability
        self.types = list(types)
        self.weights = list(weights) if weights else None
        self._rng = random.Random()
        self.node_root = node_root
        node_faults = "node" in self.types or any(f.type == "node" for f in faults)
        self._registered = register_rank(node_root, rank) \
            if node_root is not None and node_faults else None

    def close(self) -> None:
        """The run is complete: no node fault of a later run may find this pid."""
        unregister_rank(self._registered)
        self._registered = None

    def _claim(self, fault: Fault, scheduled: bool) -> bool:
        """True exactly once per fault across every restart: the marker is created atomically.
        A scheduled fault is one per step, named by its step alone: after the world changed
        size (a lost node, no spare) the schedule puts that step's fault on another rank, and
        a replay of the step must still not fire it again."""
        if self.record_dir is None:
            return True
        name = f"step{fault.step:08d}" if scheduled else \
            f"step{fault.step:08d}_rank{fault.rank:05d}"
        return claim_marker(self.record_dir / name, fault.type)

    def at_step(self, step: int) -> None:
        fault = self.mine.get(step)
        scheduled = fault is not None
        if fault is None and self.probability and self.rank != 0 and self._rng.random() < self.probability:
            fault = Fault(step, self.rank, self._rng.choices(self.types, weights=self.weights)[0])
        if fault is None or not self._claim(fault, scheduled):
            return
        self.events.emit("fault", step=step, type=fault.type)
        fire(fault.type, self.device_type, step, self.node_root)


POINT_FAULTS_ENV = "NVRX_EKS_POINT_FAULTS"  # test hook: "buffers:1:2,final:1" (point:rank[:attempt])


def claim_marker(path: Path, text: str) -> bool:
    """True exactly once per path across every restart: the marker is created atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.write(fd, text.encode())
    os.fsync(fd)
    os.close(fd)
    return True


def at_point(point: str, step: int, rank: int, record_dir: Optional[Path], events: EventLog,
             attempt: int = 0) -> None:
    """Raise an injected exception at a named point of set-up or tear-down (model, buffers,
    restore, final), as listed in NVRX_EKS_POINT_FAULTS: each entry fires once across every
    restart, on its rank, in the first in-process attempt numbered at least its own. Tests use
    it to interrupt re-entry and the end of a run where no step can."""
    spec = os.environ.get(POINT_FAULTS_ENV, "")
    if not spec or record_dir is None:
        return
    for i, entry in enumerate(spec.split(",")):
        name, who, since = (entry.strip().split(":") + ["0", "0"])[:3]
        if name != point or int(who) != rank or attempt < int(since):
            continue
        if claim_marker(Path(record_dir) / "faults" / f"point{i:03d}_{name}_rank{rank:05d}", name):
            events.emit("fault", step=step, type="exception", point=point)
            raise InjectedFault(f"injected exception at {point}")


def fire(kind: str, device_type: str, step: int, node_root: Optional[Path] = None) -> None:
    if kind == "exception":
        raise InjectedFault(f"injected exception at step {step}")
    if kind == "hang":
        _hang()
    elif kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "segfault":
        _segfault()
    elif kind == "oom":
        _oom(device_type)
    elif kind == "node":
        lose_node(node_root)
    raise ValueError(f"unknown fault type {kind!r}")
