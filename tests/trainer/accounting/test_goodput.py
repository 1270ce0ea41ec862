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
    assert f["breakdown_seconds"] == {"detected": 1.0, "restarted": 1.5, "imported": None,
                                      "pg_ready": 2.0, "model_ready": None, "buffers_ready": None,
                                      "loaded": 2.5}
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
