"""A launcher's stop request reaches its ranks whenever it is sent, and SIGTERM still ends a rank
at once (`trainer.termination`). Real processes and signals."""

import os
import signal
import subprocess
import sys

from tests.jobs import ROOT
from trainer import termination

RANK = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from trainer import termination
print("started", flush=True)
sys.stdin.readline()  # the test signals this process before its handler exists
termination.install()
time.sleep(0.2)
print("asked to stop" if termination.requested() else "not asked", flush=True)
sys.stdin.readline()
"""


def _rank(held: bool) -> subprocess.Popen:
    """A rank started by an agent that holds the stop signal (or not)."""
    agent = ("import subprocess, sys\n"
             "from trainer import termination\n"
             f"{'termination.hold_in_agent()' if held else ''}\n"
             "code = subprocess.call([sys.executable, '-c', sys.argv[1]])\n"
             "print('rank exit', code, flush=True)\n")
    return subprocess.Popen([sys.executable, "-c", agent, RANK], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _rank_pid(agent: subprocess.Popen) -> int:
    import psutil

    assert agent.stdout.readline().strip() == "started"
    (rank,) = psutil.Process(agent.pid).children()
    return rank.pid


def test_a_stop_request_sent_before_the_rank_is_ready_waits_for_it():
    agent = _rank(held=True)
    os.kill(_rank_pid(agent), termination.STOP_SIGNAL)
    agent.stdin.write("\n")
    agent.stdin.flush()
    assert agent.stdout.readline().strip() == "asked to stop"
    agent.stdin.write("\n")
    agent.stdin.flush()
    assert agent.stdout.readline().split() == ["rank", "exit", "0"]
    unheld = _rank(held=False)  # what the hold is for: the signal's default ends the rank
    os.kill(_rank_pid(unheld), termination.STOP_SIGNAL)
    assert unheld.stdout.readline().split() == ["rank", "exit", str(-termination.STOP_SIGNAL)]


def test_sigterm_still_ends_a_rank_at_once():
    """torchrun, ft_launcher and NVRx's in-process monitor tear ranks down with it."""
    agent = _rank(held=True)
    rank = _rank_pid(agent)
    agent.stdin.write("\n")
    agent.stdin.flush()
    assert agent.stdout.readline().strip() == "not asked"
    os.kill(rank, signal.SIGTERM)
    assert agent.stdout.readline().split() == ["rank", "exit", str(-signal.SIGTERM)]


def test_the_write_is_tried_only_if_it_fits_in_the_grace_left(one_rank_group):
    device = one_rank_group.device
    assert termination.time_allows(1e6, 1.0, device)  # not asked to stop: no deadline
    termination._note(termination.STOP_SIGNAL, None)
    try:
        grace = termination.EXIT_RESERVE_S + 60
        assert termination.time_allows(30.0, grace, device)
        assert not termination.time_allows(90.0, grace, device)
        assert not termination.time_allows(0.0, termination.EXIT_RESERVE_S, device)
    finally:
        termination._received = None
