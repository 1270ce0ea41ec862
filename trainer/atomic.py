"""Crash-safe small-file writes shared by the checkpoint, snapshot and results code."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional


def write_json_atomic(path: Path, data: object, durable: bool = True) -> None:
    """Write JSON so that readers see the old file or the complete new one, never a torn one.
    `durable=False` skips the fsyncs, for files that need not survive the node: an fsync
    waits behind whatever the file system is writing back (a checkpoint: seconds)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_json_exclusive(path: Path, data: object) -> bool:
    """Create `path` complete with `data`, only if it does not exist yet (across processes and
    hosts sharing the file system); False if another writer created it first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    try:
        os.link(tmp, path)  # atomic, and the file is complete when it appears
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> Optional[Any]:
    """A small JSON file written by the functions above; None if it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
