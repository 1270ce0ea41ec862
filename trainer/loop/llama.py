"""The LLaMA architecture in plain PyTorch: what the trainer trains.

It computes what `transformers`' LlamaForCausalLM computes, under the same parameter names, so
Hugging Face weights load into it and its checkpoints export to that format unchanged
(tests/trainer/loop/test_llama.py compares the two). It exists because importing transformers
cost a fresh rank about 1.5 CPU-s and a fork server 2.3 on this project's CPU machine, beyond
what FSDP2 imports anyway (docs/testing.md), on every start and every restart; this module needs
torch alone.

Training only: full causal sequences, no KV cache, no attention mask. Attention is SDPA with
`is_causal=True`, so no host ever reads a tensor to build a mask.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class LlamaArgs:
    """The architecture, under config.json's key names (`from_hf` reads one)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rope_theta: float
    tie_word_embeddings: bool
    rms_norm_eps: float = 1e-5
    head_dim: Optional[int] = None
    # None: plain RoPE; else {"rope_type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"}
    rope_scaling: Optional[dict[str, Any]] = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                             f"of num_key_value_heads {self.num_key_value_heads}")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} is not supported; allowed: "
                             f"{', '.join(ROPE_TYPES)}")

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> "LlamaArgs":
        """A LLaMA config.json (either transformers' `rope_parameters` or the older
        `rope_theta` + `rope_scaling` form); anything this module does not compute is refused."""
        model_type = config.get("model_type", "llama")
        if model_type != "llama":
            raise ValueError(f"model_type {model_type!r} is not supported; allowed: llama")
        for key, allowed in (("hidden_act", "silu"), ("attention_bias", False),
                             ("mlp_bias", False), ("pretraining_tp", 1)):
            if config.get(key, allowed) != allowed:
                raise ValueError(f"{key} {config[key]!r} is not supported; allowed: {allowed!r}")
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = rope.pop("rope_type", rope.pop("type", "default"))
        scaling = None if rope_type == "default" else {"rope_type": rope_type, **rope}
        return cls(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                   intermediate_size=config["intermediate_size"],
                   num_hidden_layers=config["num_hidden_layers"],
                   num_attention_heads=config["num_attention_heads"],
                   num_key_value_heads=config.get("num_key_value_heads",
                                                  config["num_attention_heads"]),
                   max_position_embeddings=config["max_position_embeddings"], rope_theta=theta,
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                   head_dim=config.get("head_dim"), rope_scaling=scaling)

    def to_hf(self) -> dict[str, Any]:
        """The keyword arguments of transformers' LlamaConfig for this architecture."""
        fields = asdict(self)
        if fields["rope_scaling"] is None:
            del fields["rope_scaling"]
        return {**fields, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def inverse_frequencies(args: LlamaArgs) -> torch.Tensor:
    """RoPE's inverse frequencies (fp32, on the CPU), with Llama 3's long-context scaling when
    configured: wavelengths beyond the original context are divided by `factor`, those between
    the two cut-offs interpolated smoothly."""
    dim = args.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (args.rope_theta ** exponents)
    if args.rope_scaling is None:
        return inv_freq
    s = args.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    context = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    """Normalizes in fp32 and scales in the input's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [batch, heads, seq, head_dim], the halves of head_dim paired (Hugging Face's
    layout, which its LLaMA weights assume)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.head_dim = d
        self.q_proj = nn.Linear(h, args.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, args.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, args.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(args.num_attention_heads * d, h, bias=False)
        self.grouped = args.num_attention_heads != args.num_key_value_heads

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        shape = (batch, seq, -1, self.head_dim)
        q = rotate(self.q_proj(x).view(shape).transpose(1, 2), cos, sin)
        k = rotate(self.k_proj(x).view(shape).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             scale=self.head_dim ** -0.5,
                                             enable_gqa=self.grouped)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """SwiGLU."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One block: the unit FSDP shards, checkpoints and compiles (`trainer.loop.parallel`)."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embedding, blocks, final norm: Hugging Face's `model.` prefix."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        # An explicit weight skips nn.Embedding's own init: on the meta device any computation
        # runs a reference kernel, whose first use imports torch._dynamo (0.6 CPU-s a process).
        # `init_weights` fills it.
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size,
                                         _weight=torch.empty(args.vocab_size, args.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        # Filled by `reset_buffers`: never computed on the meta device (see above).
        self.register_buffer("inv_freq", torch.empty(args.head_dim // 2), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=h.device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq.float()[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(h.dtype), angles.sin().to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    """Token ids [batch, seq] in, next-token logits [batch, seq, vocab] out."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.args = args
        self.model = Decoder(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if not self.model.inv_freq.is_meta:
            self.reset_buffers()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Recompute the buffers that are not state (RoPE's frequencies) in place: after
        `to_empty` they hold whatever the allocation held."""
        self.model.inv_freq.copy_(inverse_frequencies(self.args))

    @torch.no_grad()
    def init_weights(self) -> None:
        """A random start from torch's global generator: matrices and embeddings N(0, 0.02)
        (the LLaMA recipe, and Hugging Face's), norms one. Module order fixes the draws."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                if not (module is self.lm_head and self.args.tie_word_embeddings):
                    module.weight.normal_(0.0, 0.02)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
