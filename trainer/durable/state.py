"""A rank's training state as flat local tensors, and its restoration at any world size.

FSDP2 shards every parameter (and with it the Adam moments) along dim 0. A shard records, per
parameter, the global shape and the row range it holds, so a checkpoint written by N ranks can
be read by M ranks: each new rank copies the rows it owns from every saved shard that overlaps
them. With M == N that is exactly its own file.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Protocol

import torch
from torch.distributed.tensor import DTensor

from trainer.buffers import dtype_name

OPTIM_KEYS = ("exp_avg", "exp_avg_sq")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def row_range(p: torch.Tensor) -> tuple[int, int]:
    """(first global row, row count) of this rank's shard of `p` along dim 0."""
    if p.dim() == 0:
        return 0, 0
    if not isinstance(p, DTensor):
        return 0, p.shape[0]
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return int(offset[0]), int(shape[0])


def ensure_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Create Adam's state tensors before the first step, so they can be saved or loaded into.
    The step count lives beside its parameter, as the fused optimizer keeps it."""
    for p in model.parameters():
        st = optimizer.state[p]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=_local(p).device)
            for k in OPTIM_KEYS:
                st[k] = torch.zeros_like(p, memory_format=torch.preserve_format)


def local_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor this rank must persist, by stable name; views of the live state, no copies."""
    ensure_optimizer_state(model, optimizer)
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[f"model/{name}"] = _local(p.detach())
        st = optimizer.state[p]
        out[f"optim/{name}/step"] = st["step"]
        for k in OPTIM_KEYS:
            out[f"optim/{name}/{k}"] = _local(st[k])
    return out


def shard_layout(model: torch.nn.Module) -> dict[str, dict]:
    """Per parameter: global shape, dtype and the rows this rank holds."""
    out = {}
    for name, p in model.named_parameters():
        start, rows = row_range(p)
        out[name] = {"shape": list(p.shape), "dtype": dtype_name(p.dtype), "row_start": start,
                     "rows": rows}
    return out


class Shard(Protocol):
    """Saved state of one rank: its parameters' row ranges, and rows of any tensor by name."""

    params: Mapping[str, dict]

    def get(self, key: str, lo: int = 0, hi: Optional[int] = None) -> torch.Tensor: ...


class TensorShard:
    """A shard already in memory: views of a flat buffer (a snapshot slot, a mapped file)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], params: Mapping[str, dict]):
        self.tensors, self.params = tensors, params

    def get(self, key: str, lo: int = 0, hi: Optional[int] = None) -> torch.Tensor:
        t = self.tensors[key]
        return t if t.dim() == 0 else t[lo:hi]


def overlapping_ranks(model: torch.nn.Module, saved_world: int) -> list[int]:
    """The ranks of a checkpoint saved at `saved_world` whose rows this rank needs: about
    saved_world / world of them, whatever the world size, instead of every saved shard."""
    needed: set[int] = set()
    for _, p in model.named_parameters():
        start, rows = row_range(p)
        if p.dim() == 0 or rows == 0:
            continue
        per = -(-p.shape[0] // saved_world)
        needed.update(range(start // per, (start + rows - 1) // per + 1))
    return sorted(needed) or [0]


def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            shards: Iterable[Shard]) -> None:
    """Fill this rank's state from saved shards of any world size, reading only the rows it
    owns from each."""
    ensure_optimizer_state(model, optimizer)
    shards = list(shards)
    mine = {name: (p, row_range(p)) for name, p in model.named_parameters()}
    with torch.no_grad():
        for name, (p, (start, rows)) in mine.items():
            st = optimizer.state[p]
            targets = {"model": _local(p), **{k: _local(st[k]) for k in OPTIM_KEYS}}
            filled, stepped = 0, False
            for shard in shards:
                saved = shard.params[name]
                if list(p.shape) != saved["shape"]:
                    raise ValueError(f"checkpoint parameter {name} has shape {saved['shape']}, "
                                     f"the model has {list(p.shape)}: a different model")
                s0 = saved["row_start"]
                lo, hi = (0, 1) if p.dim() == 0 else (max(start, s0), min(start + rows, s0 + saved["rows"]))
                if lo >= hi:
                    continue
                for key, dst in targets.items():
                    src_name = f"model/{name}" if key == "model" else f"optim/{name}/{key}"
                    if p.dim() == 0:
                        dst.copy_(shard.get(src_name))
                    else:  # non-blocking: from pinned memory it overlaps the next copies
                        dst[lo - start:hi - start].copy_(shard.get(src_name, lo - s0, hi - s0),
                                                         non_blocking=True)
                if not stepped:
                    st["step"].copy_(shard.get(f"optim/{name}/step"))
                    stepped = True
                filled += (hi - lo)
                if p.dim() == 0:
                    break
            if p.dim() > 0 and filled != rows:
                raise ValueError(f"checkpoint covers {filled} of the {rows} rows of {name} "
                                 "this rank needs: shards are missing")
    if any(p.is_cuda for p, _ in mine.values()):
        torch.cuda.synchronize()  # the sources may be unmapped or reused once this returns
