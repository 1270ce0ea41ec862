"""A launcher killed with SIGKILL takes every process of its run with it, in every recovery mode,
and the next run takes the directory over and ends exactly where an uninterrupted run does.

Each mode is killed twice at seeded random instants: the pods' launcher (`trainer.recovery.launch`)
during start-up, then the local runner between two checkpoints. Every process of a run carries a
marker in its environment, so the test finds them wherever they went (forked, spawned,
double-forked, adopted by init).
"""

import os
import random
import signal
import time
import uuid

import pytest

from devtools.local import free_port_block, tier_flags
from tests.jobs import (INTERVAL, STEPS, events, launcher_cmd, local_cmd, marked, ok,
                        recovery_flags, results, run_local, runner_flags, start, wait_for)

MARK = "NVRX_EKS_TEST_RUN"
GONE_BOUND_S = 60  # how long the test waits for the run's processes to go before it fails
TAKEOVER = "taking over the lease of run"


def kill_and_expect_none_left(job, mark: str) -> None:
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + GONE_BOUND_S
    while (left := marked(MARK, mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]  # before they go
    for proc in left:  # never leave them to the rest of the suite
        proc.kill()
    assert not left, "outlived their launcher: " + "; ".join(described)


def step_events_since(run_dir, t: float) -> list[int]:
    return [e["step"] for e in events(run_dir) if e["event"] == "step" and e["t"] >= t]


@pytest.mark.parametrize("mode", ["baseline", "ft_launcher", "inprocess", "ft_launcher+inprocess"])
def test_killed_launchers_leave_nothing_behind_and_the_next_run_resumes_exactly(
        cache_dir, reference, tmp_path, mode):
    ref = reference()
    rng = random.Random(f"launcher-death/{mode}")
    run_dir = tmp_path / "run"
    lease = run_dir / "checkpoints" / "LEASE.json"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL), *tier_flags(mode),
            *recovery_flags(cache_dir))

    # 1. The pods' launcher, its process group killed while the ranks start.
    mark = uuid.uuid4().hex
    job = start(launcher_cmd(mode, run_dir, free_port_block(), *args), cache_dir, run_dir,
                {MARK: mark})
    wait_for(lambda: any(e["event"] == "launch" and e["rank"] == 0 for e in events(run_dir)),
             what="the first rank to start")
    time.sleep(rng.uniform(0.0, 3.0))
    kill_and_expect_none_left(job, mark)

    # 2. The local runner resumes, and its process group is killed between two checkpoints.
    leased = lease.exists()
    mark, since = uuid.uuid4().hex, time.time()
    kill_at = rng.randint(INTERVAL + 1, STEPS - 2)
    job = start(local_cmd(mode, run_dir, *args, local_args=runner_flags(cache_dir, mode)),
                cache_dir, run_dir, {MARK: mark})
    wait_for(lambda: max(step_events_since(run_dir, since), default=0) >= kill_at or
             job.poll() is not None, what=f"step {kill_at}")
    assert job.poll() is None, (run_dir / "test-output.log").read_text()[-3000:]
    time.sleep(rng.uniform(0.0, 0.5))
    kill_and_expect_none_left(job, mark)
    log = (run_dir / "test-output.log").read_text()
    assert (TAKEOVER in log) == leased, log[-3000:]
    assert lease.exists()  # the killed run held it

    # 3. The next run takes the directory over and ends with the uninterrupted run's parameters.
    proc = run_local(cache_dir, mode, run_dir, *args, local_args=runner_flags(cache_dir, mode))
    ok(proc)
    assert TAKEOVER in proc.stdout + proc.stderr
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["param_sha256"] == ref["param_sha256"]
