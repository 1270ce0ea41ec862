"""The checkpoint manager the training loop talks to: save at the interval, poll, restore.

A save first copies the rank's shard into its host staging buffer (the only part that blocks
training in async mode), then writes it: inline with torch.save (sync, the baseline) or in NVRx's
persistent background worker (async). Each rank's write, once its shard and marker are durable,
adds to one counter in the process group's store; rank 0 watches that counter (one store
operation per look), reads the N markers once it is complete, publishes the manifest and sets
a key the other ranks wait on (`landing`). The markers stay the verified record; the store only
says when to look. Nothing here needs a collective except restore, where all ranks must agree.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist

from trainer.accounting.events import EventLog, utc_stamp
from trainer.atomic import read_json, write_json_atomic
from trainer.buffers import HostBuffer, Layout, host_copy_stream
from trainer.durable.landing import Landings
from trainer.durable.state import local_tensors, overlapping_ranks, restore, shard_layout
from trainer.durable.store import (CheckpointError, CheckpointStore, RestoreError, SaveStats,
                                   ShardFile, ShardWrite, StorageError, error_file, step_dir_name,
                                   write_shard)
from trainer.phases import injected_delay

MARKER_GRACE_S = 60.0  # how long a marker may lag behind the write that returned it
COMMIT_POLL_S = 0.2  # rank 0's committer looks at the landed counter this often


class InFlight(NamedTuple):
    """This rank's write in the background writer."""

    step: int
    since: float
    buffer: str
    landings: Landings  # the attempt that submitted it: its counter is the one to add to


class Pending(NamedTuple):
    """Rank 0: a checkpoint submitted and not yet committed."""

    step: int
    world_size: int
    landings: Landings


def staging_path(root: Path, rank: int) -> Path:
    """A rank's durable staging buffer on its node; its layout is kept beside it (.json)."""
    return root / f"durable.rank{rank:05d}.buf"


def warm_staging(root: Path, rank: int, pin: bool) -> None:
    """A restarted process: map and pin the staging buffer its predecessor left, in the
    background while the process group and the model are built (HostBuffer.warm)."""
    path = staging_path(root, rank)
    try:
        layout = Layout.from_json(read_json(path.with_suffix(".json")))
    except (KeyError, TypeError):  # no layout kept beside it (or an unreadable one)
        return
    if path.is_file() and path.stat().st_size >= layout.total_bytes:
        HostBuffer.warm([(path, layout)], pin)


class CheckpointManager:
    def __init__(self, checkpoint_dir: str, *, rank: int, world_size: int, device: torch.device,
                 use_async: bool, retain: int, timeout_s: float, events: EventLog,
                 node_root: Path, keepalive: Callable[[], None] = lambda: None,
                 log: Callable[[str], None] = print):
        self.store = CheckpointStore(checkpoint_dir, retain=retain, warn=log)
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.use_async = use_async
        self.timeout_s = timeout_s
        self.events = events
        self.log = log
        self.stats = SaveStats()
        self.node_root = node_root
        self._buffer: Optional[HostBuffer] = None
        self._stream = host_copy_stream(device)
        self._writer = None
        self._in_flight: Optional[InFlight] = None
        self._landing: Optional[tuple[int, Landings]] = None  # async: the last step written
        self._landings: Optional[Landings] = None  # this attempt's keys, from its first save
        self._uncommitted: list[Pending] = []  # rank 0: steps waiting for every rank's marker
        self._found: dict[int, dict[int, dict]] = {}  # rank 0: the markers read, per step
        self._committing: Optional[threading.Thread] = None  # rank 0: a commit being published
        self._commit_error: Optional[Exception] = None
        self._commits = threading.RLock()  # the pending steps, between training and committer
        self._committer: Optional[threading.Thread] = None  # rank 0: `_keep_committing`
        self._stop_committer = threading.Event()
        self.last_saved_step = -1
        self.keepalive = keepalive  # bounded waits keep heartbeats going
        self._on_written: Optional[Callable[[], None]] = None

    def rejoin(self, rank: int, world_size: int, keepalive: Callable[[], None]) -> None:
        """A new in-process attempt: an earlier attempt's write goes on (a dead writer is
        dropped), and ranks may have been reassigned."""
        self._recheck_writer()
        self.rank, self.world_size = rank, world_size
        self.keepalive = keepalive
        self._landings = None  # the new attempt's first save agrees on its own keys

    def resumed_at(self, step: int) -> None:
        """Training resumes from `step`: never rewrite that checkpoint."""
        self.last_saved_step = step

    # -- saving ------------------------------------------------------------------------------
    def prepare(self, layout: Layout) -> None:
        """Map and pin the staging buffer before training, so no save pays for it."""
        self._staging_for(layout)

    def _staging_for(self, layout: Layout) -> HostBuffer:
        if self._buffer is None or self._buffer.layout != layout:
            if self._buffer is not None:
                self._close_buffer(delete=True)
            path = staging_path(self.node_root, self.rank)
            self._buffer = HostBuffer.open(path, layout, pin=self.device.type == "cuda")
            write_json_atomic(path.with_suffix(".json"), layout.to_json())  # for warm_staging
            self.stats.bytes_per_rank = layout.total_bytes
        return self._buffer

    def _close_buffer(self, delete: bool) -> None:
        self._buffer.close(delete=delete)
        if delete:
            self._buffer.path.with_suffix(".json").unlink(missing_ok=True)
        self._buffer = None

    def start_writer(self) -> None:
        """Start NVRx's persistent writer now, so the first save pays no process start."""
        if self.use_async and self._writer is None:
            from trainer.nvrx_compat import AsyncWriter

            self._writer = AsyncWriter(self.rank)  # its process ends with this one

    def save(self, step: int, model, optimizer, meta: dict, final: bool = False,
             source: Optional[HostBuffer] = None,
             on_written: Optional[Callable[[], None]] = None) -> float:
        """Checkpoint `step`; returns the seconds training was blocked.

        A `final` save is the one at the end of training, reported apart from the in-loop ones.
        `source` is a buffer that already holds this step's shard (a snapshot slot): it is
        written as is, and `on_written` runs once the write no longer reads it.
        """
        t0 = time.perf_counter()
        self.wait_for_writer()  # the staging buffer is free only once the last write is done
        if self._landing is not None:
            self._commit_landed()
        if self._landings is None:
            self._landings = Landings.join(self.rank)
        landings = self._landings
        if source is None:
            tensors = local_tensors(model, optimizer)
            buf = self._staging_for(Layout.of(tensors))
            buf.stage(tensors, self._stream)
        else:
            buf = source
            self.stats.bytes_per_rank = buf.layout.total_bytes
        req = ShardWrite(str(buf.path), buf.layout.to_json(),
                         {**meta, "step": step, "world_size": self.world_size, "rank": self.rank,
                          "params": shard_layout(model)},
                         str(self.store.root / step_dir_name(step)), self.rank, step,
                         self.world_size,
                         landings.landed(step) if self.use_async and landings.signals_itself()
                         else None)
        if self.use_async:
            self.start_writer()
            self._writer.submit(write_shard, req)
            self._in_flight = InFlight(step, time.time(), str(buf.path), landings)
            self._landing = (step, landings)
            self._on_written = on_written
        else:
            marker = write_shard(req)
            landings.add_landed(step)
            self.stats.write_seconds.append(marker["write_seconds"])
            if on_written:
                on_written()
        if self.rank == 0:
            with self._commits:
                self._uncommitted.append(Pending(step, self.world_size, landings))
            self._start_committer()
        if not self.use_async:
            dist.barrier()
            self.poll()
        blocked = time.perf_counter() - t0
        self.stats.count += 1
        self.stats.blocking_seconds.append(blocked)
        self.last_saved_step = step
        self.events.emit("ckpt_save", step=step, blocking_s=blocked, is_async=self.use_async,
                         bytes=self.stats.bytes_per_rank, final=final)
        return blocked

    def _commit_landed(self) -> None:
        """Commit the last async checkpoint before any rank writes the next one: every rank has
        waited for its own write, so all shards are on storage. A full disk can then cost the
        next checkpoint, never the one before it."""
        dist.barrier()
        if self.rank == 0:
            self._commit_pending()
        self._await_committed(*self._landing)
        self._landing = None

    def _commit_pending(self) -> None:
        """Rank 0, once every rank's write has returned (a barrier said so): commit everything
        pending from its markers, each read once, waiting briefly for those not yet visible (a
        shared file system can show them late), and saying which ones were late: a write that
        returned has left its marker behind."""
        self._commit_ready()  # also waits for a publish in the background to end
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
            self._commit_ready()
        self._commit_ready()  # the committer's publish of the last one, if it took it
        if time.time() - t0 > 1.0:
            self.log(f"rank 0: markers appeared {time.time() - t0:.1f} s after every write returned")

    def _await_committed(self, step: int, landings: Landings) -> None:
        """Wait for rank 0 to publish `step` by checking its committed key in the store, not in
        a collective (publishing to a busy disk can outlast the collective timeout) and not on
        the shared file system (N ranks looking for one manifest load one metadata server).
        Bounded by the checkpoint timeout; should rank 0 fail instead, the restart that follows
        ends this wait."""
        if not landings.wait_committed(step, self.timeout_s, self.keepalive):
            raise CheckpointError(f"checkpoint step {step} was not committed within "
                                  f"{self.timeout_s:g} s (--checkpoint_timeout)")

    def _release_source(self) -> None:
        if self._on_written:
            self._on_written()
            self._on_written = None

    def _check_writer(self) -> None:
        """Fail loudly if the background writer died or overran its time."""
        if self._in_flight is None or self._writer is None:
            return
        flight = self._in_flight
        step, since, buffer_path = flight.step, flight.since, flight.buffer
        code = self._writer.worker_exitcode()
        if code is not None:
            self._writer.close(abort=True)
            self._in_flight = None
            self._release_source()
            cause = error_file(buffer_path)
            if cause.is_file():  # the writer said why: the storage refused the write
                raise StorageError(f"{cause.read_text().strip()}; earlier checkpoints are intact")
            raise CheckpointError(f"the background checkpoint writer of rank {self.rank} died "
                                  f"(exit code {code}) while writing step {step}; that "
                                  "checkpoint is not committed")
        if time.time() - since > self.timeout_s:
            self._writer.close(abort=True)
            self._in_flight = None
            self._release_source()
            raise CheckpointError(f"the background checkpoint writer of rank {self.rank} took "
                                  f"more than {self.timeout_s:g} s (--checkpoint_timeout) for "
                                  f"step {step}; that checkpoint is not committed")

    def poll(self) -> None:
        """Once per step: retire finished writes, watch the writer, commit what is complete."""
        if self._in_flight is not None and self._writer is not None:
            if self._writer.poll():
                done = self._in_flight
                self.stats.write_seconds.append(time.time() - done.since)
                self._in_flight = None
                self._release_source()
                if not done.landings.signals_itself():  # no writer can reach it: say it here
                    done.landings.add_landed(done.step)
            else:
                self._check_writer()
        if self.rank == 0:
            self._commit_ready(background=True)

    def _commit_ready(self, background: bool = False) -> None:
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
        """The part of `_commit_ready` after any earlier publish has ended (lock held).

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

    def _start_committer(self) -> None:
        if self._committer is None:
            self._stop_committer.clear()
            self._committer = threading.Thread(target=self._keep_committing, daemon=True,
                                               name="checkpoint-committer")
            self._committer.start()

    def _keep_committing(self) -> None:
        """Rank 0, on a thread of its own: publish what has landed while the training thread
        cannot (a peer hangs, an in-process restart waits at a barrier for a rank the watchdog
        will kill), so `latest` never waits for the loop. A failed publish waits there for the
        training thread, which raises it. A store that does not answer (the job is going
        down) leaves the next look to the training thread, which reports it."""
        while not self._stop_committer.wait(COMMIT_POLL_S):
            with self._commits:
                if self.rank != 0 or self._commit_error is not None:
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
        except Exception as exc:  # raised on the training thread by the next _commit_ready
            self._commit_error = exc

    def seconds_to_save(self) -> float:
        """How long a new checkpoint would take to be written after the write in flight: the
        last write's duration twice over while one is in flight, less what it has run; 0 before
        any write has been timed."""
        last = self.stats.write_seconds[-1] if self.stats.write_seconds else 0.0
        if self._in_flight is None:
            return last
        return last + max(0.0, last - (time.time() - self._in_flight.since))

    def wait_for_writer(self) -> None:
        """Block until this rank's background write is done (watched, never forever)."""
        while self._in_flight is not None:
            self.poll()
            if self._in_flight is not None:
                self.keepalive()
                time.sleep(0.01)

    def _recheck_writer(self) -> None:
        """After an in-process restart: a background write of the failed attempt goes on (its
        buffer is pinned) and is committed by the usual polling; a dead writer is dropped."""
        try:
            self._check_writer()
        except StorageError:
            raise
        except CheckpointError as exc:
            self.log(f"rank {self.rank}: {exc}")

    def _drain_for_restore(self) -> None:
        """Before reading the durable store: every rank's pending write lands, rank 0 commits
        what is complete, and the rest is abandoned (it belongs to a dead timeline)."""
        try:
            self.wait_for_writer()
        except StorageError:
            raise
        except CheckpointError as exc:
            self.log(f"rank {self.rank}: {exc}")
        dist.barrier()
        if self.rank == 0:
            with self._commits:
                self._commit_ready()
                self._uncommitted.clear()
                self._found.clear()
        self._landing = None

    def finish(self) -> None:
        """Drain writes and, on rank 0, commit everything still pending (bounded by the timeout).

        The writer and the staging buffer stay: a re-entered attempt may still need them. They go
        with `close`, once the process is done."""
        t0 = time.perf_counter()
        self.wait_for_writer()
        dist.barrier()
        if self.rank == 0:
            self._commit_pending()
        self.events.emit("ckpt_drain", seconds=time.perf_counter() - t0)

    def close(self, failed: bool = False) -> None:
        """Stop the writer and unmap the staging buffer. After a failure the writer is stopped at
        once and the buffer's file stays on the node: the next process of this rank maps it
        again instead of touching gigabytes of fresh pages while every rank waits."""
        if self._committer is not None:
            self._stop_committer.set()
            self._committer.join()
            self._committer = None
        if self._committing is not None and not failed:
            self._committing.join()
        if self._writer is not None:
            self._writer.close(abort=failed)
            self._writer = None
        if self._buffer is not None:
            self._close_buffer(delete=not failed)
        self._in_flight = None

    # -- restoring ---------------------------------------------------------------------------
    def _candidates(self) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
        """(step, saved world size) of every committed checkpoint that passes the cheap checks,
        newest first, and (step, why) of those that fail them: rank 0 reads the manifests and
        checks their shards' sizes (its work per checkpoint grows with the world, once per
        restore), every rank gets the two short lists."""
        found = None
        if self.rank == 0:
            good, bad = self.store.survey()
            found = ([(step, m["world_size"]) for step, _, m in good], bad)
        box = [found]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _shards_for(self, step: int, saved_world: int, model) -> list[ShardFile]:
        """The saved shards this rank needs, read through their markers: its own, whole, at the
        same world size; else only the rows it owns of the shards that overlap them."""
        if saved_world == self.world_size:
            shard = self.store.open_shard(step, self.rank)
            shard.load_all()
            return [shard]
        shards = []
        for r in overlapping_ranks(model, saved_world):
            shards.append(self.store.open_shard(step, r))
            self.keepalive()
        return shards

    def _first_failure(self, failed: bool, err: str) -> Optional[str]:
        """Every rank: None if no rank failed to load the candidate, else the lowest failed
        rank's reason, the same on every rank. One MIN all-reduce of one number (as the old
        yes-or-no vote), and on a failure one broadcast of one line from that rank."""
        first = torch.tensor([self.rank if failed else self.world_size], device=self.device)
        dist.all_reduce(first, op=dist.ReduceOp.MIN)
        rank = int(first.item())
        if rank == self.world_size:
            return None
        box = [err if self.rank == rank else None]
        dist.broadcast_object_list(box, src=rank)
        return f"rank {rank}: {box[0]}"

    def restore(self, model, optimizer, required: bool,
                allow_fresh_start: bool = False) -> Optional[dict]:
        """Load the newest checkpoint every rank can read and verify; its meta, or None if the
        directory holds no committed checkpoint.

        All ranks try the same candidates in the same order and agree on each through an
        all-reduce, so no rank can resume from a different step than another. Committed
        checkpoints of which none can be restored stop the run (`RestoreError`), unless
        `allow_fresh_start`: then they are set aside and training starts from step 0.
        """
        self._drain_for_restore()
        if self.rank == 0:
            for step in self.store.commit_complete():
                self.log(f"committed checkpoint step {step}: all shards had landed before the fault")
        dist.barrier()
        candidates, skipped = self._candidates()
        reasons = [f"{step_dir_name(step)}: {why}" for step, why in skipped]
        for step, saved_world in candidates:
            t0 = time.time()
            shards, err = None, ""
            try:
                shards = self._shards_for(step, saved_world, model)
                restore(model, optimizer, shards)
            except (CheckpointError, OSError, KeyError, ValueError) as exc:
                shards, err = None, str(exc)
            why = self._first_failure(shards is None, err)
            if why is None:
                meta = shards[0].meta  # step, data cursor and RNG are the same in every shard
                nbytes = sum(s.bytes for s in shards)
                for s in shards:
                    s.close()
                self.events.emit("ckpt_load", step=step, tier="durable", bytes=nbytes,
                                 seconds=time.time() - t0, saved_world_size=saved_world,
                                 shards_read=len(shards))
                if self.rank == 0:
                    self.store.discard_after(step)
                return meta
            if self.rank == 0:
                self.log(f"skipping checkpoint {self.store.root / step_dir_name(step)}: {why}")
            reasons.append(f"{step_dir_name(step)}: {why}")
        return self._nothing_restored(reasons, required, allow_fresh_start)

    def _nothing_restored(self, reasons: list[str], required: bool,
                          allow_fresh_start: bool) -> None:
        """No checkpoint was restored; `reasons` names each committed one and why it failed.
        An empty directory starts from step 0. Damaged checkpoints stop the run, on every rank
        with the same line, and stay where they are, so the next run refuses them again;
        with `allow_fresh_start` each is set aside as `step_NNNNNNNN.skipped` and training
        starts from step 0."""
        root = self.store.root
        if not reasons and not required:
            if self.rank == 0:
                self.store.discard_after(-1)  # partial ones of a run that never committed
            return None
        if not reasons:
            raise RestoreError(f"no complete checkpoint in {root} (--resume required)")
        what = f"no committed checkpoint in {root} can be restored ({'; '.join(reasons)})"
        if required:
            raise RestoreError(f"{what} (--resume required)")
        if not allow_fresh_start:
            raise RestoreError(f"{what}; refusing to start from step 0, which would discard "
                               "their work: repair or remove them, or pass --allow_fresh_start "
                               "true to train from step 0 with each set aside as "
                               "step_NNNNNNNN.skipped")
        if self.rank == 0:
            self.store.discard_after(-1)
            self.log(f"{what}; starting from step 0 (--allow_fresh_start true), each set aside "
                     "as step_NNNNNNNN.skipped")
        return None
