"""The model's weights: their first value and their fingerprint.

Every rank fills only the rows of its own shard, and a row's value depends on neither the rank
nor the world size, so a run starts from the same weights at every world size; the fingerprint
(`param_fingerprint`) is equal iff two runs trained identically, at any world size.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainer.durable.state import row_range

FULL_INIT_MAX_BYTES = 4 << 30  # above this, presets are initialized shard by shard on the device

INIT_BLOCK_ROWS = 64  # rows per independently seeded block of the shard-by-shard init
FINGERPRINT_LANES = 8  # 32-bit lanes of the summed row digests: 256 bits


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
def param_fingerprint(model: torch.nn.Module) -> str:
    """A digest of every parameter, equal iff two models hold the same values, whatever their
    world sizes; no rank gathers the model.

    Each rank hashes the rows it holds, each row with its parameter's name and its global index
    (`sha256`), and adds the digests as eight 32-bit lanes; one SUM all-reduce of eight
    integers combines the ranks. A row's digest does not depend on the shard it is in, so the
    sum is the same at any world size."""
    import numpy as np

    lanes = np.zeros(FINGERPRINT_LANES, dtype=np.int64)
    for name, p in sorted(model.named_parameters()):
        if not isinstance(p, DTensor) and dist.is_initialized() and dist.get_rank() != 0:
            continue  # a replicated parameter counts once
        start, _ = row_range(p)
        local = (p.to_local() if isinstance(p, DTensor) else p).detach().float().cpu()
        rows = local.reshape(local.shape[0], -1) if local.dim() else local.reshape(1, 1)
        tag = name.encode()
        for i, row in enumerate(rows.contiguous().numpy()):
            digest = hashlib.sha256(tag + (start + i).to_bytes(8, "little") + row.tobytes()).digest()
            lanes += np.frombuffer(digest, dtype="<u4")
    total = torch.from_numpy(lanes)
    if dist.is_initialized():
        device = next(model.parameters()).device
        total = total.to(device)
        dist.all_reduce(total)  # at most 2^32 x ranks per lane: exact in int64
    return "".join(f"{int(v) % 2**32:08x}" for v in total.cpu().tolist())