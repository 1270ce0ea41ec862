"""A run that has ended: the node's launcher (`trainer.recovery.launch.supervise`) stops a
standby agent (no workers) and exits 0, but leaves an agent whose workers have just finished
to end on its own: stopped in its exit barrier, ft_launcher's agent would never close the
rendezvous, and a node that comes later would train again.

The agent here is a process of the same shape as ft_launcher's: its workers lead process
groups of their own, and after them it waits (its exit barrier) before it closes and exits.
The look intervals are shortened in the supervising process so that each case takes seconds."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
END = "step 4 of 4 is committed"


def agent(worker_s: float, then_s: float, closed: Path) -> list[str]:
    """An agent whose worker (0 s: none) lives `worker_s`; it then waits `then_s` and records
    that it closed the rendezvous."""
    code = ("import subprocess, sys, time\n"
            f"if {worker_s} > 0:\n"
            f"    subprocess.run([sys.executable, '-c', 'import time; time.sleep({worker_s})'],"
            " start_new_session=True)\n"
            f"time.sleep({then_s})\n"
            f"open({str(closed)!r}, 'w').write('closed')\n")
    return [sys.executable, "-c", code]


def supervised(cmd: list[str], agent_exit_s: float) -> subprocess.CompletedProcess:
    prog = ("import os, sys\n"
            "import trainer.recovery.launch as launch\n"
            "launch.END_POLL_S, launch.WORKER_POLL_S = 1.0, 0.2\n"
            f"launch.AGENT_EXIT_S = {agent_exit_s}\n"
            f"sys.exit(launch.supervise({cmd!r}, dict(os.environ), finished=lambda: {END!r}))\n")
    return subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_an_agent_whose_workers_finished_closes_the_rendezvous_itself(tmp_path):
    closed = tmp_path / "closed"
    proc = supervised(agent(worker_s=1.5, then_s=4.0, closed=closed), agent_exit_s=330)
    assert proc.returncode == 0, proc.stderr
    assert closed.read_text() == "closed"  # not stopped in its exit barrier
    assert "nothing to train" not in proc.stderr


@pytest.mark.parametrize("worker_s", [0, 1.5], ids=["never-seated", "seated-long-ago"])
def test_a_standby_agent_is_stopped_once_the_run_has_ended(tmp_path, worker_s):
    closed = tmp_path / "closed"
    proc = supervised(agent(worker_s=worker_s, then_s=600, closed=closed), agent_exit_s=2.0)
    assert proc.returncode == 0, proc.stderr
    assert not closed.exists()
    assert f"the run has ended ({END}): this node has nothing to train" in proc.stderr
