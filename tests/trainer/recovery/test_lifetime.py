"""Each helper of a run ends with the process that started it, however that one ended; the lease
names its holder by pid and start time (`trainer.lifetime`). Real processes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobs import ROOT, env_for
from trainer.durable.lease import Lease, LeaseError
from trainer.lifetime import ProcessId, process_start

BOUND_S = 120  # how long a test waits for a process to appear or go before it fails


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    return process_start(pid) is not None  # a zombie has exited


def _parent(tmp_path: Path, body: str) -> tuple[subprocess.Popen, int]:
    """A parent process running `body`, which starts one helper and writes its pid to the file
    `out`; returns the parent and the helper's pid."""
    out = tmp_path / "helper.pid"
    code = (f"import os, sys, time; sys.path.insert(0, {str(ROOT)!r}); out = {str(out)!r}\n"
            f"{body}\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env_for(tmp_path))
    try:
        _wait(lambda: out.exists() and out.read_text().strip(), "the helper never started")
    except BaseException:
        parent.kill()  # and its helpers with it, if they follow it
        parent.wait()
        raise
    return parent, int(out.read_text())


def _kill_and_expect_gone(parent: subprocess.Popen, helper: int) -> None:
    try:
        assert _alive(helper)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _wait(lambda: not _alive(helper), "the helper outlived its parent")
    finally:
        parent.kill()
        if _alive(helper):
            os.kill(helper, signal.SIGKILL)


def _started(helper: str) -> str:
    """Parent code that starts `helper` (which gets the repository root and `out` as argv)."""
    return ("import subprocess\n"
            f"subprocess.Popen([sys.executable, '-c', {helper!r}, {str(ROOT)!r}, out], "
            "start_new_session=True)\n")


HELPER = ("import os, sys, time; sys.path.insert(0, sys.argv[1])\n{}\n"
          "open(sys.argv[2], 'w').write(str(os.getpid()))\ntime.sleep(600)\n")


def test_a_helper_following_its_parent_exits_once_the_parent_is_killed(tmp_path):
    """The watch for helpers started from a thread that may end first (the checkpoint writer)."""
    helper = HELPER.format("from trainer.lifetime import follow_parent\n"
                           "follow_parent(os.getppid(), poll_s=0.05)")
    _kill_and_expect_gone(*_parent(tmp_path, _started(helper)))


def test_a_helper_whose_parent_is_gone_before_it_looks_exits_at_once():
    for call in ("follow_parent", "die_with_parent"):
        proc = subprocess.run([sys.executable, "-c",
                               f"import os, sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
                               f"from trainer.lifetime import {call}\n"
                               f"{call}(os.getppid() + 1_000_000)\n"
                               "time.sleep(60)\n"], timeout=BOUND_S)
        assert proc.returncode == 1, call


def test_a_launchers_child_gets_the_parent_death_signal(tmp_path):
    """What the local runner and `trainer.recovery.launch` give the elastic agent they start."""
    body = ("import subprocess\n"
            "from trainer.lifetime import child_dies_with_me\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True, preexec_fn=child_dies_with_me())\n"
            "open(out, 'w').write(str(child.pid))\n")
    _kill_and_expect_gone(*_parent(tmp_path, body))


def test_a_command_line_worker_dies_with_the_agent_that_named_itself(tmp_path):
    """As torch elastic starts a worker: in a session of its own, from the agent's main thread."""
    helper = HELPER.format("from trainer.lifetime import worker_dies_with_agent\n"
                           "worker_dies_with_agent()")
    body = "from trainer.lifetime import announce_agent\nannounce_agent()\n"
    _kill_and_expect_gone(*_parent(tmp_path, body + _started(helper)))


def test_a_worker_whose_agent_died_before_it_started_exits_at_once(tmp_path):
    proc = subprocess.run([sys.executable, "-c",
                           f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
                           "from trainer.lifetime import worker_dies_with_agent\n"
                           "worker_dies_with_agent()\n"
                           "time.sleep(60)\n"],
                          env={**env_for(tmp_path), "NVRX_EKS_AGENT": str(os.getpid() + 1_000_000)},
                          timeout=BOUND_S)
    assert proc.returncode == 1


def test_a_forked_worker_dies_with_its_fork_server(tmp_path):
    """The fork server forks the ft_launcher workers (`trainer.recovery.worker_groups`)."""
    body = ("import multiprocessing\n"
            "from multiprocessing import forkserver\n"
            "def work(path):\n"
            "    open(path, 'w').write(str(os.getpid()))\n"
            "    time.sleep(600)\n"
            "if __name__ == '__main__':\n"
            "    ctx = multiprocessing.get_context('forkserver')\n"
            "    ctx.set_forkserver_preload(['trainer.recovery.worker_groups'])\n"
            "    p = ctx.Process(target=work, args=(out + '.worker',))\n"
            "    p.start()\n"
            "    while not os.path.exists(out + '.worker') or not open(out + '.worker').read():\n"
            "        time.sleep(0.05)\n"
            "    open(out, 'w').write(str(forkserver._forkserver._forkserver_pid) + ' ' + "
            "open(out + '.worker').read())\n")
    script = tmp_path / "server.py"
    script.write_text(f"import os, sys, time; sys.path.insert(0, {str(ROOT)!r}); "
                      f"out = {str(tmp_path / 'pids')!r}\n{body}    time.sleep(600)\n")
    launcher = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env_for(tmp_path))
    pids = tmp_path / "pids"
    try:
        _wait(lambda: pids.exists() and len(pids.read_text().split()) == 2, "no worker")
        server, worker = (int(p) for p in pids.read_text().split())
        os.kill(server, signal.SIGKILL)
        _wait(lambda: not _alive(worker), "the worker outlived its fork server")
    finally:
        launcher.kill()
        launcher.wait()


def _writer_started(fork: bool, then: str = "") -> str:
    """Parent code that starts NVRx's persistent writer through `AsyncWriter`, runs `then` and
    writes the writer's pid to `out`."""
    return ("from trainer.nvrx_compat import AsyncWriter\n"
            f"w = AsyncWriter(0, fork={fork})\n"
            "proc = w._ckpt._async_calls_queue.persistent_caller.process\n"
            f"{then}"
            "open(out, 'w').write(str(proc.pid))\n")


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
@pytest.mark.parametrize("when", ["running", "starting"])
def test_the_checkpoint_writer_dies_with_its_rank(tmp_path, when, fork):
    """NVRx's persistent writer, started by `AsyncWriter`: killed while it runs, or while it is
    still starting (before any request could have told it who its rank is)."""
    wait = "time.sleep(0.5)\n" if when == "running" else ""
    _kill_and_expect_gone(*_parent(tmp_path, _writer_started(fork, wait)))


def _caught_signals(pid: int) -> int:
    """The signals `pid` has handlers for (`SigCgt` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigCgt for pid {pid}")


def test_a_forked_writer_keeps_none_of_its_ranks_signal_handlers(tmp_path):
    """A rank handles the stop signal (`termination.install`); the writer it forks starts with
    the dispositions of a spawned writer, which the stop signal sent to a rank's group ends."""
    writers, served = {}, "w.submit(print, 'served')\nwhile not w.poll(): time.sleep(0.01)\n"
    for fork in (True, False):
        (tmp_path / str(fork)).mkdir()
        parent, pid = _parent(tmp_path / str(fork), "from trainer import termination\n"
                              "termination.install()\n" + _writer_started(fork, served))
        try:
            writers[fork] = _caught_signals(pid)
        finally:
            _kill_and_expect_gone(parent, pid)
    assert writers[True] == writers[False]
    assert not writers[True] & (1 << (signal.SIGUSR1 - 1))


def test_a_process_id_never_names_a_recycled_pid_or_a_zombie():
    me = ProcessId.current()
    assert me.alive() and ProcessId.of(os.getpid()) == me
    assert not ProcessId(me.pid, me.start + 1).alive()  # the same pid, another process
    assert ProcessId.from_json({"pid": 1}) is None  # no start time: names nothing
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait(lambda: process_start(child.pid) is None, "the child never exited")  # now a zombie
    child.wait()


def _lease_file(path: Path, **holder) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "LEASE.json").write_text(json.dumps({"run": "other", "renewed_at": time.time(),
                                                 **holder}))
    return path


def test_a_lease_holder_lives_while_one_of_its_processes_does(tmp_path):
    host = socket.gethostname()
    pid1 = ProcessId.of(1)
    live = _lease_file(tmp_path / "a", host=host,
                       processes=[{"pid": 1, "start": pid1.start + 1, "role": "launcher"},
                                  {**ProcessId.current().to_json(), "role": "rank 0"}])
    with pytest.raises(LeaseError, match="rank 0 pid"):
        Lease(live).acquire()
    warnings = []
    # PID 1 and a recycled pid, with start times that are not theirs: no live holder.
    dead = _lease_file(tmp_path / "b", host=host,
                       processes=[{"pid": 1, "start": pid1.start + 1, "role": "launcher"},
                                  {"pid": os.getpid(), "start": 0, "role": "rank 0"}])
    lease = Lease(dead, warn=warnings.append)
    lease.acquire()
    assert warnings and "no longer alive" in warnings[0]
    mine = json.loads((dead / "LEASE.json").read_text())
    assert mine["run"] != "other" and all(p["pid"] != 1 and p["start"] for p in mine["processes"])
    lease.release()
    assert not (dead / "LEASE.json").exists()


def test_a_lease_that_names_pids_without_start_times_counts_only_its_renewal(tmp_path):
    old = _lease_file(tmp_path / "old", host=socket.gethostname(), pids=[os.getpid(), 1],
                      renewed_at=time.time() - 3600)
    warnings = []
    lease = Lease(old, warn=warnings.append)
    lease.acquire()  # PID 1 lives, yet the holder is long gone
    lease.release()
    assert warnings
    fresh = _lease_file(tmp_path / "fresh", host=socket.gethostname(), pids=[1])
    with pytest.raises(LeaseError):
        Lease(fresh).acquire()


LEAVER = """
import multiprocessing, os, sys
from trainer.lifetime import leave
queue, event = multiprocessing.get_context("spawn").Queue(), multiprocessing.get_context("spawn").Event()
leave(0) if sys.argv[1] == "leave" else os._exit(0)
"""


@pytest.mark.parametrize("how", ("leave", "os._exit"))
def test_leaving_at_once_unlinks_the_named_semaphores_it_created(how):
    """NVRx's in-process Wrapper holds a spawn-context queue and events; a rank that ends with
    `os._exit` alone leaves their names to the resource tracker, which warns at every run's end."""
    proc = subprocess.run([sys.executable, "-c", LEAVER, how], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("leaked semaphore" in proc.stderr) == (how == "os._exit"), proc.stderr
