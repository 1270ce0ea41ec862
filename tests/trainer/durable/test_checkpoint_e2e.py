"""Real 2-rank jobs, real SIGKILLs: checkpoints never lose or duplicate an update."""

import shutil

import pytest

from tests.jobs import (INTERVAL, STEPS, events, faults, first, kill_group, ok,
                                    results, run_local, samples_by_step, start_local, wait_for)
from trainer.durable.store import MANIFEST, CheckpointStore, file_sha256, shard_name, step_dir_name


def _committed(run_dir, step):
    return (run_dir / "checkpoints" / step_dir_name(step) / MANIFEST).is_file()


@pytest.mark.parametrize("use_async", ["true", "false"])
def test_sigkill_midway_then_resume_matches_uninterrupted(cache_dir, reference, tmp_path, use_async):
    ref = reference()
    run_dir = tmp_path / "run"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL),
            "--use_async_checkpoint", use_async, "--trace_samples", "true")
    job = start_local(cache_dir, "baseline", run_dir, *args)
    wait_for(lambda: _committed(run_dir, 2 * INTERVAL), what="the step-12 commit")
    kill_group(job)
    assert not first(events(run_dir), "train_end")


    ok(run_local(cache_dir, "baseline", run_dir, *args))
    res = results(run_dir)
    assert res["param_sha256"] == ref["param_sha256"]
    assert res["steps_completed"] == STEPS
    load = first(events(run_dir), "ckpt_load")
    assert load and 2 * INTERVAL <= load["step"] < STEPS
    # The data position survived: every step's samples, per rank, equal the uninterrupted run's.
    assert samples_by_step(run_dir) == samples_by_step(ref["run_dir"])
    # Each checkpoint step reports the time the loop spent on its checkpoint.
    ev = events(run_dir)
    saved = {e["step"] for e in ev if e["event"] == "ckpt_save" and e["rank"] == 0 and not e["final"]}
    stalls = {e["step"]: e["stall"] for e in ev if e["event"] == "step" and e["step"] in saved}
    assert saved and all(stall > 0 for stall in stalls.values())


def test_each_rank_logs_a_steps_samples_before_it_saves_that_step(reference):
    """A kill just after a commit must not lose the committed step's record of what it read."""
    ev = events(reference()["run_dir"])
    logged = {(e["step"], e["rank"]): e["t"] for e in ev if e["event"] == "samples"}
    saves = [e for e in ev if e["event"] == "ckpt_save"]
    assert saves
    for save in saves:
        assert logged[save["step"], save["rank"]] < save["t"], save


def test_sigkill_during_a_write_resumes_from_the_previous_checkpoint(cache_dir, reference, tmp_path,
                                                                     monkeypatch):
    ref = reference()
    run_dir = tmp_path / "run"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL))
    monkeypatch.setenv("NVRX_EKS_SLOW_WRITE_S", "2.0")  # widen the write so the kill lands inside
    job = start_local(cache_dir, "baseline", run_dir, *args)
    step_dir = run_dir / "checkpoints" / step_dir_name(2 * INTERVAL)
    wait_for(lambda: _committed(run_dir, INTERVAL) and step_dir.is_dir()
             and any(p.name.endswith(".tmp") for p in step_dir.iterdir()),
             what="a shard of step 12 being written")
    kill_group(job)
    assert not (step_dir / MANIFEST).exists()
    monkeypatch.delenv("NVRX_EKS_SLOW_WRITE_S")

    ok(run_local(cache_dir, "baseline", run_dir, *args))
    assert first(events(run_dir), "ckpt_load")["step"] == INTERVAL
    assert results(run_dir)["param_sha256"] == ref["param_sha256"]


def test_damaged_newest_checkpoints_are_skipped_by_name(cache_dir, reference, tmp_path):
    ref = reference()
    run_dir = tmp_path / "run"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL), "--keep_checkpoints", "3")
    ok(run_local(cache_dir, "baseline", run_dir, *args))
    ckpts = run_dir / "checkpoints"
    truncated = ckpts / step_dir_name(STEPS) / shard_name(1)
    truncated.write_bytes(truncated.read_bytes()[:-1000])
    flipped = ckpts / step_dir_name(STEPS - INTERVAL) / shard_name(0)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 3] ^= 0x5A  # same size: only the checksum can tell
    flipped.write_bytes(bytes(data))

    proc = run_local(cache_dir, "baseline", run_dir, *args)
    ok(proc)
    out = proc.stdout + proc.stderr
    assert f"skipping checkpoint {ckpts / step_dir_name(STEPS)}" in out
    assert f"skipping checkpoint {ckpts / step_dir_name(STEPS - INTERVAL)}" in out and "sha256" in out
    loads = [e for e in events(run_dir) if e["event"] == "ckpt_load"]
    assert {e["step"] for e in loads} == {STEPS - 2 * INTERVAL}  # the newest intact one
    assert results(run_dir)["param_sha256"] == ref["param_sha256"]
    # The steps written again are exactly what their manifests say (no stale marker committed),
    # and the damaged ones were set aside, never mixed with the new shards.
    store = CheckpointStore(ckpts)
    assert [s for s, _ in store.committed()][-2:] == [STEPS - INTERVAL, STEPS]
    for step, path in store.committed():
        manifest = store.read_manifest(path)
        for shard in manifest["shards"]:
            assert file_sha256(path / shard["file"]) == shard["sha256"], f"{path}: {shard}"
    assert (ckpts / (step_dir_name(STEPS) + ".skipped")).is_dir()
    # And a restart from them resumes at the end, with nothing skipped.
    again = run_local(cache_dir, "baseline", run_dir, *args, "--resume", "required")
    ok(again)
    assert "skipping checkpoint" not in again.stdout + again.stderr


def _copy_of_reference(ref: dict, run_dir) -> None:
    """The 2-rank reference run's checkpoints, in a run directory of the test's own."""
    shutil.copytree(ref["run_dir"] / "checkpoints", run_dir / "checkpoints")


def test_resume_at_another_world_size_restores_parameters_exactly(cache_dir, reference, tmp_path):
    ref = reference()
    for nproc in (1, 3):  # shrink, and grow to a world that does not divide the rows evenly
        copy = tmp_path / f"world{nproc}"
        _copy_of_reference(ref, copy)
        ok(run_local(cache_dir, "baseline", copy, "--max_steps", str(STEPS), "--resume", "required",
                     "--trace_samples", "true", nproc=nproc))
        res = results(copy)
        load = first(events(copy), "ckpt_load")
        assert load["saved_world_size"] == 2 and load["step"] == STEPS
        assert res["param_sha256"] == ref["param_sha256"]


def test_failed_rank_leaves_its_staging_buffer_for_the_next_process(cache_dir, tmp_path):
    """A restarted rank maps the staging buffer its failed predecessor left instead of touching
    a fresh one; a run that completes removes it."""
    run_dir, node_dir = tmp_path / "run", tmp_path / "node"
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(INTERVAL),
            "--node_dir", str(node_dir), *faults("exception"))
    buffers = lambda: sorted(p.name for p in node_dir.rglob("durable.rank*.*"))
    failed = run_local(cache_dir, "baseline", run_dir, *args, local_args=("--job_restarts", "0"))
    assert failed.returncode != 0
    (fault,) = [e for e in events(run_dir) if e["event"] == "fault"]
    assert {f"durable.rank{fault['rank']:05d}.{ext}" for ext in ("buf", "json")} <= set(buffers())

    ok(run_local(cache_dir, "baseline", run_dir, *args))
    assert results(run_dir)["steps_completed"] == STEPS
    assert buffers() == []


def test_final_checkpoint_false_leaves_the_last_step_unsaved(cache_dir, tmp_path):
    """For benchmarks and throwaway runs: the periodic checkpoints only."""
    run_dir = tmp_path / "run"
    ok(run_local(cache_dir, "baseline", run_dir, "--max_steps", str(STEPS),
                 "--checkpoint_interval", str(INTERVAL), "--final_checkpoint", "false"))
    assert results(run_dir)["steps_completed"] == STEPS
    committed = [step for step, _, _ in CheckpointStore(run_dir / "checkpoints").candidates()]
    assert max(committed) == STEPS - INTERVAL


def test_a_changed_run_on_resume_is_refused_or_logged(cache_dir, reference, tmp_path):
    """A new --seq_len, --seed or --model cannot continue the run: one line, exit 2, before any
    launch. A new --lr can, and the change is logged."""
    run_dir = tmp_path / "run"
    _copy_of_reference(reference(), run_dir)
    more = ("--max_steps", str(STEPS + 2), "--checkpoint_interval", str(INTERVAL),
            "--trace_samples", "true")
    for flag, value in (("--seq_len", "32"), ("--seed", "7"), ("--model", "llama-1b")):
        proc = run_local(cache_dir, "baseline", run_dir, *more, flag, value)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert f"{flag} " in lines[0] and "use a new --checkpoint_dir" in lines[0]
    proc = run_local(cache_dir, "baseline", run_dir, *more, "--lr", "0.0001")
    ok(proc)
    assert "--lr changes from 0.0003 to 0.0001" in proc.stdout
    assert f"--max_steps changes from {STEPS} to {STEPS + 2}" in proc.stdout
