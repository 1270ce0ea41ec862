"""Crash-safe small-file writes shared by the checkpoint, snapshot and results code."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON so that readers see the old file or the complete new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
