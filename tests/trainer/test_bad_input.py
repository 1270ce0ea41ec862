"""Bad input and damaged checkpoints, as a user meets them on CPU: each is one line naming the
value or file and exit code 2, before anything is launched or written, or, where only the ranks
can tell, before training; none is retried, and nothing committed is lost.

Most cases call the checks, or run a command line that exits before launch; real multi-rank
jobs only where the behaviour needs them (every checkpoint damaged, a failure that every restart
would meet again)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from config.contract import FINAL_ERROR_ENV
from tests.jobs import (JOB_FLAGS, MODEL, ROOT, env_for, events, ok, results, run_local, small_fs,
                        wait_for)
from trainer.accounting.events import EventLog
from trainer.durable.manager import CheckpointManager
from trainer.durable.run_settings import SETTINGS_FILE
from trainer.durable.store import (MANIFEST, CheckpointStore, RestoreError, ShardWrite,
                                   StorageError, shard_name, step_dir_name, write_shard)
from trainer.errors import ConfigError, FinalError

BIT_FLIP_AT = 1 / 3  # where in a shard a same-size corruption goes: only its digest can tell


# -- helpers ------------------------------------------------------------------------------------
def _one_line_refusal(cmd: list[str], tmp_path: Path, extra_env: dict | None = None) -> str:
    """Run `cmd`, which must refuse its input: exit code 2 and one line on stderr, returned."""
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(tmp_path / "cache", extra_env),
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    return lines[0]


def _entry_points(tmp_path: Path, nproc: int = 2) -> dict[str, list[str]]:
    """The three places a run's input is checked before it trains: the local runner, the pods'
    launcher and the trainer; each takes the trainer's flags last."""
    run = tmp_path / "run"
    return {
        "runner": [sys.executable, "-m", "devtools.local", "--mode", "baseline",
                   "--nproc_per_node", str(nproc), "--run_dir", str(run), "--", *JOB_FLAGS],
        "launcher": [sys.executable, "-m", "trainer.recovery.launch", "--mode", "baseline",
                     "--nnodes", "1", "--nproc_per_node", str(nproc), "--node_rank", "0",
                     "--master_addr", "127.0.0.1", "--metrics_port", "0", "--", *JOB_FLAGS,
                     "--checkpoint_dir", str(run / "checkpoints")],
        "trainer": [sys.executable, "-m", "trainer", *JOB_FLAGS],
    }


def _token_dir(path: Path, tokens: int) -> Path:
    """A data directory of `tokens` byte-level ids, as `prepare` writes one."""
    path.mkdir(parents=True)
    (np.arange(tokens) % 256).astype(np.uint16).tofile(path / "tokens.bin")
    (path / "meta.json").write_text(json.dumps(
        {"num_tokens": tokens, "dtype": "uint16", "vocab_size": 258, "eos_id": 256,
         "tokenizer": "byte", "source": "test", "documents": 1, "max_token_id": 255}))
    return path


def _damage(shard: Path, how: str) -> None:
    """A shard emptied (the manifest's size check finds it) or one bit flipped at the same size
    (only the digest, read at load, finds it)."""
    if how == "empty":
        shard.write_bytes(b"")
        return
    data = bytearray(shard.read_bytes())
    data[int(len(data) * BIT_FLIP_AT)] ^= 0x20
    shard.write_bytes(bytes(data))


# -- settings and flags -------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (("--seed", "-1"), "--seed -1 must be between 0 and 4294967295"),
    (("--lr", "inf"), "--lr inf must be a finite number"),
    (("--max_steps", "0"), "--max_steps 0 must be at least 1"),
    (("--tiers", "disk", "--snapshot_interval", "1", "--checkpoint_dir", "/tmp/c"),
     "--tiers 'disk' is unknown"),
    (("--resume", "required", "--allow_fresh_start", "true", "--checkpoint_dir", "/tmp/c"),
     "--allow_fresh_start true contradicts --resume required"),
    (("--fresh_start",), "unrecognized arguments: --fresh_start"),
])
def test_bad_flags_are_one_line_and_exit_2(flags, message, capsys):
    from trainer.config import parse_args

    with pytest.raises(SystemExit) as exited:
        parse_args([*flags])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and message in line, line


@pytest.mark.parametrize("override, message", [
    ("trainer.seed=-1", "trainer.seed -1 must be between 0 and 4294967295"),
    ("trainer.max_steps=0", "trainer.max_steps 0 must be at least 1"),
    ("trainer.fault_probability=2", "trainer.fault_probability 2 must be between 0 and 1"),
])
def test_profile_values_out_of_range_are_one_line(override, message):
    from config.errors import ProfileError
    from config.loading import load_profile

    with pytest.raises(ProfileError) as refused:
        load_profile("p5", [override])
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_yaml_anchor_bomb_is_refused_without_expanding_it(tmp_path):
    from config.errors import ProfileError
    from config.loading import load_profile

    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("name: bomb\n" + "\n".join(levels) + "\ntrainer:\n  seed: *a8\n")
    with pytest.raises(ProfileError) as refused:
        load_profile(str(bomb))
    assert "a0: unknown key" in str(refused.value) and "\n" not in str(refused.value)


# -- the checkpoint directory, before launch ----------------------------------------------------
def test_a_checkpoint_dir_that_is_a_file_is_refused_before_launch(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    runner = _entry_points(tmp_path)["runner"]
    line = _one_line_refusal([*runner, "--checkpoint_dir", str(a_file / "c")], tmp_path)
    assert f"--checkpoint_dir '{a_file / 'c'}': {a_file} is not a directory" in line
    assert not (tmp_path / "run").exists()  # nothing launched, nothing written


def test_a_read_only_checkpoint_dir_is_refused_before_launch(tmp_path):
    with small_fs(tmp_path / "ro", "1m", read_only=True) as ro:
        runner = _entry_points(tmp_path)["runner"]
        line = _one_line_refusal([*runner, "--checkpoint_dir", str(ro / "c")], tmp_path)
    assert f"{ro} is not writable" in line
    assert not (tmp_path / "run").exists()


def test_a_changed_seed_is_refused_before_launch(tmp_path):
    from trainer.config import from_values
    from trainer.durable import run_settings

    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    run_settings.record(from_values(checkpoint_dir=str(ckpts), model=MODEL, seq_len=64, seed=7))
    runner = _entry_points(tmp_path)["runner"]
    line = _one_line_refusal([*runner, "--checkpoint_dir", str(ckpts), "--seed", "8"], tmp_path)
    assert f"--seed 8 differs from 7, which the run in {ckpts} trains with" in line
    assert not (tmp_path / "run").exists()


# -- the data, before launch, in all three places -----------------------------------------------
@pytest.mark.parametrize("entry", ["runner", "launcher", "trainer"])
def test_data_shorter_than_one_sample_is_refused_before_launch_everywhere(entry, tmp_path):
    data = _token_dir(tmp_path / "data", tokens=2)
    cmd = _entry_points(tmp_path)[entry]
    line = _one_line_refusal([*cmd, "--data_path", str(data)], tmp_path)
    assert (f"--data_path '{data}': tokens.bin holds 2 tokens, fewer than one sample of "
            "--seq_len 64 (65 tokens)") in line
    assert not (tmp_path / "run").exists()


def test_the_bundled_corpus_shorter_than_one_sample_is_refused_before_launch(tmp_path,
                                                                             monkeypatch):
    from trainer.config import from_values
    from trainer.preflight import check_environment
    from trainer.loop.data import default_data_path

    monkeypatch.setenv("NVRX_EKS_CACHE", str(tmp_path))
    _token_dir(default_data_path(), tokens=100)
    check_environment(from_values(seq_len=99))  # 100 tokens: exactly one sample of 99
    with pytest.raises(ConfigError, match="the bundled corpus .* fewer than one sample of "
                                          "--seq_len 100"):
        check_environment(from_values(seq_len=100))


@pytest.mark.parametrize("entry", ["runner", "launcher", "trainer"])
def test_a_global_batch_the_world_cannot_divide_is_refused_before_launch_everywhere(entry,
                                                                                   tmp_path):
    cmd = _entry_points(tmp_path, nproc=3)[entry]
    line = _one_line_refusal([*cmd, "--global_batch_size", "4"], tmp_path,
                             extra_env={"WORLD_SIZE": "3"} if entry == "trainer" else None)
    assert "global batch size 4 cannot be kept at world size 3" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("entry", ["runner", "launcher", "trainer"])
def test_compile_with_torch_under_a_path_with_a_space_is_refused_before_launch_everywhere(
        entry, tmp_path):
    """torch played from a path with a space: a link to this interpreter's torch, found first."""
    spaced = tmp_path / "site packages"
    spaced.mkdir()
    (spaced / "torch").symlink_to(Path(torch.__file__).parent, target_is_directory=True)
    cmd = _entry_points(tmp_path)[entry]
    path = os.pathsep.join([str(spaced), str(ROOT)])
    line = _one_line_refusal([*cmd, "--compile", "true"], tmp_path, extra_env={"PYTHONPATH": path})
    assert f"--compile true: torch is installed under '{spaced / 'torch'}', a path with a " \
           "space" in line and "--compile false" in line
    assert not (tmp_path / "run").exists()


def test_a_source_file_that_cannot_be_read_is_named(tmp_path, capsys):
    from trainer.loop.data import main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.parquet").write_bytes(b"ab")
    code = main(["prepare", "--source", str(tmp_path / "src"), "--output", str(tmp_path / "out"),
                 "--num_proc", "1"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and f"{tmp_path / 'src' / 'bad.parquet'} cannot be read as parquet" in line
    assert not (tmp_path / "out").exists()


# -- storage full at the first checkpoint -------------------------------------------------------
def test_a_full_disk_at_the_first_checkpoint_names_the_shard(tmp_path):
    from trainer.buffers import HostBuffer, Layout

    tensors = {"w": torch.zeros(1 << 20)}  # 4 MiB, on a 1 MiB disk
    buf = HostBuffer(tmp_path / "buf", Layout.of(tensors), pin=False)
    buf.stage(tensors)
    with small_fs(tmp_path / "small", "1m") as small:
        req = ShardWrite(str(buf.path), buf.layout.to_json(), {"step": 4, "params": {}},
                         str(small / step_dir_name(4)), 0, 4, 1)
        with pytest.raises(StorageError) as refused:
            write_shard(req)
        assert f"No space left on device: {small / step_dir_name(4) / shard_name(0)}" in \
            str(refused.value)
        assert list((small / step_dir_name(4)).iterdir()) == []  # no temporary file left
    assert isinstance(refused.value, FinalError)  # exit 2, never retried


# -- one line, said once ------------------------------------------------------------------------
def test_an_error_every_rank_meets_is_said_once(tmp_path, monkeypatch, capsys):
    """A refusal the ranks agree on is handed to the launcher, which says it: no rank prints
    it; without a launcher, rank 0 alone. One rank's own error is said by that rank."""
    from trainer.cli import final_exit

    same = RestoreError("no committed checkpoint in /c can be restored (...)")
    final = tmp_path / "final-error"
    monkeypatch.setenv(FINAL_ERROR_ENV, str(final))
    assert [final_exit(same, rank) for rank in range(4)] == [2] * 4
    assert capsys.readouterr().err == ""
    assert final.read_text() == str(same)  # the launcher's line, without a rank's number
    monkeypatch.delenv(FINAL_ERROR_ENV)
    for rank in range(4):
        final_exit(same, rank)
    assert capsys.readouterr().err.splitlines() == [f"python -m trainer: error: {same}"]
    final_exit(StorageError("writing rank 3's shard failed: No space left on device"), 3)
    assert capsys.readouterr().err.splitlines() == [
        "rank 3: error: writing rank 3's shard failed: No space left on device"]


# -- no checkpoint restorable: the decision, on one rank ----------------------------------------
def _manager(ckpts: Path, node: Path) -> CheckpointManager:
    return CheckpointManager(str(ckpts), rank=0, world_size=1, device=torch.device("cpu"),
                             use_async=False, retain=3, timeout_s=60, events=EventLog(None, 0),
                             node_root=node)


def test_committed_checkpoints_none_restorable_are_refused_by_name_and_kept(one_rank_group,
                                                                            tmp_path):
    from trainer.loop.model import build_model

    model = build_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    ckpts = tmp_path / "checkpoints"
    manager = _manager(ckpts, tmp_path / "node")
    for step in (1, 2, 3):
        manager.save(step, model, optimizer, {"loss": 0.0})
    manager.finish()
    manager.close()
    _damage(ckpts / step_dir_name(3) / shard_name(0), "empty")
    manifest = json.loads((ckpts / step_dir_name(2) / MANIFEST).read_text())
    manifest["shards"][0]["bytes"] += 1  # an edited manifest
    (ckpts / step_dir_name(2) / MANIFEST).write_text(json.dumps(manifest))
    _damage(ckpts / step_dir_name(1) / shard_name(0), "flip")

    manager = _manager(ckpts, tmp_path / "node")
    with pytest.raises(RestoreError) as refused:
        manager.restore(model, optimizer, required=False)
    message = str(refused.value)
    assert message.startswith(f"no committed checkpoint in {ckpts} can be restored")
    assert f"{step_dir_name(3)}: {ckpts / step_dir_name(3) / shard_name(0)}: 0 bytes on disk" \
        in message
    assert f"{step_dir_name(2)}: {ckpts / step_dir_name(2) / shard_name(0)}: " in message
    assert f"{step_dir_name(1)}: rank 0: {ckpts / step_dir_name(1) / shard_name(0)}: sha256" \
        in message
    assert "--allow_fresh_start true" in message and "\n" not in message
    assert isinstance(refused.value, FinalError) and refused.value.same_on_every_rank
    assert [s for s, _ in CheckpointStore(ckpts).committed()] == [1, 2, 3]  # kept as they are

    with pytest.raises(RestoreError, match=r"\(--resume required\)$"):
        manager.restore(model, optimizer, required=True)
    assert manager.restore(model, optimizer, required=False, allow_fresh_start=True) is None
    assert CheckpointStore(ckpts).committed() == []
    assert sorted(p.name for p in ckpts.glob("*.skipped")) == [
        f"{step_dir_name(s)}.skipped" for s in (1, 2, 3)]
    manager.close()


# -- no checkpoint restorable: real jobs --------------------------------------------------------
@pytest.fixture(scope="module")
def damaged_run(cache_dir, tmp_path_factory) -> Path:
    """A real 2-rank run's checkpoints of steps 4 and 8, each with a damaged shard: an empty
    one (found by the manifest's sizes) and one bit flipped (found by its digest at load)."""
    run = tmp_path_factory.mktemp("damaged")
    ok(run_local(cache_dir, "baseline", run, "--max_steps", "8", "--checkpoint_interval", "4"))
    _damage(run / "checkpoints" / step_dir_name(8) / shard_name(1), "empty")
    _damage(run / "checkpoints" / step_dir_name(4) / shard_name(0), "flip")
    return run / "checkpoints"


# The tests of `damaged_run` run on one worker of `make test`, which builds it once.
on_damaged_run_worker = pytest.mark.xdist_group("damaged_run")


def _launches(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] in ("launch", "attempt_start")]


def _refused_restore(proc: subprocess.CompletedProcess, ckpts: Path) -> str:
    """The refusal: exit 2, said once, on the last line, naming both checkpoints and why."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"no committed checkpoint in {ckpts} can be restored" in last
    said = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "no committed checkpoint in" in line
            and "exit_ex: RestartAbort(" not in line]  # NVRx's own record, per rank, in-process
    assert said == [last]
    assert f"{step_dir_name(8)}: {ckpts / step_dir_name(8) / shard_name(1)}: 0 bytes on disk" \
        in last
    assert f"{step_dir_name(4)}: rank 0: {ckpts / step_dir_name(4) / shard_name(0)}: sha256" \
        in last
    assert "--allow_fresh_start true" in last
    assert [s for s, _ in CheckpointStore(ckpts).committed()] == [4, 8]  # nothing set aside
    return last


@on_damaged_run_worker
def test_every_committed_checkpoint_damaged_stops_before_training(cache_dir, damaged_run,
                                                                  tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(damaged_run, run_dir / "checkpoints")
    args = ("--max_steps", "12", "--checkpoint_interval", "4")
    _refused_restore(run_local(cache_dir, "baseline", run_dir, *args), run_dir / "checkpoints")
    ev = events(run_dir)
    assert not [e for e in ev if e["event"] == "step"]  # stopped before training
    assert len([e for e in ev if e["event"] == "launch"]) == 2  # one per rank: no job restart

    proc = run_local(cache_dir, "baseline", run_dir, *args, "--allow_fresh_start", "true")
    ok(proc)
    assert "starting from step 0 (--allow_fresh_start true)" in proc.stdout
    assert not [e for e in events(run_dir) if e["event"] in ("ckpt_load", "snapshot_load")]
    assert results(run_dir, signalled=True)["steps_completed"] == 12
    ckpts = run_dir / "checkpoints"
    assert {p.name for p in ckpts.glob("*.skipped")} == {f"{step_dir_name(4)}.skipped",
                                                         f"{step_dir_name(8)}.skipped"}


@on_damaged_run_worker
@pytest.mark.parametrize("tiers, mode, nnodes", [
    ("memory", "inprocess", 1),  # in-process restart does not retry it
    ("memory,node,peer", "ft_launcher", 2),  # nor does ft_launcher, with a peer on another node
])
def test_snapshot_tiers_with_the_durable_tier_damaged_stop_before_training(
        cache_dir, pace, damaged_run, tmp_path, tiers, mode, nnodes):
    run_dir = tmp_path / "run"
    shutil.copytree(damaged_run, run_dir / "checkpoints")
    proc = run_local(cache_dir, mode, run_dir, "--max_steps", "12", "--checkpoint_interval", "4",
                     "--tiers", tiers, "--snapshot_interval", "1", *pace.recovery_flags(),
                     nproc=2 // nnodes,
                     local_args=(*pace.runner_flags(mode), "--nnodes", str(nnodes)))
    _refused_restore(proc, run_dir / "checkpoints")
    ev = events(run_dir)
    assert not [e for e in ev if e["event"] in ("step", "snapshot_load", "ckpt_load")]
    assert all(e.get("launcher_restart", 0) == 0 and e.get("iteration", 0) == 0
               for e in _launches(run_dir)), "retried"


# -- a failure that every restart would meet again: not retried ---------------------------------
def test_a_checkpoint_of_other_data_ends_the_job_without_a_restart(cache_dir, tmp_path):
    """Another --data_path passes every check before launch (it may change), but the
    checkpoint's data position is for another dataset: every rank and every restart would fail
    alike, so the job ends at once with exit 2, and the Job's restarts are not spent."""
    from trainer.loop.data import BYTE, prepare
    from trainer.loop.sources import LOCAL

    small, large = tmp_path / "small", tmp_path / "large"
    prepare(LOCAL, 200, BYTE, small)
    prepare(LOCAL, 300, BYTE, large)
    run_dir = tmp_path / "run"
    ok(run_local(cache_dir, "baseline", run_dir, "--max_steps", "4", "--data_path", str(small)))
    proc = run_local(cache_dir, "baseline", run_dir, "--max_steps", "8",
                     "--data_path", str(large))
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "checkpoint data position is for" in last and "the dataset, --seq_len or --seed " \
        "changed" in last
    assert "restarting the whole job" not in proc.stdout + proc.stderr
    assert len([e for e in events(run_dir) if e["event"] == "launch"]) == 4  # two runs, 2 ranks


# -- exports ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_rank_checkpoint(one_rank_group, tmp_path_factory) -> Path:
    """A committed checkpoint of the tiny model, saved by one rank: what an export reads."""
    from trainer.atomic import write_json_atomic
    from trainer.loop.model import build_model

    root = tmp_path_factory.mktemp("export")
    ckpts = root / "checkpoints"
    model = build_model("tiny", seed=1)
    optimizer = torch.optim.AdamW(model.parameters())
    ckpts.mkdir()
    write_json_atomic(ckpts / SETTINGS_FILE, {"model": "tiny", "data_path": None})
    manager = _manager(ckpts, root / "node")
    manager.save(1, model, optimizer, {"loss": 0.0})
    manager.finish()
    manager.close()
    return ckpts


def _export_cmd(ckpts: Path, out: Path, fmt: str = "hf") -> list[str]:
    return [sys.executable, "-m", "trainer.export", "--checkpoint_dir", str(ckpts), "--format",
            fmt, "--out", str(out)]


def _whole_hf_export(out: Path) -> None:
    """Every file the index names, the config and the record: nothing missing, nothing mixed."""
    index = json.loads((out / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"].values())
    assert names and all((out / n).is_file() for n in names)
    assert {p.name for p in out.glob("*.safetensors")} == names
    assert (out / "config.json").is_file() and json.loads((out / "EXPORT.json").read_text())


@pytest.mark.slow
def test_a_second_export_to_the_same_out_is_refused_while_the_first_wins_whole(
        one_rank_checkpoint, tmp_path):
    from trainer.export.landing import lock_path

    exports = tmp_path / "exports"
    out = exports / "model"
    env = env_for(tmp_path / "cache")
    first = subprocess.Popen(_export_cmd(one_rank_checkpoint, out), cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def first_holds_the_lock() -> bool:
        try:
            return lock_path(out).read_text().strip() == f"pid {first.pid}"
        except OSError:
            return False

    try:
        wait_for(first_holds_the_lock, what="the first export to hold the lock")
        os.kill(first.pid, signal.SIGSTOP)  # mid-export, for as long as the second one takes
        try:
            line = _one_line_refusal(_export_cmd(one_rank_checkpoint, out), tmp_path)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert line == (f"export: error: another export to {out} is running (pid {first.pid}): "
                        "wait for it to end, or export elsewhere")
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    _whole_hf_export(out)
    assert [p.name for p in exports.iterdir()] == ["model"]  # no staging, no lock left


@pytest.mark.slow
def test_a_killed_export_leaves_no_half_out_and_the_next_one_clears_its_staging(
        one_rank_checkpoint, tmp_path):
    from trainer.export.landing import partial_prefix

    exports = tmp_path / "exports"
    out = exports / "model"
    killed = subprocess.Popen(_export_cmd(one_rank_checkpoint, out), cwd=ROOT,
                              env=env_for(tmp_path / "cache"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    staging = lambda: list(exports.glob(partial_prefix(out) + "*"))  # noqa: E731
    try:
        wait_for(lambda: exports.is_dir() and bool(staging()), what="the export to stage")
    finally:
        killed.kill()
        killed.wait()
    assert not out.exists() and staging()
    proc = subprocess.run(_export_cmd(one_rank_checkpoint, out), cwd=ROOT,
                          env=env_for(tmp_path / "cache"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _whole_hf_export(out)
    assert [p.name for p in exports.iterdir()] == ["model"]


@pytest.mark.parametrize("fmt", ["hf", "dcp"])
def test_an_export_that_fills_the_disk_is_one_line_naming_it(one_rank_checkpoint, tmp_path,
                                                             capsys, fmt):
    from trainer.export.cli import main

    with small_fs(tmp_path / "small", "1m") as small:
        out = small / "model"
        code = main(["--checkpoint_dir", str(one_rank_checkpoint), "--format", fmt,
                     "--out", str(out)])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"export: error: writing the export to {out} failed: No space "
                                 f"left on device: it needs ")
        assert err[0].endswith(f"{small} has 1.0 MB free")
        assert list(small.iterdir()) == []  # no half export, no staging, no lock


@pytest.mark.parametrize("writer", ["safetensors", "dcp"])
def test_a_disk_that_fills_during_the_write_is_named_whatever_the_writer(tmp_path, writer):
    """The room an export needs is checked before it writes; should the disk fill meanwhile,
    each writer's way of saying so (safetensors: text with the OS error's number; torch: a short
    write without its cause) becomes the same one line."""
    from trainer.export.landing import Staging, storage_failure

    tensors = {"w": torch.zeros(1 << 20)}  # 4 MiB, on a 1 MiB disk
    with small_fs(tmp_path / "small", "1m") as small:
        stage = Staging(small / "model", small / ".model.partial-x")
        stage.path.mkdir()
        stage.needed = 4 << 20
        with pytest.raises(BaseException) as failed:  # DCP's CheckpointException is one
            if writer == "safetensors":
                from safetensors.torch import save_file

                save_file(tensors, str(stage.path / "model.safetensors"))
            else:
                import torch.distributed.checkpoint as dcp

                dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(stage.path)),
                         no_dist=True)
        refused = storage_failure(failed.value, stage)
    assert isinstance(refused, StorageError)
    assert str(refused) == (f"writing the export to {small / 'model'} failed: No space left on "
                            f"device: {stage.path}")


def test_an_export_of_a_directory_without_checkpoints_says_so_first(tmp_path, capsys):
    """Without a committed checkpoint nothing else matters: said before the missing model."""
    from trainer.export.cli import main

    (tmp_path / "checkpoints").mkdir()
    assert main(["--checkpoint_dir", str(tmp_path / "checkpoints"), "--format", "hf",
                 "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"export: error: no committed checkpoint in {tmp_path / 'checkpoints'}"
    (tmp_path / "checkpoints" / step_dir_name(1)).mkdir()
    (tmp_path / "checkpoints" / step_dir_name(1) / MANIFEST).write_text("{}")
    assert main(["--checkpoint_dir", str(tmp_path / "checkpoints"), "--format", "hf",
                 "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{tmp_path / 'checkpoints' / SETTINGS_FILE} does not name the run's model" in line
    assert not (tmp_path / "out").exists()
