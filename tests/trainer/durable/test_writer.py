"""The checkpoint writer process of one rank: forked before the process group exists, as
`trainer.cli` does, and replaced after it dies. One real rank, NVRx's real persistent writer."""

from __future__ import annotations

import os
import signal
import socket

import pytest
import torch
import torch.distributed as dist

from trainer.accounting.events import EventLog
from trainer.cli import fork_writer
from trainer.config import parse_args
from trainer.durable.manager import CheckpointManager
from trainer.durable.store import CheckpointError, CheckpointStore
from trainer.lifetime import process_start

pytestmark = pytest.mark.slow  # a process group and writer processes


def _writer_pid(manager: CheckpointManager) -> int:
    return manager._writer._ckpt._async_calls_queue.persistent_caller.process.pid


def _group() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def test_a_forked_writer_commits_and_a_dead_one_is_replaced_by_a_spawned_one(tmp_path,
                                                                              monkeypatch):
    from trainer.loop.model import build_model

    monkeypatch.setenv("RANK", "0")
    ckpts = tmp_path / "checkpoints"
    cfg = parse_args(["--checkpoint_dir", str(ckpts), "--use_async_checkpoint", "true"])
    writer = fork_writer(cfg)  # before the process group, as a rank does
    assert writer is not None and writer.forked
    assert fork_writer(parse_args(["--checkpoint_dir", str(ckpts),
                                   "--use_async_checkpoint", "false"])) is None
    _group()
    manager = CheckpointManager(str(ckpts), rank=0, world_size=1, device=torch.device("cpu"),
                                use_async=True, retain=3, timeout_s=60,
                                events=EventLog(None, 0), node_root=tmp_path / "node",
                                writer=writer)
    try:
        model = build_model("tiny", seed=0)
        optimizer = torch.optim.AdamW(model.parameters())
        manager.start_writer()
        forked = _writer_pid(manager)
        assert manager._writer is writer  # taken, not started again
        manager.save(1, model, optimizer, {"loss": 0.0})
        manager.finish()

        os.kill(forked, signal.SIGKILL)
        manager.save(2, model, optimizer, {"loss": 0.0})
        with pytest.raises(CheckpointError, match="writer of rank 0 died .* step 2"):
            manager.wait_for_writer()

        # as an in-process restart goes on: a new attempt resumes from the newest commit
        manager.rejoin(0, 1, lambda: None)
        assert manager.restore(model, optimizer, required=True)["step"] == 1
        manager.save(3, model, optimizer, {"loss": 0.0})  # a new writer, watching this rank
        spawned = _writer_pid(manager)
        assert spawned != forked and not manager._writer.forked
        manager.finish()
        assert [s for s, _ in CheckpointStore(ckpts).committed()] == [1, 3]
    finally:
        manager.close()
        dist.destroy_process_group()
    assert process_start(forked) is None and process_start(spawned) is None
