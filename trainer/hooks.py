"""What a recovery layer plugs into the training loop, and what outlives one attempt.

The loop (`train.run`) is one attempt. The recovery layers around it (in-process restart,
ft_launcher's heartbeats) reach it only through a `Hooks`; the objects an in-process restart
must find again (the tiers' buffers and writer, the directory's lease, the layers' own clients,
the step log's sinks)
live in its `ProcessState`, one per process.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol, TypeVar

import torch
import torch.distributed as dist

from trainer.leftovers import Attempt
from trainer.phases import run_here, run_phase

if TYPE_CHECKING:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    from trainer.durable.lease import Lease
    from trainer.durable.manager import CheckpointManager
    from trainer.nvrx_compat import AsyncWriter
    from trainer.snapshots import Snapshotter
    from trainer.telemetry.report import Telemetry

KEEPALIVE_S = 0.25
T = TypeVar("T")


class Stateful(Protocol):
    """A part of the run whose state a checkpoint carries, as JSON-able values
    (`loop.state`): the loop's own parts, and what a layer plugs in through `Hooks.stateful`."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class ProcessState:
    """The objects that outlive an attempt, typed: one per process, shared by its attempts."""

    checkpoints: Optional["CheckpointManager"] = None  # the durable tier and its writer process
    writer: Optional["AsyncWriter"] = None            # that writer, until `checkpoints` takes it
    snapshots: Optional["Snapshotter"] = None          # the mapped, pinned snapshot slots
    lease: Optional["Lease"] = None                    # rank 0: the checkpoint directory's lease
    leased: bool = False                               # the lease was taken (or waited for) once
    app_store: Optional[dist.Store] = None             # in-process: the trainer's own store
    ft_client: Optional["RankMonitorClient"] = None    # ft_launcher: the rank's heartbeats
    telemetry: Optional["Telemetry"] = None            # the step log's sinks and live figures
    previous: Attempt = field(default_factory=Attempt)  # weak references to the newest attempt


@dataclass
class Hooks:
    """What a recovery layer plugs into the loop."""

    # Where the process group meets: in-process, the Wrapper's per-attempt store; else the
    # run's store process (no rank hosts one); None: torch's env:// rendezvous, rank 0 hosting.
    store: Optional[dist.Store] = None
    iteration: int = 0                           # in-process attempt number
    keepalive: list[Callable[[], None]] = field(default_factory=list)  # heartbeats, pings
    on_ready: list[Callable[[], None]] = field(default_factory=list)   # training is about to start
    # a layer's own state, saved with every checkpoint and loaded on resume (`loop.state`)
    stateful: dict[str, Stateful] = field(default_factory=dict)
    process: ProcessState = field(default_factory=ProcessState)
    steps_done: int = 0                          # training steps this attempt queued
    _last_alive: float = 0.0

    def for_attempt(self, iteration: int, store: dist.Store, ping: Callable[[], None]) -> "Hooks":
        """An in-process attempt's hooks: its own store, counters and wrapper ping; the same
        callbacks and process state."""
        return dataclasses.replace(self, store=store, iteration=iteration,
                                   keepalive=[*self.keepalive, ping], steps_done=0,
                                   _last_alive=0.0)

    def alive(self) -> None:
        """Send the keepalives, at most every KEEPALIVE_S: each one is an IPC message, and a
        flood of them delays (NVRx's in-process monitor: starves) the peer that reads them."""
        now = time.monotonic()
        if now - self._last_alive >= KEEPALIVE_S:
            self._last_alive = now
            for fn in self.keepalive:
                fn()

    def phase(self, name: str, fn: Callable[[], T], bound_s: float,
              device: Optional[torch.device] = None) -> T:
        """Run set-up or tear-down work outside the progress timeouts, bounded by `bound_s`."""
        return run_phase(name, fn, bound_s, self.alive, device)

    def phase_here(self, name: str, fn: Callable[[], T], bound_s: float) -> T:
        """`phase`, but on this thread: for work whose per-thread caches the loop reuses."""
        return run_here(name, fn, bound_s, self.alive)
