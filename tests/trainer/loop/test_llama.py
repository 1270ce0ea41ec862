"""The trainer's LLaMA computes what transformers' LlamaForCausalLM computes, under its names."""

import json

import pytest
import torch
import torch.nn.functional as F

from config.presets import PRESETS
from trainer.loop.llama import LlamaArgs, LlamaForCausalLM, inverse_frequencies
from trainer.loop.model import build_model, llama_config

pytestmark = pytest.mark.slow  # imports transformers

# Llama 3's RoPE scaling at a context short enough that all three of its frequency bands
# (kept, interpolated, divided) hold some of tiny's 16 frequencies.
LLAMA3_SHORT = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
VARIANTS = {
    "tiny": llama_config("tiny"),
    "tied, llama3 rope": LlamaArgs.from_hf({**PRESETS["tiny"], "tie_word_embeddings": True,
                                            "rope_scaling": LLAMA3_SHORT}),
    "no grouped heads": LlamaArgs.from_hf({**PRESETS["tiny"], "num_key_value_heads": 8}),
}


def _hf_twin(ours: LlamaForCausalLM):
    """transformers' model of the same architecture holding our weights, on its own masked
    SDPA path."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    config = LlamaConfig(**ours.args.to_hf())
    config._attn_implementation = "sdpa"
    twin = HFLlama(config)
    missing, unexpected = twin.load_state_dict(ours.state_dict(), strict=True)
    assert not missing and not unexpected
    return twin.train()


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_and_gradients_equal_transformers(variant):
    torch.manual_seed(0)
    ours = LlamaForCausalLM(VARIANTS[variant])
    ours.init_weights()
    twin = _hf_twin(ours)
    assert ours.state_dict().keys() == twin.state_dict().keys()
    tokens = torch.randint(0, 264, (2, 300))  # longer than the scaled RoPE's original context
    losses = []
    for model, logits in ((ours, ours(tokens)), (twin, twin(input_ids=tokens).logits)):
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        losses.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (logits, grads), (hf_logits, hf_grads) = losses
    torch.testing.assert_close(logits, hf_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == hf_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], hf_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_logits_equal_transformers():
    """What FSDP computes in: parameters and activations in bf16."""
    torch.manual_seed(1)
    ours = LlamaForCausalLM(VARIANTS["tiny"])
    ours.init_weights()
    twin = _hf_twin(ours).to(torch.bfloat16)
    tokens = torch.randint(0, 264, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(ours.to(torch.bfloat16)(tokens), twin(input_ids=tokens).logits)


def test_every_presets_parameters_match_transformers():
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    for name in PRESETS:
        ours = build_model(name, 0, "meta")
        config = LlamaConfig(**ours.args.to_hf())
        with torch.device("meta"):
            twin = HFLlama(config)
        shapes = {n: p.shape for n, p in ours.named_parameters()}
        assert shapes == {n: p.shape for n, p in twin.named_parameters()}, name
        torch.testing.assert_close(inverse_frequencies(ours.args),
                                   LlamaRotaryEmbedding(config).inv_freq, msg=name)


def test_config_json_is_read_in_both_of_its_forms(tmp_path):
    """transformers 5 writes `rope_parameters`; Meta's published files have `rope_theta` and
    `rope_scaling`."""
    from transformers import LlamaConfig

    expected = llama_config("llama3.1-8b")
    LlamaConfig(**expected.to_hf()).save_pretrained(tmp_path)
    assert "rope_parameters" in json.loads((tmp_path / "config.json").read_text())
    assert llama_config(str(tmp_path)) == expected
    meta_style = {**PRESETS["llama3.1-8b"], "rope_scaling": {**PRESETS["llama3.1-8b"]["rope_scaling"]},
                  "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5}
    assert LlamaArgs.from_hf(meta_style) == expected


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
])
def test_architectures_it_does_not_compute_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        LlamaArgs.from_hf({**PRESETS["tiny"], **change})


def test_a_model_is_random_from_its_seed_and_its_norms_start_at_one():
    one, same, other = (build_model("tiny", seed) for seed in (3, 3, 4))
    for (name, p), q, r in zip(one.named_parameters(), same.parameters(), other.parameters()):
        assert torch.equal(p, q), name
        if "norm" in name:
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert not torch.equal(p, r), name
            assert abs(float(p.detach().std()) - 0.02) < 0.002, name


RANK = """
import os, sys, importlib, torch, torch.distributed as dist
from trainer.recovery.forkserver import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
from trainer.distributed import DistEnv
from trainer.loop.model import optimizer_groups
from trainer.loop.parallel import build_sharded_model
from trainer.loop.train import train_step
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = build_sharded_model("tiny", 0, DistEnv(0, 1, 0, 1, torch.device("cpu")), param_bytes=1)
optimizer = torch.optim.AdamW(optimizer_groups(model, 0.1), lr=1e-3)
train_step(model, optimizer, [torch.randint(0, 264, (2, 33))], 1e-3, 1.0, world_size=1,
           tokens_per_step=64)
print(sorted(m for m in ("transformers", "huggingface_hub") if m in sys.modules))
sys.stdout.flush()
os._exit(0)
"""


def test_a_rank_builds_and_trains_without_importing_transformers():
    """What the fork server preloads and a rank builds and runs: transformers' import would
    cost a fresh rank about 1.5 CPU-s more here, on every restart."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", RANK], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
