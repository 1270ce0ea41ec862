"""The model presets as data: the exact published architectures (Meta's Llama 3.1 8B and
Llama 3.2 1B/3B config.json files; `micro` and `tiny` are ours), the tokenizer each is trained
with, and the arithmetic the manifests and the capacity plan size memory by. No torch, no
transformers: the trainer builds the models (`trainer.loop.model`), everything else reads the
numbers here."""

from __future__ import annotations

from typing import Any

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

PRESETS: dict[str, dict[str, Any]] = {
    # ~0.13 M parameters: the test suite's multi-process jobs. The same architecture (grouped
    # heads, blocks that FSDP2 shards one by one) at the size where a CPU rank's step costs
    # little beside its start-up, which is what those jobs exercise.
    "micro": dict(vocab_size=264, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  rope_theta=10000.0, tie_word_embeddings=False),
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

# The Hugging Face repository whose tokenizer each preset is trained with; `micro` and `tiny`
# read bytes.
TOKENIZERS = {
    "micro": "byte",
    "tiny": "byte",
    "llama-1b": "meta-llama/Llama-3.2-1B",
    "llama-3b": "meta-llama/Llama-3.2-3B",
    "llama3.1-8b": "meta-llama/Llama-3.1-8B",
}
# Bytes of training state per parameter: fp32 weights and Adam's two fp32 moments.
STATE_BYTES_PER_PARAMETER = 12


def preset_parameters(name: str) -> int:
    """Parameters of a preset by arithmetic alone (no torch): what the manifests size memory by."""
    c = PRESETS[name]
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * c["intermediate_size"] + 2 * h
    embeddings = vocab * h * (1 if c["tie_word_embeddings"] else 2)
    return embeddings + layers * per_layer + h


def preset_largest_parameter(name: str) -> int:
    """Elements of a preset's largest parameter (the embedding, for every preset here): what
    an export holds whole while it assembles it."""
    c = PRESETS[name]
    h = c["hidden_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    return h * max(c["vocab_size"], c["intermediate_size"], h, kv)
