"""The durable tier's staging buffer across a restart: a failed rank leaves it and its layout on
the node, and the next process maps (on a GPU: pins) it in the background before its model
exists; a run that completes removes both."""

import json

import torch

from trainer.accounting.events import EventLog
from trainer.durable.manager import CheckpointManager, staging_path, warm_staging
from trainer.buffers import HostBuffer, Layout


def _manager(tmp_path) -> CheckpointManager:
    return CheckpointManager(str(tmp_path / "ckpt"), rank=0, world_size=1,
                             device=torch.device("cpu"), use_async=False, retain=2, timeout_s=60,
                             events=EventLog(None, 0), node_root=tmp_path / "node")


def test_a_restarted_rank_gets_its_staging_buffer_mapped_in_the_background(tmp_path):
    layout = Layout.of({"w": torch.zeros(1024), "step": torch.zeros(())})
    buf = staging_path(tmp_path / "node", 0)
    sidecar = buf.with_suffix(".json")
    first = _manager(tmp_path)
    first.prepare(layout)
    first.close(failed=True)  # a failed rank: the buffer and its layout stay
    assert buf.is_file() and Layout.from_json(json.loads(sidecar.read_text())) == layout

    warm_staging(tmp_path / "node", 0, pin=False)
    (thread,) = HostBuffer.warming(buf.parent)
    thread.join(timeout=30)
    warmed = HostBuffer.opened(buf.parent)[buf.resolve()]

    second = _manager(tmp_path)
    second.prepare(layout)
    assert HostBuffer.opened(buf.parent)[buf.resolve()] is warmed  # reused, not mapped again
    second.close()  # a complete run
    assert not buf.exists() and not sidecar.exists()


def test_no_layout_beside_the_buffer_means_nothing_to_warm(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    staging_path(node, 0).write_bytes(b"\0" * 4096)
    warm_staging(node, 0, pin=False)
    assert not HostBuffer.warming(node)
