"""What the step loop reports and how it learns it: step figures read back from the device one
step late, tokens/s and MFU, and the step log's window, whose figures (`StepFigures`) the log
line, TensorBoard, W&B and the metrics endpoint all show (`trainer.telemetry`).

Reading a step's figures must never stall the device nor block in CUDA holding the GIL, so
everything here polls events and reads pinned host memory.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from trainer.accounting.events import utc_stamp
from trainer.buffers import host_copy_stream


@dataclass
class StepRecord:
    """One optimizer step's figures, on their way back from the device."""

    step: int
    lr: float
    host: torch.Tensor                       # [loss, grad norm, stops], filled once `copied` completes
    t0: float                                # host clock when the step began
    start: Optional["torch.cuda.Event"] = None
    end: Optional["torch.cuda.Event"] = None     # the step's work complete
    copied: Optional["torch.cuda.Event"] = None  # its figures on the host
    dt: float = 0.0
    stall: float = 0.0                       # seconds the loop was blocked after the step
    snapshot_s: float = 0.0                  # of which taking the snapshot
    done: float = 0.0                        # wall clock when the step's work completed

    @property
    def loss(self) -> float:
        return float(self.host[0])

    @property
    def grad_norm(self) -> float:
        return float(self.host[1])

    @property
    def stop_requests(self) -> int:
        """How many ranks had been asked to stop when they began this step."""
        return round(float(self.host[2]))


class StepReadback:
    """Reads each step's loss and grad norm back one step late, off the critical path.

    On a GPU the figures are copied into pinned host memory behind the step's work and an event
    is recorded; they are read only after the next step has been queued, by polling that event
    (`wait_for_device`), so the GPU never idles for the host and no thread blocks in CUDA
    holding the GIL. The copy runs on the process's host-copy stream (`host_copy_stream`), ahead
    of the snapshot queued after it, and never holds the compute stream. dt of a step is the
    device time from the step's start marker (recorded when the host began the step: data
    loading is included when the device is idle) to the end of its work: steps queued back to
    back measure their own duration, never the host's checkpoint stalls between them. On a
    CPU everything is synchronous and dt is wall time.
    """

    def __init__(self, device: torch.device,
                 wait: Callable[[torch.device, "torch.cuda.Event"], None]):
        self.device = device
        self._wait = wait  # polls, never blocks in CUDA: see train.wait_for_device
        self._queue: deque[StepRecord] = deque()
        self._anchor: Optional["torch.cuda.Event"] = None
        self._stream: Optional["torch.cuda.Stream"] = None
        if device.type == "cuda":
            self._stream = host_copy_stream(device)
            # A device event at a known wall time: a step's completion time is this plus the
            # device time between the two, not the later moment the host reads it back.
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._wait(device, self._anchor)  # the restore has synchronized: at once
            self._anchor_t = time.time()

    def begin(self, step: int, lr: float) -> StepRecord:
        rec = StepRecord(step, lr, torch.empty(0), time.perf_counter())
        if self.device.type == "cuda":
            rec.start = torch.cuda.Event(enable_timing=True)
            rec.start.record()
        return rec

    def queue(self, rec: StepRecord, stats: torch.Tensor) -> None:
        if self.device.type == "cuda":
            rec.end = torch.cuda.Event(enable_timing=True)
            rec.end.record()
            rec.host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
            self._stream.wait_event(rec.end)
            with torch.cuda.stream(self._stream):
                rec.host.copy_(stats, non_blocking=True)
                rec.copied = torch.cuda.Event()
                rec.copied.record()
            stats.record_stream(self._stream)
        else:
            rec.host = stats
            rec.dt = time.perf_counter() - rec.t0
            rec.done = time.time()
        self._queue.append(rec)

    def wait_all(self) -> list[StepRecord]:
        """Wait until every queued step's figures are on the host, without taking them from the
        queue: a durable save checks them first, `ready` still reports them in order."""
        for rec in self._queue:
            if rec.copied is not None:
                self._wait(self.device, rec.copied)
        return list(self._queue)

    def ready(self, in_flight: int = 1) -> list[StepRecord]:
        """Completed records, oldest first; on a GPU the newest `in_flight` stay in flight."""
        if self.device.type != "cuda":
            in_flight = 0
        out = []
        while len(self._queue) > in_flight:
            rec = self._queue.popleft()
            if rec.copied is not None:
                self._wait(self.device, rec.copied)
                rec.dt = rec.start.elapsed_time(rec.end) / 1000.0
                rec.done = self._anchor_t + self._anchor.elapsed_time(rec.end) / 1000.0
            out.append(rec)
        return out


class Throughput:
    """Tokens/s and MFU. Model FLOPs per token: `model.flops_per_token`; peak: the device's
    dense bf16 peak (`peak_flops`), None on CPUs, and then MFU is None too."""

    def __init__(self, flops_per_token: int, peak: Optional[float], tokens_per_step: int,
                 world_size: int, device_name: str = "cpu"):
        self.flops_per_token, self.peak, self.device_name = flops_per_token, peak, device_name
        self.tokens_per_step, self.world_size = tokens_per_step, world_size
        self.step_times: list[float] = []

    def per_gpu(self, tokens_per_second: float) -> float:
        return tokens_per_second / self.world_size

    def mfu_pct(self, tokens_per_second: float) -> Optional[float]:
        if not self.peak:
            return None
        return 100.0 * self.per_gpu(tokens_per_second) * self.flops_per_token / self.peak

    def add(self, dt: float) -> None:
        self.step_times.append(dt)

    def summary(self) -> dict:
        """From the median step time of this attempt, its first step (warm-up, compilation)
        left out: the steady state, without checkpoint stalls."""
        times = self.step_times[1:] or self.step_times
        dt = statistics.median(times) if times else None
        tps = self.tokens_per_step / dt if dt else None
        return {"tokens_per_step": self.tokens_per_step,
                "tokens_per_second": tps,
                "tokens_per_second_per_gpu": self.per_gpu(tps) if tps else None,
                "flops_per_token": self.flops_per_token,
                "device_name": self.device_name,
                "peak_flops_per_gpu": self.peak,
                "mfu_pct": self.mfu_pct(tps) if tps else None}


@dataclass(frozen=True)
class StepFigures:
    """One step-log line's figures: means over the steps since the last line, and wall-clock
    throughput over the same span (so it includes checkpoint and snapshot stalls)."""

    step: int
    max_steps: int
    time: float                  # wall clock of the line
    steps: int                   # steps in the window
    loss: float
    grad_norm: float
    lr: float
    tokens_per_second: float
    tokens_per_second_per_gpu: float
    mfu_pct: Optional[float]     # None where the device's peak is unknown (CPUs)
    checkpoint_stall_s: float    # the window's seconds blocked by durable checkpoints
    snapshot_stall_s: float      # ... and by snapshots
    memory_gib: Optional[float] = None        # peak device memory reserved in the window (CUDA)
    memory_total_gib: Optional[float] = None

    def line(self) -> str:
        tps = self.tokens_per_second
        return (f"{utc_stamp(self.time)} step {self.step:>6}/{self.max_steps} | loss {self.loss:.4f} | "
                f"grad norm {self.grad_norm:.3f} | lr {self.lr:.2e} | "
                f"{tps:>10,.0f} tok/s ({self.tokens_per_second_per_gpu:,.0f}/gpu, with stalls) | "
                + (f"MFU {self.mfu_pct:.1f}% | " if self.mfu_pct is not None else "")
                + f"ckpt stall {self.checkpoint_stall_s:.3f} s"
                + (f" | snapshot {self.snapshot_stall_s:.3f} s" if self.snapshot_stall_s else "")
                + (f" | mem {self.memory_gib:.1f}/{self.memory_total_gib:.0f} GiB"
                   if self.memory_gib is not None else ""))


class Window:
    """The steps since the last log line."""

    def __init__(self, t: float):
        self.reset(t)

    def reset(self, t: float) -> None:
        self.t, self.steps, self.loss, self.grad_norm, self.lr = t, 0, 0.0, 0.0, 0.0
        self.stall = self.snapshot = 0.0

    def add(self, rec: StepRecord) -> None:
        self.steps += 1
        self.loss += rec.loss
        self.grad_norm += rec.grad_norm
        self.stall += rec.stall
        self.snapshot += rec.snapshot_s
        self.lr = rec.lr

    def figures(self, step: int, max_steps: int, perf: Throughput,
                device: torch.device) -> StepFigures:
        n = max(1, self.steps)
        tps = perf.tokens_per_step * self.steps / max(time.perf_counter() - self.t, 1e-9)
        memory, total = device_memory(device)
        return StepFigures(step, max_steps, time.time(), self.steps, self.loss / n,
                           self.grad_norm / n, self.lr, tps, perf.per_gpu(tps), perf.mfu_pct(tps),
                           self.stall - self.snapshot, self.snapshot, memory, total)


def device_memory(device: torch.device) -> tuple[Optional[float], Optional[float]]:
    """(peak GiB the caching allocator reserved since the last call, the device's GiB), on a
    GPU; (None, None) elsewhere. Reading the allocator's counters does not synchronize."""
    if device.type != "cuda":
        return None, None
    peak = torch.cuda.max_memory_reserved(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return peak, torch.cuda.get_device_properties(device).total_memory / 2**30


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def peak_flops(device: torch.device) -> Optional[float]:
    """Dense bf16 peak FLOP/s of one device, or None where unknown (CPUs, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = device_name(device)
    for fragment, flops in PEAK_BF16_FLOPS:
        if fragment in name:
            return flops
    return None


# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets; the first match wins.
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
                   ("A100", 312e12), ("L40S", 362e12), ("B200", 2250e12))
