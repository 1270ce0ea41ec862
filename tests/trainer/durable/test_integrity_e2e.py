"""Nothing committed is ever wrong: full and read-only storage, two runs on one directory, stale
host snapshots, diverged losses and bad settings. Real processes, real file systems (a tmpfs
mount where the machine permits it)."""

import json
import shutil

import pytest

from config.presets import STATE_BYTES_PER_PARAMETER, preset_parameters
from tests.jobs import MODEL, events, kill_group, ok, run_local, small_fs, start_local, wait_for
from trainer.durable.store import CheckpointStore, file_sha256, step_dir_name


def _last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_full_disk_keeps_the_last_checkpoint_and_stops_with_the_cause(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    # Room for one checkpoint and some 60% of a second, which does not fit beside it.
    room = 1.6 * preset_parameters(MODEL) * STATE_BYTES_PER_PARAMETER
    with small_fs(tmp_path / "small", f"{room / 1024:.0f}k") as small:
        ckpts = small / "ckpt"
        proc = run_local(cache_dir, "baseline", run_dir, "--max_steps", "12",
                         "--checkpoint_interval", "4", "--checkpoint_dir", str(ckpts))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "No space left on device" in _last_line(proc) and str(ckpts) in _last_line(proc)
        store = CheckpointStore(ckpts)
        assert [s for s, _ in store.committed()] == [4]  # committed before step 8 was written
        manifest = store.read_manifest(ckpts / step_dir_name(4))
        assert all(file_sha256(ckpts / step_dir_name(4) / s["file"]) == s["sha256"]
                   for s in manifest["shards"])
        assert not [p for p in ckpts.rglob("*.tmp")]
        # never retried: one launch of each rank
        assert len([e for e in events(run_dir) if e["event"] == "launch"]) == 2


def test_read_only_or_file_checkpoint_dir_fails_before_launch(cache_dir, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = run_local(cache_dir, "baseline", tmp_path / "r1", "--checkpoint_dir", str(a_file / "c"))
    assert proc.returncode == 2 and "is not a directory" in _last_line(proc)
    with small_fs(tmp_path / "ro", "1m", read_only=True) as ro:
        proc = run_local(cache_dir, "baseline", tmp_path / "r2", "--checkpoint_dir", str(ro / "c"))
        assert proc.returncode == 2 and "is not writable" in _last_line(proc)


def test_a_second_run_on_a_directory_in_use_is_refused_and_a_dead_ones_lease_taken_over(
        cache_dir, tmp_path):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    shared = tmp_path / "ckpt"
    job = start_local(cache_dir, "baseline", first_dir, "--max_steps", "100000",
                      "--checkpoint_dir", str(shared))
    try:
        wait_for(lambda: any(e["event"] == "step" for e in events(first_dir)), what="training")
        proc = run_local(cache_dir, "baseline", second_dir, "--max_steps", "4",
                         "--checkpoint_dir", str(shared))
        assert proc.returncode == 2
        assert "is in use by run" in _last_line(proc)
        assert not any(e["event"] == "step" for e in events(second_dir))
    finally:
        kill_group(job)
    holder = json.loads((shared / "LEASE.json").read_text())
    proc = run_local(cache_dir, "baseline", second_dir, "--max_steps", "4",
                     "--checkpoint_dir", str(shared), "--checkpoint_interval", "2")
    ok(proc)
    assert f"taking over the lease of run {holder['run']}" in proc.stdout + proc.stderr
    assert not (shared / "LEASE.json").exists()  # released at the end of a complete run


def test_a_new_directory_at_an_old_path_never_resumes_old_host_snapshots(cache_dir, tmp_path):
    run_dir, node_dir = tmp_path / "run", tmp_path / "node"
    args = ("--max_steps", "100000", "--checkpoint_interval", "1000", "--tiers", "memory,node",
            "--snapshot_interval", "1", "--node_dir", str(node_dir))
    job = start_local(cache_dir, "baseline", run_dir, *args)
    try:
        wait_for(lambda: len([e for e in events(run_dir) if e["event"] == "step"]) >= 5,
                 what="five steps")
    finally:
        kill_group(job)
    assert list(node_dir.rglob("*.slot*.json"))  # the old run's snapshots are still there
    shutil.rmtree(run_dir)
    proc = run_local(cache_dir, "baseline", run_dir, "--max_steps", "3", "--tiers", "memory,node",
                     "--snapshot_interval", "1", "--node_dir", str(node_dir))
    ok(proc)
    assert "starting from step 0" in proc.stdout
    assert not [e for e in events(run_dir) if e["event"] in ("snapshot_load", "ckpt_load")]


def test_a_diverged_loss_stops_before_it_is_saved_and_is_never_retried(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, "baseline", run_dir, "--max_steps", "8", "--lr", "1e6",
                     "--checkpoint_interval", "1")
    assert proc.returncode == 2
    last = _last_line(proc)
    assert " is nan at step " in last or " is inf at step " in last
    bad = int(last.split(" at step ")[1].split(";")[0])
    committed = [s for s, _ in CheckpointStore(run_dir / "checkpoints").committed()]
    assert all(step < bad for step in committed)
    assert len([e for e in events(run_dir) if e["event"] == "launch"]) == 2  # no job restart


@pytest.mark.parametrize("flags, message", [
    (("--lr", "inf"), "--lr inf must be a finite number"),
    (("--seed", "-1"), "--seed -1 must be between 0 and 4294967295"),
    (("--data_path", "/nonexistent/data"), "--data_path '/nonexistent/data' is not a directory"),
    (("--resume", "required"), "--resume required, but"),
])
def test_bad_settings_fail_before_launch_with_one_line(cache_dir, tmp_path, flags, message):
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, "baseline", run_dir, *flags)
    assert proc.returncode == 2
    assert message in _last_line(proc) and len(proc.stderr.strip().splitlines()) <= 2
    assert not events(run_dir)  # nothing launched
