"""The compute dtype follows the device: bf16 where it is native, fp32 where a CPU would emulate
it, either one when forced; and FSDP computes in the dtype chosen."""

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer.loop.precision import choose, cpu_capabilities

X86_AVX2 = {"architecture": "x86_64", "avx2": True, "avx512_f": False, "avx512_bf16": False,
            "amx_bf16": False}
X86_AVX512_BF16 = {**X86_AVX2, "avx512_f": True, "avx512_bf16": True}
X86_AMX = {**X86_AVX2, "avx512_f": True, "amx_bf16": True}
ARM_NEON = {"architecture": "arm64", "neon": True, "bf16": False, "sve_bf16": False}
ARM_BF16 = {**ARM_NEON, "bf16": True}
AARCH64_SVE_BF16 = {"architecture": "aarch64", "sve": True, "sve_bf16": True}


@pytest.mark.parametrize("setting, device, caps, dtype", [
    ("auto", "cpu", X86_AVX2, torch.float32),          # bf16 emulated: fp32
    ("auto", "cpu", X86_AVX512_BF16, torch.bfloat16),
    ("auto", "cpu", X86_AMX, torch.bfloat16),
    ("auto", "cpu", ARM_NEON, torch.float32),
    ("auto", "cpu", ARM_BF16, torch.bfloat16),
    ("auto", "cpu", AARCH64_SVE_BF16, torch.bfloat16),
    ("auto", "cpu", {"architecture": "riscv64"}, torch.float32),
    ("bf16", "cpu", X86_AVX2, torch.bfloat16),          # forced either way
    ("fp32", "cpu", X86_AVX512_BF16, torch.float32),
    ("auto", "cuda", X86_AVX2, torch.bfloat16),         # GPUs: bf16, whatever the host CPU
    ("fp32", "cuda", X86_AVX512_BF16, torch.float32),
])
def test_compute_dtype_follows_the_capability_or_the_setting(setting, device, caps, dtype):
    precision = choose(setting, device, caps)
    assert precision.dtype == dtype
    assert precision.line().startswith(f"compute dtype {'bf16' if dtype == torch.bfloat16 else 'fp32'}: ")


def test_the_reason_names_what_the_cpu_lacks_and_how_to_force_bf16():
    line = choose("auto", "cpu", X86_AVX2).line()
    assert "avx512_bf16 or amx_bf16" in line and "--compute_dtype bf16" in line
    assert "avx512_bf16" in choose("auto", "cpu", X86_AVX512_BF16).line()


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="compute dtype 'fp16' is unknown"):
        choose("fp16", "cpu", X86_AVX2)


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").is_file(),
                    reason="the kernel's CPU flags are read on x86-64 Linux")
def test_the_capabilities_agree_with_the_kernels_cpu_flags():
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())
    caps = cpu_capabilities()
    assert caps["architecture"] == "x86_64"
    for feature in ("avx512_bf16", "amx_bf16", "avx2"):
        assert bool(caps[feature]) == (feature in flags), feature
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert choose("auto", "cpu").dtype == (torch.bfloat16 if native else torch.float32)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_fsdp_computes_in_the_chosen_dtype_and_keeps_fp32_weights(one_rank_group, dtype):
    from trainer.loop.parallel import build_sharded_model

    model = build_sharded_model("tiny", 5, one_rank_group, param_bytes=1, compute_dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    tokens = torch.randint(0, 258, (2, 17), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    assert logits.dtype == dtype
    F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
