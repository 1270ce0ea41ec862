"""ft_launcher whose workers are forked from a process that has already imported the trainer.

A fresh interpreter spends seconds on imports (torch with its distributed packages and NVRx),
on every restart. ft_launcher can start its workers as functions (`--run-path`) through
multiprocessing's fork server: one process per node imports `PRELOAD` once, and each worker of
each restart is forked from it with those modules in place. The fork server never initializes
CUDA (a forked CUDA context is unusable), and none of these modules does on import; every
worker sets up its own device. Each worker leads its own process group, as a command-line worker
does, and the fork server and its workers die with this launcher
(`trainer.recovery.worker_groups`).

The fork server starts, and imports `PRELOAD`, as the launcher starts (`warm`), beside the
first rendezvous, not at the first launch of workers: a spare node that waits in the
rendezvous has its imports done before it is called in.

    python -m trainer.recovery.forkserver <ft_launcher flags> --run-path --start-method=forkserver \\
        <trainer/__main__.py> <trainer flags>
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from pathlib import Path

from trainer.faults.node_loss import NODE_LEADER_ENV
from trainer.lifetime import announce_agent
from trainer.termination import hold_in_agent

# What a worker imports before its first step; a module missing here is imported by each worker.
PRELOAD = (
    "trainer.recovery.worker_groups",  # first: the server's forks get process groups of their own
    "trainer.cli", "trainer.tiers", "trainer.loop.train", "trainer.loop.model",
    "trainer.loop.parallel", "trainer.loop.data", "trainer.durable.manager",
    "trainer.buffers", "trainer.snapshots", "trainer.recovery.heartbeat",
    "trainer.recovery.failfast", "trainer.recovery.inprocess", "trainer.faults.inject",
    "trainer.accounting.goodput", "trainer.telemetry.report", "trainer.telemetry.live",
    "trainer.telemetry.tensorboard", "torch.utils.tensorboard",
    "nvidia_resiliency_ext.fault_tolerance.launcher",  # the worker function's own module
    "torch.distributed.checkpoint",
    "torch._dynamo",  # FSDP2's first DTensor imports it (0.6 CPU-s), compiled or not
)
WORKER_SCRIPT = Path(__file__).parents[1] / "__main__.py"  # the rank's entry point


def launcher_args() -> list[str]:
    """ft_launcher flags that start each worker as `trainer/__main__.py` in a forked process."""
    return ["--run-path", "--start-method=forkserver", str(WORKER_SCRIPT)]


def forked_worker() -> bool:
    """Whether this process is a worker forked by the fork server: multiprocessing ends it (and
    waits for the other workers' results first), so it must return instead of exiting."""
    return multiprocessing.parent_process() is not None


def plain_elastic_logs() -> None:
    """Give the launcher's torchelastic records a plain formatter. torch's own imports
    torch._dynamo the first time it formats a record with a traceback, and in the launcher that
    record is the first worker failure: the import (4.8 s on an H200 host) ran before the launcher
    reacted to it (BENCHMARKS.md section 7)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(
        "%(levelname).1s%(asctime)s %(process)d %(name)s:%(lineno)d] %(message)s"))
    logger = logging.getLogger("torch.distributed.elastic")
    logger.addHandler(handler)
    logger.propagate = False


def warm() -> None:
    """Start the fork server now, so that its imports overlap the rendezvous. It is the one
    server that ft_launcher's start method later forks the workers from (multiprocessing keeps
    one per process), started from the same environment and signal mask as it would be then."""
    from multiprocessing import forkserver

    forkserver.ensure_running()


def main() -> None:
    announce_agent()  # before the fork server starts: it inherits the environment...
    hold_in_agent()  # ...and the signal mask
    os.environ["PYTHONUNBUFFERED"] = "1"  # what `-u` gives a command-line worker
    os.environ.setdefault(NODE_LEADER_ENV, str(os.getpid()))  # no `launch` above: this process
    plain_elastic_logs()
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    warm()
    from trainer.recovery.launcher_events import record_ft_launcher_detections
    from trainer.nvrx_compat import ft_launcher_main

    record_ft_launcher_detections(os.environ)

    sys.exit(ft_launcher_main())


if __name__ == "__main__":
    main()
