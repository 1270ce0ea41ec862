"""Speed options and the arithmetic around them: flags, FLOPs, weight decay groups, and per-layer
activation checkpointing and compilation on a real (one-rank, gloo) FSDP2 model."""

import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.jobs import ROOT
from trainer.config import accumulation_steps, from_values, validate
from trainer.errors import ConfigError
from config.presets import PRESETS, preset_parameters
from trainer.loop.model import flops_per_token, llama_config

pytestmark = pytest.mark.slow  # real training steps and trainer processes


def test_global_batch_flags(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert accumulation_steps(8, 2, 2) == 2 and accumulation_steps(4, 4, 1) == 1
    with pytest.raises(ConfigError, match="--global_batch_size 6 is not a multiple of --batch_size 4"):
        validate(from_values(global_batch_size=6, batch_size=4))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="global batch size 4 cannot be kept at world size 2"):
        validate(from_values(global_batch_size=4, batch_size=4))
    assert validate(from_values(global_batch_size=16, batch_size=4)).global_batch_size == 16
    with pytest.raises(ConfigError, match="--weight_decay -0.1 must be 0 or more"):
        validate(from_values(weight_decay=-0.1))


@pytest.mark.parametrize("args, fragment", [
    (["--global_batch_size", "6", "--batch_size", "4"], "is not a multiple of --batch_size 4"),
    (["--activation_checkpointing", "some"], "invalid choice: 'some'"),
    (["--compile", "perhaps"], "'perhaps' is not a boolean"),
])
def test_bad_speed_flags_are_one_line_and_exit_2(args, fragment):
    proc = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_flops_per_token_and_mfu_of_the_reference_run():
    from trainer.telemetry.metrics import Throughput

    for name in PRESETS:
        c = PRESETS[name]
        h, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
        matmul_params = preset_parameters(name) - (0 if c["tie_word_embeddings"] else c["vocab_size"] * h)
        assert flops_per_token(llama_config(name), 2048) == 6 * matmul_params + 12 * layers * h * 2048
    # llama-1b, seq 2048, 2 GPUs at 26.6k tokens/s in all: about 11 % of an H200's 989 TFLOP/s.
    perf = Throughput(flops_per_token(llama_config("llama-1b"), 2048), 989e12, 2 * 2048, 2)
    assert 10.5 < perf.mfu_pct(26_600) < 11.5
    assert Throughput(1, None, 1, 1).mfu_pct(1000.0) is None  # CPUs: no made-up peak



def _grads(env, **options):
    from trainer.loop.parallel import build_sharded_model

    model = build_sharded_model("tiny", 5, env, param_bytes=1, **options)
    tokens = torch.randint(0, 258, (2, 33), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return {n: p.grad.full_tensor() for n, p in model.named_parameters()}


def test_weight_decay_skips_one_dimensional_parameters(one_rank_group):
    from trainer.loop.model import optimizer_groups
    from trainer.loop.parallel import build_sharded_model

    model = build_sharded_model("tiny", 5, one_rank_group, param_bytes=1)
    decay, keep = optimizer_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    assert {names[id(p)] for p in keep["params"]} == {n for n, p in model.named_parameters()
                                                       if n.endswith("norm.weight")}
    assert all(p.dim() == 2 for p in decay["params"])
    assert len(decay["params"]) + len(keep["params"]) == len(names)


def test_activation_checkpointing_and_compile_keep_gradients_and_names(one_rank_group):
    from trainer.preflight import torch_home_with_a_space

    home = torch_home_with_a_space()
    if home is not None:  # refused before launch there (test_bad_input)
        pytest.skip(f"torch under {home!r}: torch.compile cannot link there "
                    "(pytorch/pytorch#191010)")
    plain = _grads(one_rank_group)
    for mode in ("selective", "full"):  # recomputation is exact
        grads = _grads(one_rank_group, activation_checkpointing=mode)
        assert grads.keys() == plain.keys()
        assert all(torch.equal(grads[n], plain[n]) for n in plain), mode
    compiled = _grads(one_rank_group, compile=True, activation_checkpointing="selective")
    assert compiled.keys() == plain.keys()  # checkpoints stay interchangeable
    for n in plain:  # fused bf16 kernels round differently: close as a whole, not bit for bit
        assert float((compiled[n] - plain[n]).norm()) <= 0.02 * float(plain[n].norm()), n


def test_step_figures_and_the_log_line_on_cpu():
    from trainer.telemetry.metrics import StepReadback, Throughput, Window

    waited = []
    readback = StepReadback(torch.device("cpu"), lambda device, event: waited.append(event))
    window = Window(0.0)
    for step, (loss, norm) in enumerate([(3.0, 1.5), (2.0, 0.5)], start=1):
        rec = readback.begin(step, 1e-3 * step)
        readback.queue(rec, torch.tensor([loss, norm]))
        done = readback.ready()  # a CPU step is complete when queued: nothing stays in flight
        assert [r.step for r in done] == [step] and done[0].dt >= 0.0
        window.add(done[0])
    assert not waited  # no device events to poll on a CPU
    cpu = torch.device("cpu")
    figures = window.figures(2, 10, Throughput(100, None, 256, 2), cpu)
    line = figures.line()
    assert figures.loss == 2.5 and figures.steps == 2 and figures.mfu_pct is None
    assert "loss 2.5000" in line and "grad norm 1.000" in line and "lr 2.00e-03" in line
    assert "tok/s" in line and "with stalls" in line and "MFU" not in line
    # a timestamp first; no device memory on a CPU
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ step      2/10 \|", line), line
    assert "mem" not in line and figures.memory_gib is None
    assert "MFU" in window.figures(2, 10, Throughput(100, 1e12, 256, 2), cpu).line()
