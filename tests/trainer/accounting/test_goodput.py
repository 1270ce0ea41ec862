"""Goodput formulas on a hand-made timeline, where every number is known."""

import pytest

from trainer.accounting.goodput import summarize


def _ev(t, event, rank=0, **kw):
    return {"t": t, "event": event, "rank": rank, **kw}


def test_one_fault_timeline():
    ev = [_ev(0.0, "launch"), _ev(0.0, "launch", 1), _ev(1.0, "pg_ready"), _ev(2.0, "train_start", step=0)]
    ev += [_ev(2.0 + s, "step", step=s, dt=1.0, stall=0.5 if s == 3 else 0.0)
           for s in range(1, 7)]  # steps 1..6, 1 s each; step 3 checkpoints
    ev += [_ev(5.0, "ckpt_save", step=3, blocking_s=0.5, bytes=100)]
    ev += [_ev(8.5, "fault", 1, step=7, type="exception"), _ev(9.5, "abort"),
           _ev(9.6, "pg_aborted", seconds=0.1), _ev(9.8, "handover"),
           _ev(9.9, "health_check", which="restart_health_check"),
           _ev(10.0, "attempt_start", iteration=1), _ev(10.5, "pg_ready"), _ev(11.0, "ckpt_load", step=3, tier="durable"),
           _ev(11.0, "train_start", step=3)]
    ev += [_ev(11.0 + (s - 3), "step", step=s, dt=1.0) for s in range(4, 11)]  # replay 4..6, then 7..10
    ev += [_ev(17.5, "ckpt_save", step=10, blocking_s=0.25, bytes=100, final=True),
           _ev(17.9, "ckpt_drain", seconds=0.4), _ev(18.0, "train_end", steps_completed=10)]
    r = summarize(ev, max_steps=10, checkpoint_interval=3)
    assert r["wall_seconds"] == 18.0 and r["step_time_seconds"] == 1.0
    assert r["useful_steps"] == 10
    assert r["training_goodput_pct"] == pytest.approx(100 * 10 / 18)
    (f,) = r["faults"]
    assert f["steps_lost"] == 3  # steps 4, 5, 6 were trained twice
    assert f["recovery_seconds"] == pytest.approx(12.0 - 8.5)
    assert f["breakdown_seconds"] == pytest.approx({
        "detected": 1.0, "left": None, "aborted": 1.1, "handed_over": 1.3, "health_checked": 1.4,
        "restarted": 1.5, "imported": None,
                                      "pg_ready": 2.0, "model_ready": None, "buffers_ready": None,
        "loaded": 2.5})
    assert f["restored_from"] == "durable"
    assert r["infra_goodput_pct"] == pytest.approx(100 * (18 - 2.5) / 18)
    # 13 steps of 1 s and one in-loop save that blocked 0.5 s
    assert r["training_efficiency_pct"] == pytest.approx(100 * (1 - 0.5 / 13.5))
    assert r["checkpoint"]["final_seconds"] == pytest.approx(0.65)
    assert r["checkpoint"]["count"] == 2 and r["checkpoint"]["blocking_seconds_total"] == 0.5
    assert r["restarts"] == 1 and r["recovery_seconds_mean"] == pytest.approx(3.5)


def test_no_events_is_an_error():
    with pytest.raises(ValueError):
        summarize([], 10, 0)


def test_recovery_ends_when_the_first_step_completed_not_when_it_was_read_back():
    """On GPUs a step's event is written one step later; its `done` stamp says when it ended."""
    ev = [_ev(0.0, "launch"), _ev(1.0, "train_start", step=0), _ev(2.0, "step", step=1, dt=1.0),
          _ev(3.0, "fault", step=2, type="exception"), _ev(4.0, "attempt_start", iteration=1),
          _ev(4.5, "snapshot_load", step=1, tier="memory"), _ev(4.5, "train_start", step=1),
          _ev(6.0, "step", step=2, dt=0.5, done=5.0), _ev(6.5, "step", step=3, dt=0.5, done=5.5),
          _ev(7.0, "train_end", steps_completed=3)]
    (f,) = summarize(ev, max_steps=3, checkpoint_interval=0)["faults"]
    assert f["recovery_seconds"] == pytest.approx(5.0 - 3.0)


def _run_until(t_fail, launcher="A"):
    """Rank 0 and 1 launched by one launcher start; steps 1..4 of 1 s, then `t_fail`."""
    ev = [_ev(0.0, "launch", launcher=launcher, launcher_restart=0),
          _ev(0.0, "launch", 1, launcher=launcher, launcher_restart=0),
          _ev(1.0, "train_start", step=0), _ev(1.0, "train_start", 1, step=0)]
    ev += [_ev(1.0 + s, "step", step=s, dt=1.0) for s in range(1, 5)]
    ev += [_ev(4.5, "ckpt_save", 1, step=4, blocking_s=0.1)]  # rank 1's last sign of life
    return ev


def _resume(t, step, tier="node", launcher="A", restart=1, last=12):
    ev = [_ev(t, "launch", launcher=launcher, launcher_restart=restart),
          _ev(t, "launch", 1, launcher=launcher, launcher_restart=restart),
          _ev(t + 0.5, "snapshot_load", step=step, tier=tier),
          _ev(t + 0.5, "snapshot_load", 1, step=step, tier="peer" if tier == "node" else tier),
          _ev(t + 1.0, "train_start", step=step), _ev(t + 1.0, "train_start", 1, step=step)]
    ev += [_ev(t + 1.0 + (s - step), "step", step=s, dt=1.0) for s in range(step + 1, last + 1)]
    return ev + [_ev(t + 1.0 + last - step + 0.5, "train_end")]


@pytest.mark.parametrize("collective_first", [True, False])
def test_a_frozen_rank_is_one_failure_from_its_last_sign_of_life(collective_first):
    """SIGSTOP on rank 1 under ft_launcher+inprocess: rank 0's collective times out (an error of
    its own, before or after the Wrapper's abort), the Wrapper sees rank 1's soft timeout, its
    watchdog kills rank 1 and records why, the launcher restarts the group. One failure, dated
    by the last step every rank completed, detected by the soft timeout."""
    ev = _run_until(5.0)
    ev += [_ev(8.0 if collective_first else 14.0, "error", type="RuntimeError",
               message="Timed out waiting 4000ms"),
           _ev(8.1, "abort", iteration=0, interruptions=[[1, "soft_timeout"]]),
           _ev(16.0, "error", 1, type="WatchdogTimeout", message="no progress within the hard timeout"),
           _ev(17.0, "workers_failed", -1, node=0, failures=[
               {"rank": 1, "local_rank": 1, "pid": 9, "exit_code": -15, "signal": "SIGTERM"}])]
    ev += _resume(18.0, 4)
    r = summarize(ev, max_steps=12, checkpoint_interval=0)
    (f,) = r["faults"]
    assert (f["rank"], f["type"], f["injected"]) == (1, None, [])
    assert f["t"] == 5.0 and f["t_source"] == "last_step"  # step 4 completed at 5.0
    assert (f["detected_by"], f["detection"]) == ("inprocess", "soft_timeout")
    assert f["detected_seconds"] == pytest.approx(3.1)
    assert f["failed_ranks"] == [1, 0] and (f["exit_code"], f["signal"]) == (-15, "SIGTERM")
    assert f["restarts"] == ["launcher"] and r["restarts"] == 1
    assert f["resumed_from_step"] == 4 and f["steps_lost"] == 0
    assert f["restored_from"] == "peer"  # the slowest tier any rank read
    assert f["recovery_seconds"] == pytest.approx(20.0 - 5.0)
    assert r["infra_goodput_pct"] == pytest.approx(100 * (r["wall_seconds"] - 14.0) / r["wall_seconds"])


def test_a_killed_rank_is_told_from_the_peer_that_raised_after_it():
    """SIGKILL on rank 1 under ft_launcher: rank 0 raises (connection reset), the launcher finds
    both dead; the rank that died first without a word is the failure."""
    ev = _run_until(5.0)
    ev += [_ev(5.2, "error", type="RuntimeError", message="Connection reset by peer"),
           _ev(5.4, "workers_failed", -1, node=0, failures=[
               {"rank": 0, "local_rank": 0, "pid": 8, "exit_code": 1, "signal": None},
               {"rank": 1, "local_rank": 1, "pid": 9, "exit_code": -9, "signal": "SIGKILL"}])]
    ev += _resume(6.0, 4)
    (f,) = summarize(ev, max_steps=12, checkpoint_interval=0)["faults"]
    assert (f["rank"], f["detection"], f["signal"], f["exit_code"]) == (1, "process_death", "SIGKILL", -9)
    assert f["t_source"] == "last_step" and f["detected_by"] == "launcher"


def test_an_exception_names_the_rank_that_raised_not_the_peer_that_left():
    """Dated by the last step: an exception's own time can be long after the failure (a
    collective timed out behind a dead peer), so no exception's time is taken once a step ran."""
    ev = _run_until(5.0)
    ev += [_ev(5.3, "error", 1, type="ValueError", message="bad batch"),
           _ev(5.35, "peer_failed", failed_rank=1),
           _ev(5.6, "workers_failed", -1, node=0, failures=[
               {"rank": 0, "local_rank": 0, "pid": 8, "exit_code": 1, "signal": None},
               {"rank": 1, "local_rank": 1, "pid": 9, "exit_code": 1, "signal": None}])]
    ev += _resume(6.0, 4)
    (f,) = summarize(ev, max_steps=12, checkpoint_interval=0)["faults"]
    assert (f["rank"], f["t"], f["t_source"], f["detection"]) == (1, 5.0, "last_step", "exception")
    assert f["error"] == "rank 1: ValueError: bad batch" and f["failed_ranks"] == [1]


def test_a_failure_before_the_first_step_is_dated_by_its_exception():
    ev = [_ev(0.0, "launch", launcher="A"), _ev(1.0, "error", 1, type="OSError", message="disk"),
          _ev(1.2, "abort", iteration=0, interruptions=[[1, "exception"]]),
          _ev(1.5, "attempt_start", iteration=1), _ev(2.0, "train_start", step=0),
          _ev(3.0, "step", step=1, dt=1.0), _ev(3.5, "train_end")]
    (f,) = summarize(ev, max_steps=1, checkpoint_interval=0)["faults"]
    assert (f["rank"], f["t"], f["t_source"], f["detection"]) == (1, 1.0, "exception", "exception")
    assert f["recovery_seconds"] == pytest.approx(2.0) and f["steps_lost"] == 0


def test_an_injected_fault_and_the_failure_it_caused_are_one_entry():
    ev = _run_until(5.0)
    ev += [_ev(5.1, "fault", 1, step=5, type="sigkill"),
           _ev(5.4, "workers_failed", -1, node=0, failures=[
               {"rank": 1, "local_rank": 1, "pid": 9, "exit_code": -9, "signal": "SIGKILL"}])]
    ev += _resume(6.0, 4)
    r = summarize(ev, max_steps=12, checkpoint_interval=0)
    (f,) = r["faults"]
    assert (f["step"], f["rank"], f["type"], f["t"]) == (5, 1, "sigkill", 5.1)
    assert f["t_source"] == "injected" and f["injected"] == [{"step": 5, "rank": 1, "type": "sigkill"}]
    assert f["detection"] == "process_death" and f["detected_seconds"] == pytest.approx(0.3)


def test_a_silent_job_restart_is_a_failure_dated_by_the_last_step():
    """A node lost under the baseline on Kubernetes: nothing is written until the Job's new
    pods launch (another start of the launcher)."""
    ev = _run_until(5.0) + _resume(30.0, 4, tier="durable", launcher="B", restart=0)
    r = summarize(ev, max_steps=12, checkpoint_interval=0)
    (f,) = r["faults"]
    assert (f["detected_by"], f["detection"], f["restarts"]) == ("job", "job_restart", ["job"])
    assert f["t"] == 5.0 and f["detected_seconds"] == pytest.approx(25.0)
    assert f["restored_from"] == "durable" and r["restarts"] == 1


def test_restarts_are_told_apart_by_the_launcher_that_started_them():
    """Same launcher start: a worker-group restart, even when the restart count stays (a healthy
    node restarted for another's failure); another start: a job restart. Logs without launcher
    ids fall back to the restart count."""
    def restarts(first, second):
        ev = _run_until(5.0, launcher=first[0]) + _resume(6.0, 4, launcher=second[0], restart=second[1])
        ev[0]["launcher_restart"] = first[1]
        return summarize(ev, 12, 0)["faults"][0]["restarts"]

    assert restarts(("A", 0), ("A", 0)) == ["launcher"]
    assert restarts(("A", 0), ("B", 0)) == ["job"]
    assert restarts((None, 0), (None, 1)) == ["launcher"]
    assert restarts((None, 2), (None, 0)) == ["job"]


def test_failures_apart_are_separate_and_a_fault_free_run_has_none():
    ev = _run_until(5.0)
    ev += [_ev(5.1, "fault", 1, step=5, type="exception"), _ev(5.3, "abort", iteration=0,
                                                               interruptions=[[1, "exception"]]),
           _ev(5.5, "attempt_start", iteration=1), _ev(6.0, "train_start", step=4)]
    ev += [_ev(6.0 + s - 4, "step", step=s, dt=1.0) for s in range(5, 9)]
    ev += [_ev(10.2, "abort", iteration=1, interruptions=[[0, "hard_timeout"], [1, "soft_timeout"]]),
           _ev(11.0, "attempt_start", iteration=2), _ev(11.5, "train_start", step=8)]
    ev += [_ev(11.5 + s - 8, "step", step=s, dt=1.0) for s in range(9, 13)]
    ev += [_ev(16.0, "train_end")]
    r = summarize(ev, max_steps=12, checkpoint_interval=0)
    first, second = r["faults"]
    assert first["type"] == "exception" and first["restarts"] == ["inprocess"]
    assert (second["type"], second["rank"], second["detection"]) == (None, 0, "hard_timeout")
    assert second["t"] == 10.0 and second["restarts"] == ["inprocess"] and r["restarts"] == 2
    assert summarize(_run_until(5.0) + [_ev(6.0, "train_end")], 4, 0)["faults"] == []


def _synthetic_log(directory, events: int, failures: int) -> int:
    """A two-node run of about `events` events with `failures` in-process restarts, written as
    the trainer writes it: one file per node, lines in time order. Returns its step count."""
    import json
    import random

    rng = random.Random(0)
    per_step = 4  # rank 0's step and samples, rank 1's samples, a share of checkpoints
    steps = events // per_step
    every = steps // (failures + 1)
    directory.mkdir(parents=True)
    files = [open(directory / f"node-{n:05d}.jsonl", "w") for n in (0, 1)]

    def emit(t, event, rank=0, **kw):
        files[rank].write(json.dumps({"t": t, "event": event, "rank": rank, **kw}) + "\n")

    t, step, iteration = 0.0, 0, 0
    for rank in (0, 1):
        emit(t, "launch", rank, launcher="A", launcher_restart=0)
        emit(t + 0.5, "train_start", rank, step=0)
    t = 1.0
    while step < steps:
        step += 1
        t += 0.1
        emit(t, "step", step=step, dt=round(rng.uniform(0.09, 0.11), 5), stall=0.0, done=t)
        emit(t, "samples", step=step, indices=[step, step + 1])
        emit(t, "samples", 1, step=step, indices=[step + 2, step + 3])
        if step % 10 == 0:
            for rank in (0, 1):
                emit(t + 0.01, "ckpt_save", rank, step=step, blocking_s=0.01, bytes=100)
        if step % every == 0 and iteration < failures:
            iteration += 1
            emit(t + 0.02, "fault", 1, step=step + 1, type="exception")
            for rank in (0, 1):
                emit(t + 0.05, "abort", rank, iteration=iteration - 1, interruptions=[[1, "exception"]])
                emit(t + 0.3, "attempt_start", rank, iteration=iteration)
                emit(t + 0.4, "snapshot_load", rank, step=step - 1, tier="memory")
                emit(t + 0.5, "train_start", rank, step=step - 1)
            t += 0.5
            step -= 1  # the last step is trained again
    emit(t + 1.0, "train_end")
    for f in files:
        f.close()
    return step


def _peak_bytes(directory) -> tuple[int, dict]:
    import tracemalloc

    from trainer.accounting.events import read_events

    tracemalloc.start()
    try:
        r = summarize(read_events(directory), max_steps=10**9, checkpoint_interval=10)
        return tracemalloc.get_traced_memory()[1], r
    finally:
        tracemalloc.stop()


def test_summarize_streams_a_large_log_in_bounded_memory(tmp_path):
    """One pass over 80,000 events with 50 failures holds a few windows and the failures'
    entries, not the log: the peak does not grow with the log, and stays far below its size."""
    small_steps = _synthetic_log(tmp_path / "small", 20_000, 50)
    large_steps = _synthetic_log(tmp_path / "large", 80_000, 50)
    large_bytes = sum(f.stat().st_size for f in (tmp_path / "large").iterdir())
    small_peak, small = _peak_bytes(tmp_path / "small")
    large_peak, large = _peak_bytes(tmp_path / "large")
    assert large["steps_completed"] == large_steps and small["steps_completed"] == small_steps
    assert len(large["faults"]) == 50 and large["restarts"] == 50
    assert all(f["steps_lost"] == 1 and f["restored_from"] == "memory" for f in large["faults"])
    assert large_bytes > 5 * 2**20  # the log: about 6.5 MiB on disk, several times that as objects
    assert large_peak < 2 * 2**20
    assert large_peak < 1.25 * small_peak  # four times the events, the same memory


def test_a_silent_node_is_the_failure_not_the_rank_that_watched_it():
    """A frozen node's ranks are named by the neighbour's watch (`nodewatch`); the watcher,
    which left because of it, did not fail."""
    ev = _run_until(5.0)
    ev += [_ev(11.0, "node_silent", 0, node=1, ranks=[1], silent_s=6.0),
           _ev(11.1, "workers_failed", -1, node=0, failures=[
               {"rank": 0, "local_rank": 0, "pid": 8, "exit_code": 1, "signal": None}])]
    ev += _resume(12.0, 4)
    (f,) = summarize(ev, max_steps=12, checkpoint_interval=0)["faults"]
    assert (f["rank"], f["detection"], f["failed_ranks"]) == (1, "node_lost", [1])
    assert f["detected_by"] == "launcher"
