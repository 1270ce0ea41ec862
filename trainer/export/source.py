"""A committed checkpoint opened for export: every shard read through its marker's chunk
digests (each byte read once, and checked as it is read); whole tensors assembled one at a time
from the rows each shard holds.

FSDP2 shards every parameter along dim 0, so each shard holds a row range of every parameter
(`trainer.durable.state`). A parameter is put together from those ranges, whatever the world
size that wrote them, and dropped by the caller once written: no more than one tensor is ever
held whole, and the shards themselves stay on storage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from trainer.durable.store import MANIFEST, CheckpointError, CheckpointStore, ShardFile, step_dir_name
from trainer.errors import ConfigError

if TYPE_CHECKING:
    import torch

MODEL = "model"
OPTIM_KINDS = ("step", "exp_avg", "exp_avg_sq")  # Adam's state per parameter, as saved


class ExportError(ConfigError):
    """A checkpoint that cannot be exported as asked: the message names the file or value."""


@dataclass(frozen=True)
class Parameter:
    """One parameter across the shards: its global shape, its saved dtype, and which rows each
    shard holds, as (shard index, first row, row count), in row order."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[tuple[int, int, int], ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def choose(store: CheckpointStore, step: Optional[int]) -> tuple[int, Path]:
    """The checkpoint to export: `step`, which must be committed, or the newest committed one."""
    committed = store.committed()
    steps = ", ".join(str(s) for s, _ in committed) or "none"
    if step is None:
        if not committed:
            raise ExportError(f"no committed checkpoint in {store.root}")
        return committed[-1]
    path = store.root / step_dir_name(step)
    if not path.is_dir():
        raise ExportError(f"--step {step}: no checkpoint {path}; committed steps: {steps}")
    if not (path / MANIFEST).is_file():
        raise ExportError(f"--step {step}: {path / MANIFEST} does not exist: the checkpoint was "
                          f"never committed; committed steps: {steps}")
    return step, path


class Checkpoint:
    """The verified, mapped shards of one committed checkpoint and the parameters they hold."""

    def __init__(self, step: int, path: Path, shards: list[ShardFile]):
        self.step, self.path, self.shards = step, path, shards
        self.params = _parameters(path, shards)

    @staticmethod
    def open(store: CheckpointStore, step: int, path: Path, manifest: dict,
             on_shard: Callable[[int], None] = lambda nbytes: None) -> "Checkpoint":
        """Open each shard through its marker, whose digest must be the manifest's; its bytes are
        checked chunk by chunk as `assemble` reads them. `on_shard(bytes)` after each. A damaged
        shard raises CheckpointError naming it."""
        shards = []
        for rank in range(manifest["world_size"]):
            shard = store.open_shard(step, rank)
            if shard.marker["sha256"] != manifest["shards"][rank]["sha256"]:
                raise CheckpointError(f"{shard.path}: its marker's sha256 is not the manifest's")
            shards.append(shard)
            on_shard(shard.bytes)
        return Checkpoint(step, path, shards)

    @property
    def world_size(self) -> int:
        return len(self.shards)

    @property
    def meta(self) -> dict:
        """What the trainer saved besides tensors (step, data position, loss); rank 0's."""
        return {k: v for k, v in self.shards[0].meta.items() if k != "params"}

    def assemble(self, name: str, kind: str = MODEL,
                 dtype: "Optional[torch.dtype]" = None) -> "torch.Tensor":
        """Parameter `name` whole (`kind` "model"), or its optimizer state (`kind` one of
        OPTIM_KINDS), in `dtype` (default: as saved). A new tensor; nothing else is kept."""
        import torch

        from trainer.buffers import dtype_of

        p = self.params[name]
        key = f"model/{name}" if kind == MODEL else f"optim/{name}/{kind}"
        if kind == "step" or not p.shape:  # one value, the same in every shard
            value = self.shards[0].get(key)
            return value.to(dtype or value.dtype, copy=True)
        out = torch.empty(p.shape, dtype=dtype or dtype_of(p.dtype))
        for shard, start, rows in p.pieces:
            out[start:start + rows].copy_(self.shards[shard].get(key, 0, rows))
        return out


def _parameters(path: Path, shards: list[ShardFile]) -> dict[str, Parameter]:
    """Every parameter of the checkpoint, in the order the trainer saved them, each checked to
    be covered exactly once by the shards' row ranges."""
    first = shards[0].meta["params"]
    out = {}
    for name, saved in first.items():
        pieces = []
        for i, shard in enumerate(shards):
            entry = shard.meta["params"].get(name)
            if entry is None or entry["shape"] != saved["shape"]:
                raise CheckpointError(f"{path}: rank {i}'s shard disagrees with rank 0's about "
                                      f"parameter {name}")
            if entry["rows"] > 0:
                pieces.append((i, entry["row_start"], entry["rows"]))
        pieces.sort(key=lambda piece: piece[1])
        _check_rows(path, name, saved["shape"], pieces)
        out[name] = Parameter(name, tuple(saved["shape"]), saved["dtype"], tuple(pieces))
    return out


def _check_rows(path: Path, name: str, shape: list[int],
                pieces: list[tuple[int, int, int]]) -> None:
    """The pieces, in row order, cover rows 0 to shape[0] once each."""
    if not shape:
        return
    row = 0
    for shard, start, rows in pieces:
        if start != row:
            raise CheckpointError(f"{path}: the shards hold rows from {start} on of {name} where "
                                  f"row {row} is next (rank {shard}): a shard of another layout")
        row = start + rows
    if row != shape[0]:
        raise CheckpointError(f"{path}: the shards hold {row} of the {shape[0]} rows of {name}")
