"""Every recovery mode against the faults it is meant to handle, with real processes.

Each run must reach max_steps, fire every scheduled fault exactly once, and end with the
fault-free run's param_sha256: no update lost, none applied twice.
"""

import time

import pytest

from config.contract import RecoveryMode
from devtools.pace import COLLECTIVE_TIMEOUT_S, HEARTBEAT_FLOOR_S, SOFT_TIMEOUT_S
from tests.jobs import INTERVAL, STEPS, events, faults, faults_fired, first, ok, results, run_local

CASES = {
    "baseline": ("exception", "hang"),
    "inprocess": ("exception", "hang", "oom"),
    "ft_launcher": ("sigkill", "hang", "segfault"),
    "ft_launcher+inprocess": ("hang", "sigkill", "exception"),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_mode_recovers_from_its_faults(cache_dir, pace, reference, tmp_path, mode):
    ref = reference()
    run_dir = tmp_path / "run"
    flags = faults(*CASES[mode])
    proc = run_local(cache_dir, mode, run_dir, "--max_steps", str(STEPS), "--checkpoint_interval",
                     str(INTERVAL), *pace.recovery_flags(), *flags,
                     local_args=pace.runner_flags(mode))
    ok(proc)
    res = results(run_dir)
    assert res["steps_completed"] == STEPS and res["mode"] == mode
    assert res["param_sha256"] == ref["param_sha256"]
    fired = faults_fired(run_dir)
    assert [f["type"] for f in fired] == list(CASES[mode])  # each exactly once, in order
    assert [f["type"] for f in res["faults"]] == list(CASES[mode])
    for f in res["faults"]:
        assert f["recovery_seconds"] is not None and f["recovery_seconds"] > 0
        # at most one interval, plus the steps while the next checkpoint was still being written
        assert f["steps_lost"] is not None and 0 <= f["steps_lost"] <= 2 * INTERVAL
    assert 0 < res["training_goodput_pct"] <= res["infra_goodput_pct"] <= 100

    ev = events(run_dir)
    hang = next(f for f in fired if f["type"] == "hang")
    # Detection within the configured timeout plus a margin, read from the event log: prompt on
    # a fast machine, as much slower as the machine is.
    timeout = {"baseline": COLLECTIVE_TIMEOUT_S, "inprocess": SOFT_TIMEOUT_S,
               "ft_launcher": HEARTBEAT_FLOOR_S, "ft_launcher+inprocess": SOFT_TIMEOUT_S}[mode]
    bound = pace.seconds(timeout + 15)
    detected = first(ev, {"baseline": "worker_failed", "ft_launcher": "launch"}.get(mode, "abort"),
                     after=hang["t"])
    assert detected and detected["t"] - hang["t"] <= bound
    launches = [e for e in ev if e["event"] == "launch"]
    # ft_launcher forks its workers from a process that has imported the trainer
    assert {e["forked"] for e in launches} == {RecoveryMode(mode).uses_ft_launcher}
    if RecoveryMode(mode).in_process:  # each attempt's health checks, timed part by part
        checks = [e for e in ev if e["event"] == "health_check"]
        assert len(checks) >= 2 * (len(fired) + 1)
        assert all("FaultCounter" in e["seconds"] for e in checks)
        # every in-process attempt after a fault found the failed attempt's model, optimizer
        # and loop collected (weak references, after a full collection)
        starts = [e for e in ev if e["event"] == "leftovers"]
        assert starts and all(e["alive"] == [] for e in starts), starts
        assert all(f["leftovers"] == [] for f in res["faults"] if f["leftovers"] is not None)
    if mode == "baseline":  # the other rank left with the one that raised, not after it
        raised = next(f for f in fired if f["type"] == "exception")
        left = first(ev, "peer_failed", after=raised["t"])
        assert left and left["failed_rank"] == raised["rank"] != left["rank"]


def test_inprocess_alone_cannot_survive_a_killed_process(cache_dir, pace, tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.time()
    proc = run_local(cache_dir, "inprocess", run_dir, "--max_steps", str(STEPS),
                     "--checkpoint_interval", str(INTERVAL), *pace.recovery_flags(),
                     *faults("sigkill"))
    assert proc.returncode != 0
    assert "mode inprocess could not recover" in proc.stderr
    assert not (run_dir / "results.json").exists()
    assert time.time() - t0 < pace.seconds(200)  # ended, not hung
