"""A node fault: the whole node is lost at once: its launcher, every rank on it, and its
node-local memory.

Each rank registers its pid under the node's directory while node faults are possible, so the
rank that fires one can kill its node's other ranks; a rank that ends its run unregisters. The
node's launcher is named to its ranks in NODE_LEADER_ENV: in a pod, `trainer.recovery.launch`
(PID 1: the pod ends with it); locally, each simulated node's launcher, which leads a process
group of its own (`devtools.local`): the group is killed, so nothing of the node answers again,
not even its rendezvous keep-alive.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Optional

from trainer.node_dir import ranks_dir

NODE_LEADER_ENV = "NVRX_EKS_NODE_LEADER"  # pid of the node's outermost launcher process


def register_rank(node_root: Path, rank: int) -> Path:
    path = ranks_dir(node_root) / f"rank{rank:05d}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    return path


def unregister_rank(path: Optional[Path]) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def kill_leader() -> None:
    """SIGKILL the node's launcher, with its process group where it leads one."""
    leader = os.environ.get(NODE_LEADER_ENV)
    if not leader:
        return
    pid = int(leader)
    try:
        if os.getpgid(pid) == pid and pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def lose_node(node_root: Optional[Path]) -> None:
    """Wipe the node's directory (its snapshot files), SIGKILL every registered rank and the
    node's launcher, this rank last."""
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
    kill_leader()
    os.kill(os.getpid(), signal.SIGKILL)
