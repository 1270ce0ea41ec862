"""A node fault: every rank of one node dies at once and its node-local memory is lost.

Each rank registers its pid under the node's directory while node faults are possible, so the
rank that fires one can kill its node's other ranks; a rank that ends its run unregisters.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Optional

from trainer.node_dir import ranks_dir


def register_rank(node_root: Path, rank: int) -> Path:
    path = ranks_dir(node_root) / f"rank{rank:05d}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    return path


def unregister_rank(path: Optional[Path]) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def lose_node(node_root: Optional[Path]) -> None:
    """Wipe the node's directory (its snapshot files) and SIGKILL every registered rank, this
    one last."""
    pids = []
    if node_root is not None:
        for f in ranks_dir(node_root).glob("rank*"):
            try:
                pids.append(int(f.read_text()))
            except (OSError, ValueError):
                pass
        shutil.rmtree(node_root, ignore_errors=True)
    for pid in pids:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.kill(os.getpid(), signal.SIGKILL)
