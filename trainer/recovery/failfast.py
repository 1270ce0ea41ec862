"""A failed rank's peers leave with it, when a launcher restarts every worker (ft_launcher
without in-process restarts, and the baseline's torchrun).

The launcher signals the surviving workers only once the failed process has exited, and each
exit takes seconds (unregistering a rank's pinned snapshot slots costs about 0.2 s per GiB,
BENCHMARKS.md section 4): one after the other, the two exits double the time before the
relaunch. So a failing rank first sets a key in the launcher's store, and every rank watches
that key on a thread and leaves at once, the way the failed rank does (`cli.exit_now`). The key
names the rendezvous round (`stores.round_key`), so a later round never sees it.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Callable, Optional

import torch.distributed as dist

from trainer.recovery.stores import external, round_key

KEY = "nvrx-eks/failed-rank"
_WAIT = timedelta(hours=1)  # one blocking wait at a time; renewed when it times out
_announcer: Optional[dist.Store] = None  # a connection of its own, see `watch`


def _connect() -> Optional[dist.Store]:
    """A client of the run's store process, else of the launcher's store (torchelastic gives
    every worker its address)."""
    host, port = external() or (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    if not host or not port:
        return None
    try:
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30),
                             wait_for_workers=False)
    except Exception:  # noqa: BLE001 - no store, no early leave: the launcher's signal still comes
        return None


def _key() -> str:
    return f"{KEY}/{round_key()}"


def announce(rank: int) -> None:
    """Tell every peer that this rank failed; best effort, never raises."""
    if _announcer is None:
        return
    try:
        _announcer.set(_key(), str(rank))
    except Exception:  # noqa: BLE001 - a store that is gone: the launcher's signal still comes
        pass


def watch(on_failure: Callable[[int], None]) -> None:
    """Call `on_failure(failed_rank)` on a daemon thread once a peer announces its failure.

    A store client serves one request at a time, so the blocking wait gets a connection of its
    own: on a shared one, `announce` would queue behind it. The wait releases the GIL, so the
    watch costs the loop nothing."""
    global _announcer
    watcher, _announcer = _connect(), _connect()
    if watcher is None:
        return
    key = _key()

    def run() -> None:
        while True:
            try:
                watcher.wait([key], _WAIT)
                failed = int(watcher.get(key))
            except Exception:  # noqa: BLE001 - a timeout, or the store closing at the job's end
                time.sleep(1.0)
                continue
            on_failure(failed)
            return

    threading.Thread(target=run, daemon=True, name="peer-failure-watch").start()
