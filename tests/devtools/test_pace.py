"""Local jobs' bounds follow the machine's measured pace: tight on a fast machine, stretched in
proportion on a slower one, always a valid set of trainer and runner settings; a job out of time
says how far it got and how fast."""

import subprocess
import sys

import pytest

from config.contract import MODE_NAMES
from devtools import pace as pacing
from devtools.local import progress
from devtools.pace import Pace
from tests.jobs import JOB_FLAGS, ROOT, env_for, faults, stretched
from trainer.accounting.events import EventLog, events_dir
from trainer.config import parse_args
from trainer.loop.precision import choose
from trainer.recovery.launch import LaunchSpec, check


def _flag(flags: list[str], name: str) -> float:
    return float(flags[flags.index(name) + 1])


def test_a_fast_machine_keeps_the_tight_bounds():
    for step_s in (0.05, pacing.FAST_STEP_S):
        flags = Pace(step_s).recovery_flags()
        assert _flag(flags, "--soft_timeout") == pacing.SOFT_TIMEOUT_S
        assert _flag(flags, "--hard_timeout") == pacing.HARD_TIMEOUT_S
        assert _flag(flags, "--nccl_timeout") == pacing.COLLECTIVE_TIMEOUT_S


def test_a_slower_machine_stretches_every_bound_in_proportion():
    slow = Pace(3 * pacing.FAST_STEP_S)
    assert slow.stretch == pytest.approx(3)
    flags = slow.recovery_flags()
    assert _flag(flags, "--soft_timeout") == 3 * pacing.SOFT_TIMEOUT_S
    assert _flag(flags, "--nccl_timeout") == 3 * pacing.COLLECTIVE_TIMEOUT_S
    assert slow.job_limit(100) == 3 * Pace(pacing.FAST_STEP_S).job_limit(100)
    ft = slow.runner_flags("ft_launcher")
    assert _flag(ft, "--heartbeat_timeout") == 3 * pacing.HEARTBEAT_FLOOR_S
    assert _flag(ft, "--initial_heartbeat_timeout") == 3 * pacing.INITIAL_HEARTBEAT_S


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("step_s", (0.1, 0.9, 7.3))
def test_the_bounds_are_valid_trainer_and_runner_settings_at_any_pace(mode, step_s):
    p = Pace(step_s)
    cfg = parse_args(["--mode", mode, "--device", "cpu", *p.recovery_flags()])
    flags = p.runner_flags(mode)
    if "--heartbeat_timeout" in flags:
        check(LaunchSpec(mode, 1, 2, 0, "127.0.0.1", heartbeat_timeout=_flag(flags, "--heartbeat_timeout")),
              cfg)
    assert cfg.collective_timeout("cpu") < cfg.soft_timeout  # a rank behind a hung peer fails first


def test_the_measured_pace_is_this_machines(pace):
    assert pace.step_s > 0
    assert pace.compute_dtype == choose("auto", "cpu").name


def test_progress_reads_the_step_reached_and_the_step_time(tmp_path):
    path = tmp_path / "events.jsonl"
    assert progress(path) == (0, None)
    log = EventLog(path, rank=0)
    log.emit("train_start", step=0)
    for step, dt in ((1, 3.0), (2, 0.5), (3, 0.7), (4, 0.6)):
        log.emit("step", step=step, dt=dt)
    assert progress(path) == (4, 0.6)  # the first step (warm-up) left out


def test_a_job_out_of_time_names_the_step_it_reached_and_its_step_time(cache_dir, pace, tmp_path):
    # A rank hangs at a step; the peer's collective timeout lies beyond the job's limit.
    run_dir = tmp_path / "run"
    limit = stretched(25)
    proc = subprocess.run(
        [sys.executable, "-m", "devtools.local", "--mode", "baseline", "--run_dir", str(run_dir),
         "--job_restarts", "0", "--timeout", f"{limit:g}", "--", *JOB_FLAGS, "--max_steps", "16",
         "--nccl_timeout", f"{2 * limit:g}", *faults("hang", after=4)],
        cwd=ROOT, env=env_for(cache_dir), capture_output=True, text=True, timeout=4 * limit)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    reached, step_s = progress(events_dir(run_dir))
    assert reached >= 4 and step_s > 0
    assert last == (f"devtools.local: error: job did not finish within {limit:g} s: it reached "
                    f"step {reached} of 16 at {step_s:.2f} s a step")
