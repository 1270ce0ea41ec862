"""ft_launcher's rank monitor: a heartbeat per step, so a dead or silent rank is restarted.

The launcher's heartbeat timeouts are always set explicitly by `trainer.recovery.launch` (NVRx 0.6+ has
no defaults); the initial one allows for model building and checkpoint loading. The client's
state (timeouts it may have calculated) travels with every checkpoint.
"""

from __future__ import annotations

import contextlib

from trainer.accounting.events import EventLog
from trainer.hooks import Hooks


def attach_heartbeat(hooks: Hooks, events: EventLog) -> None:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    events.emit("ft_client_ready")
    hooks.on_ready.append(client.send_heartbeat)
    hooks.keepalive.append(client.send_heartbeat)
    hooks.stateful["ft_client"] = client
    hooks.process.ft_client = client


def detach_heartbeat(hooks: Hooks) -> None:
    """Stop the rank monitor's clock once this worker is done. A forked worker outlives its
    training (multiprocessing ends it only once every worker has returned), and a rank that
    is silent past the heartbeat timeout would get the job restarted."""
    client, hooks.process.ft_client = hooks.process.ft_client, None
    if client is not None:
        with contextlib.suppress(Exception):  # a monitor that is gone: nothing to tell
            client.shutdown_workload_monitoring()
