"""Snapshots on a GPU: the copies run on streams beside the training step, so what a slot holds
depends on the events the optimizer waits for. Each test changes the state in place right after
the fence, as the optimizer does, with no host synchronization in between. Skipped without CUDA;
run on a GPU machine with `python -m pytest tests/trainer/test_snapshot_gpu.py`."""

import tempfile
import time
from pathlib import Path

import pytest
import torch

from trainer.accounting.events import EventLog
from trainer.buffers import DeviceStage, HostBuffer, Layout, host_copy_stream
from trainer.snapshots import Snapshotter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MIB = 1 << 20


def _state(value: float) -> dict[str, torch.Tensor]:
    """Some 768 MiB on the device, large enough that a copy takes a while, and a scalar like
    fused Adam's step count."""
    dev = torch.device("cuda", 0)
    state = {f"p{i}": torch.full((64 * MIB,), value, device=dev) for i in range(3)}
    state["step"] = torch.tensor(value, device=dev)
    return state


def _optimizer(state: dict[str, torch.Tensor], value: float) -> None:
    for t in state.values():
        t.fill_(value)


@pytest.fixture
def node_dir():
    """Slots live in a memory file system, as on the nodes (--node_dir defaults to /dev/shm)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        yield Path(d)


def _snapshotter(root: Path, share: float) -> Snapshotter:
    return Snapshotter(root, rank=0, world_size=1, local_world_size=1,
                       device=torch.device("cuda", 0), tiers=("memory", "node"), budget_gib=0.0,
                       durable=False, events=EventLog(None, 0), device_share=share)


def _holds(slot, value: float) -> bool:
    return all(bool((view == value).all()) for view in slot.buffer.views.values())


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0], ids=["host", "split", "device"])
def test_the_optimizer_right_after_the_fence_never_reaches_the_snapshot(node_dir, share):
    snap = _snapshotter(node_dir, share)
    state = _state(1.0)
    snap.own.take(0, state, {"step": 0})  # first allocations of pinned memory synchronize the device
    snap.own.poll(wait=True)
    # The host runs ahead: the step's own kernels still run when its snapshot is queued, so
    # the copies and the optimizer after the fence would start together, but for the fence.
    torch.cuda._sleep(200_000_000)
    slot = snap.own.take(1, state, {"step": 1})
    snap.own.fence()
    _optimizer(state, 2.0)
    snap.own.poll(wait=True)
    assert slot.step == 1 and _holds(slot, 1.0)
    snap.close(delete=True)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0], ids=["host", "split", "device"])
def test_a_snapshot_due_while_the_last_copy_runs_keeps_the_newest_complete_one(node_dir, share):
    """Copies slower than steps: step 3's snapshot is due while step 2's copy still runs, and the
    only other slot holds step 1, the newest complete snapshot. Step 1 must stay until step 2 is
    complete: a crash in between would otherwise find no snapshot at all."""
    snap = _snapshotter(node_dir, share)
    state = _state(1.0)
    snap.own.take(1, state, {"step": 1})
    snap.own.poll(wait=True)
    torch.cuda._sleep(200_000_000)  # step 2's kernels still run, so its copy is still to come
    snap.own.take(2, state, {"step": 2})
    snap.own.fence()
    _optimizer(state, 3.0)
    snap.own.take(3, state, {"step": 3})
    newest = snap.own.newest()
    assert newest is not None and newest.step == 2 and _holds(newest, 1.0)
    assert snap.stats["waits"] == 1
    snap.own.poll(wait=True)
    assert snap.own.newest().step == 3 and _holds(snap.own.newest(), 3.0)
    snap.close(delete=True)


def test_a_device_without_an_index_is_the_current_one(node_dir):
    """"cuda" alone names no device, and the committer thread must select one."""
    snap = Snapshotter(node_dir, rank=0, world_size=1, local_world_size=1,
                       device=torch.device("cuda"), tiers=("memory", "node"), budget_gib=0.0,
                       durable=False, events=EventLog(None, 0))
    state = _state(1.0)
    torch.cuda._sleep(100_000_000)
    slot = snap.own.take(1, state, {"step": 1})
    assert slot.pending is not None  # the copy runs: the committer thread will commit it
    deadline = time.monotonic() + 30
    while slot.step != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slot.step == 1 and snap.own.committer_running
    snap.close(delete=True)


@pytest.mark.parametrize("share", [0.5, 1.0], ids=["split", "device"])
def test_captures_queued_back_to_back_through_one_device_stage_each_land_whole(node_dir, share):
    """The device stage is refilled every step: each fill must wait for the copy out of the
    previous one, and the host never waits in between (six buffers: no slot is reused)."""
    state = _state(1.0)
    layout = Layout.of(state)
    stage = DeviceStage(layout, torch.device("cuda", 0), layout.suffix_start(share))
    stream = host_copy_stream(torch.device("cuda", 0))
    buffers = [HostBuffer.open(node_dir / f"b{i}.buf", layout, pin=True) for i in range(6)]
    for step, buf in enumerate(buffers, start=1):
        _optimizer(state, float(step))
        staged = stage.fill(state)
        stage.drain(buf, stream)
        torch.cuda.current_stream().wait_event(staged)  # the fence
    torch.cuda.synchronize()
    for step, buf in enumerate(buffers, start=1):
        staged_part = {n: v for n, v in buf.views.items() if n in stage.views}
        assert staged_part and all(bool((v == step).all()) for v in staged_part.values())
        buf.close(delete=True)


def test_a_relaunch_pins_the_slot_it_restores_from_first_and_the_others_after_a_snapshot(node_dir):
    """A relaunched worker finds its predecessor's slots: only the newest snapshot's is pinned
    before the restore; the others are pinned in the background once snapshots start, and no
    snapshot is copied into a slot meanwhile being pinned."""
    first = _snapshotter(node_dir, 0.0)
    for step in (1, 2):
        first.own.take(step, _state(float(step)), {"step": step})
        first.own.poll(wait=True)
    first.close(delete=False)
    again = _snapshotter(node_dir, 0.0)
    state = _state(3.0)
    again.own.allocate(Layout.of(state))
    newest = again.own.newest()
    others = [s for s in again.own.slots if s is not newest]
    assert newest.step == 2 and newest.buffer._pinned and _holds(newest, 2.0)
    assert others and not any(s.buffer._pinned for s in others)
    for step in range(3, 8):
        _optimizer(state, float(step))
        slot = again.own.take(step, state, {"step": step})
        assert slot is None or not slot.buffer.pin_pending
        again.own.poll(wait=True)
        assert again.own.newest().step == step and _holds(again.own.newest(), float(step))
    deadline = time.monotonic() + 60
    while any(s.buffer.pin_pending for s in others) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(s.buffer._pinned for s in again.own.slots)
    again.close(delete=True)


@pytest.mark.parametrize("share", [0.5, 1.0], ids=["split", "device"])
def test_a_restore_from_the_device_stage_reads_the_step_it_holds_even_with_its_fill_queued(node_dir, share):
    """An in-process restore copies the stage's tensors device to device instead of the slot's
    over PCIe. The fill runs on a stream of its own: a read queued on the compute stream right
    after it, with no host synchronization, must still see the filled step."""
    snap = _snapshotter(node_dir, share)
    state = _state(1.0)
    snap.own.take(1, state, {"step": 1})
    snap.own.poll(wait=True)
    _optimizer(state, 2.0)
    torch.cuda._sleep(200_000_000)  # the step's kernels still run: the fill is still to come
    slot = snap.own.take(2, state, {"step": 2})
    snap.own.fence()
    views = snap.own.stage.read_views()
    restored = {n: torch.full_like(t, -1.0) for n, t in views.items()}
    for n, t in views.items():
        restored[n].copy_(t, non_blocking=True)
    _optimizer(state, 3.0)  # the next step, after the fence
    torch.cuda.synchronize()
    assert restored and all(bool((t == 2.0).all()) for t in restored.values())
    snap.own.poll(wait=True)
    assert slot.step == 2 and _holds(slot, 2.0)
    staged = snap.own.staged_views(2)
    assert set(staged) == set(views) and all(bool((t == 2.0).all()) for t in staged.values())
    assert snap.own.staged_views(1) == {}
    snap.close(delete=True)
