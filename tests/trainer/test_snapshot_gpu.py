"""Snapshots on a GPU: the copies run on streams beside the training step, so what a slot holds
depends on the events the optimizer waits for. Each test changes the state in place right after
the fence, as the optimizer does, with no host synchronization in between. Skipped without CUDA;
run on a GPU machine with `python -m pytest tests/trainer/test_snapshot_gpu.py`."""

import tempfile
from pathlib import Path

import pytest
import torch

from trainer.events import EventLog
from trainer.snapshot import Snapshotter
from trainer.staging import DeviceStage, HostBuffer, Layout, host_copy_stream

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
    snap.take(0, state, {"step": 0})  # first allocations of pinned memory synchronize the device
    snap.poll(wait=True)
    # The host runs ahead: the step's own kernels still run when its snapshot is queued, so
    # the copies and the optimizer after the fence would start together, but for the fence.
    torch.cuda._sleep(200_000_000)
    slot = snap.take(1, state, {"step": 1})
    snap.fence()
    _optimizer(state, 2.0)
    snap.poll(wait=True)
    assert slot.step == 1 and _holds(slot, 1.0)
    snap.close(remove=True)


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
        staged, _ = stage.capture(state, buf, stream)
        torch.cuda.current_stream().wait_event(staged)  # the fence
    torch.cuda.synchronize()
    for step, buf in enumerate(buffers, start=1):
        staged_part = {n: v for n, v in buf.views.items() if n in stage.views}
        assert staged_part and all(bool((v == step).all()) for v in staged_part.values())
        buf.close(unlink=True)
