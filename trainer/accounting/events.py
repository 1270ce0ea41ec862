"""An append-only JSONL event log shared by all ranks and all restarts of one run.

Goodput is computed from this log alone, so every process incarnation appends to the same file:
one line per event, written with a single O_APPEND write (atomic for short lines on POSIX file
systems). A process that dies right after an event loses nothing: the line is in the kernel's
page cache. There is no fsync: it guards only against the node's own crash, and with a checkpoint
write filling the disk an fsync on the recovery path (fault, error, abort) can wait seconds.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Optional


class EventLog:
    def __init__(self, path: Optional[str | Path], rank: int):
        self.path = Path(path) if path else None
        self.rank = rank
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> dict:
        rec = {"t": time.time(), "event": event, "rank": self.rank, "pid": os.getpid(), **fields}
        if self.path is None:
            return rec
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return rec


def read_events(path: str | Path) -> list[dict]:
    """All complete events; a torn last line (a crash mid-write) is ignored."""
    return list(iter_events(path))


def iter_events(path: str | Path) -> Iterator[dict]:
    p = Path(path)
    if not p.is_file():
        return
    with p.open() as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue
