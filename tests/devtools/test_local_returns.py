"""When the local runner brings a lost node back: after some seconds, or after the others
trained some steps since the loss (rank 0's step events, as the log grows)."""

import argparse
import time

import pytest

from devtools.local import Returns, parse
from trainer.accounting.events import EventLog, node_log_name


def _returns(tmp_path, seconds: float = 0.0, steps=None) -> Returns:
    return Returns(argparse.Namespace(node_return_s=seconds, node_return_steps=steps), tmp_path)


def test_a_node_returns_after_the_steps_trained_since_its_loss(tmp_path):
    rank0 = EventLog(tmp_path / node_log_name(0), 0)
    rank0.emit("step", step=1, dt=0.1)  # before the loss: not counted
    returns = _returns(tmp_path, steps=2)
    time.sleep(0.01)
    returns.lose(1)
    assert 1 in returns and not returns.by_time()
    rank0.emit("step", step=2, dt=0.1)
    assert returns.due() == []
    rank0.emit("ckpt_commit", step=2)
    rank0.emit("step", step=3, dt=0.1)
    assert returns.due() == [1]
    assert 1 not in returns and returns.due() == []


def test_a_node_returns_after_its_seconds_or_never(tmp_path):
    returns = _returns(tmp_path, seconds=0.0)
    assert not returns.by_time(), "no node lost: none to come back"
    returns.lose(0)
    assert returns.by_time() and returns.due() == [0]
    never = _returns(tmp_path, seconds=-1)
    never.lose(0)
    assert not never.by_time() and never.due() == []


def test_a_return_after_no_step_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["--node_return_steps", "0"])
    assert exc.value.code == 2
    assert "--node_return_steps 0 must be at least 1" in capsys.readouterr().err
