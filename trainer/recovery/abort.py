"""The in-process restart's abort of the process groups, off the restart's critical path.

NVRx's `AbortTorchDistributed` aborts every NCCL backend, then `destroy_process_group` shuts
every group down and clears torch's registry of groups. NCCL's `ncclCommAbort` returns only
once its proxy threads have seen the abort flag, and they look every 500 ms: one abort took
0.98-1.02 s on an H100 whatever the torch settings (`bench.nccl_costs`), most of an
in-process restart. The next attempt needs only two things from it: the old communicators'
kernels stopped (the abort flag, which `ncclCommAbort` sets first) and torch's registry empty,
so that `init_process_group` can make new groups.

So the registry is cleared at once, as `destroy_process_group` clears it, and the same aborts
and shutdowns run on a thread of their own (`nccl-abort`), which holds the old groups until it
is done. The next abort, and the process's orderly end, wait for it (`join_pending`). The
registry's private names are checked by tests/trainer/recovery/test_abort.py on both torches.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

_pending: list[threading.Thread] = []


def _backends(group) -> list:
    """The NCCL backends of `group` (the ones NVRx aborts); none on CPU ranks."""
    if not torch.cuda.is_available():
        return []
    try:
        backend = group._get_backend(torch.device("cuda"))
    except RuntimeError:  # a group without a CUDA backend (gloo)
        return []
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    return [backend] if nccl is not None and isinstance(backend, nccl) else []


def forget_process_groups() -> list:
    """Empty torch's registry of process groups the way `destroy_process_group` does for the
    default group, without shutting the groups down; returns them, newest first (the order
    torch shuts them down in)."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    groups = sorted(world.pg_names, key=lambda g: world.pg_names[g], reverse=True)
    c10d._update_default_pg(None)
    for registry in (world.pg_map, world.pg_names, world.pg_group_ranks,
                     world.pg_backend_config, world.pg_to_tag, world.tags_to_pg,
                     world.pg_coalesce_state):
        registry.clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0  # as torch resets it: the next groups get the same names again
    return groups


def abort_process_groups(done: Optional[Callable[[float], None]] = None,
                         wait_s: float = 120.0) -> None:
    """Abort and shut down every process group on a background thread, once the registry is
    empty; `done(seconds)` is called from that thread when it ends."""
    join_pending(wait_s)
    if not (dist.is_available() and dist.is_initialized()):
        return
    groups = forget_process_groups()
    nccl = [b for g in groups for b in _backends(g)]

    def run() -> None:
        t0 = time.perf_counter()
        aborts = [threading.Thread(target=b.abort, name="nccl-abort-comm") for b in nccl]
        try:
            for t in aborts:  # in parallel, as NVRx does: aborts of several groups never wait in turn
                t.start()
            for t in aborts:
                t.join()
            for g in groups:
                g.shutdown()
        finally:  # a group that fails to shut down is given up with the attempt that made it
            if done is not None:
                done(time.perf_counter() - t0)

    thread = threading.Thread(target=run, name="nccl-abort", daemon=True)
    _pending.append(thread)
    thread.start()


def join_pending(wait_s: float) -> bool:
    """Wait up to `wait_s` for earlier aborts still running; whether none is left."""
    deadline = time.monotonic() + wait_s
    for thread in list(_pending):
        thread.join(max(0.0, deadline - time.monotonic()))
        if not thread.is_alive():
            _pending.remove(thread)
    return not _pending
