"""The live view of a run, from its event log: the step and its ETA, tokens/s, restarts, the
last failure and its recovery, goodput so far and the newest durable checkpoint.

    python -m trainer.telemetry.status RUN_DIR [--interval 10] [--once]

It follows every node's file of RUN_DIR/events (`Follower`) into the `Goodput` pass of
results.json, and redraws every `--interval` seconds until rank 0 has ended training. One
function renders the view (`render`): `python -m devtools.watch` runs it on a laptop's run
directory, `nvrx-eks watch` in a short-lived pod that mounts FSx.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path
from typing import Optional, Sequence, TextIO

from trainer.accounting.events import Follower, LogStats, events_dir
from trainer.accounting.goodput import Goodput

RATE_STEPS = 20  # the recent steps whose rate gives tokens/s and the ETA
CLEAR = "\x1b[H\x1b[2J"


class Progress:
    """What the view needs besides the goodput pass: the run's length and tokens per step (rank
    0's `train_start`), and the rate of its recent steps (wall clock, stalls included)."""

    def __init__(self) -> None:
        self.max_steps: Optional[int] = None
        self.tokens_per_step: Optional[int] = None
        self.recent: deque[tuple[float, int]] = deque(maxlen=RATE_STEPS)

    def feed(self, e: dict) -> None:
        if e["rank"] != 0:
            return
        if e["event"] == "train_start":
            self.max_steps = e.get("max_steps", self.max_steps)
            self.tokens_per_step = e.get("tokens_per_step", self.tokens_per_step)
            self.recent.clear()  # a restart's pause is not the rate of training
        elif e["event"] == "step":
            self.recent.append((e.get("done") or e["t"], e["step"]))

    def steps_per_second(self) -> Optional[float]:
        if len(self.recent) < 2:
            return None
        (t0, s0), (t1, s1) = self.recent[0], self.recent[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def duration(seconds: float) -> str:
    """3h 05m, 12m 30s, 42s."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def _failure_line(f: dict) -> str:
    who = f"rank {f['rank']}" if f["rank"] is not None else "unknown rank"
    what = f["type"] or f["detection"]
    line = f"step {f['step']}, {who}, {what} (detected by {f['detected_by']})"
    if f["recovery_seconds"] is None:
        return line + ": recovering"
    line += f", recovered in {f['recovery_seconds']:.2f} s, {f['steps_lost']} step(s) trained again"
    return line + (f", from the {f['restored_from']} tier" if f["restored_from"] else "")


def render(where: str, summary: Optional[dict], progress: Progress, stats: LogStats,
           ended: bool, now: float) -> list[str]:
    """The view's lines: what the log says so far."""
    if summary is None:
        return [f"run {where}: no event yet"]
    step, total = summary["steps_completed"], progress.max_steps
    state = "ended" if ended else "training"
    lines = [f"run {where}: {state}, {duration(summary['wall_seconds'])} since launch"]
    rate = progress.steps_per_second()
    head = f"step      {step}" + (f"/{total} ({100 * step / total:.1f} %)" if total else "")
    if total and not ended:
        head += f", ETA {duration((total - step) / rate)}" if rate else ", ETA unknown"
    lines.append(head)
    if rate and progress.tokens_per_step and not ended:
        lines.append(f"tokens/s  {rate * progress.tokens_per_step:,.0f} (last {len(progress.recent)} "
                     "steps, stalls included)")
    faults = summary["faults"]
    lines.append(f"restarts  {summary['restarts']}, failures {len(faults)}")
    if faults:
        lines.append(f"last failure  {_failure_line(faults[-1])}")
    lines.append(f"goodput   training {summary['training_goodput_pct']:.1f} %, infra "
                 f"{summary['infra_goodput_pct']:.1f} %")
    ckpt = summary["checkpoint"]
    if ckpt["last_step"] is not None:
        lines.append(f"checkpoint  step {ckpt['last_step']}, committed "
                     f"{duration(now - ckpt['last_committed_at'])} ago, written in "
                     f"{ckpt['last_write_seconds']:.1f} s")
    lines.append(f"events    {stats.files} file(s), {stats.events} event(s)"
                 + (f", {stats.unreadable} unreadable line(s) skipped" if stats.unreadable else ""))
    return lines


class RunView:
    """A run directory's log, followed: `poll` reads what was appended and renders."""

    def __init__(self, run_dir: Path):
        self.where = str(run_dir)
        self.stats = LogStats()
        self.follower = Follower(events_dir(run_dir), self.stats)
        self.goodput = Goodput(0, 0)
        self.progress = Progress()

    def poll(self, final: bool = False) -> list[str]:
        while True:
            for e in self.follower.poll(final=final or self.goodput.ended):
                self.goodput.feed(e)
                self.progress.feed(e)
            if not self.follower.behind:
                break
        summary = self.goodput.summary() if self.goodput.events else None
        return render(self.where, summary, self.progress, self.stats, self.goodput.ended, time.time())


def watch(run_dir: Path, interval: float, once: bool, out: TextIO = sys.stdout) -> int:
    """Redraw until rank 0 has ended training (or once); a terminal is redrawn in place."""
    view = RunView(run_dir)
    redraw = out.isatty()
    while True:
        lines = view.poll(final=once)
        out.write((CLEAR if redraw else "") + "\n".join(lines) + "\n" + ("" if redraw else "\n"))
        out.flush()
        if once or view.goodput.ended:
            return 0
        time.sleep(interval)


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m trainer.telemetry.status") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="the run's directory (results.json and events/ are there)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="show the view once and exit")
    args = p.parse_args(argv)
    if args.interval <= 0:
        p.error(f"--interval {args.interval:g} must be positive")
    if not args.run_dir.is_dir():
        p.error(f"{args.run_dir} is not a directory")
    try:
        return watch(args.run_dir, args.interval, args.once)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
