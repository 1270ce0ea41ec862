"""The node-local directory: where a run keeps its host buffers on each node (`--node_dir`).

One rule for every tier that uses it: the durable tier's staging buffers, the snapshot slots and
the ranks a node fault kills all live under one root per run and node.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional


def default_node_dir() -> Path:
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / "nvrx-eks"


def node_root(node_dir: Optional[str], checkpoint_dir: str, lineage: str) -> Path:
    """This run's node-local directory: named after the checkpoint directory and the identity
    stored in it (trainer.durable.lease), so two runs on one node never share buffers, and a new
    directory at an old path never finds the old one's snapshots."""
    key = hashlib.sha1(f"{os.path.abspath(checkpoint_dir)}:{lineage}".encode()).hexdigest()[:12]
    return Path(node_dir or default_node_dir()) / key


def snapshots_dir(root: Path) -> Path:
    """The snapshot slots and peer replicas of every rank on the node."""
    return root / "snapshots"


def ranks_dir(root: Path) -> Path:
    """One pid file per rank on the node: what a node fault kills."""
    return root / "pids"
