"""Where a rank's stores live: in the run's store process (`trainer.recovery.store_server`) when
the launcher runs with `--external_store`, else where torchelastic puts them (rank 0 hosts).

With the store process, no rank hosts a store: the default process group's, the fail-fast key,
the in-process Wrapper's and the application store are clients of the store process. Those
stores outlive every restart of the workers, so each worker group keys what it writes by the
rendezvous round it joined (`round_key`), the same on every node of that round: a later round
never reads an earlier one's keys. (torchelastic's own restart count differs between nodes: a
spare that has just joined counts 0.)

The launcher sets EXTERNAL_STORE_ENV; ft_launcher's agent sets RDZV_ROUND_ENV in each worker's
environment (`nvrx_compat.use_round_in_worker_env`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

from config.contract import RDZV_ROUND_ENV

EXTERNAL_STORE_ENV = "NVRX_EKS_STORE"  # "host:port" of the run's store process (the launcher's P)


def external(environ: Optional[dict] = None) -> Optional[tuple[str, int]]:
    """(host, P) of the run's store process, or None where rank 0 hosts the stores."""
    value = (os.environ if environ is None else environ).get(EXTERNAL_STORE_ENV)
    if not value:
        return None
    host, _, port = value.rpartition(":")
    return host, int(port)


def round_key(environ: Optional[dict] = None) -> str:
    """What this worker group's keys in a long-lived store are prefixed with: the run and the
    rendezvous round (the launcher's restart count where no round is known)."""
    env = os.environ if environ is None else environ
    run = env.get("TORCHELASTIC_RUN_ID", "run")
    rnd = env.get(RDZV_ROUND_ENV)
    return f"{run}/round{rnd}" if rnd is not None else \
        f"{run}/restart{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def client(host: str, port: int, timeout_s: float):
    """A client of one of the store process's stores; it never hosts one."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def external_group_store(timeout_s: float):
    """The default process group's store in the store process, for this round; None without
    one (torch's env:// rendezvous then has rank 0 host it)."""
    where = external()
    if where is None:
        return None
    import torch.distributed as dist

    return dist.PrefixStore(f"nvrx-eks/pg/{round_key()}", client(*where, timeout_s))
