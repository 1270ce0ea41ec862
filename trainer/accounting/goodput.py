"""Goodput from the event log alone: what the run achieved, and where the time went.

Definitions (also in the README):
- wall_seconds: first process start (`launch`) to the end of training (`train_end`).
- step_time: median duration of steps that are neither checkpoint steps nor the first step
  of an attempt - the fault-free step time.
- useful steps: the steps that survive into the final model (each step number counted once,
  from where this run started); replayed steps are not useful.
- training_goodput_pct = 100 * useful_steps * step_time / wall_seconds.
- per fault: recovery_seconds = fault -> first step completed after it (the step event's
  `done`: on GPUs the event itself is written one step later); the breakdown stamps
  detection, restart (new attempt), process group ready, state loaded, first step;
  steps_lost = last step completed before the fault - step resumed from.
- infra_goodput_pct = 100 * (wall - sum of fault -> training resumed) / wall.
- training_efficiency_pct = 100 * (1 - B / (S + B)), the share of the training loop's time not
  blocked by checkpointing: B = seconds the loop spent after its steps taking snapshots and
  checkpoints, S = the sum of step times.
- loop_step_seconds: mean step time plus stall over the steps (each attempt's first left out).
  It counts what blocking leaves out, steps slowed by a background write; the benchmark
  divides a run without checkpoints' figure by it (throughput_vs_no_checkpoint_pct).
  The save at the end of training and the final wait for the last background write are reported
  apart (checkpoint.final_seconds): they end a run, they do not slow its steady state.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional

# Events after a fault, in the order a recovery passes through them.
_PHASES = (("detected", ("abort", "worker_failed")),
           ("restarted", ("launch", "attempt_start")),
           ("imported", ("imported",)),
           ("pg_ready", ("pg_ready",)),
           ("model_ready", ("model_ready",)),
           ("buffers_ready", ("buffers_ready",)),
           ("loaded", ("ckpt_load", "snapshot_load", "train_start")))


def _done(step: dict) -> float:
    """When a step's work completed: on GPUs its event is written one step later, when the
    figures are read back (older event logs have only that time)."""
    return step.get("done") or step["t"]


def _first_after(events: list[dict], t: float, names: Iterable[str], until: float) -> Optional[dict]:
    names = set(names)
    for e in events:
        if t <= e["t"] <= until and e["event"] in names:
            return e
    return None


def _restarts(events: list[dict]) -> int:
    """Every restart of rank 0, wherever it failed: process launches after the first, and
    in-process re-entries (attempts after the first within one process)."""
    launches = sum(1 for e in events if e["event"] == "launch" and e["rank"] == 0)
    reentries = sum(1 for e in events if e["event"] == "attempt_start" and e["rank"] == 0
                    and e.get("iteration", 0) > 0)
    return max(0, launches - 1) + reentries


def summarize(events: list[dict], max_steps: int, checkpoint_interval: int) -> dict[str, Any]:
    events = sorted(events, key=lambda e: e["t"])
    if not events:
        raise ValueError("the event log is empty")
    launches = [e["t"] for e in events if e["event"] == "launch"]
    t_begin = min(launches) if launches else events[0]["t"]
    ends = [e for e in events if e["event"] == "train_end" and e["rank"] == 0]
    t_end = ends[-1]["t"] if ends else events[-1]["t"]
    wall = max(t_end - t_begin, 1e-9)

    steps = [e for e in events if e["event"] == "step"]
    starts = [e for e in events if e["event"] == "train_start" and e["rank"] == 0]
    first_steps = {s["step"] + 1 for s in starts}
    ckpt_steps = {e["step"] for e in events if e["event"] == "ckpt_save"}
    steady = [s["dt"] for s in steps if s["step"] not in first_steps and s["step"] not in ckpt_steps]
    step_time = statistics.median(steady or [s["dt"] for s in steps] or [0.0])
    start_step = starts[0]["step"] if starts else 0
    final_step = max((s["step"] for s in steps), default=start_step)
    useful_steps = max(0, final_step - start_step)

    faults = []
    downtime = 0.0
    fault_events = [e for e in events if e["event"] == "fault"]
    for i, f in enumerate(fault_events):
        t_f = f["t"]
        until = fault_events[i + 1]["t"] if i + 1 < len(fault_events) else float("inf")
        rec: dict[str, Any] = {"step": f["step"], "rank": f["rank"], "type": f["type"], "t": t_f}
        stamps = {}
        for phase, names in _PHASES:
            e = _first_after(events, t_f, names, until)
            stamps[phase] = e["t"] - t_f if e else None
        resumed = _first_after(events, t_f, ("train_start",), until)
        first = _first_after(events, resumed["t"] if resumed else t_f, ("step",), until)
        rec["breakdown_seconds"] = stamps
        rec["resumed_from_step"] = resumed["step"] if resumed else None
        rec["recovery_seconds"] = _done(first) - t_f if (first and resumed) else None
        # Steps finished before the restart (some ranks finish the faulting step's neighbours
        # after the fault is stamped) and not in the state resumed from are trained again.
        last_done = max((s["step"] for s in steps if s["t"] < (resumed or f)["t"]), default=start_step)
        rec["steps_lost"] = max(0, last_done - resumed["step"]) if resumed else None
        loaded = _first_after(events, t_f, ("ckpt_load", "snapshot_load"), until)
        rec["restored_from"] = loaded.get("tier") if loaded else None
        if resumed:
            downtime += resumed["t"] - t_f
        faults.append(rec)

    saves = [e for e in events if e["event"] == "ckpt_save" and e["rank"] == 0]
    blocking = [e["blocking_s"] for e in saves if not e.get("final")]
    final_s = sum(e["blocking_s"] for e in saves if e.get("final")) + sum(
        e["seconds"] for e in events if e["event"] == "ckpt_drain" and e["rank"] == 0)
    stalls = sum(s.get("stall", 0.0) for s in steps)
    loop_s = sum(s["dt"] for s in steps) + stalls
    steady_loop = [s["dt"] + s.get("stall", 0.0) for s in steps if s["step"] not in first_steps]
    writes = [e["write_s"] for e in events if e["event"] == "ckpt_commit"]
    recoveries = [f["recovery_seconds"] for f in faults if f["recovery_seconds"] is not None]
    return {
        "steps_completed": final_step,
        "max_steps": max_steps,
        "wall_seconds": wall,
        "step_time_seconds": step_time,
        "useful_steps": useful_steps,
        "training_efficiency_pct": 100.0 * (1.0 - stalls / loop_s) if loop_s else None,
        "loop_step_seconds": statistics.fmean(steady_loop) if steady_loop else None,
        "training_goodput_pct": 100.0 * useful_steps * step_time / wall,
        "infra_goodput_pct": 100.0 * (wall - downtime) / wall,
        "recovery_seconds_mean": statistics.fmean(recoveries) if recoveries else None,
        "restarts": _restarts(events),
        "checkpoint": {
            "count": len(saves),
            "interval": checkpoint_interval,
            "blocking_seconds_total": sum(blocking),
            "blocking_seconds_mean": statistics.fmean(blocking) if blocking else 0.0,
            "final_seconds": final_s,
            "write_seconds_mean": statistics.fmean(writes) if writes else 0.0,
            "bytes_per_rank": saves[-1]["bytes"] if saves else 0,
        },
        "faults": faults,
    }
