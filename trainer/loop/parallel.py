"""Process groups, devices and FSDP2 sharding: one unit per decoder layer, bf16 compute;
activation checkpointing and torch.compile per layer; device peak FLOP/s for MFU.

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

from trainer.durable.state import row_range

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


INIT_BLOCK_ROWS = 64  # rows per independently seeded block of the shard-by-shard init


def _block_generator(seed: int, name: str, block: int, device: torch.device) -> torch.Generator:
    key = hashlib.sha256(f"{seed}:{name}:{block}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(key[:8], "little") >> 1)


def _init_rows_(name: str, local: torch.Tensor, seed: int, start: int, total_rows: int) -> None:
    """Random init of global rows [start, start + len(local)) of parameter `name`.

    Rows come in fixed blocks, each drawn from a generator seeded by (seed, name, block): a row's
    value depends on neither the world size nor the rank, so every world starts from the same
    weights. A shard boundary inside a block costs drawing that one block whole.
    """
    if "norm" in name:
        local.fill_(1.0)
        return
    if local.dim() == 0 or local.shape[0] == 0:
        return
    rows = local.shape[0]
    first, last = start // INIT_BLOCK_ROWS, (start + rows - 1) // INIT_BLOCK_ROWS
    for block in range(first, last + 1):
        b0 = block * INIT_BLOCK_ROWS
        b1 = min(b0 + INIT_BLOCK_ROWS, total_rows)
        values = torch.empty((b1 - b0, *local.shape[1:]), dtype=local.dtype, device=local.device)
        values.normal_(0.0, 0.02, generator=_block_generator(seed, name, block, local.device))
        lo, hi = max(start, b0), min(start + rows, b1)
        local[lo - start:hi - start].copy_(values[lo - b0:hi - b0])


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def peak_flops(device: torch.device) -> Optional[float]:
    """Dense bf16 peak FLOP/s of one device, or None where unknown (CPUs, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = device_name(device)
    for fragment, flops in PEAK_BF16_FLOPS:
        if fragment in name:
            return flops
    return None


# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets; the first match wins.
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
                   ("A100", 312e12), ("L40S", 362e12), ("B200", 2250e12))


def _apply_layer_options(layer: torch.nn.Module, checkpointed: bool, compiled: bool) -> None:
    """Activation checkpointing, then torch.compile, on one decoder layer's forward.

    The layer's forward is replaced in place, not wrapped in another module, so parameter names
    (and with them checkpoints) are the same with and without either option. The FSDP hooks
    stay outside the compiled region, as in torchtitan (compile per block, then shard).
    """
    forward = layer.forward
    if checkpointed:
        from torch.utils.checkpoint import checkpoint

        def forward_checkpointed(*args, _inner=forward, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        forward = forward_checkpointed
    if compiled:
        forward = torch.compile(forward)
    layer.forward = forward


def checkpointed_layers(mode: str, layers: int) -> list[bool]:
    """Which decoder layers recompute their activations: none, every other one, or all."""
    if mode == "full":
        return [True] * layers
    if mode == "selective":
        return [i % 2 == 1 for i in range(layers)]
    return [False] * layers


def build_sharded_model(ref: str, seed: int, env: DistEnv, param_bytes: int, *,
                        compile: bool = False, activation_checkpointing: str = "none",
                        full_init_max_bytes: int = FULL_INIT_MAX_BYTES,
                        initialize: bool = True) -> torch.nn.Module:
    """Shard a LlamaForCausalLM over all ranks and put its local shards on the device.

    The model is built on the meta device and sharded first, then its local shards are
    allocated. With `initialize=False` the weights stay uninitialized, for a caller that
    restores them (a restart must not pay for a random init that the restore overwrites) or
    calls `initialize_weights` once it knows nothing is to be restored.
    """
    from trainer.loop.model import build_model

    model = build_model(ref, seed, "meta")
    layers = list(model.model.layers)
    for layer, ckpt in zip(layers, checkpointed_layers(activation_checkpointing, len(layers))):
        _apply_layer_options(layer, ckpt, compile)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, layer in enumerate(layers):
        # The root's parameters (embedding, norm, output) are gathered again for the backward
        # pass right after the forward: keeping the last layer gathered saves one all-gather.
        fully_shard(layer, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=env.device)
    with torch.no_grad():
        # Buffers that are not parameters (rotary frequencies) stayed uninitialized on the
        # meta device: rebuild those modules on the CPU and move their buffers over.
        for mod in model.modules():
            if type(mod).__name__.endswith("RotaryEmbedding"):
                fresh = type(mod)(config=mod.config)
                for bname, buf in fresh.named_buffers(recurse=False):
                    setattr(mod, bname, buf.to(env.device))
                mod.attention_scaling = fresh.attention_scaling
    if initialize:
        initialize_weights(model, ref, seed, param_bytes, full_init_max_bytes)
    return model.train()


@torch.no_grad()
def initialize_weights(model: torch.nn.Module, ref: str, seed: int, param_bytes: int,
                       full_init_max_bytes: int = FULL_INIT_MAX_BYTES) -> None:
    """Fill the local shards: small presets are built whole on the CPU and each rank copies its
    rows (HF's own init); larger presets are initialized row block by row block
    (`_init_rows_`), and a Hugging Face directory is read row range by row range from its
    safetensors files. No rank ever holds a large model whole, and the result is the same at
    every world size.
    """
    from trainer.loop.model import PRESETS, SafetensorsRows, build_model, weights_dir

    full, source = None, None
    if ref in PRESETS and param_bytes <= full_init_max_bytes:
        full = dict(build_model(ref, seed, "cpu").named_parameters())
    elif ref not in PRESETS:
        source = SafetensorsRows(weights_dir(ref))
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        start, rows = row_range(p)
        if full is not None:
            local.copy_(full[name] if p.dim() == 0 else full[name][start:start + rows])
        elif source is not None:
            local.copy_(source.rows(name, start, rows))
        else:
            _init_rows_(name, local, seed, start, p.shape[0] if p.dim() else 0)
    if source is not None:
        source.close()


@torch.no_grad()
def full_param_sha256(model: torch.nn.Module) -> str:
    """sha256 over every full parameter in name order: equal iff training was identical."""
    sha = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        sha.update(name.encode())
        sha.update(full.detach().float().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()
