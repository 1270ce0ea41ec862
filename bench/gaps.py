"""Where a profiled step's GPU sat idle, and what the host did meanwhile.

The trainer's `--profile_from N --profile_steps K` writes every rank's torch.profiler timeline
(`profile/rankNNNNN.trace.json`). A step that takes longer than its device work leaves gaps on
the GPU; the host operators that overlap each gap name what held it (a first dispatch through
DTensor, a host sync, a kernel loaded lazily).

    python -m bench.gaps RUN_DIR [--min_gap_ms 2] [--top 12]

Prints, per timeline: its span, the GPU's busy time, the gaps longer than `--min_gap_ms` with
the host operators inside each, longest first, and the CUDA runtime calls by total time.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Iterable, Optional

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
HOST = ("cpu_op", "cuda_runtime", "cuda_driver", "python_function", "user_annotation")
RUNTIME = ("cuda_runtime", "cuda_driver")


def _complete(events: Iterable[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and "ts" in e]


def gpu_gaps(gpu: list[dict], min_gap_us: float) -> list[tuple[float, float]]:
    """(start, end) of every stretch longer than `min_gap_us` with no GPU operation running."""
    gaps: list[tuple[float, float]] = []
    ops = sorted(gpu, key=lambda e: e["ts"])
    if not ops:
        return gaps
    end = ops[0]["ts"]
    for e in ops:
        if e["ts"] - end > min_gap_us:
            gaps.append((end, e["ts"]))
        end = max(end, e["ts"] + e.get("dur", 0))
    return gaps


def host_inside(host: list[dict], start: float, end: float, top: int = 8) -> list[tuple[str, float]]:
    """The host operators overlapping (start, end), by microseconds of overlap, most first.
    Spans longer than 5 s (the profiler's own step markers) are left out."""
    inside: collections.Counter = collections.Counter()
    for e in host:
        s, d = e["ts"], e.get("dur", 0)
        overlap = min(end, s + d) - max(start, s)
        if overlap > 0 and d < 5e6:
            inside[f"{e['name'][:70]} [{e['cat'][:4]}]"] += overlap
    return inside.most_common(top)


def summarize(trace: Path, min_gap_ms: float, top: int) -> str:
    """The report for one timeline, as text."""
    events = _complete(json.loads(trace.read_text()).get("traceEvents", []))
    gpu = [e for e in events if e.get("cat") in GPU]
    host = [e for e in events if e.get("cat") in HOST]
    if not gpu:
        return f"== {trace}\nno GPU operations in this timeline"
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e.get("dur", 0) for e in events)
    busy = sum(e.get("dur", 0) for e in gpu)
    gaps = gpu_gaps(gpu, min_gap_ms * 1e3)
    lines = [f"== {trace}",
             f"span {(t1 - t0) / 1e3:.1f} ms, GPU operations {len(gpu)}, GPU busy {busy / 1e3:.1f} ms",
             f"gaps over {min_gap_ms:g} ms: {len(gaps)}, {sum(b - a for a, b in gaps) / 1e3:.1f} ms in all"]
    for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:top]:
        names = ", ".join(f"{n} {us / 1e3:.1f}" for n, us in host_inside(host, a, b))
        lines.append(f"  +{(a - t0) / 1e3:8.1f} ms  {(b - a) / 1e3:7.1f} ms: {names}")
    calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in RUNTIME:
            calls[e["name"]][0] += 1
            calls[e["name"]][1] += e.get("dur", 0) / 1e3
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][1])[:10]
    lines.append("runtime calls: " + ", ".join(f"{k} {ms:.1f} ms/{int(n)}" for k, (n, ms) in ranked))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gaps", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a run directory (or any folder) holding rank*.trace.json")
    p.add_argument("--min_gap_ms", type=float, default=2.0)
    p.add_argument("--top", type=int, default=12, help="gaps listed per timeline")
    a = p.parse_args(argv)
    traces = sorted(a.run_dir.glob("**/rank*.trace.json"))
    if not traces:
        print(f"bench.gaps: {a.run_dir}: no rank*.trace.json under it (run the trainer with "
              "--profile_from N --profile_steps K)", file=sys.stderr)
        return 2
    for trace in traces:
        print(summarize(trace, a.min_gap_ms, a.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
