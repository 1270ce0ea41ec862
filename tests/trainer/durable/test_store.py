"""The commit protocol: a checkpoint is visible only once complete and verified."""

import json

import pytest
import torch

from trainer.buffers import HostBuffer, Layout
from trainer.durable.store import (MANIFEST, CheckpointError, CheckpointStore, ShardWrite, marker_name,
                                   shard_name, step_dir_name, write_shard)


def _write(root, step, rank, world, value):
    tensors = {"w": torch.full((4, 3), float(value)), "b": torch.arange(5, dtype=torch.bfloat16)}
    buf = HostBuffer(root / f"buf{rank}", Layout.of(tensors), pin=False)
    buf.stage(tensors)
    req = ShardWrite(str(buf.path), buf.layout.to_json(), {"step": step, "params": {}},
                     str(root / step_dir_name(step)), rank, step, world)
    return write_shard(req)


def _commit(store, step, world=2):
    for r in range(world):
        _write(store.root, step, r, world, step + r)
    markers = store.ready_markers(step, world)
    store.commit(step, markers, {})


def test_commit_needs_every_marker_and_moves_latest(tmp_path):
    store = CheckpointStore(tmp_path, retain=2)
    _write(tmp_path, 10, 0, 2, 1.0)
    assert store.ready_markers(10, 2) is None  # rank 1 not done: nothing to commit
    assert store.latest_step() is None
    _write(tmp_path, 10, 1, 2, 2.0)
    store.commit(10, store.ready_markers(10, 2), {})
    assert store.latest_step() == 10
    assert json.loads((tmp_path / "latest").read_text())["step"] == 10
    assert [s for s, _, _ in store.candidates()] == [10]
    shard = store.open_shard(10, 1)
    shard.load_all()
    assert torch.equal(shard.get("w"), torch.full((4, 3), 2.0))
    assert torch.equal(shard.get("b"), torch.arange(5, dtype=torch.bfloat16))


def test_retention_keeps_newest_and_drops_abandoned_partials(tmp_path):
    store = CheckpointStore(tmp_path, retain=2)
    _commit(store, 5)
    _write(tmp_path, 7, 0, 2, 0.0)  # a partial checkpoint from a crash
    _commit(store, 10)
    _commit(store, 15)
    assert [s for s, _ in store.step_dirs()] == [10, 15]
    _write(tmp_path, 20, 0, 2, 0.0)  # in flight, newer than the newest commit: kept
    store.prune()
    assert [s for s, _ in store.step_dirs()] == [10, 15, 20]
    store.discard_after(15)
    assert [s for s, _ in store.step_dirs()] == [10, 15]


def test_resuming_before_a_damaged_checkpoint_sets_it_aside(tmp_path):
    store = CheckpointStore(tmp_path, retain=3)
    _commit(store, 5)
    _commit(store, 10)
    _write(tmp_path, 15, 0, 2, 0.0)  # partial
    store.discard_after(5)  # step 10 could not be loaded by every rank
    assert [s for s, _ in store.step_dirs()] == [5]
    assert (tmp_path / (step_dir_name(10) + ".skipped") / MANIFEST).is_file()
    assert store.ready_markers(10, 2) is None  # its markers can no longer be committed


def test_truncated_shard_and_bad_manifest_are_skipped_with_a_warning(tmp_path):
    warnings = []
    store = CheckpointStore(tmp_path, retain=3, warn=warnings.append)
    _commit(store, 5)
    _commit(store, 10)
    _commit(store, 15)
    shard = tmp_path / step_dir_name(15) / shard_name(1)
    shard.write_bytes(shard.read_bytes()[:-100])
    (tmp_path / step_dir_name(10) / MANIFEST).write_text("{not json")
    assert [s for s, _, _ in store.candidates()] == [5]
    assert any("step_00000015" in w and "bytes on disk" in w for w in warnings)
    assert any("step_00000010" in w and "unreadable manifest" in w for w in warnings)


def test_corrupted_shard_fails_its_checksum(tmp_path):
    store = CheckpointStore(tmp_path)
    _commit(store, 5)
    shard = tmp_path / step_dir_name(5) / shard_name(0)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        store.open_shard(5, 0).load_all()


def test_marker_that_disagrees_with_its_shard_is_an_error(tmp_path):
    store = CheckpointStore(tmp_path)
    _write(tmp_path, 5, 0, 1, 1.0)
    (tmp_path / step_dir_name(5) / shard_name(0)).write_bytes(b"short")
    with pytest.raises(CheckpointError, match="does not match"):
        store.ready_markers(5, 1)
    assert json.loads((tmp_path / step_dir_name(5) / marker_name(0)).read_text())["rank"] == 0


def _big_tensors(value: float) -> dict:
    """A shard of several chunks (rows of 1 KiB), so that reading rows touches only some."""
    return {"w": torch.full((3000, 256), value), "v": torch.arange(2048, dtype=torch.float32)}


def _write_big(root, chunk_bytes: int, monkeypatch) -> dict:
    import trainer.durable.store as store_module

    monkeypatch.setattr(store_module, "_HASH_CHUNK", chunk_bytes)
    tensors = _big_tensors(3.0)
    tensors["w"][1234] = 7.0
    buf = HostBuffer(root / "buf", Layout.of(tensors), pin=False)
    buf.stage(tensors)
    req = ShardWrite(str(buf.path), buf.layout.to_json(), {"step": 1, "params": {}},
                     str(root / step_dir_name(1)), 0, 1, 1)
    return write_shard(req)


def test_rows_are_read_from_verified_chunks_only(tmp_path, monkeypatch):
    """A resume at another world size reads the rows it owns: only the chunks that hold them
    are read, each checked against its digest."""
    marker = _write_big(tmp_path, 64 << 10, monkeypatch)
    assert len(marker["chunks"]) > 40 and marker["chunk_bytes"] == 64 << 10
    store = CheckpointStore(tmp_path)
    store.commit(1, [marker], {})
    shard = store.open_shard(1, 0)
    reads = []
    real_pread = __import__("os").pread
    monkeypatch.setattr("trainer.durable.store.os.pread",
                        lambda fd, n, off: reads.append((n, off)) or real_pread(fd, n, off))
    rows = shard.get("w", 1230, 1240)
    assert rows.shape == (10, 256) and float(rows[4, 0]) == 7.0 and float(rows[0, 0]) == 3.0
    assert sum(n for n, _ in reads) <= 2 * (64 << 10)  # one or two chunks, not the file
    assert torch.equal(shard.get("v", 100, 104), torch.arange(100, 104, dtype=torch.float32))


def test_a_damaged_chunk_is_refused_when_read(tmp_path, monkeypatch):
    marker = _write_big(tmp_path, 64 << 10, monkeypatch)
    store = CheckpointStore(tmp_path)
    store.commit(1, [marker], {})
    path = tmp_path / step_dir_name(1) / shard_name(0)
    data = bytearray(path.read_bytes())
    data[-200_000] ^= 0xFF  # inside w's rows near the end
    path.write_bytes(bytes(data))
    shard = store.open_shard(1, 0)
    assert shard.get("w", 0, 4).shape == (4, 256)  # chunks far from the damage still read
    with pytest.raises(CheckpointError, match="sha256 of chunk .* does not match its marker"):
        shard.get("w", 2000, 3000)
