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
    return DistEnv(rank, world, local_rank, local_world, dev)


def init_process_group(env: DistEnv, timeout_s: float, store: Optional[dist.Store] = None) -> None:
    kwargs = dict(backend=env.backend, rank=env.rank, world_size=env.world_size,
                  timeout=timedelta(seconds=timeout_s))
    if store is not None:
        kwargs["store"] = store
    if env.device.type == "cuda":
        kwargs["device_id"] = env.device
    dist.init_process_group(**kwargs)


def pg_store() -> dist.Store:
    """The default process group's store: small keys every rank sets or reads a few of, where
    a collective would move the whole world's data (the snapshot agreement, for one)."""
    return dist.distributed_c10d._get_default_store()
