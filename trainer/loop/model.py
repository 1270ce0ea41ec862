"""The model a run trains: presets, or the architecture and weights of a local directory.

Presets give the exact published architectures with random weights (what the benchmarks need);
a local Hugging Face directory gives real weights without the network; only a hub id named
explicitly may download. Models are always built on the meta device and sharded before any
weight exists, so no rank ever holds a whole large model. The model itself is
`trainer.loop.llama`, which needs no transformers.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from config.presets import PRESETS

if TYPE_CHECKING:  # torch loads only when a model is built
    import torch

    from trainer.loop.llama import LlamaArgs, LlamaForCausalLM


def llama_config(ref: str) -> "LlamaArgs":
    """The architecture of a preset, a local directory or a hub id (its config.json)."""
    from trainer.loop.llama import LlamaArgs

    if ref in PRESETS:
        return LlamaArgs.from_hf(PRESETS[ref])
    return LlamaArgs.from_hf(_read_config(ref))


def hf_config(ref: str):
    """transformers' LlamaConfig of `ref`, for an export: a directory's or hub id's own
    config.json with every key kept, a preset's from its architecture."""
    from transformers import AutoConfig, LlamaConfig

    if ref in PRESETS:
        return LlamaConfig(**llama_config(ref).to_hf())
    return AutoConfig.from_pretrained(ref, local_files_only=os.path.isdir(ref))


def _read_config(ref: str) -> dict[str, Any]:
    if os.path.isdir(ref):
        path = os.path.join(ref, "config.json")
        if not os.path.isfile(path):
            raise OSError(f"{ref} holds no config.json")
    else:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(ref, "config.json")
    with open(path) as f:
        return json.load(f)


def build_model(ref: str, seed: int, device: "torch.device | str" = "cpu") -> "LlamaForCausalLM":
    """The model in fp32 in training mode, randomly initialized from `seed` (a directory's
    weights are loaded shard by shard afterwards, `trainer.loop.weights`).

    On the `meta` device nothing is allocated: the caller shards first, then materializes.
    """
    import torch

    from trainer.loop.llama import LlamaForCausalLM

    with torch.device(device):
        model = LlamaForCausalLM(llama_config(ref))
    if torch.device(device).type != "meta":
        torch.manual_seed(seed)
        model.init_weights()
    return model.train()


def weights_dir(ref: str) -> str:
    """The directory holding a model's safetensors: a local directory, or a hub id downloaded."""
    if os.path.isdir(ref):
        return ref
    from huggingface_hub import snapshot_download

    return snapshot_download(ref, allow_patterns=["*.json", "*.safetensors"])


class SafetensorsRows:
    """Reads row ranges of named tensors from a model's safetensors files, never whole files.

    Each rank reads only the rows its shards hold (`safe_open` + `get_slice`), so loading an 8B
    model needs no full copy of it on any rank.
    """

    def __init__(self, directory: str):
        from pathlib import Path

        root = Path(directory)
        index = root / "model.safetensors.index.json"
        if index.is_file():
            import json

            self._file_of = {k: str(root / f)
                             for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            from safetensors import safe_open

            self._file_of = {}
            for f in sorted(root.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as h:
                    self._file_of.update({k: str(f) for k in h.keys()})
        if not self._file_of:
            raise ValueError(f"model directory {directory} holds no .safetensors weights")
        self._open: dict[str, Any] = {}

    def key_for(self, name: str) -> str:
        if name in self._file_of:
            return name
        bare = name.removeprefix("model.")
        if bare in self._file_of:
            return bare
        raise KeyError(f"parameter {name} is not in the model's safetensors files")

    def rows(self, name: str, start: int, count: int) -> "torch.Tensor":
        """Rows [start, start + count) of `name` (the whole tensor for a 0-d one)."""
        from safetensors import safe_open

        key = self.key_for(name)
        path = self._file_of[key]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        sl = self._open[path].get_slice(key)
        if len(sl.get_shape()) == 0:
            return self._open[path].get_tensor(key)
        return sl[start:start + count]

    def close(self) -> None:
        self._open.clear()


def optimizer_groups(model: "torch.nn.Module", weight_decay: float) -> list[dict]:
    """AdamW parameter groups: matrices decay; norms, biases and other 1-D parameters do not
    (Megatron's and nanoGPT's choice: decaying a norm's gain only pulls it away from 1)."""
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def flops_per_token(config, seq_len: int) -> int:
    """Training FLOPs per token (forward and backward): 6 N + 12 L H D S.

    N counts the parameters used in matrix products: all but the input embedding lookup (with
    tied embeddings the one table is the output projection, and counts). 12 L H D S is the
    attention score and value products for L layers, H heads of dimension D, sequence length S,
    not halved for the causal mask (torchtitan's and PaLM's convention).
    """
    h, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = config.num_key_value_heads * head_dim
    per_layer = 2 * h * heads * head_dim + 2 * h * kv + 3 * h * config.intermediate_size + 2 * h
    lm_head = config.vocab_size * h
    matmul_params = layers * per_layer + h + lm_head
    return 6 * matmul_params + 12 * layers * heads * head_dim * seq_len


def parameter_count(ref: str) -> int:
    """Parameters of a model without allocating it."""
    model = build_model(ref, 0, device="meta")
    return sum(p.numel() for p in model.parameters())
