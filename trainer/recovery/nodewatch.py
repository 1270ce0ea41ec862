"""A node that stops answering is found in seconds where the rendezvous itself cannot find it.

NVRx 0.6+'s barrier rendezvous keeps no keep-alive: a node that freezes (its processes stopped,
its connections open, as a machine that hangs) is found only once the survivors' heartbeats or
collectives time out, a minute or more. So each node's first rank beats a counter in the run's
store process, and watches one other node's: the next node of its round, in a ring. Each node
does O(1) store operations per beat, whatever the node count. A neighbour whose counter has
not moved for the node timeout is gone: the watcher ends its own rank as a failed one would
(`cli.exit_now`, which tells its peers), its launcher restarts the workers in a new round,
and a spare takes the silent node's seat.

The launcher turns this on (NODE_TIMEOUT_ENV, `launch.launch_env`) where the run's stores live
in the store process and the rendezvous finds no silent node (`nvrx_compat`). A neighbour is
judged only after its first beat: one that never starts is the launcher's initial heartbeat
timeout's to find.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional

from trainer.recovery.stores import client, external, round_key

NODE_TIMEOUT_ENV = "NVRX_EKS_NODE_TIMEOUT"  # seconds; set by the launcher, absent: no watch
KEY = "nvrx-eks/node-alive"


def beat_key(node: int, environ: Optional[dict] = None) -> str:
    """The counter node `node` of this worker group's round beats."""
    return f"{KEY}/{round_key(environ)}/{node}"


def neighbour(node: int, nodes: int) -> int:
    """The node `node` watches: the next one of its round."""
    return (node + 1) % nodes


class Watch:
    """One node's beat and its watch of its neighbour, driven by `tick`; time is passed in, so
    the judgement can be followed step by step."""

    def __init__(self, store, node: int, nodes: int, timeout_s: float,
                 environ: Optional[dict] = None) -> None:
        self.store, self.timeout_s = store, timeout_s
        self.watched = neighbour(node, nodes)
        self._mine, self._theirs = beat_key(node, environ), beat_key(self.watched, environ)
        self._last: Optional[int] = None  # the neighbour's counter when it last moved
        self._moved_at = 0.0

    def tick(self, now: float) -> Optional[float]:
        """Beat once and look at the neighbour: the seconds it has been silent once that
        exceeds the timeout, else None."""
        self.store.add(self._mine, 1)
        seen = self.store.add(self._theirs, 0)  # 0 until its first beat; never blocks
        if seen != self._last:
            self._last, self._moved_at = seen, now
            return None
        silent = now - self._moved_at
        return silent if seen > 0 and silent > self.timeout_s else None


def start(node: int, nodes: int, on_silent: Callable[[int, float], None],
          environ: Optional[dict] = None) -> Optional[threading.Thread]:
    """Beat and watch from a daemon thread with a store connection of its own, a beat every
    third of the node timeout; call `on_silent(node, seconds)` once the neighbour is silent.
    Nothing starts without the launcher's NODE_TIMEOUT_ENV, the store process, or a second node."""
    env = os.environ if environ is None else environ
    timeout_s = float(env.get(NODE_TIMEOUT_ENV, 0) or 0)
    where = external(env)
    if timeout_s <= 0 or where is None or nodes < 2:
        return None
    interval = timeout_s / 3

    def run() -> None:
        try:
            watch = Watch(client(*where, timeout_s=max(30.0, timeout_s)), node, nodes,
                          timeout_s, env)
        except Exception:  # noqa: BLE001 - no store: the launcher's own timeouts still apply
            return
        while True:
            try:
                silent = watch.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - the store closing at the job's end
                return
            if silent is not None:
                on_silent(watch.watched, silent)
                return
            time.sleep(interval)

    thread = threading.Thread(target=run, daemon=True, name="node-watch")
    thread.start()
    return thread
