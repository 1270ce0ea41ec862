"""How fast this machine trains, measured, and the bounds of local jobs that follow from it.

A CPU job's recovery timeouts are tight, so that the demo and the tests notice a hang within
seconds. They hold for a machine that trains the tiny model at FAST_STEP_S a step or faster
(2 ranks, 128-token sequences, 4 a rank). A slower machine (an older CPU, one core, other work)
stretches every bound in proportion to its measured step time, so a healthy rank is never taken
for a hung one and a job never runs out of time because the machine is slow; a fast machine
keeps them tight. The pace is measured once, with a short fault-free job (`measure`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from devtools.local import mode_flags, progress
from trainer.accounting.events import events_dir

ROOT = Path(__file__).resolve().parents[1]
FAST_STEP_S = 0.4
# The bounds on a machine at FAST_STEP_S, in seconds: the in-process watchdog notices a hang
# after 6 s (15 steps without a ping) and kills its rank after 14 s; a gloo collective gives up
# after 4 s (10 steps), so a rank waiting for a hung peer fails and restarts; ft_launcher's
# heartbeats time out after 8 s (20 steps), or with in-process restart inside, 6 s beyond the
# hard timeout.
SOFT_TIMEOUT_S = 6.0
HARD_TIMEOUT_S = 14.0
COLLECTIVE_TIMEOUT_S = 4.0
BARRIER_TIMEOUT_S = 60.0
HEARTBEAT_FLOOR_S = 8.0
HEARTBEAT_MARGIN_S = 6.0
INITIAL_HEARTBEAT_S = 120.0
RESTART_BACKOFF_S = 0.5
# The measuring job: fault-free, a few steps after the first (warm-up), a wide bound of its own.
MEASURE_STEPS = 8
MEASURE_LIMIT_S = 900.0


class PaceError(RuntimeError):
    """The measuring job failed; the message names its log."""


@dataclass(frozen=True)
class Pace:
    step_s: float  # seconds a step of the measuring job (goodput's step time)
    compute_dtype: str = ""  # what its steps computed in

    @property
    def stretch(self) -> float:
        """How much longer than on a fast machine every bound is: 1, or step_s / FAST_STEP_S."""
        return max(1.0, self.step_s / FAST_STEP_S)

    def seconds(self, fast_s: float) -> float:
        """A bound of `fast_s` seconds on a fast machine, on this one."""
        return round(fast_s * self.stretch, 1)

    def recovery_flags(self) -> list[str]:
        """The trainer's recovery timeouts for CPU ranks."""
        s = self.seconds
        return ["--soft_timeout", f"{s(SOFT_TIMEOUT_S):g}", "--hard_timeout", f"{s(HARD_TIMEOUT_S):g}",
                "--barrier_timeout", f"{s(BARRIER_TIMEOUT_S):g}",
                "--completion_timeout", f"{s(BARRIER_TIMEOUT_S):g}",
                "--nccl_timeout", f"{s(COLLECTIVE_TIMEOUT_S):g}"]

    def runner_flags(self, mode: str) -> list[str]:
        """Local-runner flags for `mode` beside `recovery_flags`: the Job's restart backoff kept
        short where the Job restarts on every fault; ft_launcher's heartbeat timeouts, beyond
        the hard timeout when in-process restart is on (`devtools.local.mode_flags`)."""
        s = self.seconds
        return mode_flags(mode, s(HARD_TIMEOUT_S), backoff_seconds=RESTART_BACKOFF_S,
                          heartbeat_floor=s(HEARTBEAT_FLOOR_S), heartbeat_margin=s(HEARTBEAT_MARGIN_S),
                          initial_heartbeat=s(INITIAL_HEARTBEAT_S))

    def job_limit(self, steps: int) -> float:
        """Seconds a job of `steps` steps may take: on a fast machine 3 s a step and 120 s for
        its start-ups and restarts, several times what they take there."""
        return self.seconds(120.0 + 3.0 * steps)

    def line(self) -> str:
        dtype = f" in {self.compute_dtype}" if self.compute_dtype else ""
        return (f"pace: {self.step_s:.2f} s a step{dtype}, bounds x{self.stretch:.1f} (soft timeout "
                f"{self.seconds(SOFT_TIMEOUT_S):g} s, hard {self.seconds(HARD_TIMEOUT_S):g} s, "
                f"collectives {self.seconds(COLLECTIVE_TIMEOUT_S):g} s)")


def measure(run_dir: Path, trainer_args: Sequence[str] = (), env: Optional[dict] = None) -> Pace:
    """This machine's pace: a fault-free job of the tiny model on 2 ranks, `MEASURE_STEPS` steps
    with `trainer_args` (the compute dtype of the jobs that follow), in `run_dir`. Without a
    background checkpoint writer: its start-up (a process importing torch) would share the cores
    with the steps measured, and double their time on 2 cores."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "devtools.local", "--mode", "baseline", "--nproc_per_node", "2",
           "--run_dir", str(run_dir), "--job_restarts", "0", "--timeout", f"{MEASURE_LIMIT_S:g}",
           "--", "--model", "tiny", "--max_steps", str(MEASURE_STEPS),
           "--log_interval", str(MEASURE_STEPS), "--final_checkpoint", "false",
           "--use_async_checkpoint", "false", *trainer_args]
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
    log = run_dir / "output.log"
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=base, stdout=out, stderr=subprocess.STDOUT)
    _, step_s = progress(events_dir(run_dir))
    if proc.returncode != 0 or not step_s:
        raise PaceError(f"the job measuring this machine's pace failed (exit {proc.returncode}); "
                        f"its log is {log}")
    results = json.loads((run_dir / "results.json").read_text())
    return Pace(step_s, results["compute_dtype"])
