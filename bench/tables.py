"""The rows of BENCHMARKS.md's tables, read from the JSON files that `bench.run` writes.

    python -m bench.tables bench/results/h200x1-current-code/*.json

Each file holds `{"machine": ..., "results": {run name: results.json of that run}}`. The runs
are grouped by what they measure, one markdown table per group, so a new measurement lands in
BENCHMARKS.md by pasting rows instead of copying figures by hand:
- recovery and fault-free runs: steps, hash, restarts, each fault's recovery by type, the
  mean, infra goodput;
- throughput, profile and checkpoint runs: median and steady step, throughput against the run
  without checkpoints, MFU, checkpoint blocking, snapshots that waited for a copy in flight;
- floors: each measured bandwidth.

With `--phases`, one column per run instead: when each stage of its restarts ended after the
fault, min-max over the faults, and in brackets what the stage added (the restart floor's
table). Those files may also be a run's own results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

Run = dict[str, Any]

RECOVERY = ("run", "machine", "steps", "param_sha256", "restarts", "exceptions (s)", "hangs (s)",
            "other faults (s)", "recovery mean", "infra goodput", "restored from")
THROUGHPUT = ("run", "machine", "median step", "steady step", "vs no checkpoints, median / steady",
              "MFU median", "MFU loop", "training efficiency", "checkpoint blocking (mean)",
              "snapshot waits")


# A restart's stages in order (`faults[].breakdown_seconds`), as BENCHMARKS names them.
PHASES = (("detected", "detected"), ("left", "the failed worker's way out done"),
          ("aborted", "process group aborted"), ("handed_over", "restart taken up"),
          ("health_checked", "health checked"),
          ("restarted", "restarted: re-entered, or relaunched"),
          ("imported", "imported"), ("pg_ready", "process group"),
          ("model_ready", "model built and sharded"), ("buffers_ready", "buffers ready"),
          ("loaded", "state loaded"))


class NotResults(ValueError):
    """A file that `bench.run` did not write."""


def load(path: Path) -> tuple[str, dict[str, Any]]:
    """(machine, results) of one file; the machine as 'N× GPU name'."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise NotResults(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict) or not {"machine", "results"} <= data.keys():
        raise NotResults(f"{path}: not a bench.run result file (it needs 'machine' and 'results')")
    gpus = data["machine"].get("gpus") or ["cpu"]
    return f"{len(gpus)}× {gpus[0].removeprefix('NVIDIA ')}", data["results"]


def _s(value: Optional[float], digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f} s"


def _pct(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f} %"


def recovery_row(name: str, machine: str, run: Run) -> tuple[str, ...]:
    """One recovery or fault-free run; a run without results.json shows its exit code."""
    if "steps_completed" not in run:
        return (name, machine, f"no results (exit {run.get('exit_code')})", *[""] * 8)
    by_type: dict[str, list[str]] = {"exception": [], "hang": [], "other": []}
    for fault in run.get("faults", []):
        kind = fault["type"] if fault["type"] in by_type else "other"
        label = f"{fault['recovery_seconds']:.2f}" if fault.get("recovery_seconds") else "?"
        by_type[kind].append(label if kind != "other" else f"{fault['type']} {label}")
    restored = sorted({f.get("restored_from") or "none" for f in run.get("faults", [])})
    return (name, machine, f"{run['steps_completed']}/{run['max_steps']}",
            f"`{str(run.get('param_sha256'))[:8]}…`", str(run.get("restarts", "")),
            ", ".join(by_type["exception"]), ", ".join(by_type["hang"]), ", ".join(by_type["other"]),
            _s(run.get("recovery_seconds_mean")), _pct(run.get("infra_goodput_pct")),
            ", ".join(restored) if run.get("faults") else "")


def throughput_row(name: str, machine: str, run: Run,
                   reference: Optional[Run]) -> tuple[str, ...]:
    """One run against the run without checkpoints of the same length in its file, if any."""
    median, steady = run.get("step_time_seconds"), run.get("steady_step_seconds")
    versus = ""
    if reference and reference is not run and median and reference.get("step_time_seconds"):
        # bench.run compares by the steady step, or by the loop's mean step where a run has no
        # steady figure (a restarted run, or a file written before steady steps were recorded)
        basis = "" if steady else " (loop)"
        versus = (f"{100 * reference['step_time_seconds'] / median:.1f} % / "
                  f"{_pct(run.get('throughput_vs_no_checkpoint_pct')) or '?'}{basis}")
    blocking = (run.get("checkpoint") or {}).get("blocking_seconds_mean")
    return (name, machine, _s(median, 4), _s(steady, 4), versus, _pct(run.get("mfu_pct")),
            _pct(run.get("loop_mfu_pct")), _pct(run.get("training_efficiency_pct")),
            _s(blocking) if blocking else "",
            str((run.get("snapshots") or {}).get("waits", "")) if run.get("snapshots") else "")


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f} s" if values else ""


def phase_column(faults: list[dict]) -> list[str]:
    """Restart stages, then the first step, each as 'ended (+added)' over these faults; a
    stage no fault stamped stays empty."""
    stamps = [[*((f.get("breakdown_seconds") or {}).get(key) for key, _ in PHASES),
               f["recovery_seconds"]] for f in faults]
    cells = []
    for i in range(len(PHASES) + 1):
        ended = [row[i] for row in stamps if row[i] is not None]
        added = []
        for row in stamps:
            before = next((v for v in reversed(row[:i]) if v is not None), None)
            if row[i] is not None and before is not None:
                added.append(row[i] - before)
        cells.append(f"{_span(ended)} (+{_span(added)})" if added else _span(ended))
    return cells


def render_phases(paths: list[Path]) -> str:
    """One column per run (a bench.run file's runs, or a results.json) and fault type: its
    restart stages."""
    columns: dict[str, list[str]] = {}
    for path in paths:
        data = json.loads(path.read_text()) if path.is_file() else None
        if isinstance(data, dict) and "faults" in data:
            runs = {path.stem.removesuffix("-results"): data}
        else:
            runs = {n: r for n, r in load(path)[1].items() if isinstance(r, dict)}
        for name, run in runs.items():
            by_type: dict[str, list[dict]] = {}
            for f in run.get("faults", []):
                if f.get("recovery_seconds"):
                    by_type.setdefault(f.get("type") or "fault", []).append(f)
            for kind, faults in by_type.items():
                columns[f"{name}: {len(faults)} × {kind}"] = phase_column(faults)
    header = ("stage", *columns)
    labels = [label for _, label in PHASES] + ["first step done"]
    return _table(header, [(label, *(col[i] for col in columns.values()))
                           for i, label in enumerate(labels)])


def _is_reference(name: str) -> bool:
    return name.endswith("-compiled") or name.startswith("ckpt-none-") or name.endswith("-clean")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = [header, tuple("---" for _ in header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def render(paths: list[Path]) -> str:
    """The tables for these files, recovery runs first; floors as name and value."""
    recovery, throughput, floors = [], [], []
    for path in paths:
        machine, results = load(path)
        runs = {n: r for n, r in results.items() if isinstance(r, dict)}
        references = {r.get("max_steps"): r for n, r in runs.items() if _is_reference(n)}
        for name, run in runs.items():
            if name.startswith(("recovery-", "faultfree-")):
                recovery.append(recovery_row(name, machine, run))
            else:
                throughput.append(throughput_row(name, machine, run,
                                                 references.get(run.get("max_steps"))))
        floors += [(name, machine, f"{value:.3g}") for name, value in results.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)]
    parts = [_table(RECOVERY, recovery) if recovery else "",
             _table(THROUGHPUT, throughput) if throughput else "",
             _table(("floor", "machine", "value"), floors) if floors else ""]
    return "\n\n".join(p for p in parts if p)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tables",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON files written by python -m bench.run")
    p.add_argument("--phases", action="store_true",
                   help="each run's restart stages, min-max over its faults")
    a = p.parse_args(argv)
    try:
        print(render_phases(a.files) if a.phases else render(a.files))
    except NotResults as e:
        print(f"bench.tables: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
