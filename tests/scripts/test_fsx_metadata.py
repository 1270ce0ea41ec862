"""The metadata operations the plan counts are the ones the durable store makes: every call of a
real checkpoint's writes, commit and retention, recorded at two world sizes; and `bench.scale`'s
counts of rank 0's commit and of a resume through the checkpoint manager at two world sizes."""

from __future__ import annotations

import builtins
import io
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from bench import scale
from scripts import fsx_metadata
from trainer.buffers import HostBuffer, Layout
from trainer.durable.store import CheckpointStore, ShardWrite, step_dir_name, write_shard

KEEP = 2


class StoreCalls:
    """Every metadata call made on `root`, by the kinds of `scripts.fsx_metadata`."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root, self.counts, self._mp = str(root), Counter(), monkeypatch

    def _ours(self, path, dir_fd, by_descriptor: bool) -> bool:
        # shutil.rmtree lists a directory, and unlinks in it, through the directory's descriptor
        if dir_fd is not None or isinstance(path, int):
            return dir_fd is not None or by_descriptor
        return os.fspath(path).startswith(self.root)

    def _wrap(self, module, name: str, kind) -> None:
        real = getattr(module, name)

        def call(path, *args, **kwargs):
            if not self._ours(path, kwargs.get("dir_fd"), by_descriptor=name == "scandir"):
                return real(path, *args, **kwargs)
            if kind == "mkdir":
                try:
                    result = real(path, *args, **kwargs)
                except FileExistsError:
                    self.counts["mkdir_exists"] += 1
                    raise
                self.counts["mkdirs"] += 1
                return result
            self.counts[kind(args, kwargs) if callable(kind) else kind] += 1
            return real(path, *args, **kwargs)

        self._mp.setattr(module, name, call)

    def __enter__(self) -> "StoreCalls":
        def file_mode(args, kwargs):
            mode = args[0] if args else kwargs.get("mode", "r")
            return "creates" if set(mode) & set("wxa") else "opens"

        def os_flags(args, kwargs):
            return "creates" if (args[0] if args else kwargs["flags"]) & os.O_CREAT else "opens"

        for name in ("stat", "lstat"):
            self._wrap(os, name, "stats")
        self._wrap(os, "open", os_flags)
        self._wrap(builtins, "open", file_mode)
        self._wrap(io, "open", file_mode)
        for name in ("listdir", "scandir"):
            self._wrap(os, name, "listings")
        self._wrap(os, "replace", "renames")
        self._wrap(os, "unlink", "unlinks")
        self._wrap(os, "rmdir", "rmdirs")
        self._wrap(os, "mkdir", "mkdir")
        real_fsync = os.fsync
        self._mp.setattr(os, "fsync", lambda fd: (self.counts.update(["fsyncs"]), real_fsync(fd))[1])
        return self

    def __exit__(self, *exc) -> None:
        self._mp.undo()

    def as_ops(self) -> fsx_metadata.MetadataOps:
        return fsx_metadata.MetadataOps(**self.counts)


def _shard(buffers: Path, ckpt: Path, step: int, rank: int, world: int) -> dict:
    tensors = {"w": torch.full((64, 8), float(rank + step)), "b": torch.arange(5.0)}
    buf = HostBuffer(buffers / f"rank{rank}", Layout.of(tensors), pin=False)
    buf.stage(tensors)
    return write_shard(ShardWrite(str(buf.path), buf.layout.to_json(), {"step": step, "params": {}},
                                  str(ckpt / step_dir_name(step)), rank, step, world))


def _checkpoint(store: CheckpointStore, buffers: Path, step: int, world: int) -> None:
    for rank in range(world):
        _shard(buffers, store.root, step, rank, world)
    store.commit(step, store.ready_markers(step, world), {})


@pytest.mark.parametrize("world", [2, 5])
def test_a_checkpoint_makes_the_calls_the_plan_counts(world, tmp_path, monkeypatch):
    """The third checkpoint with keep_checkpoints 2: every rank's shard and marker, rank 0's
    commit, and the removal of the first checkpoint."""
    buffers, ckpt = tmp_path / "node", tmp_path / "ckpt"
    buffers.mkdir()
    ckpt.mkdir()
    store = CheckpointStore(ckpt, retain=KEEP)
    for step in (10, 20):
        _checkpoint(store, buffers, step, world)
    with StoreCalls(ckpt, monkeypatch) as calls:
        _checkpoint(store, buffers, 30, world)
    assert [s for s, _ in store.committed()] == [20, 30]
    assert calls.as_ops() == fsx_metadata.checkpoint(world, KEEP).all_ranks


def test_rank_0_grows_with_the_world_and_the_others_do_not():
    small, large = fsx_metadata.checkpoint(16, KEEP), fsx_metadata.checkpoint(64, KEEP)
    assert large.rank0.stats - small.rank0.stats == 3 * 48  # every marker and shard, once
    assert large.rank0.unlinks - small.rank0.unlinks == 2 * 48  # the oldest checkpoint's files
    per_rank = fsx_metadata.shard_save(makes_directory=False)
    assert (large.all_ranks.total - large.rank0.total) - (small.all_ranks.total - small.rank0.total) \
        == 48 * per_rank.total
    assert fsx_metadata.resume(64, KEEP).rank0.stats - fsx_metadata.resume(16, KEEP).rank0.stats \
        == 2 * 48 * KEEP  # every kept manifest's shards, checked and sized


# --- bench.scale: one rank of a world of N, through the checkpoint manager ----------------------
# bench.scale counts every stat, open and directory read of the process, on the checkpoint or
# not: it reads /proc/self/io when its counting starts and when it ends, and a resume's torch.load
# stats a file of torch's own (torch/utils/serialization/config.py) twice. The plan counts what
# reaches FSx.
HARNESS_OPENS = 2
TORCH_OWN_STATS = 2
WORLDS = (16, 64)


def _bench_view(ops: fsx_metadata.MetadataOps) -> dict[str, int]:
    return {"fs_stats": ops.stats, "fs_opens": ops.creates + ops.opens, "fs_listings": ops.listings}


def _measured(op: str, world: int, rank: int) -> dict[str, int]:
    counts = scale.measure(op, world, rank)
    return {k: counts.get(k, 0) for k in ("fs_stats", "fs_opens", "fs_listings")}


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_rank_0s_commit_matches_bench_scale(world):
    # bench.scale commits the first checkpoint of the directory: nothing to remove yet
    expected = _bench_view(fsx_metadata.commit(world, step_dirs=1))
    expected["fs_opens"] += HARNESS_OPENS
    assert _measured("commit", world, 0) == expected


@pytest.mark.slow
def test_a_resume_matches_bench_scale_at_two_world_sizes():
    """What bench.scale counts beyond the plan's resume is the same for rank 0 and another rank
    at both world sizes: what grows with the world is what the plan says grows."""
    rest = set()
    for world in WORLDS:
        for rank, ops in ((0, fsx_metadata.resume_rank0(world, keep=1) + fsx_metadata.shard_resume()),
                          (scale.playing_rank("resume", world), fsx_metadata.shard_resume())):
            measured, planned = _measured("resume", world, rank), _bench_view(ops)
            rest.add(tuple(measured[k] - planned[k] for k in measured))
    assert rest == {(TORCH_OWN_STATS, HARNESS_OPENS, 0)}
