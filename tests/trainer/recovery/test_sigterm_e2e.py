"""SIGTERM, as a pod gets it on deletion, drain or spot interruption: the ranks commit the newest
state within the grace period and exit, the launcher exits 143, and the next run resumes from
that state and ends with the uninterrupted run's parameters. Real processes, every mode."""

import random
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from config import MODE_NAMES
from devtools.local import free_port_block, tier_flags
from tests.jobs import (INTERVAL, STEPS, events, launcher_cmd, ok, recovery_flags, results,
                        run_local, runner_flags, start, wait_for)
from trainer.termination import SIGTERM_EXIT_CODE



def terminated_run(cache_dir, mode: str, run_dir, *args: str) -> tuple[int, int, str]:
    """The pods' launcher, sent SIGTERM once rank 0 has reported a seeded step between two
    checkpoints; returns (the step reported then, the last step reported, the log). The
    launcher's own temporary folder is gone once it has exited."""
    at = random.Random(f"sigterm/{mode}").randint(INTERVAL + 1, STEPS - 3)
    # short: multiprocessing puts its sockets' paths in here too
    scratch = Path(tempfile.mkdtemp(prefix="nvrx-eks-t"))
    job = start(launcher_cmd(mode, run_dir, free_port_block(), *args), cache_dir, run_dir,
                {"TMPDIR": str(scratch)})
    wait_for(lambda: max(steps(run_dir), default=0) >= at or job.poll() is not None,
             what=f"step {at}")
    signalled_at = max(steps(run_dir), default=0)
    job.send_signal(signal.SIGTERM)  # PID 1 of a pod: the launcher alone
    code = job.wait()
    log = (run_dir / "test-output.log").read_text()
    assert code == SIGTERM_EXIT_CODE, log[-3000:]
    assert not (run_dir / "results.json").exists()  # the run is not over
    assert not list(scratch.glob("nvrx-eks-launch-*"))
    shutil.rmtree(scratch, ignore_errors=True)
    return signalled_at, max(steps(run_dir)), log


def steps(run_dir) -> list[int]:
    return [e["step"] for e in events(run_dir) if e["event"] == "step"]


def resumed_step(run_dir) -> int:
    """The step the next run's ranks restored (from a snapshot or a checkpoint)."""
    loads = [e for e in events(run_dir) if e["event"] in ("ckpt_load", "snapshot_load")]
    return loads[-1]["step"]


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_sigterm_commits_the_newest_step_and_the_next_run_resumes_from_it(
        cache_dir, reference, tmp_path, mode):
    ref = reference()
    run_dir = tmp_path / "run"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL), *tier_flags(mode),
            *recovery_flags(cache_dir))
    signalled_at, reached, log = terminated_run(cache_dir, mode, run_dir, *args)
    assert reached >= signalled_at  # the step in flight was finished, none was undone
    assert f"stopped by SIGTERM at step {reached}: checkpoint step {reached} committed" in log
    assert "SignalException" not in log
    # neither launcher took the stop for a failure: no worker was started twice
    assert len([e for e in events(run_dir) if e["event"] == "launch"]) == 2

    proc = run_local(cache_dir, mode, run_dir, *args, local_args=runner_flags(cache_dir, mode))
    ok(proc)
    assert resumed_step(run_dir) == reached  # no step lost
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["param_sha256"] == ref["param_sha256"]


def test_sigterm_with_no_time_to_write_loses_only_the_steps_since_the_last_checkpoint(
        cache_dir, reference, tmp_path):
    """A grace period that leaves nothing for a write (the trainer keeps 10 s for its exit):
    the newest step is not written, and the next run resumes from the last periodic checkpoint.
    Sync checkpoints: each one is on storage by the end of its step."""
    ref = reference()
    run_dir = tmp_path / "run"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL),
            "--use_async_checkpoint", "false", "--termination_grace", "10")
    _, reached, _ = terminated_run(cache_dir, "baseline", run_dir, *args)
    assert not any(e["event"] == "stopped" and e["wrote"] for e in events(run_dir))

    proc = run_local(cache_dir, "baseline", run_dir, *args)
    ok(proc)
    assert resumed_step(run_dir) == reached - reached % INTERVAL
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["param_sha256"] == ref["param_sha256"]
