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


SHMEM_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64


def mount_of(path: Path) -> Optional[tuple[str, str, str]]:
    """(mount point, file system type, options) of the mount that holds `path`, from
    /proc/mounts; None where that cannot be read."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target, best = str(Path(path).resolve()), None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, fields[2], fields[3])
    return best


def page_bytes(path: Path) -> int:
    """The page size that backs files under `path`: 2 MiB on a tmpfs given huge pages (its
    `huge=always` or `within_size`, or the host's `shmem_enabled` forcing them, as the GPU
    nodes' `/dev/shm` has), the huge page size on hugetlbfs, else the base page. Pinning a
    buffer for CUDA (cudaHostRegister) and a restarted process's first touch of it both cost
    per page: on 4 KiB pages about six times as long (docs/snapshots.md)."""
    small = os.sysconf("SC_PAGE_SIZE")
    mount = mount_of(path)
    if mount is None:
        return small
    _, fstype, options = mount
    if fstype == "hugetlbfs":
        return os.statvfs(path).f_bsize
    if fstype != "tmpfs":
        return small
    try:
        text = SHMEM_ENABLED.read_text()
        setting = text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        setting = ""
    if setting in ("force", "deny"):
        return HUGE_PAGE if setting == "force" else small
    huge = dict(o.split("=", 1) for o in options.split(",") if "=" in o).get("huge", "never")
    return HUGE_PAGE if huge in ("always", "within_size") else small

