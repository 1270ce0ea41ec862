"""Process groups, devices and FSDP2 sharding: one unit per decoder layer, bf16 compute.

FSDP2 (`fully_shard`) runs on CUDA with NCCL and on CPU with gloo alike, so local runs use the
very code and checkpoint format of the cluster.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from trainer.state import _row_range

FULL_INIT_MAX_BYTES = 4 << 30  # above this, presets are initialized shard by shard on the device


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


def _init_shard_(name: str, local: torch.Tensor, seed: int, rank: int) -> None:
    """Random init of one local shard, reproducible for a given world size."""
    if "norm" in name:
        local.fill_(1.0)
        return
    key = hashlib.sha256(f"{seed}:{name}:{rank}".encode()).digest()
    gen = torch.Generator(device=local.device).manual_seed(int.from_bytes(key[:8], "little") >> 1)
    local.normal_(0.0, 0.02, generator=gen)


def build_sharded_model(ref: str, seed: int, env: DistEnv, param_bytes: int) -> torch.nn.Module:
    """Shard a LlamaForCausalLM over all ranks and put its local shards on the device.

    Small models (and any model loaded from a directory) are built whole on the CPU first and
    each rank copies its rows, so the result is identical at every world size. Large presets are
    built on the meta device and initialized shard by shard, so no rank ever holds the whole.
    """
    from trainer.model import PRESETS, build_model

    full = None
    if ref not in PRESETS or param_bytes <= FULL_INIT_MAX_BYTES:
        full = dict(build_model(ref, seed, "cpu").named_parameters())
    model = build_model(ref, seed, "meta")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=env.device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            if full is None:
                _init_shard_(name, local, seed, env.rank)
                continue
            start, rows = _row_range(p)
            src = full[name] if p.dim() == 0 else full[name][start:start + rows]
            local.copy_(src)
        # Buffers that are not parameters (rotary frequencies) stayed uninitialized on the
        # meta device: rebuild those modules on the CPU and move their buffers over.
        for mod in model.modules():
            if type(mod).__name__.endswith("RotaryEmbedding"):
                fresh = type(mod)(config=mod.config)
                for bname, buf in fresh.named_buffers(recurse=False):
                    setattr(mod, bname, buf.to(env.device))
                mod.attention_scaling = fresh.attention_scaling
    return model


@torch.no_grad()
def full_param_sha256(model: torch.nn.Module) -> str:
    """sha256 over every full parameter in name order: equal iff training was identical."""
    sha = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        sha.update(name.encode())
        sha.update(full.detach().float().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()
