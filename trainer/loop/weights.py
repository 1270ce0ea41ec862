"""The model's weights: their first value and their fingerprint.

Every rank fills only the rows of its own shard, and a row's value depends on neither the rank
nor the world size, so a run starts from the same weights at every world size; the fingerprint
(`full_param_sha256`) is equal iff two runs trained identically.
"""

from __future__ import annotations

import hashlib

import torch
from torch.distributed.tensor import DTensor

from trainer.durable.state import row_range

FULL_INIT_MAX_BYTES = 4 << 30  # above this, presets are initialized shard by shard on the device

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


@torch.no_grad()
def initialize_weights(model: torch.nn.Module, ref: str, seed: int, param_bytes: int,
                       full_init_max_bytes: int = FULL_INIT_MAX_BYTES) -> None:
    """Fill the local shards: small presets are built whole on the CPU and each rank copies its
    rows (HF's own init); larger presets are initialized row block by row block
    (`_init_rows_`), and a Hugging Face directory is read row range by row range from its
    safetensors files. No rank ever holds a large model whole, and the result is the same at
    every world size.
    """
    from config.presets import PRESETS
    from trainer.loop.model import SafetensorsRows, build_model, weights_dir

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
