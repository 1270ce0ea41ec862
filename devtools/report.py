"""`python -m devtools.report`: compare runs the way the published post does, and draw them.

    python -m devtools.report runs/a/results.json runs/b/results.json [--out DIR] [--labels a,b]

Prints one row per results.json: the post's columns (mode, training and infra goodput, seconds
per fault) and the ones that explain them (faults, steps lost, checkpoint blocking, training
efficiency, wall time). With --out it also writes DIR/report.md (the same table) and
DIR/timeline.png (steps over wall time, failures and recoveries marked), drawn from the event
log that the trainer writes beside each results.json (its events/ directory, or a merged
events.jsonl) and the results' faults[].
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

PROG = "python -m devtools.report"
REQUIRED = ("mode", "steps_completed", "wall_seconds")  # what every results.json has

# (row key, header, number format). A None value prints as "-".
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("label", "run", "{}"),
    ("training_goodput_pct", "training goodput %", "{:.1f}"),
    ("infra_goodput_pct", "infra goodput %", "{:.1f}"),
    ("recovery_seconds_mean", "s per fault", "{:.1f}"),
    ("faults", "faults", "{:d}"),
    ("steps_lost", "steps lost", "{:d}"),
    ("ckpt_blocking_seconds", "ckpt blocking s", "{:.2f}"),
    ("training_efficiency_pct", "training efficiency %", "{:.2f}"),
    ("wall_seconds", "wall s", "{:.1f}"),
)


class ReportError(ValueError):
    """Bad input; the message names the file and what is wrong with it."""


# ---- the table ---------------------------------------------------------------------------------

def load_results(path: str | Path) -> dict:
    """Read one results.json, refusing anything else early with a message that names it."""
    p = Path(path)
    if not p.is_file():
        raise ReportError(f"{p}: no such file")
    try:
        data = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"{p}: not a results.json (not JSON: {exc})") from None
    missing = [k for k in REQUIRED if not isinstance(data, dict) or k not in data]
    if missing:
        raise ReportError(f"{p}: not a results.json (no {', '.join(missing)})")
    return data


def _steps_lost(faults: Optional[list[dict]]) -> Optional[int]:
    """Total replayed steps; unknown ("-") if any fault's count is unknown, not a partial sum."""
    if faults is None:
        return None
    lost = [f.get("steps_lost") for f in faults]
    return None if None in lost else int(sum(lost))


def table_rows(results: Sequence[dict], labels: Optional[Sequence[str]] = None) -> list[dict]:
    """One row per run with the COLUMNS keys; a label replaces the mode (e.g. sync vs async)."""
    if labels is not None and len(labels) != len(results):
        raise ReportError(f"--labels has {len(labels)} labels for {len(results)} results files")
    rows = []
    for i, r in enumerate(results):
        faults = r.get("faults")
        rows.append({
            "label": labels[i] if labels is not None else r["mode"],
            "training_goodput_pct": r.get("training_goodput_pct"),
            "infra_goodput_pct": r.get("infra_goodput_pct"),
            "recovery_seconds_mean": r.get("recovery_seconds_mean"),
            "faults": len(faults) if faults is not None else None,
            "steps_lost": _steps_lost(faults),
            "ckpt_blocking_seconds": (r.get("checkpoint") or {}).get("blocking_seconds_total"),
            "training_efficiency_pct": r.get("training_efficiency_pct"),
            "wall_seconds": r.get("wall_seconds"),
        })
    return rows


def cell(row: dict, key: str) -> str:
    """One value as the tables print it; unknown values are "-" rather than a made-up 0."""
    fmt = next(f for k, _, f in COLUMNS if k == key)
    return "-" if row.get(key) is None else fmt.format(row[key])


def _cells(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    headers = [header for _, header, _ in COLUMNS]
    return headers, [[cell(row, key) for key, _, _ in COLUMNS] for row in rows]


def render_text(rows: Sequence[dict]) -> str:
    """A fixed-width table for the terminal: the run name left-aligned, numbers right-aligned."""
    headers, body = _cells(rows)
    widths = [max(len(c) for c in column) for column in zip(headers, *body)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(cells) for cells in body)]) + "\n"


def render_markdown(rows: Sequence[dict]) -> str:
    """The same table in Markdown, for a README, an issue or the post itself."""
    headers, body = _cells(rows)
    align = [":--"] + ["--:"] * (len(headers) - 1)
    lines = [headers, align, *body]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


# ---- the timeline ------------------------------------------------------------------------------

# What the timeline reads of a log: rank 0's steps and attempts, and the first launch.
TIMELINE_EVENTS = ("launch", "train_start", "step")


def events_beside(results_path: str | Path) -> list[dict]:
    """The events the timeline draws, from the log beside a results.json (one pass; the rest
    of the log is not kept)."""
    from trainer.accounting.events import log_beside, read_events

    path = log_beside(results_path)
    events = [e for e in read_events(path) if e["event"] in TIMELINE_EVENTS
              and (e["event"] == "launch" or e["rank"] == 0)]
    if not events:
        raise ReportError(f"{path}: no events (the timeline is drawn from the event log beside "
                          "each results.json)")
    return events


@dataclass
class Timeline:
    """What one run's panel shows, in seconds since the first process started."""
    segments: list[tuple[list[float], list[int]]] = field(default_factory=list)  # per attempt
    faults: list[tuple[float, int, str]] = field(default_factory=list)  # (t, step, what)
    recoveries: list[tuple[float, float]] = field(default_factory=list)  # (failure, first step)


def timeline(events: Sequence[dict], faults: Sequence[dict] = ()) -> Timeline:
    """Steps per attempt (a new line at each rank-0 train_start, so a rollback shows as a drop),
    and the failures of results.json's faults[] with their recoveries, as goodput timed them:
    failure -> first step completed after it."""
    if not events:
        raise ReportError("no events to draw")
    launches = [e["t"] for e in events if e["event"] == "launch"]
    t0 = min(launches) if launches else min(e["t"] for e in events)
    tl = Timeline()
    for e in events:
        if e["event"] == "train_start" and e["rank"] == 0:
            tl.segments.append(([e["t"] - t0], [e["step"]]))
        elif e["event"] == "step" and e["rank"] == 0:
            if not tl.segments:
                tl.segments.append(([], []))
            tl.segments[-1][0].append(e["t"] - t0)
            tl.segments[-1][1].append(e["step"])
    for f in faults:
        tl.faults.append((f["t"] - t0, f["step"], f.get("type") or f.get("detection", "failure")))
        if f.get("recovery_seconds") is not None:
            tl.recoveries.append((f["t"] - t0, f["t"] - t0 + f["recovery_seconds"]))
    return tl


def plot_timeline(runs: Sequence[tuple[str, Sequence[dict], Sequence[dict]]],
                  path: str | Path) -> None:
    """Draw (label, events, faults) runs as panels stacked vertically on one time axis: overlaid in one
    plot, 4-5 runs hide each other's fault marks and recovery shading; stacked, each stays
    readable and the runs still line up in time. Uses Agg directly, so no display is needed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # Run colours leave red and black to the recovery shading and the fault marks.
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:cyan",
              "tab:olive", "tab:pink", "tab:gray")
    if not runs:
        raise ReportError("no runs to draw")
    fig = Figure(figsize=(10, 1.2 + 1.9 * len(runs)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(runs), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for i, (ax, (label, events, faults)) in enumerate(zip(axes, runs)):
        tl = timeline(events, faults)
        color = colors[i % len(colors)]
        for ts, steps in tl.segments:
            ax.plot(ts, steps, color=color, lw=1.6)
        for start, end in tl.recoveries:
            ax.axvspan(start, end, color="tab:red", alpha=0.15, lw=0)
        for t, step, kind in tl.faults:  # the fault fires before `step` runs: mark the last done
            ax.plot([t], [step - 1], "x", color="black", ms=8, mew=2)
            ax.annotate(kind, (t, step - 1), xytext=(4, 4), textcoords="offset points", fontsize=8)
        ax.set_title(label, loc="left", fontsize=10)
        ax.set_ylabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(handles=[Line2D([], [], color="black", marker="x", ls="", label="fault"),
                            Patch(color="tab:red", alpha=0.15, label="recovery")],
                   loc="upper left", fontsize=8)
    axes[-1].set_xlabel("wall time since launch (s)")
    fig.suptitle("completed steps over wall time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="results.json files, one row each")
    p.add_argument("--out", help="directory for report.md and timeline.png")
    p.add_argument("--labels", help="comma-separated row names, one per results file (default: mode)")
    args = p.parse_args(argv)
    try:
        results = [load_results(path) for path in args.results]
        labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
        rows = table_rows(results, labels)
        runs: list[tuple[str, Any]] = []
        if args.out:  # read every log before writing anything
            runs = [(row["label"], events_beside(path), r.get("faults") or [])
                    for row, path, r in zip(rows, args.results, results)]
    except ReportError as exc:
        p.error(str(exc))
    print(render_text(rows), end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(render_markdown(rows))
        plot_timeline(runs, out / "timeline.png")
        print(f"wrote {out / 'report.md'} and {out / 'timeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
