"""Set-up and tear-down never trip the training-progress timeouts, re-entry is idempotent at
every set-up point, errors that recur without progress end the job at once, and a fault during
the final save costs neither a rewind nor the result. Real jobs, real NVRx, CPU ranks."""

import pytest

from devtools.pace import Pace
from tests.jobs import STEPS, events, faults, faults_fired, first, ok, results, run_local, runner_error

from trainer.faults.inject import POINT_FAULTS_ENV
from trainer.phases import SLOW_PHASE_ENV

TIERS = ("--tiers", "memory,node", "--snapshot_interval", "1")
# Seconds on a fast machine (`devtools.pace`): heartbeats shorter than the slow phases below,
# where the mode allows it (with in-process restart inside, the heartbeat must outlast the hard
# timeout of 14 s); the slow phases beyond the soft timeout (6 s) and that heartbeat.
HEARTBEAT_S = {"ft_launcher": 6.0, "ft_launcher+inprocess": 20.0}
SLOW_S = 8.0


def local_args(mode: str, pace: Pace) -> tuple[str, ...]:
    return ("--heartbeat_timeout", f"{pace.seconds(HEARTBEAT_S[mode]):g}") if mode in HEARTBEAT_S else ()


# The two modes whose timeouts a slow phase could trip: the launcher's heartbeat, and with
# in-process restart also the Wrapper's soft and hard timeouts. baseline and inprocess carry a
# subset of them (the collective timeout every mode has; the Wrapper's alone).
@pytest.mark.parametrize("mode", ("ft_launcher", "ft_launcher+inprocess"))
def test_slow_startup_first_step_checkpoint_commit_and_final_save_cost_no_restart(cache_dir, pace, tmp_path, mode):
    run_dir = tmp_path / "run"
    slow = f"{pace.seconds(SLOW_S):g}"
    proc = run_local(cache_dir, mode, run_dir, "--max_steps", "8", "--checkpoint_interval", "4",
                     *TIERS, *pace.recovery_flags(), local_args=local_args(mode, pace),
                     extra_env={SLOW_PHASE_ENV: f"startup={slow},first_step={slow},checkpoint={slow},"
                                               f"final={slow},commit={slow}"})
    ok(proc)
    res = results(run_dir)  # asserts restarts == 0
    assert res["steps_completed"] == 8
    # No restart was even started: NVRx may still tear its process group down through the
    # abort hook once the work is complete, so only aborts before the end count.
    ev = events(run_dir)
    end = max(e["t"] for e in ev if e["event"] == "train_end")
    assert not [e for e in ev if e["event"] == "abort" and e["t"] < end]


def test_reentry_interrupted_at_every_setup_point_recovers(cache_dir, pace, reference, tmp_path):
    ref = reference()
    run_dir = tmp_path / "run"
    # An exception at a step, then each re-entry fails at the next set-up point, on either rank.
    points = "model:1:1,buffers:0:2,restore:1:3"
    proc = run_local(cache_dir, "inprocess", run_dir, "--max_steps", str(STEPS),
                     "--checkpoint_interval", "4", *TIERS, *pace.recovery_flags(), *faults("exception"),
                     extra_env={POINT_FAULTS_ENV: points})
    ok(proc)
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["param_sha256"] == ref["param_sha256"]
    fired = faults_fired(run_dir)
    assert [f.get("point") for f in fired] == [None, "model", "buffers", "restore"]
    assert res["restarts"] == 4


def test_same_error_before_any_progress_ends_the_job_with_its_cause(cache_dir, pace, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, "inprocess", run_dir, "--max_steps", str(STEPS),
                     "--checkpoint_interval", "4", *TIERS, *pace.recovery_flags(), *faults("exception"),
                     extra_env={POINT_FAULTS_ENV: "buffers:1:1,buffers:1:2,buffers:1:3,buffers:1:4"})
    assert proc.returncode == 1
    last = runner_error(proc.stderr)
    assert last.startswith("devtools.local: error: mode inprocess could not recover"), proc.stderr[-3000:]
    assert "InjectedFault: injected exception at buffers" in last
    assert "failed again before training a step" in last
    # the second identical failure ends it: the third and fourth never fire
    assert [f.get("point") for f in faults_fired(run_dir)] == [None, "buffers", "buffers"]


@pytest.mark.parametrize("mode", ("inprocess", "ft_launcher"))
def test_fault_during_the_final_save_is_survived_without_a_rewind(cache_dir, pace, reference, tmp_path, mode):
    ref = reference()
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, mode, run_dir, "--max_steps", str(STEPS), "--checkpoint_interval",
                     "4", *TIERS, *pace.recovery_flags(), local_args=local_args(mode, pace),
                     extra_env={POINT_FAULTS_ENV: "final:1"})
    ok(proc)
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["param_sha256"] == ref["param_sha256"]
    (fault,) = faults_fired(run_dir)
    assert fault["point"] == "final"
    resumed = [e["step"] for e in events(run_dir) if e["event"] == "train_start" and e["t"] > fault["t"]]
    assert resumed and all(step == STEPS for step in resumed)  # never rewound
    if mode == "ft_launcher":  # the other rank left at once, without the launcher's signal
        left = first(events(run_dir), "peer_failed", after=fault["t"])
        assert left and left["failed_rank"] == fault["rank"] != left["rank"]
