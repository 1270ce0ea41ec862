"""The metadata operations checkpointing and resuming cost FSx, counted from what the durable
store does (`trainer/durable/store.py`), as functions of the world size.

A test holds these counts to the store's own calls (`tests/scripts/test_fsx_metadata.py`: the
store run in-process, and `bench.scale` at two world sizes), so the plan and the code agree.
Counted per call the store makes on the checkpoint directory:
- stats: stat and lstat (`is_file`, `is_dir`, `stat`); a mkdir that finds the directory there
  counts as `mkdir_exists` (a lookup), one that makes it as `mkdirs`;
- creates: a file created (every write goes to a new temporary file first), opens: an existing
  file or directory opened (a read, a directory opened to fsync it); every one is closed again;
- listings (directory reads), renames, unlinks (also of a name that is not there), rmdirs,
  fsyncs (of a file or a directory).

A checkpoint of N ranks, in steady state (`keep` committed ones before it): every rank writes its
shard and its marker, each through a temporary file, a rename and an fsync of the directory;
rank 0 reads every marker and stats every shard, writes the manifest and `latest`, scans the
step directories and removes the oldest checkpoint. A resume at the same world size: rank 0
scans the step directories and reads every kept manifest, checking the size of each of its
shards; every rank then reads its own marker and shard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from config import fsx


@dataclass(frozen=True)
class MetadataOps:
    stats: int = 0
    creates: int = 0
    opens: int = 0
    listings: int = 0
    renames: int = 0
    unlinks: int = 0
    mkdirs: int = 0
    mkdir_exists: int = 0
    rmdirs: int = 0
    fsyncs: int = 0

    def __add__(self, other: "MetadataOps") -> "MetadataOps":
        return MetadataOps(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                              for f in fields(self)})

    def times(self, n: int) -> "MetadataOps":
        return MetadataOps(**{f.name: getattr(self, f.name) * n for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def closes(self) -> int:
        return self.creates + self.opens

    @property
    def total(self) -> int:
        return sum(self.as_dict().values()) + self.closes

    def iops_seconds(self) -> float:
        """Metadata IOPS times the seconds these operations keep them busy, at the rates of
        `config.fsx` (AWS's per kind, the assumed ones for the kinds AWS lists no rate for)."""
        by_kind = {"create": self.creates, "open": self.opens, "close": self.closes,
                   "unlink": self.unlinks, "mkdir": self.mkdirs, "rmdir": self.rmdirs,
                   "stat": self.stats + self.mkdir_exists, "listing": self.listings,
                   "fsync": self.fsyncs, "rename": self.renames}
        rates = fsx.OPS_PER_METADATA_IOPS
        return sum(n / rates[fsx.ASSUMED_LIKE.get(kind, kind)] for kind, n in by_kind.items())


def _json_written() -> MetadataOps:
    """`trainer.atomic.write_json_atomic`: a temporary file, fsynced, renamed over the name,
    then the directory opened and fsynced."""
    return MetadataOps(creates=1, fsyncs=2, renames=1, opens=1)


def shard_save(makes_directory: bool) -> MetadataOps:
    """One rank's `write_shard`: the step directory (made by the first rank to get there, found
    by the others: mkdir fails and `is_dir` checks), the stale marker unlinked, the shard written
    like a JSON file, then its marker."""
    directory = MetadataOps(mkdirs=1) if makes_directory else MetadataOps(mkdir_exists=1, stats=1)
    return directory + MetadataOps(unlinks=1) + _json_written() + _json_written()


def _scan(step_dirs: int) -> MetadataOps:
    """`CheckpointStore.step_dirs`: the root checked and listed, each step directory checked."""
    return MetadataOps(stats=1 + step_dirs, listings=1)


def _committed(step_dirs: int) -> MetadataOps:
    """`CheckpointStore.committed`: the scan, and each step directory's manifest looked for."""
    return _scan(step_dirs) + MetadataOps(stats=step_dirs)


def commit(world: int, step_dirs: int) -> MetadataOps:
    """Rank 0 once per checkpoint, with `step_dirs` step directories after it (the new one
    included): `ready_markers` (each marker checked and read, its shard checked and its size
    read), the manifest and `latest` written, and `prune`'s two scans (removals apart)."""
    markers = MetadataOps(stats=3 * world, opens=world)
    published = _json_written().times(2)
    pruned = _committed(step_dirs) + _scan(step_dirs) + MetadataOps(stats=step_dirs)
    return markers + published + pruned


def removal(world: int) -> MetadataOps:
    """One checkpoint directory removed (`shutil.rmtree`): checked, opened and listed, its
    shards, markers and manifest unlinked, then itself."""
    return MetadataOps(stats=1, opens=1, listings=1, unlinks=2 * world + 1, rmdirs=1)


@dataclass(frozen=True)
class PerRun:
    """What one checkpoint or one resume costs: all ranks together, and what rank 0 does beyond
    its own shard, one operation after another."""

    all_ranks: MetadataOps
    rank0: MetadataOps


def checkpoint(world: int, keep: int) -> PerRun:
    """A checkpoint in steady state: `keep` committed ones before it, the oldest removed."""
    saves = shard_save(makes_directory=True) + shard_save(makes_directory=False).times(world - 1)
    rank0 = commit(world, step_dirs=keep + 1) + removal(world)
    return PerRun(saves + rank0, rank0)


def shard_resume() -> MetadataOps:
    """One rank reading its own shard at the same world size: its marker read; the shard
    checked and sized, opened for its chunks, for its zip directory and by `torch.load` (which
    also stats it), then sized and opened once more to hash it."""
    return MetadataOps(opens=1) + MetadataOps(stats=2, opens=3) + MetadataOps(stats=1) \
        + MetadataOps(stats=1, opens=1)


def resume_rank0(world: int, keep: int) -> MetadataOps:
    """Rank 0's part before any rank reads (`commit_complete`, `candidates`, and
    `discard_after` once the step is agreed), with `keep` committed checkpoints and nothing
    else in the directory: each manifest read and each of its shards checked and sized."""
    commit_complete = _committed(keep)
    candidates = _committed(keep) + MetadataOps(opens=keep, stats=2 * world * keep)
    return commit_complete + candidates + _scan(keep)


def resume(world: int, keep: int) -> PerRun:
    rank0 = resume_rank0(world, keep)
    return PerRun(rank0 + shard_resume().times(world), rank0)
