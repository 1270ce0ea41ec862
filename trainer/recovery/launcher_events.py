"""What a node's launcher detects, recorded in its node's event log (`accounting.events`).

ft_launcher finds a dead worker (its exit code or signal) and its rank monitors find a silent
one (the heartbeat timeout), then restart the worker group; the workers that come back cannot
tell why. These records are the launcher's evidence of each failure, written at the point of
detection: `workers_failed`, `heartbeat_timeout`, and `nodes_lost` (participants of its
rendezvous round whose keep-alive expired: a node that stopped answering). `supervise` (the pod's first process)
records its launcher's failed exit, after which the Job restarts the pod: `worker_failed`.
"""

from __future__ import annotations

from typing import Mapping

from trainer.accounting.events import EventLog, launcher_log


def record_ft_launcher_detections(environ: Mapping[str, str]) -> EventLog:
    """Hook the launcher running in this process (and the rank monitors it forks) to the
    node's log; a launcher given no events directory records nothing."""
    events = launcher_log(environ)
    if events.path is None:
        return events
    from nvidia_resiliency_ext.fault_tolerance import launcher

    from trainer.nvrx_compat import (watch_heartbeat_timeouts, watch_lost_nodes,
                                              watch_worker_failures)

    watch_worker_failures(launcher, lambda failures: events.emit("workers_failed",
                                                                 failures=failures))
    watch_heartbeat_timeouts(lambda rank, pid: events.emit("heartbeat_timeout", failed_rank=rank,
                                                           failed_pid=pid))
    watch_lost_nodes(lambda lost, rnd: events.emit("nodes_lost", lost=lost, round=rnd))
    return events


def record_launcher_exit(environ: Mapping[str, str], exit_code: int) -> None:
    """The launcher ended with a failure its own restarts did not fix (or that it never
    restarts, under torchrun): the Job restarts the pod."""
    launcher_log(environ).emit("worker_failed", exit_code=exit_code)
