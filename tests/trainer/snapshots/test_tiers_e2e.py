"""Snapshot tiers with real processes: which tier each recovery read from, proven by the event log."""

import json
import subprocess
import sys

import pytest

from tests.jobs import (JOB_FLAGS, ROOT, env_for, events, faults, kill_group, ok, results,
                        run_local, start_local, wait_for)

TIERS = ["--tiers", "memory,node,peer", "--snapshot_interval", "1"]


def steps(run_dir):
    return [e["step"] for e in events(run_dir) if e["event"] == "step"]


def _loads(run_dir):
    return [e for e in events(run_dir) if e["event"] in ("snapshot_load", "ckpt_load")]


def test_killed_rank_uses_its_node_and_a_lost_node_uses_peers(cache_dir, pace, reference, tmp_path):
    steps = 16
    ref = reference(steps=steps, nproc=4)
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, "ft_launcher", run_dir, "--max_steps", str(steps),
                     "--checkpoint_interval", "8", *TIERS, *pace.recovery_flags(),
                     *faults("sigkill", "node", steps=steps, after=3, world=4),
                     nproc=2, local_args=("--nnodes", "2", "--heartbeat_timeout", f"{pace.seconds(20):g}"))
    ok(proc)
    fired = [e for e in events(run_dir) if e["event"] == "fault"]
    loads = _loads(run_dir)
    assert [f["type"] for f in fired] == ["sigkill", "node"]
    assert all(e["event"] == "snapshot_load" for e in loads), "no durable read was needed"
    after_kill = [e for e in loads if fired[0]["t"] < e["t"] < fired[1]["t"]]
    after_node = [e for e in loads if e["t"] > fired[1]["t"]]
    assert {e["tier"] for e in after_kill} == {"node"} and len(after_kill) == 4
    assert len(after_node) == 4 and "peer" in {e["tier"] for e in after_node}
    res = results(run_dir)
    assert res["param_sha256"] == ref["param_sha256"]
    assert res["faults"][0]["restored_from"] == "node"
    assert res["faults"][1]["restored_from"] in ("node", "peer")


@pytest.mark.parametrize("staging", ["host", "split", "device"])
def test_inprocess_exception_resumes_from_memory(cache_dir, pace, reference, tmp_path, staging):
    ref = reference()
    run_dir = tmp_path / "run"
    ok(run_local(cache_dir, "inprocess", run_dir, "--max_steps", "16", "--checkpoint_interval", "8",
                 *TIERS, "--snapshot_staging", staging, *pace.recovery_flags(),
                 *faults("exception", after=4)))
    (load,) = {(e["tier"], e["step"]) for e in _loads(run_dir)}
    res = results(run_dir)
    assert load[0] == "memory"
    # the stage still holds the restored step: every staged byte is read from it, not the slot
    for e in _loads(run_dir):
        share = e["staged_bytes"] / e["bytes"]
        # (`bytes` counts the slot's alignment padding too)
        assert {"host": share == 0, "split": 0 < share < 0.99, "device": share > 0.99}[staging], e
    (fault,) = res["faults"]
    assert fault["steps_lost"] <= 1 and fault["restored_from"] == "memory"
    assert res["param_sha256"] == ref["param_sha256"]


def test_snapshot_torn_mid_copy_is_never_used(cache_dir, reference, tmp_path, monkeypatch):
    ref = reference()
    run_dir = tmp_path / "run"
    node_dir = tmp_path / "node"
    args = ("--max_steps", "16", "--checkpoint_interval", "0", "--node_dir", str(node_dir),
            "--tiers", "memory,node", "--snapshot_interval", "1")
    monkeypatch.setenv("NVRX_EKS_SLOW_SNAPSHOT_S", "1.0")
    job = start_local(cache_dir, "baseline", run_dir, *args)
    headers = lambda: sorted(node_dir.rglob("rank00000.slot*.json"))
    buffers = lambda: sorted(node_dir.rglob("rank00000.slot*.buf"))
    # Kill while rank 0 rewrites a slot (its header is gone) and the other slot is intact.
    wait_for(lambda: len(buffers()) == 2 and len(headers()) == 1 and len(steps(run_dir)) >= 3,
             what="a slot being rewritten after three steps")
    kill_group(job)
    monkeypatch.delenv("NVRX_EKS_SLOW_SNAPSHOT_S")
    assert len(headers()) == 1, "the torn slot has no header"
    headers = headers()
    valid_step = json.loads(headers[0].read_text())["step"]

    ok(run_local(cache_dir, "baseline", run_dir, *args))
    (load,) = [e for e in _loads(run_dir) if e["rank"] == 0]
    assert load["event"] == "snapshot_load" and load["tier"] == "node"
    assert load["step"] == valid_step  # the intact older slot, never the torn one
    assert results(run_dir)["param_sha256"] == ref["param_sha256"]


def test_memory_budget_too_small_is_a_clear_error_before_training(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *JOB_FLAGS, "--max_steps", "4", "--checkpoint_dir",
         str(run_dir / "ck"), "--results_path", str(run_dir / "results.json"), *TIERS,
         "--memory_budget_gib", "0.001"],
        cwd=ROOT, env={**env_for(cache_dir), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731"},
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--memory_budget_gib 0.001 cannot hold the snapshot buffers" in proc.stderr
    assert not any(e["event"] == "train_start" for e in events(run_dir))
