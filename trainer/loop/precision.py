"""The compute dtype: bf16 where the device computes it natively, fp32 where it would be emulated.

FSDP2 keeps fp32 master weights and gradient reductions either way; only the dtype that the
forward and backward passes compute in differs. GPUs compute bf16 natively. A CPU without bf16
instructions emulates it, and the same matrix product then runs many times slower than in fp32
(36.6 against 1.3 GFLOP/s on one core of an AVX2 EPYC), so local runs there compute in fp32.

The choice depends only on the setting and the machine, so every run on one machine (a
fault-free reference and a run through faults alike) computes in the same dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

# CPU features, as `torch.cpu.get_capabilities()` names them, that compute bf16 natively, by
# its "architecture" (aarch64 is arm64 by another name).
NATIVE_BF16 = {
    "x86_64": ("avx512_bf16", "amx_bf16"),
    "arm64": ("bf16", "sve_bf16"),
    "aarch64": ("bf16", "sve_bf16"),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return next(k for k, v in DTYPES.items() if v == self.dtype)

    def line(self) -> str:
        return f"compute dtype {self.name}: {self.reason}"


def native_bf16_features(capabilities: Mapping[str, object]) -> list[str]:
    """The features of this CPU (`torch.cpu.get_capabilities()`) that compute bf16 natively."""
    wanted = NATIVE_BF16.get(str(capabilities.get("architecture")), ())
    return [f for f in wanted if capabilities.get(f)]


def cpu_capabilities() -> Mapping[str, object]:
    return torch.cpu.get_capabilities()


def choose(setting: str, device_type: str,
           capabilities: Optional[Mapping[str, object]] = None) -> Precision:
    """The compute dtype for `--compute_dtype setting` on a `device_type` device; on a CPU,
    from its `capabilities` (default: this machine's)."""
    if setting in DTYPES:
        return Precision(DTYPES[setting], f"--compute_dtype {setting}")
    if setting != "auto":
        raise ValueError(f"compute dtype {setting!r} is unknown; allowed: auto, {', '.join(DTYPES)}")
    if device_type != "cpu":
        return Precision(torch.bfloat16, f"native on {device_type}")
    caps = cpu_capabilities() if capabilities is None else capabilities
    native = native_bf16_features(caps)
    if native:
        return Precision(torch.bfloat16, f"native on this CPU ({', '.join(native)})")
    arch = caps.get("architecture", "unknown")
    missing = " or ".join(NATIVE_BF16.get(str(arch), ("native bf16",)))
    return Precision(torch.float32, f"this {arch} CPU has no {missing}: bf16 would be emulated "
                                    "(--compute_dtype bf16 forces it)")
