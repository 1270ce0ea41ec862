"""Bit-reproducible training on GPUs (`--deterministic true`), so that recovery can be proven exact
there as it is on CPU ranks: a run through faults must end with the fault-free run's hash.

What varies between identical GPU runs, and what fixes it:
- cuBLAS split-K reductions and workspace reuse: `CUBLAS_WORKSPACE_CONFIG` and PyTorch's
  deterministic algorithms;
- the attention backward of the flash and memory-efficient kernels (atomic adds): attention
  falls back to the math kernel, whose backward is plain matrix products;
- NCCL's choice of algorithm and protocol, which changes the order of the reduction:
  fixed to Ring and Simple.
The cost in step time is measured in BENCHMARKS.md.
"""

from __future__ import annotations

import os

import torch

ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def make_deterministic() -> None:
    """Call before the process group and the first CUDA kernel: the variables are read then."""
    for key, value in ENV.items():
        os.environ[key] = value
    torch.use_deterministic_algorithms(True)
    # No NaN-filling of every new tensor: nothing here reads memory it did not write, and the
    # fill would add a pass over every FSDP gather buffer to each step.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if torch.cuda.is_available():
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)
