"""SIGTERM: stop at a step every rank agrees on, commit the newest state if the grace allows, end.

Kubernetes sends SIGTERM on pod deletion, node drain and spot interruption, and SIGKILL after the
pod's terminationGracePeriodSeconds (sized from the checkpoint write time, `scripts.plan`, and
passed to the trainer as --termination_grace). In a pod the node tier (/dev/shm) goes with the
pod, so whatever is newer than the last durable checkpoint is lost unless it is written now.

- The launcher (PID 1 of a pod: `trainer.recovery.launch`; locally `devtools.local`) takes the
  SIGTERM and passes `STOP_SIGNAL` to its workers. Workers keep SIGTERM's default: it is what
  torchrun, ft_launcher and NVRx's in-process monitor use to tear a rank down at once after a
  failure, and a handler would delay that (a rank stuck in C never runs one). The elastic agent
  holds `STOP_SIGNAL` blocked (`hold_in_agent`), so a worker inherits it blocked and takes one
  sent before its handler exists once the handler is in place (`install`). Sending
  `STOP_SIGNAL` to the ranks of any launcher stops them the same way.
- The handler only notes the time; its rank's next step carries the note in the step's loss
  all-reduce (`train.train_step`), so every rank learns it from the same step's figures, whichever
  ranks got the signal, and the loop stops after the same step everywhere (no collective of its
  own, nothing per step beyond one more number in a reduction that runs anyway).
- The newest state is then committed through the durable tier's usual protocol (from a snapshot
  slot where tiers are on) if every rank expects its write to end within what is left of the
  grace (`time_allows`, one all-reduce); a write cut short by SIGKILL is never visible anyway.
- A rank that was not asked to stop itself (a peer's node is draining) stops with the others,
  then fails (`PeerTerminating`): its launcher or the Job restarts it to meet the replaced
  node, from the checkpoint just committed. A rank that was asked returns normally (exit code
  0), so neither torchrun nor ft_launcher takes its end for a failure to restart; its launcher
  exits 143.
"""

from __future__ import annotations

import math
import signal
import time
from typing import Optional

EXIT_RESERVE_S = 10.0  # of the grace, kept for tearing down and exiting after the commit
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # what a launcher stopped by SIGTERM exits with
STOP_SIGNAL = signal.SIGUSR1  # a launcher's SIGTERM, as its workers get it

_received: Optional[float] = None  # time.monotonic() of this process's first stop signal


class PeerTerminating(RuntimeError):
    """This rank stopped because another rank was asked to; its launcher or the Job restarts it."""


def hold_in_agent() -> None:
    """Called by the node's elastic agent before it starts workers: they inherit the stop
    signal blocked, until `install`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})


def install() -> None:
    """First thing in a rank: note the stop signal (one already pending arrives now)."""
    signal.signal(STOP_SIGNAL, _note)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})


def _note(signum, frame) -> None:
    global _received
    if _received is None:
        _received = time.monotonic()


def requested() -> bool:
    """Whether this process was asked to stop (its launcher got SIGTERM)."""
    return _received is not None


def seconds_left(grace_s: float) -> float:
    """Of the grace period, what is left for a checkpoint (inf unless asked to stop)."""
    if _received is None:
        return math.inf
    return grace_s - EXIT_RESERVE_S - (time.monotonic() - _received)


def time_allows(need_s: float, grace_s: float, device) -> bool:
    """Every rank: whether every rank expects `need_s` (its estimate of the write) to fit in what
    is left of its grace. One all-reduce, so all ranks decide alike."""
    import torch
    import torch.distributed as dist

    left = seconds_left(grace_s)
    shortfall = torch.tensor([need_s - min(left, 1e9)], dtype=torch.float64, device=device)
    dist.all_reduce(shortfall, op=dist.ReduceOp.MAX)
    return float(shortfall.item()) <= 0.0
