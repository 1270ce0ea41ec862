"""Failures nobody injected are counted: a rank frozen or killed from outside, with no fault
schedule, is one faults[] entry with its detection and recovery, and costs goodput."""

import os
import signal

import pytest

from devtools.local import EVERY_STEP_TIERS
from tests.jobs import (INTERVAL, STEPS, events, first, ok, pace, recovery_flags, results,
                        runner_flags, start_local, stretched, wait_for)


def _job(cache_dir, mode, run_dir, *extra):
    return start_local(cache_dir, mode, run_dir, "--max_steps", str(STEPS), "--checkpoint_interval",
                       str(INTERVAL), *EVERY_STEP_TIERS, *recovery_flags(cache_dir), *extra,
                       local_args=runner_flags(cache_dir, mode))


def _rank1_after_step(run_dir, step: int) -> int:
    """Rank 1's pid, once rank 0 has completed `step`."""
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= step for e in events(run_dir)),
             timeout=stretched(180), what=f"step {step}")
    return next(e["pid"] for e in events(run_dir) if e["event"] == "launch" and e["rank"] == 1)


def _finished(job, run_dir) -> None:
    job.wait(timeout=stretched(300))
    log = (run_dir / "test-output.log").read_text()
    assert job.returncode == 0, f"exit {job.returncode}\n{log[-4000:]}"


@pytest.mark.parametrize("resumed", ["sigcont", "watchdog"])
def test_a_frozen_rank_is_one_counted_failure(cache_dir, reference, tmp_path, resumed):
    """SIGSTOP beyond the soft timeout under ft_launcher+inprocess: then SIGCONT (the Wrapper
    restarts in-process), or left frozen until the Wrapper's watchdog kills it (the launcher
    restarts the workers). The peer's collective outlasts the soft timeout, as NCCL's does on
    GPUs: what sees the frozen rank first is the Wrapper's watchdog, not the peer's timeout."""
    ref = reference()
    run_dir = tmp_path / "run"
    # between the soft (6 s) and the hard timeout (14 s), at this machine's pace
    collective_s = pace(cache_dir).seconds(10)
    job = _job(cache_dir, "ft_launcher+inprocess", run_dir, "--nccl_timeout", f"{collective_s:g}")
    pid = _rank1_after_step(run_dir, 4)
    os.kill(pid, signal.SIGSTOP)
    if resumed == "sigcont":
        wait_for(lambda: first(events(run_dir), "abort") is not None, timeout=stretched(120),
                 what="the Wrapper's abort")
        os.kill(pid, signal.SIGCONT)
    _finished(job, run_dir)
    res = results(run_dir, signalled=True)
    assert res["param_sha256"] == ref["param_sha256"]
    (f,) = res["faults"]
    assert f["injected"] == [] and f["type"] is None
    # the peer, blocked in the collective, stops its progress stamps at the same step: the
    # Wrapper names whichever stopped first, the frozen rank or (under load) that peer
    assert f["failed_ranks"] and set(f["failed_ranks"]) <= {0, 1}
    assert (f["detected_by"], f["detection"]) == ("inprocess", "soft_timeout")
    assert f["t_source"] in ("last_step", "last_event_of_rank")
    assert 0 < f["detected_seconds"] < f["recovery_seconds"]
    assert f["steps_lost"] is not None and 0 <= f["steps_lost"] <= 2 * INTERVAL
    assert res["restarts"] == len(f["restarts"]) >= 1
    if resumed == "sigcont":
        # the Wrapper restarts in-process; or, where the resumed rank's monitor thread, frozen
        # with it, raises its restart a second time during the first (NVRx 0.4.1 under load),
        # that rank gives up and the launcher restarts the workers: one failure either way
        assert f["restarts"] in (["inprocess"], ["launcher"])
        assert f["restored_from"] == ("memory" if f["restarts"] == ["inprocess"] else "node")
    else:
        assert "launcher" in f["restarts"] and f["restored_from"] == "node"
        # the watchdog killed the frozen rank, whichever rank the fault's entry names (the
        # peer, under load, exits 1 once its Wrapper gives up)
        deaths = {d["pid"]: d["signal"] for e in events(run_dir)
                  if e["event"] == "workers_failed" for d in e["failures"]}
        assert deaths.get(pid) in ("SIGTERM", "SIGKILL"), deaths
    assert 0 < res["training_goodput_pct"] <= res["infra_goodput_pct"] < 100


def test_a_killed_rank_is_one_counted_failure(cache_dir, reference, tmp_path):
    ref = reference()
    run_dir = tmp_path / "run"
    job = _job(cache_dir, "ft_launcher", run_dir)
    os.kill(_rank1_after_step(run_dir, 4), signal.SIGKILL)
    _finished(job, run_dir)
    res = results(run_dir, signalled=True)
    assert res["param_sha256"] == ref["param_sha256"]
    (f,) = res["faults"]
    assert f["injected"] == [] and f["rank"] == 1
    assert (f["detected_by"], f["detection"], f["signal"]) == ("launcher", "process_death", "SIGKILL")
    assert f["t_source"] in ("last_step", "last_event_of_rank")
    assert f["restarts"] == ["launcher"] and res["restarts"] == 1
    assert f["restored_from"] == "node" and 0 <= f["steps_lost"] <= 2 * INTERVAL
    assert 0 < f["detected_seconds"] < f["recovery_seconds"]
    assert 0 < res["training_goodput_pct"] <= res["infra_goodput_pct"] < 100


def test_a_silent_rank_is_found_by_its_heartbeat(cache_dir, reference, tmp_path):
    """SIGSTOP under ft_launcher, the peer's collective outlasting the heartbeat timeout: the
    rank monitors (processes the launcher forks) find the silence and kill the ranks. The peer,
    blocked in the collective, stops heartbeating at the same step: both are named."""
    ref = reference()
    run_dir = tmp_path / "run"
    # well beyond the heartbeat timeout (8 s), at this machine's pace: on a slow machine a fixed
    # 30 s let the peer's collective give up first, and the launcher's stop signal reach rank 1
    collective_s = pace(cache_dir).seconds(30)
    job = _job(cache_dir, "ft_launcher", run_dir, "--nccl_timeout", f"{collective_s:g}")
    os.kill(_rank1_after_step(run_dir, 4), signal.SIGSTOP)
    _finished(job, run_dir)
    res = results(run_dir, signalled=True)
    assert res["param_sha256"] == ref["param_sha256"]
    (f,) = res["faults"]
    assert f["detected_by"] == "launcher" and 1 in f["failed_ranks"]
    assert (f["detection"], f["signal"]) == ("heartbeat_timeout", "SIGKILL")
    assert [e["how"] for e in f["evidence"]] == ["heartbeat_timeout", "process_death"]
    assert f["restarts"] == ["launcher"] and res["restarts"] == 1
    assert 0 < res["training_goodput_pct"] <= res["infra_goodput_pct"] < 100
