"""A torch.profiler window over a few training steps, and where their device time went.

Each rank writes a Chrome trace (open it in Perfetto) and rank 0 a summary: the top operators by
device time, the device time per category (compute kernels, NCCL collectives, copies by
direction), and the host's time in calls that wait for the device. The copy categories answer
the first tuning question on a multi-GPU node: do the GPUs exchange FSDP traffic peer to peer
(NVLink), or through host memory? The host waits show whether a step lets the host run ahead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile

# Device-time categories, by operator name; the first match wins.
CATEGORIES = (("nccl", "collectives"), ("c10d::", "collectives"), ("gloo", "collectives"),
              ("memcpy dtoh", "copy device to host"),
              ("memcpy htod", "copy host to device"), ("memcpy ptop", "copy peer to peer"),
              ("memcpy dtod", "copy device to device"), ("memset", "memset"))


# Host calls that wait for the device: a step that makes one cannot queue work ahead of it.
HOST_WAITS = ("synchronize", "_local_scalar_dense", "cudamemcpy")


def host_wait(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in HOST_WAITS) and "async" not in low


def category(name: str) -> str:
    low = name.lower()
    for fragment, label in CATEGORIES:
        if fragment in low:
            return label
    return "compute"


class StepProfiler:
    """Profiles steps `first` .. `first + count - 1` of an attempt (1-based step numbers)."""

    def __init__(self, first: int, count: int, out_dir: Optional[Path], rank: int,
                 device: torch.device):
        self.first, self.last = first, first + count - 1
        self.out_dir, self.rank, self.device = out_dir, rank, device
        self._prof: Optional[profile] = None
        self.done = first <= 0 or out_dir is None

    def before(self, step: int) -> None:
        """Call before training `step`."""
        if self.done or step != self.first or self._prof is not None:
            return
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, record_shapes=False)
        self._prof.__enter__()

    def after(self, step: int) -> Optional[dict]:
        """Call after `step` was queued; at the window's end, writes the files and returns
        rank 0's summary."""
        if self._prof is None or step < self.last:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the window's kernels belong in it
        self._prof.__exit__(None, None, None)
        prof, self._prof, self.done = self._prof, None, True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out_dir / f"rank{self.rank:05d}.trace.json"))
        if self.rank != 0:
            return None
        summary = summarize(prof, self.last - self.first + 1)
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        (self.out_dir / "summary.txt").write_text(prof.key_averages().table(
            sort_by="self_device_time_total" if self.device.type == "cuda" else
            "self_cpu_time_total", row_limit=30))
        return summary


def summarize(prof: profile, steps: int) -> dict:
    """Time per step by category and the top operators: device time where the window recorded
    any (GPU ranks), else CPU time (CPU ranks). Self times, so nothing is counted twice."""
    averages = prof.key_averages()
    on_device = any(getattr(a, "self_device_time_total", 0) for a in averages)
    per_category: dict[str, float] = {}
    ops = []
    for avg in averages:
        us = getattr(avg, "self_device_time_total", 0) if on_device else avg.self_cpu_time_total
        if not us or us <= 0:
            continue
        label = category(avg.key)
        per_category[label] = per_category.get(label, 0.0) + us
        ops.append((us, avg.key, label))
    ops.sort(reverse=True)
    waits = {a.key: a.self_cpu_time_total / 1e3 / steps for a in averages
             if host_wait(a.key) and a.self_cpu_time_total > 0}
    return {"steps": steps, "time": "device" if on_device else "cpu",
            "host_wait_ms_per_step": dict(sorted(waits.items(), key=lambda kv: -kv[1])),
            "ms_per_step_by_category": {k: v / 1e3 / steps for k, v in
                                        sorted(per_category.items(), key=lambda kv: -kv[1])},
            "top_ops_ms_per_step": [{"op": k, "category": c, "ms": us / 1e3 / steps}
                                    for us, k, c in ops[:15]]}


def profile_line(summary: dict, out_dir: Path) -> str:
    """One log line: the time per step of each category."""
    parts = ", ".join(f"{k} {v:.1f} ms" for k, v in summary["ms_per_step_by_category"].items())
    waits = sum(summary.get("host_wait_ms_per_step", {}).values())
    return f"profile of {summary['steps']} steps ({summary['time']} time per step): {parts}; " \
           f"host waiting for the device {waits:.1f} ms; details in {out_dir}"
