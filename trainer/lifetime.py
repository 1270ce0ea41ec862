"""Every process of a run ends with the process that started it, whatever killed that one.

torch elastic starts its workers in sessions of their own, and the workers and NVRx start helpers
of their own (the checkpoint writer, the rank monitors), so killing a launcher's process group
leaves them running: orphans that go on training and writing into the checkpoint directory.
Each process therefore ties its life to its parent's, from its first instant:

- `die_with_parent`: the kernel's parent-death signal (SIGKILL). It fires when the *thread* that
  started the process ends, so it is only used where that thread lives as long as its process
  (a launcher's main thread, the fork server's only thread). It works even while the process is
  stuck in C holding the GIL. A parent already gone before the call never fires it: the parent is
  checked once more right after.
- `follow_parent`: a thread polling the parent's pid, for processes started from a thread that
  may end first (a replacement checkpoint writer is started from whichever thread saves).
- `ProcessId`: a pid with its start time. It names one process and never a later one that got the
  same pid, as a lease holder must.

The node's elastic agent (torchrun, ft_launcher) names itself to its workers (`AGENT_ENV`), so a
worker can tell its agent from whichever process adopted it after the agent died.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

AGENT_ENV = "NVRX_EKS_AGENT"  # the pid of the node's elastic agent, set by the agent itself
PR_SET_PDEATHSIG = 1
POLL_S = 0.2  # follow_parent: a helper outlives its parent by at most this


@dataclass(frozen=True)
class ProcessId:
    """A process as the kernel knows it: the pid and the start time (clock ticks after boot,
    `/proc/<pid>/stat` field 22). A recycled pid has another start time."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Optional["ProcessId"]:
        """The process with this pid now; None if there is none (or only its zombie)."""
        start = process_start(pid)
        return None if start is None else cls(pid, start)

    @classmethod
    def current(cls) -> "ProcessId":
        found = cls.of(os.getpid())
        return found if found is not None else cls(os.getpid(), 0)

    def alive(self) -> bool:
        return process_start(self.pid) == self.start

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, doc: dict) -> Optional["ProcessId"]:
        """None for a record without a start time: it could name any later process."""
        try:
            return cls(int(doc["pid"]), int(doc["start"]))
        except (KeyError, TypeError, ValueError):
            return None


def process_start(pid: int) -> Optional[int]:
    """Start time of a running process (not a zombie), None if there is none. Off Linux, from
    psutil, in microseconds after the epoch."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc here
        return _psutil_start(pid)
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19]
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _psutil_start(pid: int) -> Optional[int]:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return int(proc.create_time() * 1e6)
    except psutil.Error:
        return None


def _prctl() -> Optional[Callable[..., int]]:
    if not os.path.exists("/proc/self"):  # Linux only
        return None
    return ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(parent: int) -> None:
    """SIGKILL this process once `parent` (the process that started it) ends; exit now if it
    has ended already. Only for a process started by a thread that lives as long as `parent`;
    off Linux, a `follow_parent` thread instead."""
    prctl = _prctl()
    if prctl is None:
        follow_parent(parent)
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # adopted before the signal was set: it will never fire
        os._exit(1)


def follow_parent(parent: int, poll_s: float = POLL_S) -> None:
    """Exit (at once, without teardown) once `parent` is no longer this process's parent."""
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def child_dies_with_me() -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen` from a single-threaded launcher: the child gets
    SIGKILL when this process ends."""
    parent = os.getpid()
    return lambda: die_with_parent(parent)


def announce_agent() -> None:
    """Called by the node's elastic agent: its workers inherit its pid
    (`worker_dies_with_agent`)."""
    os.environ[AGENT_ENV] = str(os.getpid())


def agent() -> Optional[int]:
    value = os.environ.get(AGENT_ENV, "")
    return int(value) if value.isdigit() else None


def worker_dies_with_agent() -> None:
    """First thing in a command-line worker started by an elastic agent: die with it.

    The agent starts every worker from its main thread, so the parent-death signal is safe. A
    worker under an agent that did not name itself (a bare torchrun) takes its parent as it
    finds it; one already adopted by init exits."""
    expected = agent()
    if expected is None and "TORCHELASTIC_RUN_ID" in os.environ:
        expected = os.getppid()
        if expected == 1:  # adopted by init: the agent is gone
            os._exit(1)
    if expected is not None:
        die_with_parent(expected)


def leave(rc: int) -> None:
    """End this process at once, without interpreter teardown (see `trainer.__main__`), but
    with the named semaphores it created unlinked first.

    NVRx's in-process Wrapper talks to its monitor process through a spawn-context queue and
    events: named POSIX semaphores that multiprocessing unlinks at interpreter exit. `os._exit`
    skips that, so the resource tracker would unlink them after the run and print "There appear
    to be N leaked semaphore objects" at the end of every in-process run. Unlinking only drops
    the names: the handles this process and the monitor hold stay valid.
    """
    from multiprocessing import synchronize, util

    # The stdlib keeps its exit-time finalizers in this registry; a semaphore's is its
    # `SemLock._cleanup` (tests/trainer/recovery/test_lifetime.py fails if that changes).
    for finalizer in list(util._finalizer_registry.values()):
        if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:
            finalizer()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def launcher() -> Optional[ProcessId]:
    """The process that restarts this worker: the node's elastic agent (never PID 1)."""
    pid = agent() or os.getppid()
    return ProcessId.of(pid) if pid > 1 else None
