"""Ranks and process groups: who this process is (from the launcher's environment) and the
default process group (NCCL on CUDA, gloo on CPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_world_size


def dist_env(device: str) -> DistEnv:
    """Ranks from the launcher's environment (torchrun, ft_launcher, or none: one rank)."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but no CUDA device is visible")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        keep_cuda_guard_alive()
    return DistEnv(rank, world, local_rank, local_world, dev)


def keep_cuda_guard_alive() -> None:
    """On a CUDA build of torch that sees no GPU, make the process-wide CUDA device guard one
    that lives as long as the process. Call it from the main thread before any other thread
    runs torch code.

    With no GPU visible, the first FakeTensorMode entered (DTensor's sharding propagation
    enters one, from whichever thread first dispatches a DTensor op) puts in torch's device
    guard registry a no-op CUDA guard that it keeps in that thread's thread-local storage
    (`torch._C._ensureCUDADeviceGuardSet`, measured on torch 2.11.0+cu130). The trainer builds
    the model on a phase thread (`trainer.phases`); once that thread ends, the
    registry points at freed memory, and the autograd engine, which asks every registered guard
    for its device count at the first backward, crashes with SIGSEGV. Setting the guard here
    first, on the main thread, leaves it there: a guard already set is kept. CPU-only builds
    register no CUDA guard and a visible GPU keeps the real one: the call changes nothing then.
    """
    ensure = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)
    if ensure is not None and torch.backends.cuda.is_built():
        ensure()


def init_process_group(env: DistEnv, timeout_s: float, store: Optional[dist.Store] = None) -> None:
    kwargs = dict(backend=env.backend, rank=env.rank, world_size=env.world_size,
                  timeout=timedelta(seconds=timeout_s))
    if store is not None:
        kwargs["store"] = store
    if env.device.type == "cuda":
        kwargs["device_id"] = env.device
    dist.init_process_group(**kwargs)


def default_group_store() -> dist.Store:
    """The default process group's store: small keys every rank sets or reads a few of, where
    a collective would move the whole world's data (the snapshot agreement, for one)."""
    return dist.distributed_c10d._get_default_store()
