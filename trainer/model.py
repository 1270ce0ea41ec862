"""LLaMA-architecture models through `transformers`: presets, or weights from a local directory.

Presets give the exact published architectures with random weights (what the benchmarks need);
a local Hugging Face directory gives real weights without the network; only a hub id named
explicitly may download.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and transformers load only when a model is built
    import torch

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Architectures: Meta's Llama 3.1 8B and Llama 3.2 1B/3B config.json files; `tiny` is ours.
PRESETS: dict[str, dict[str, Any]] = {
    # ~3 M parameters: trains on CPU ranks in seconds; byte-level vocabulary.
    "tiny": dict(vocab_size=264, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                 rope_theta=10000.0, tie_word_embeddings=False),
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling=_LLAMA3_ROPE | {"factor": 32.0}, tie_word_embeddings=True),
    "llama-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192,
                     num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                     max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling=_LLAMA3_ROPE | {"factor": 32.0}, tie_word_embeddings=True),
    "llama3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling=_LLAMA3_ROPE, tie_word_embeddings=False),
}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_model_reference(ref: str) -> bool:
    return ref in PRESETS or os.path.isdir(ref) or bool(_HUB_ID.fullmatch(ref))


def llama_config(ref: str):
    """The LlamaConfig of a preset, a local directory or a hub id."""
    from transformers import AutoConfig, LlamaConfig

    if ref in PRESETS:
        return LlamaConfig(rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, **PRESETS[ref])
    return AutoConfig.from_pretrained(ref, local_files_only=os.path.isdir(ref))


def build_model(ref: str, seed: int, device: "torch.device | str" = "cpu"):
    """A LlamaForCausalLM in fp32 with deterministic random init (presets) or loaded weights.

    On the `meta` device nothing is allocated: the caller shards first, then materializes.
    """
    import torch
    from transformers import LlamaForCausalLM

    config = llama_config(ref)
    config._attn_implementation = "sdpa"
    if ref not in PRESETS:
        return LlamaForCausalLM.from_pretrained(
            ref, torch_dtype=torch.float32, local_files_only=os.path.isdir(ref),
            attn_implementation="sdpa")
    with torch.device(device):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def preset_parameters(name: str) -> int:
    """Parameters of a preset by arithmetic alone (no torch): what the manifests size memory by."""
    c = PRESETS[name]
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * c["intermediate_size"] + 2 * h
    embeddings = vocab * h * (1 if c["tie_word_embeddings"] else 2)
    return embeddings + layers * per_layer + h


# Bytes of training state per parameter: fp32 weights and Adam's two fp32 moments.
STATE_BYTES_PER_PARAMETER = 12


def parameter_count(ref: str) -> int:
    """Parameters of a model without allocating it."""
    import torch

    model = build_model(ref, 0, device="meta") if ref in PRESETS else None
    if model is None:
        from transformers import LlamaForCausalLM

        with torch.device("meta"):
            model = LlamaForCausalLM(llama_config(ref))
    return sum(p.numel() for p in model.parameters())
