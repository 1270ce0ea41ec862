"""In-process mode, a rank frozen (SIGSTOP) right after it handed a checkpoint to its writer: NVRx's
watchdog kills it at the hard timeout, which ends the job. The job's last line names the rank,
the signal and the timeouts; the checkpoint that landed meanwhile is committed although rank 0's
loop never ran again; the next run takes the directory over and ends exactly."""

import json
import os
import signal

from devtools.local import tier_flags
from tests.jobs import (STEPS, events, local_cmd, ok, recovery_flags, results, run_local,
                        runner_error, runner_flags, start, wait_for)
from trainer.phases import SLOW_PHASE_ENV

INTERVAL = 4
WRITE_S = 5  # each shard's write: the frozen rank's lands long after rank 0's loop stopped


def test_a_rank_killed_by_the_watchdog_is_named_and_what_landed_is_committed(
        cache_dir, reference, tmp_path):
    ref = reference()
    run_dir = tmp_path / "run"
    mode = "inprocess"
    timeouts = recovery_flags(cache_dir)
    soft, hard = (timeouts[timeouts.index(f"--{name}_timeout") + 1] for name in ("soft", "hard"))
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL), *tier_flags(mode),
            *timeouts)
    job = start(local_cmd(mode, run_dir, *args), cache_dir, run_dir,
                {SLOW_PHASE_ENV: f"write={WRITE_S}"})
    saved = lambda: next((e for e in events(run_dir) if e["event"] == "ckpt_save"  # noqa: E731
                          and e["rank"] == 1 and e["step"] == INTERVAL), None)
    wait_for(lambda: saved() is not None or job.poll() is not None, what="rank 1's first save")
    os.kill(saved()["pid"], signal.SIGSTOP)
    assert job.wait(timeout=600) == 1
    log = (run_dir / "test-output.log").read_text()
    last = runner_error(log)
    assert "rank 1: WatchdogTimeout" in last, log[-3000:]
    assert "SIGTERM" in last and f"--hard_timeout {hard} s" in last and f"--soft_timeout {soft} s" in last

    ev = events(run_dir)
    killed = next(e for e in ev if e["event"] == "error" and e["type"] == "WatchdogTimeout")
    # committed while rank 0's loop waited for the frozen rank, before the watchdog fired
    commit = next(e for e in ev if e["event"] == "ckpt_commit" and e["step"] == INTERVAL)
    assert saved()["t"] + WRITE_S < commit["t"] < killed["t"]
    checkpoints = run_dir / "checkpoints"
    assert json.loads((checkpoints / "latest").read_text())["step"] == INTERVAL
    lease = json.loads((checkpoints / "LEASE.json").read_text())
    assert {p["role"] for p in lease["processes"]} == {"rank 0", "launcher"}
    assert all(p["pid"] > 1 and p["start"] > 0 for p in lease["processes"])

    proc = run_local(cache_dir, mode, run_dir, *args)
    ok(proc)
    assert f"taking over the lease of run {lease['run']}" in proc.stdout + proc.stderr
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["param_sha256"] == ref["param_sha256"]
