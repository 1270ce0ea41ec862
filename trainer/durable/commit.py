"""Rank 0's committer: publishes a checkpoint once every rank's shard has landed.

Each rank's write, once its shard and marker are durable, adds to one counter in the process
group's store (`landing`). Rank 0 watches that counter (one store operation per look), reads
the N markers once it is complete, publishes the manifest and sets the key the other ranks wait
on. The markers stay the verified record; the store only says when to look. Publishing (fsyncs,
pruning old shards) runs on a thread of its own, so neither the training loop nor a rank stuck
behind a hung peer delays `latest`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple, Optional

import torch.distributed as dist

from trainer.accounting.events import EventLog, utc_stamp
from trainer.durable.landing import Landings
from trainer.durable.store import CheckpointError, CheckpointStore
from trainer.phases import injected_delay

MARKER_GRACE_S = 60.0  # how long a marker may lag behind the write that returned it
COMMIT_POLL_S = 0.2  # the committer thread looks at the landed counter this often


class Pending(NamedTuple):
    """A checkpoint submitted and not yet committed."""

    step: int
    world_size: int
    landings: Landings


class Committer:
    """Rank 0's checkpoints waiting for every rank's marker, and the thread that publishes
    them. `active` is False once an in-process restart has given this process another rank."""

    def __init__(self, store: CheckpointStore, events: EventLog, timeout_s: float,
                 keepalive: Callable[[], None], log: Callable[[str], None]):
        self.store, self.events, self.timeout_s, self.log = store, events, timeout_s, log
        self.keepalive = keepalive  # bounded waits keep heartbeats going
        self.active = True
        self._uncommitted: list[Pending] = []  # steps waiting for every rank's marker
        self._found: dict[int, dict[int, dict]] = {}  # the markers read, per step
        self._committing: Optional[threading.Thread] = None  # a commit being published
        self._commit_error: Optional[Exception] = None
        self._commits = threading.RLock()  # the pending steps, between training and committer
        self._thread: Optional[threading.Thread] = None  # `_keep_committing`, from the first add
        self._stopping = threading.Event()

    def add(self, pending: Pending) -> None:
        """A checkpoint this rank submitted: published once all its shards have landed."""
        with self._commits:
            self._uncommitted.append(pending)
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._keep_committing, daemon=True,
                                               name="checkpoint-committer")
            self._thread.start()

    def abandon(self) -> None:
        """Before a restore: commit what is complete, drop the rest (a dead timeline's)."""
        with self._commits:
            self.commit_ready()
            self._uncommitted.clear()
            self._found.clear()

    def stop(self, wait_for_publish: bool) -> None:
        """End the committer thread; with `wait_for_publish`, the publish in flight too."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None
        if self._committing is not None and wait_for_publish:
            self._committing.join()

    def commit_all(self) -> None:
        """Rank 0, once every rank's write has returned (a barrier said so): commit everything
        pending from its markers, each read once, waiting briefly for those not yet visible (a
        shared file system can show them late), and saying which ones were late: a write that
        returned has left its marker behind."""
        self.commit_ready()  # also waits for a publish in the background to end
        t0, bound = time.time(), min(self.timeout_s, MARKER_GRACE_S)
        while (oldest := self._oldest_uncommitted()) is not None:
            if time.time() - t0 > bound:
                step = oldest.step
                missing = sorted(set(range(oldest.world_size)) - self._found.get(step, {}).keys())
                raise CheckpointError(f"checkpoint step {step}: the writes of ranks {missing} "
                                      f"returned, but their markers did not appear within "
                                      f"{bound:g} s; it is not committed")
            self.keepalive()
            time.sleep(0.05)
            self.commit_ready()
        self.commit_ready()  # the committer's publish of the last one, if it took it
        if time.time() - t0 > 1.0:
            self.log(f"rank 0: markers appeared {time.time() - t0:.1f} s after every write returned")

    def commit_ready(self, background: bool = False) -> None:
        """Commit, in step order, every checkpoint whose shards have all landed.

        In `background`, the publishing (fsyncs, and pruning gigabytes of old shards) runs on a
        thread: on a disk still busy with the writers it takes seconds, which the training loop
        must not spend (NVRx's progress timeouts would fire on every rank). Otherwise it waits
        for that thread first, so the caller sees everything committed that can be."""
        with self._commits:
            if self._committing is not None:
                if background and self._committing.is_alive():
                    return
                self._committing.join()
                error, self._commit_error = self._commit_error, None
                self._committing = None
                if error is not None:
                    raise error
            self._publish_landed(background)

    def _publish_landed(self, background: bool) -> None:
        """The part of `commit_ready` after any earlier publish has ended (lock held).

        In `background` (every step, and the committer thread), the landed counter says
        whether to look at all: one store operation while writes are in flight, never the N
        markers. Otherwise a barrier has just said that every write returned."""
        while self._uncommitted:
            pending = self._uncommitted[0]
            if background and pending.landings.count(pending.step) < pending.world_size:
                return
            markers = self._markers_of(pending)
            if markers is None:
                return
            self._uncommitted.pop(0)
            del self._found[pending.step]
            if not background:
                self._publish(pending, markers)
                continue
            self._committing = threading.Thread(target=self._publish_caught,
                                                args=(pending, markers), daemon=True,
                                                name="checkpoint-commit")
            self._committing.start()
            return

    def _markers_of(self, pending: Pending) -> Optional[list[dict]]:
        """Every rank's marker of `pending`, or None while some are not visible yet; each one
        is read once, however many looks it takes for the last to appear."""
        found = self._found.setdefault(pending.step, {})
        if self.store.collect_markers(pending.step, pending.world_size, found):
            return None
        return [found[r] for r in range(pending.world_size)]

    def _oldest_uncommitted(self) -> Optional[Pending]:
        with self._commits:
            return self._uncommitted[0] if self._uncommitted else None

    def _keep_committing(self) -> None:
        """Rank 0, on a thread of its own: publish what has landed while the training thread
        cannot (a peer hangs, an in-process restart waits at a barrier for a rank the watchdog
        will kill), so `latest` never waits for the loop. A failed publish waits there for the
        training thread, which raises it. A store that does not answer (the job is going
        down) leaves the next look to the training thread, which reports it."""
        while not self._stopping.wait(COMMIT_POLL_S):
            with self._commits:
                if not self.active or self._commit_error is not None:
                    continue
                if self._committing is not None:
                    if self._committing.is_alive():
                        continue
                    self._committing.join()
                    self._committing = None
                try:
                    self._publish_landed(background=True)
                except dist.DistError:  # the store: the training thread will say why
                    continue

    def _publish(self, pending: Pending, markers: list[dict]) -> None:
        """Rank 0: commit `step`, tell the other ranks, say so in the log (one line: the slowest
        rank's write time)."""
        step = pending.step
        time.sleep(injected_delay("commit"))
        self.store.commit(step, markers, {})
        pending.landings.mark_committed(step)
        event = self.events.emit("ckpt_commit", step=step,
                                 write_s=max(m["write_seconds"] for m in markers),
                                 bytes=sum(m["bytes"] for m in markers))
        self.log(f"{utc_stamp(event['t'])} checkpoint step {step} committed: "
                 f"{event['bytes'] / 2**30:.2f} GiB from {len(markers)} rank(s), written in "
                 f"{event['write_s']:.2f} s")

    def _publish_caught(self, pending: Pending, markers: list[dict]) -> None:
        try:
            self._publish(pending, markers)
        except Exception as exc:  # raised on the training thread by the next commit_ready
            self._commit_error = exc
