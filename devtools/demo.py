"""`python -m devtools.demo` (what `make demo` runs): the post's two claims, on a laptop.

Part 1, checkpoint cost: the tiny model trained twice with a checkpoint every 10 steps, once
with blocking (sync) and once with async checkpoints; prints both training efficiencies.
Part 2, recovery: one seeded schedule of 3 faults (exceptions and hangs) in every recovery
mode; prints the comparison table and writes <out>/report/{report.md,timeline.png}. The
baseline keeps only durable checkpoints, like the published one; the NVRx modes also keep a
snapshot of every step in host memory and on the node (--tiers memory,node).

First a short fault-free job measures this machine's pace (`devtools.pace`): the recovery
timeouts and each job's time limit follow it, so a slow machine makes the demo slower, never
makes it fail. Then six jobs of 2 CPU ranks, about 5-6 minutes on 2 cores. Each job starts from
an empty <out>/<job>/ and keeps its whole output in <out>/<job>/output.log; the terminal shows
the lines that tell the story (steps, faults, restarts, results) with the job's name in front.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from config.training import choices
from devtools import report
from devtools.local import tier_flags
from devtools.pace import Pace, PaceError, measure
from trainer.config import MODE_NAMES

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--model", "tiny", "--log_interval", "20"]
FAULTS = ["--fault_count", "3", "--fault_seed", "42", "--fault_after_step", "10",
          "--fault_types", "exception,hang", "--fault_type_weights", "0.6,0.4"]
# Trainer and runner lines worth showing live; launcher chatter and tracebacks stay in the log.
SHOW = re.compile(r"^(\S+Z (step|checkpoint) |resumed |no checkpoint |done: |devtools\.local|rank[ =]\d)"
                  r"|: error: |training goodput|will restart worker group")


class DemoError(RuntimeError):
    """A job failed; the message names it and its log."""


def run_job(name: str, mode: str, run_dir: Path, local_args: Sequence[str],
            trainer_args: Sequence[str], timeout_s: float) -> dict:
    """One local-runner job, streamed to the terminal and its log; returns its results.json.
    A job still running after timeout_s is stopped: a stuck job fails the demo, never hangs it."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a leftover checkpoint would be resumed from
    run_dir.mkdir(parents=True)
    log_path = run_dir / "output.log"
    cmd = [sys.executable, "-m", "devtools.local", "--mode", mode, "--nproc_per_node", "2",
           "--run_dir", str(run_dir), "--timeout", f"{timeout_s:g}", *local_args, "--",
           *MODEL, *trainer_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"\n=== {name}: {mode}, output in {log_path}", flush=True)
    with log_path.open("w") as log, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout:
            log.write(line)
            if SHOW.search(line):
                print(f"[{name}] {line.rstrip()[:160]}", flush=True)
    results = run_dir / "results.json"
    if proc.returncode != 0 or not results.is_file():
        raise DemoError(f"job {name} failed (exit {proc.returncode}); its log is {log_path}")
    return json.loads(results.read_text())


def checkpoint_cost(out: Path, steps: int, pace: Pace, common: Sequence[str]) -> None:
    """Part 1: the same run with sync and async checkpoints; only the blocking time differs."""
    flags = [*common, "--max_steps", str(steps), "--checkpoint_interval", "10"]
    once = ["--job_restarts", "0"]  # no faults here: a failure is real, restarting would hide it
    limit = pace.job_limit(steps)
    sync = run_job("sync", "baseline", out / "sync", once,
                   [*flags, "--use_async_checkpoint", "false"], limit)
    asyn = run_job("async", "baseline", out / "async", once,
                   [*flags, "--use_async_checkpoint", "true"], limit)
    rows = report.table_rows([sync, asyn], ["sync", "async"])
    print(f"\ncheckpoint cost: {steps} steps, a checkpoint every 10 steps")
    print(f"{'':24}{'sync':>10}{'async':>10}")
    for key, name in (("training_efficiency_pct", "training efficiency %"),
                      ("ckpt_blocking_seconds", "blocking seconds")):
        print(f"{name:24}" + "".join(f"{report.cell(r, key):>10}" for r in rows), flush=True)


def recovery(out: Path, steps: int, pace: Pace, common: Sequence[str]) -> int:
    """Part 2: the same faults in every mode, then the post's comparison table and timeline."""
    flags = [*common, "--max_steps", str(steps), "--checkpoint_interval", str(steps // 4),
             *FAULTS, *pace.recovery_flags()]
    paths = []
    for mode in MODE_NAMES:
        run_dir = out / mode.replace("+", "-")
        run_job(mode, mode, run_dir, pace.runner_flags(mode), [*flags, *tier_flags(mode)],
                pace.job_limit(steps))
        paths.append(str(run_dir / "results.json"))
    print(f"\nrecovery: {steps} steps, checkpoint every {steps // 4}, the same 3 seeded faults")
    return report.main([*paths, "--out", str(out / "report")])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/demo", help="directory for the six jobs and the report")
    p.add_argument("--steps", type=int, default=100, help="training steps per job (at least 40)")
    p.add_argument("--compute_dtype", choices=choices("compute_dtype"), default="auto",
                   help="the trainer's --compute_dtype for every job")
    args = p.parse_args(argv)
    if args.steps < 40:  # room for 3 faults after step 10 and 4 checkpoints
        p.error(f"--steps {args.steps} must be at least 40")
    out = Path(args.out)
    common = ["--compute_dtype", args.compute_dtype]
    started = time.time()
    try:
        print("=== pace: a short fault-free job measures this machine's step time", flush=True)
        shutil.rmtree(out / "pace", ignore_errors=True)
        pace = measure(out / "pace", common)
        print(pace.line(), flush=True)
        checkpoint_cost(out, args.steps, pace, common)
        rc = recovery(out, args.steps, pace, common)
    except (DemoError, PaceError) as exc:
        print(f"python -m devtools.demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"demo finished in {time.time() - started:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
