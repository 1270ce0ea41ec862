"""Snapshot slots: the newest complete snapshot is never the one being overwritten, also while a
durable checkpoint is being written from another slot for many steps."""

import threading
import time

import pytest
import torch

from config.contract import own_slots, snapshot_bytes
from trainer.accounting.events import EventLog
from trainer.errors import ConfigError
from trainer.buffers import HostBuffer, Layout
from trainer.snapshots import Snapshotter, warm_slots


def _snapshotter(tmp_path, durable: bool) -> Snapshotter:
    return Snapshotter(tmp_path, rank=0, world_size=1, local_world_size=1,
                       device=torch.device("cpu"), tiers=("memory", "node"), budget_gib=0.0,
                       durable=durable, events=EventLog(None, 0))


def _state(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((64,), float(step)), "m": torch.full((8, 8), float(-step))}


@pytest.mark.parametrize("durable", [True, False])
def test_every_snapshot_leaves_the_previous_one_while_a_durable_write_reads_a_slot(tmp_path, durable):
    snap = _snapshotter(tmp_path, durable)
    reading = snap.own.take(4, _state(4), {"step": 4})
    snap.own.pin(reading)  # a durable write of step 4 runs in the background for many steps
    overwritten = []
    for step in range(5, 12):
        previous = snap.own.newest()
        slot = snap.own.take(step, _state(step), {"step": step})
        assert slot is not None and slot is not reading and reading.step == 4
        overwritten.append(slot is previous)
        assert snap.own.newest().step == step
        assert float(snap.own.newest().buffer.views["w"][0]) == step
    # With durable checkpoints the tiers keep a slot for the writer, so no snapshot ever
    # overwrites the newest complete one; without that slot, every one would.
    assert not any(overwritten[1:]) if durable else all(overwritten[1:])
    snap.close(delete=True)


def test_the_newest_snapshot_is_never_the_free_slot_while_the_other_copy_is_in_flight(tmp_path):
    """Two slots: step 5 complete in one, step 6 still being copied into the other. Overwriting
    step 5 now would leave no complete snapshot until the copy lands, so no slot is free; `take`
    then waits for the copy (on a GPU, where copies run in the background)."""
    snap = _snapshotter(tmp_path, durable=False)
    done = snap.own.take(5, _state(5), {"step": 5})
    copying = next(s for s in snap.own.slots if s is not done)
    copying.pending = (6, {"step": 6}, None)  # what `take` leaves while a device copy runs
    assert snap.own.free_slot() is None
    snap.own.pin(done)  # the durable write's or a peer's read: step 5 stays readable, still not free
    assert snap.own.free_slot() is None
    snap.own.unpin(done)
    copying.pending = None
    copying.commit(6, {"step": 6}, {})  # the copy landed: step 5 is the one to overwrite now
    assert snap.own.free_slot() is done
    snap.close(delete=True)


def test_a_slot_being_pinned_in_the_background_is_never_the_free_slot(tmp_path, monkeypatch):
    """A relaunched worker pins its other slots after the first snapshot (`pin_later`): until a
    slot's registration is done, no copy goes into it; a newest snapshot is overwritten instead,
    while an older complete one stays."""
    snap = _snapshotter(tmp_path, durable=True)
    for step in (1, 2):
        snap.own.take(step, _state(step), {"step": step})
    newest = snap.own.newest()
    release = threading.Event()
    monkeypatch.setattr(HostBuffer, "_pin", lambda self: release.wait(30))
    later = [s.buffer for s in snap.own.slots if s is not newest]
    HostBuffer.pin_later(later)
    assert all(b.pin_pending for b in later)
    assert snap.own.free_slot() is newest  # step 1 stays complete in its slot meanwhile
    release.set()
    deadline = time.monotonic() + 30
    while any(b.pin_pending for b in later) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert snap.own.free_slot() is not newest
    snap.close(delete=True)


def test_memory_rule_counts_the_writer_slot_and_the_peer_slots():
    shard = 1000
    assert own_slots(peer=False, durable=False) == 2
    assert snapshot_bytes(shard, peer=False, durable=True) == 3 * shard
    assert snapshot_bytes(shard, peer=True, durable=True) == (4 + 2) * shard  # 4 own + 2 replicas


def test_slots_larger_than_the_node_directory_are_a_clear_error_before_any_file(tmp_path):
    """An 8B-sized shard on a node directory too small for its slots: refused up front, instead
    of a SIGBUS when the memory file system runs out while the slots are first touched."""
    snap = _snapshotter(tmp_path, durable=True)
    shard = Layout.of(_state(1))
    huge = Layout(shard.fields, 2**62)  # more than any file system here holds
    with pytest.raises(ConfigError, match=r"snapshot buffers of the node's 1 rank\(s\) need .* GiB"):
        snap.own.allocate(huge)
    assert not list(tmp_path.glob("*.buf"))


def test_a_restarted_process_gets_the_slots_its_predecessor_left_mapped_in_the_background(tmp_path):
    """warm_slots maps (and on a GPU pins) the slot of the previous process's newest snapshot
    before the model exists; the new snapshotter's allocate then reuses that very buffer and
    maps the others, contents and headers intact."""
    first = _snapshotter(tmp_path, durable=True)
    for step in (1, 2, 3):
        first.own.take(step, _state(step), {"step": step})
    first.close()  # a process ending: the files stay for the node tier
    assert not HostBuffer.opened(tmp_path)

    warm_slots(tmp_path, rank=0, pin=False)
    threads = HostBuffer.warming(tmp_path)
    assert len(threads) == 1
    threads.pop().join(timeout=30)
    warmed = HostBuffer.opened(tmp_path)
    assert len(warmed) == 1

    second = _snapshotter(tmp_path, durable=True)
    second.own.allocate(Layout.of(_state(0)))
    assert {id(b) for b in warmed.values()} == {id(second.own.newest().buffer)}
    assert not HostBuffer.warming(tmp_path)
    assert second.own.newest().step == 3 and float(second.own.newest().buffer.views["w"][0]) == 3
    assert sorted(s.step for s in second.own.slots) == [-1, 2, 3]
    second.close(delete=True)


def test_buffers_open_in_parallel_and_a_new_layout_replaces_an_open_buffer(tmp_path):
    small, large = Layout.of(_state(1)), Layout.of({"w": torch.zeros(4096)})
    paths = [tmp_path / f"b{i}.buf" for i in range(3)]
    bufs = HostBuffer.open_all(paths, small, pin=False)
    assert [b.path for b in bufs] == [p.resolve() for p in paths]
    assert HostBuffer.open(paths[0], small, pin=False) is bufs[0]
    replaced = HostBuffer.open(paths[0], large, pin=False)
    assert replaced is not bufs[0] and replaced.layout == large and bufs[0].flat is None
    for b in (replaced, *bufs[1:]):
        b.close(delete=True)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_a_snapshot_is_whole_whatever_share_goes_through_the_device_stage(tmp_path, share):
    """`--snapshot_staging` host, split and device: the same bytes reach the slot; the stage
    holds the tensors from the split on, and only its bytes."""
    state = {"model/w": torch.randn(96), "optim/w/step": torch.tensor(3.0),
             "optim/w/exp_avg": torch.randn(96), "model/b": torch.randn(32),
             "optim/b/step": torch.tensor(3.0), "optim/b/exp_avg": torch.randn(32)}
    snap = Snapshotter(tmp_path, rank=0, world_size=1, local_world_size=1,
                       device=torch.device("cpu"), tiers=("memory",), budget_gib=0.0,
                       durable=False, events=EventLog(None, 0), device_share=share)
    slot = snap.own.take(1, state, {"step": 1})
    for name, t in state.items():
        assert torch.equal(slot.buffer.views[name], t), name
    layout = slot.buffer.layout
    start = layout.suffix_start(share)
    staged = [] if snap.own.stage is None else list(snap.own.stage.views)
    assert staged == [s.name for s in layout.fields if s.offset >= start]
    assert (snap.own.stage is None) == (share == 0.0)
    if snap.own.stage is not None:
        assert snap.own.stage.flat.numel() == layout.total_bytes - start
    if share == 0.5:
        assert 0 < start < layout.total_bytes
    snap.close(delete=True)


def test_the_device_stage_serves_a_restore_only_while_it_holds_the_step(tmp_path):
    """An in-process restore reads the stage's tensors instead of the slot's copies, but only
    those of the stage's last fill: an older step, or a slot rewritten since, reads the slot."""
    def state(v: float) -> dict:
        return {"model/w": torch.full((64,), v), "optim/w/step": torch.tensor(v),
                "optim/w/exp_avg": torch.full((64,), -v)}

    snap = Snapshotter(tmp_path, rank=0, world_size=1, local_world_size=1,
                       device=torch.device("cpu"), tiers=("memory",), budget_gib=0.0,
                       durable=False, events=EventLog(None, 0), device_share=1.0)
    snap.own.take(1, state(1.0), {"step": 1})
    assert set(snap.own.staged_views(1)) == set(state(1.0))
    second = snap.own.take(2, state(2.0), {"step": 2})
    assert snap.own.staged_views(1) == {}  # the stage has moved on to step 2
    staged = snap.own.staged_views(2)
    for name, t in state(2.0).items():
        assert torch.equal(staged[name], t) and torch.equal(second.buffer.views[name], t), name
    second.invalidate()
    assert snap.own.staged_views(2) == {}
    snap.close(delete=True)
