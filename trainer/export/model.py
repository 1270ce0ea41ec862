"""The model a checkpoint belongs to, built on the meta device (nothing allocated): its names,
shapes and configuration, against which the checkpoint is checked before anything is written."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.contract import EXPORT_DTYPES
from trainer.export.source import Checkpoint, ExportError

if TYPE_CHECKING:
    import torch


def torch_dtype(choice: str) -> "torch.dtype":
    """--dtype fp32|bf16 as a torch dtype."""
    import torch

    return getattr(torch, EXPORT_DTYPES[choice])


def meta_model(ref: str) -> "torch.nn.Module":
    """The trainer's LlamaForCausalLM of `ref` (a preset, a directory or a hub id), unallocated."""
    from trainer.loop.model import build_model

    try:
        return build_model(ref, seed=0, device="meta")
    except (OSError, ValueError) as exc:  # an unknown reference: not a preset, directory or id
        raise ExportError(f"--model {ref!r}: no such model ({exc})") from None


def check_matches(ckpt: Checkpoint, model: "torch.nn.Module", ref: str) -> None:
    """The checkpoint holds exactly the model's parameters, shape for shape."""
    built = {name: tuple(p.shape) for name, p in model.named_parameters()}
    saved = {name: p.shape for name, p in ckpt.params.items()}
    for name in built.keys() | saved.keys():
        if built.get(name) != saved.get(name):
            raise ExportError(
                f"{ckpt.path}: parameter {name} is {_shape(saved.get(name))} in the checkpoint "
                f"but {_shape(built.get(name))} in model {ref!r}; pass the run's --model")


def _shape(shape) -> str:
    return "absent" if shape is None else "x".join(map(str, shape)) or "a scalar"


def state_dict_names(model: "torch.nn.Module") -> dict[str, str]:
    """Every key of the model's state dict -> the parameter it holds. Tied weights appear under
    each of their keys (`lm_head.weight` and `model.embed_tokens.weight`), as `state_dict()`
    lists them, so the state dict of a freshly built model loads every key."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    out = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in canonical:
            raise ExportError(f"the model's state dict holds {key}, which is no parameter and "
                              "is not in the checkpoint")
        out[key] = canonical[id(value)]
    return out
