"""A PyTorch Distributed Checkpoint of the model's state dict, written by one process without a
process group, which `torch.distributed.checkpoint.load` reads into a model of the same preset
at any world size (a one-process model, or an FSDP2 one that it reshards into).

`dcp.save` plans from the state dict's shapes and dtypes, then asks its planner for each
tensor's data as it writes it (`SavePlanner.resolve_data`). Here the state dict holds meta
tensors and the planner assembles each tensor from the shards only when asked: with one file
per tensor, the writer drops each one once written, so one tensor is held at a time.

Keys are the model's `state_dict()` keys; with `optimizer`, Adam's state follows under
`optimizer.state.<parameter>.{step,exp_avg,exp_avg_sq}` (fp32, whatever `dtype` the weights
take), the layout of the "state" part of `torch.distributed.checkpoint.state_dict.
get_optimizer_state_dict`. Parameter groups (learning rate, betas) are the trainer's settings,
not part of its checkpoint, and are not exported.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItemType

from trainer.export.model import state_dict_names
from trainer.export.progress import Progress
from trainer.export.source import MODEL, OPTIM_KINDS, Checkpoint

OPTIMIZER_PREFIX = "optimizer.state"


def plan(ckpt: Checkpoint, model: torch.nn.Module, dtype: torch.dtype,
         optimizer: bool) -> dict[str, tuple[str, str, torch.dtype]]:
    """Every key to write -> (parameter, "model" or an optimizer kind, dtype)."""
    out = {key: (name, MODEL, dtype) for key, name in state_dict_names(model).items()}
    if optimizer:
        for name in ckpt.params:
            for kind in OPTIM_KINDS:
                out[f"{OPTIMIZER_PREFIX}.{name}.{kind}"] = (name, kind, torch.float32)
    return out


def _shapes(ckpt: Checkpoint, keys: dict[str, tuple[str, str, torch.dtype]]) -> dict:
    return {key: () if kind == "step" else ckpt.params[name].shape
            for key, (name, kind, _) in keys.items()}


def _sizes(keys: dict[str, tuple[str, str, torch.dtype]], shapes: dict) -> dict[str, int]:
    return {key: math.prod(shapes[key]) * torch.empty((), dtype=d).element_size()
            for key, (_, _, d) in keys.items()}


def tensor_bytes(ckpt: Checkpoint, model: torch.nn.Module, dtype: torch.dtype,
                 optimizer: bool) -> int:
    """The bytes of tensors `write` writes, known before it writes any: the room it needs."""
    keys = plan(ckpt, model, dtype, optimizer)
    return sum(_sizes(keys, _shapes(ckpt, keys)).values())


def write(ckpt: Checkpoint, model: torch.nn.Module, out: Path, dtype: torch.dtype,
          optimizer: bool, log: Callable[[str], None]) -> int:
    """Write the export into the (empty) directory `out`; returns the bytes of tensors."""
    keys = plan(ckpt, model, dtype, optimizer)
    shapes = _shapes(ckpt, keys)
    sizes = _sizes(keys, shapes)
    progress = Progress("wrote", "tensors", len(keys), sum(sizes.values()), log)

    def assemble(key: str) -> torch.Tensor:
        name, kind, d = keys[key]
        tensor = ckpt.assemble(name, kind, d)
        progress.add(sizes[key])
        return tensor

    state = {key: torch.empty(shapes[key], dtype=d, device="meta")
             for key, (_, _, d) in keys.items()}
    writer = dcp.FileSystemWriter(str(out), single_file_per_rank=False, sync_files=True,
                                  thread_count=1)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": yes
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(state, storage_writer=writer, planner=_AssemblingPlanner(assemble), no_dist=True)
    return sum(sizes.values())


class _AssemblingPlanner(DefaultSavePlanner):
    """DCP's default planner, except that a tensor's data is assembled when the writer asks."""

    def __init__(self, assemble: Callable[[str], torch.Tensor]):
        super().__init__()
        self._assemble = assemble

    def resolve_data(self, write_item):
        if write_item.type == WriteItemType.BYTE_IO:
            return super().resolve_data(write_item)
        return self._assemble(write_item.index.fqn)
