"""A Hugging Face model directory: sharded safetensors, their index, config.json,
generation_config.json and the tokenizer, what `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` read.

The weights go out one file at a time: a file's parameters are assembled, written and dropped
before the next file's are assembled, so the export holds at most one file's tensors
(`--max_file_gb`, or one parameter larger than that) in memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from trainer.export.progress import Progress
from trainer.export.source import MODEL, Checkpoint, Parameter

if TYPE_CHECKING:
    import torch

INDEX = "model.safetensors.index.json"
ARCHITECTURE = "LlamaForCausalLM"  # what `trainer.loop.llama` computes, in transformers


def file_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def plan_files(params: list[Parameter], itemsize: int, max_bytes: int) -> list[list[Parameter]]:
    """Parameters in the trainer's order, cut into files of at most `max_bytes` each (a larger
    parameter alone in its file)."""
    files: list[list[Parameter]] = [[]]
    held = 0
    for p in params:
        nbytes = p.numel * itemsize
        if files[-1] and held + nbytes > max_bytes:
            files.append([])
            held = 0
        files[-1].append(p)
        held += nbytes
    return files


def weight_bytes(ckpt: Checkpoint, dtype: "torch.dtype") -> int:
    """The bytes of weights `write` writes, known before it writes any: the room it needs."""
    import torch

    return sum(p.numel for p in ckpt.params.values()) * torch.empty((), dtype=dtype).element_size()


def write(ckpt: Checkpoint, config, out: Path, dtype: "torch.dtype", tokenizer,
          max_file_bytes: int, log: Callable[[str], None]) -> int:
    """Write the export into the (empty) directory `out`: the weights in `dtype`, `config` (the
    model's LlamaConfig) and `tokenizer` (a Hugging Face tokenizer, or None when not known);
    returns the bytes of weights."""
    import torch
    from safetensors.torch import save_file

    itemsize = torch.empty((), dtype=dtype).element_size()
    files = plan_files(list(ckpt.params.values()), itemsize, max_file_bytes)
    total = weight_bytes(ckpt, dtype)
    progress = Progress("wrote", "files", len(files), total, log)
    weight_map = {}
    for i, params in enumerate(files):
        name = file_name(i, len(files))
        tensors = {p.name: ckpt.assemble(p.name, MODEL, dtype) for p in params}
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        _settle(out / name)
        weight_map.update({p.name: name for p in params})
        del tensors
        progress.add(sum(p.numel for p in params) * itemsize)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    config.architectures = [ARCHITECTURE]
    config.dtype = dtype
    config.use_cache = True  # for inference; the trainer builds its model without a KV cache
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
        config.eos_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
    config.save_pretrained(out)
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(config).save_pretrained(out)
    return total


def _settle(path: Path) -> None:
    """On storage, and readable as the process's other files are: safetensors creates its
    files for the owner alone."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
