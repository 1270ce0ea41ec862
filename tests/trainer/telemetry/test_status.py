"""The live view (`trainer.telemetry.status`) on a hand-made event log, where every figure is
known, and on a real run through a fault, watched while it trains until it ends."""

import json
import subprocess
import sys

import pytest

from tests.jobs import ROOT, env_for, faults, results, start_local
from trainer.accounting.events import node_log_name
from trainer.telemetry.status import RunView, duration


def _write(run_dir, events):
    d = run_dir / "events"
    d.mkdir(parents=True, exist_ok=True)
    with (d / node_log_name(0)).open("a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def _ev(t, event, rank=0, **kw):
    return {"t": t, "event": event, "rank": rank, **kw}


def test_the_view_of_a_run_in_progress_and_after_it_ended(tmp_path):
    view = RunView(tmp_path)
    assert view.poll() == [f"run {tmp_path}: no event yet"]
    ev = [_ev(0.0, "launch"), _ev(1.0, "train_start", step=0, max_steps=100, tokens_per_step=512)]
    ev += [_ev(1.0 + s, "step", step=s, dt=1.0) for s in range(1, 21)]
    ev += [_ev(10.5, "ckpt_commit", step=10, write_s=2.25, bytes=1)]
    ev += [_ev(21.5, "fault", 1, step=21, type="exception"), _ev(22.0, "attempt_start", iteration=1),
           _ev(23.0, "train_start", step=20, max_steps=100, tokens_per_step=512)]
    ev += [_ev(23.0 + s - 20, "step", step=s, dt=1.0) for s in range(21, 41)]
    _write(tmp_path, ev)
    lines = view.poll(final=True)
    assert lines[0] == f"run {tmp_path}: training, 43s since launch"
    assert lines[1] == "step      40/100 (40.0 %), ETA 1m 00s"  # 1 step/s since the restart
    assert lines[2] == "tokens/s  512 (last 20 steps, stalls included)"
    assert lines[3] == "restarts  1, failures 1"
    assert lines[4] == ("last failure  step 21, rank 1, exception (detected by inprocess), "
                        "recovered in 2.50 s, 0 step(s) trained again")
    assert lines[5].startswith("goodput   training ") and lines[5].endswith(" infra 96.5 %")
    assert lines[6].startswith("checkpoint  step 10, committed ") and lines[6].endswith("written in 2.2 s")
    assert lines[7] == "events    1 file(s), 46 event(s)"
    _write(tmp_path, [_ev(44.0, "train_end")])
    ended = view.poll()  # rank 0 ended: nothing more can sort before what is held
    assert ended[0] == f"run {tmp_path}: ended, 44s since launch" and view.goodput.ended
    assert ended[1] == "step      40/100 (40.0 %)"  # no ETA, no rate once ended


@pytest.mark.parametrize("seconds, text", [(42, "42s"), (750, "12m 30s"), (11100, "3h 05m")])
def test_durations_read_at_a_glance(seconds, text):
    assert duration(seconds) == text


def test_a_real_run_watched_while_it_trains_until_it_ends(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    steps = 16
    run = start_local(cache_dir, "ft_launcher", run_dir, "--max_steps", str(steps),
                      "--checkpoint_interval", "4", *faults("exception", steps=steps, after=5))
    watch = subprocess.run([sys.executable, "-m", "devtools.watch", str(run_dir), "--interval",
                            "0.5"], cwd=ROOT, env=env_for(cache_dir), capture_output=True,
                           text=True, timeout=600)
    assert run.wait(timeout=600) == 0, (run_dir / "test-output.log").read_text()[-3000:]
    assert watch.returncode == 0, watch.stderr
    views = [block.splitlines() for block in watch.stdout.strip().split("\n\n")]
    assert any(v[0].endswith(": training") or ": training," in v[0] for v in views[:-1])
    res = results(run_dir)
    (failure,) = res["faults"]
    last = views[-1]
    assert ": ended, " in last[0]
    assert last[1] == f"step      {steps}/{steps} (100.0 %)"
    assert f"restarts  {res['restarts']}, failures 1" in last
    (line,) = [l for l in last if l.startswith("last failure  ")]
    assert line.startswith(f"last failure  step {failure['step']}, rank {failure['rank']}, exception")
    assert f"recovered in {failure['recovery_seconds']:.2f} s" in line
    assert (f"goodput   training {res['training_goodput_pct']:.1f} %, infra "
            f"{res['infra_goodput_pct']:.1f} %") in last
