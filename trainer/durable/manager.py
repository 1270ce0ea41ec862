"""The checkpoint manager the training loop talks to: save at the interval, poll, restore.

A save first copies the rank's shard into its host staging buffer (the only part that blocks
training in async mode), then writes it: inline with torch.save (sync, the baseline) or in NVRx's
persistent background worker (async). Rank 0's `commit.Committer` publishes a checkpoint once
every rank's write has landed; `loading.Loader` restores the newest one every rank can read.
Nothing here needs a collective except restore, where all ranks must agree.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

import torch
import torch.distributed as dist

from trainer.accounting.events import EventLog
from trainer.atomic import read_json, write_json_atomic
from trainer.buffers import HostBuffer, Layout, host_copy_stream
from trainer.durable.commit import Committer, Pending
from trainer.durable.landing import Landings
from trainer.durable.loading import Loader
from trainer.durable.state import local_tensors, shard_layout
from trainer.durable.store import (CheckpointError, CheckpointStore, SaveStats, ShardWrite,
                                   StorageError, error_file, step_dir_name, write_shard)

if TYPE_CHECKING:
    from trainer.nvrx_compat import AsyncWriter


class InFlight(NamedTuple):
    """This rank's write in the background writer."""

    step: int
    since: float
    buffer: str
    landings: Landings  # the attempt that submitted it: its counter is the one to add to


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
                 log: Callable[[str], None] = print, writer: Optional["AsyncWriter"] = None):
        """`writer`: the rank's checkpoint writer if it was started already (forked by
        `trainer.cli`); without one, `start_writer` spawns one."""
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
        self._writer = writer
        self._in_flight: Optional[InFlight] = None
        self._landing: Optional[tuple[int, Landings]] = None  # async: the last step written
        self._landings: Optional[Landings] = None  # this attempt's keys, from its first save
        self._committer: Optional[Committer] = None  # rank 0's, from its first save
        self.last_saved_step = -1
        self.keepalive = keepalive  # bounded waits keep heartbeats going
        self._on_written: Optional[Callable[[], None]] = None

    def rejoin(self, rank: int, world_size: int, keepalive: Callable[[], None]) -> None:
        """A new in-process attempt: an earlier attempt's write goes on (a dead writer is
        dropped), and ranks may have been reassigned."""
        self._recheck_writer()
        self.rank, self.world_size = rank, world_size
        self.keepalive = keepalive
        if self._committer is not None:
            self._committer.active, self._committer.keepalive = rank == 0, keepalive
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
            self._rank0_committer().add(Pending(step, self.world_size, landings))
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
            self._rank0_committer().commit_all()
        self._await_committed(*self._landing)
        self._landing = None

    def _rank0_committer(self) -> Committer:
        if self._committer is None:
            self._committer = Committer(self.store, self.events, self.timeout_s, self.keepalive,
                                        self.log)
        return self._committer

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
            self._drop_writer()
            cause = error_file(buffer_path)
            if cause.is_file():  # the writer said why: the storage refused the write
                raise StorageError(f"{cause.read_text().strip()}; earlier checkpoints are intact")
            raise CheckpointError(f"the background checkpoint writer of rank {self.rank} died "
                                  f"(exit code {code}) while writing step {step}; that "
                                  "checkpoint is not committed")
        if time.time() - since > self.timeout_s:
            self._drop_writer()
            raise CheckpointError(f"the background checkpoint writer of rank {self.rank} took "
                                  f"more than {self.timeout_s:g} s (--checkpoint_timeout) for "
                                  f"step {step}; that checkpoint is not committed")

    def _drop_writer(self) -> None:
        """Kill a dead or stuck writer and forget its write; the next save starts a new writer
        (`start_writer`), behind the same watch of this rank as the first."""
        self._writer.close(abort=True)
        self._writer = None
        self._in_flight = None
        self._release_source()

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
            self._rank0_committer().commit_ready(background=True)

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
            self._rank0_committer().abandon()
        self._landing = None

    def finish(self) -> None:
        """Drain writes and, on rank 0, commit everything still pending (bounded by the timeout).

        The writer and the staging buffer stay: a re-entered attempt may still need them. They go
        with `close`, once the process is done."""
        t0 = time.perf_counter()
        self.wait_for_writer()
        dist.barrier()
        if self.rank == 0:
            self._rank0_committer().commit_all()
        self.events.emit("ckpt_drain", seconds=time.perf_counter() - t0)

    def close(self, failed: bool = False) -> None:
        """Stop the writer and unmap the staging buffer. After a failure the writer is stopped at
        once and the buffer's file stays on the node: the next process of this rank maps it
        again instead of touching gigabytes of fresh pages while every rank waits."""
        if self._committer is not None:
            self._committer.stop(wait_for_publish=not failed)
        if self._writer is not None:
            self._writer.close(abort=failed)
            self._writer = None
        if self._buffer is not None:
            self._close_buffer(delete=not failed)
        self._in_flight = None

    # -- restoring ---------------------------------------------------------------------------
    def restore(self, model, optimizer, required: bool,
                allow_fresh_start: bool = False) -> Optional[dict]:
        """Drain and commit what this run has in flight, then load the newest checkpoint every
        rank can read and verify (`loading.Loader.load`): its meta, or None."""
        self._drain_for_restore()
        return Loader(self.store, self.rank, self.world_size, self.device, self.events,
                      self.keepalive, self.log).load(model, optimizer, required,
                                                     allow_fresh_start)
