"""Who owns a checkpoint directory: its lineage's identity, and the lease of the run using it.

- `RUN.json` is created with the directory's first checkpoint run and never changes: the
  identity of the training lineage stored there. Host snapshots, staging buffers and everything
  else on a node are keyed by it, so a deleted or different directory never picks up another
  run's state, even at the same path.
- `LEASE.json` names the run that trains into the directory now: its launch id (NVRX_RUN_ID:
  the Kubernetes run id, or one per `devtools.local` or `trainer.recovery.launch` invocation),
  its host and its processes, renewed while rank 0 lives (by a thread of its own: a loop that
  waits for a hung peer, or an in-process restart, must not let it lapse). Restarts of the same
  run take it over silently; a second run is refused while the holder lives; the lease of a dead
  run is taken over with a warning.

On its own host the holder lives while rank 0 or its launcher (the node's elastic agent, which
restarts rank 0) does. Each is named by pid *and* start time (`lifetime.ProcessId`): a pid alone
would make a later process that got the same pid (in a fresh pod's pid namespace, the same
handful of small numbers) look like the holder, and PID 1 would make it immortal. A record
without start times can identify no process: only its renewal time counts then, as for a
holder on another host.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from trainer.atomic import create_json_exclusive, read_json, write_json_atomic
from trainer.errors import FinalError
from trainer.lifetime import ProcessId, launcher

RUN_FILE = "RUN.json"
LEASE_FILE = "LEASE.json"
RUN_ID_ENV = "NVRX_RUN_ID"
LEASE_TTL_S = 120.0  # a holder on another host that renewed within this is alive
RENEW_EVERY_S = 30.0


class LeaseError(FinalError):
    """The checkpoint directory is in use by another live run."""


def existing_lineage(checkpoint_dir: str | Path) -> Optional[str]:
    """The directory's identity if a run has created it already (None: a first start)."""
    found = read_json(Path(checkpoint_dir) / RUN_FILE)
    return found["lineage"] if found else None


def lineage_id(checkpoint_dir: str | Path) -> str:
    """The directory's identity, created by whichever rank gets there first."""
    path = Path(checkpoint_dir) / RUN_FILE
    for _ in range(100):
        found = read_json(path)
        if found is not None:
            return found["lineage"]
        path.parent.mkdir(parents=True, exist_ok=True)
        create_json_exclusive(path, {"lineage": uuid.uuid4().hex, "created_at": time.time()})
    raise RuntimeError(f"{path} exists but cannot be read")


def launch_id() -> str:
    """This run's id: the same for every rank and every restart of one launch. Without one
    given, torchelastic's run id if the user named the rendezvous, else the launcher's identity
    (pid and start time)."""
    given = os.environ.get(RUN_ID_ENV)
    if given:
        return given
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return elastic
    holder = launcher() or ProcessId.current()
    return f"{socket.gethostname()}-{holder.pid}-{holder.start}"


def holder_processes() -> list[dict]:
    """This process (rank 0) and its launcher, each with its start time."""
    found = [("rank 0", ProcessId.current()), ("launcher", launcher())]
    return [{**p.to_json(), "role": role} for role, p in found if p is not None]


class Lease:
    """Rank 0's hold on the checkpoint directory."""

    def __init__(self, checkpoint_dir: str | Path, warn: Callable[[str], None] = print):
        self.path = Path(checkpoint_dir) / LEASE_FILE
        self.warn = warn
        self.run = launch_id()
        self._processes = holder_processes()
        self._stop = threading.Event()
        self._renewer: Optional[threading.Thread] = None

    def _mine(self) -> dict:
        return {"run": self.run, "host": socket.gethostname(), "processes": self._processes,
                "renewed_at": time.time()}

    @staticmethod
    def holder_alive(holder: dict) -> bool:
        named = [ProcessId.from_json(p) for p in holder.get("processes", [])]
        if holder.get("host") == socket.gethostname() and named and None not in named:
            return any(p.alive() for p in named)
        return time.time() - float(holder.get("renewed_at", 0)) < LEASE_TTL_S

    @staticmethod
    def describe(holder: dict) -> str:
        processes = ", ".join(f"{p.get('role', 'process')} pid {p.get('pid')}"
                              for p in holder.get("processes", [])) or \
            f"pids {holder.get('pids')}"
        return f"host {holder.get('host')}, {processes}"

    def acquire(self) -> None:
        """Take the lease, or raise LeaseError naming the live holder."""
        holder = read_json(self.path)
        if holder is not None and holder.get("run") != self.run:
            if self.holder_alive(holder):
                raise LeaseError(
                    f"--checkpoint_dir {self.path.parent} is in use by run {holder.get('run')} "
                    f"({self.describe(holder)}); stop it or use another directory")
            self.warn(f"taking over the lease of run {holder.get('run')} on {self.path.parent}: "
                      f"it is no longer alive ({self.describe(holder)})")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if holder is None:  # two runs starting at once: exactly one creates the file
            if not create_json_exclusive(self.path, self._mine()):
                return self.acquire()
        else:
            write_json_atomic(self.path, self._mine())
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._keep_renewed, daemon=True,
                                             name="lease-renewer")
            self._renewer.start()

    def _keep_renewed(self) -> None:
        """Every RENEW_EVERY_S until released. No fsync, which would wait behind a checkpoint
        being written to the same file system; a lease lost with its node has expired anyway."""
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                write_json_atomic(self.path, self._mine(), durable=False)
            except OSError:  # storage gone for now: the next renewal tries again
                pass

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        holder = read_json(self.path)
        if holder is not None and holder.get("run") == self.run:
            self.path.unlink(missing_ok=True)
