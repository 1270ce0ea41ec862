"""Rank 0's running view of the event log: the `Goodput` pass of results.json, fed while the
run trains, on a thread of its own so the step loop never reads a file for it.

It follows the files of rank 0's node (and the local job runner's, where there is one), not
every node's: reading every node's file from one process would cost rank 0 a read per node at
every poll, growing with the job, and reading a file another node appends to makes the file
system move its lock between the two at every append. Rank 0's node file holds every step,
checkpoint and commit (rank 0 writes them), every restart of rank 0 (its launcher's and its
own), so the steps, restarts, recoveries and goodput are those of results.json; a failure on
another node is timed from the last step before it rather than from that node's own events,
which results.json, reading every file at the end, has.

A new process reads its node's file from the start once (on its thread), then only what was
appended: its cost is the node's events, whatever the world size.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Mapping, Optional

from trainer.accounting.events import JOB_LOG, Follower, events_dir, node_log_name, node_rank
from trainer.accounting.goodput import Goodput

POLL_S = 2.0


class LiveRun:
    def __init__(self, output_dir: Path, max_steps: int, checkpoint_interval: int,
                 environ: Mapping[str, str], poll_s: float = POLL_S):
        d = events_dir(output_dir)
        self.follower = Follower([d / node_log_name(node_rank(environ)), d / JOB_LOG])
        self.goodput = Goodput(max_steps, checkpoint_interval)
        self.poll_s = poll_s
        self._summary: Optional[dict] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="telemetry-live")
        self._thread.start()

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                self.catch_up()
            except Exception as exc:  # noqa: BLE001 (the view goes stale, training goes on)
                if not warned:
                    warned = True
                    print(f"telemetry: warning: the live figures stopped: {type(exc).__name__}: "
                          f"{exc}", file=sys.stderr, flush=True)
            self._stop.wait(self.poll_s)

    def catch_up(self, final: bool = False) -> None:
        """Feed what was appended since the last call; with `final`, what is still held too."""
        with self._lock:
            fed = self.goodput.events
            while True:
                for e in self.follower.poll(final=final):
                    self.goodput.feed(e)
                if not self.follower.behind:
                    break
            if self.goodput.events > fed:
                self._summary = self.goodput.summary()

    def summary(self) -> Optional[dict]:
        """The run's figures as of the last poll (None before any event was read)."""
        return self._summary

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
