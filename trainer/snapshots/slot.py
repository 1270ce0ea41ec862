"""A snapshot slot: a file-backed shared buffer in the node-local directory (/dev/shm or the
instance-store NVMe) with a JSON header beside it, so one slot serves two tiers at once:
- memory: after an in-process restart the very same mapped buffer is read back (no I/O);
- node:   after a process restart (ft_launcher) the new process maps the files again.

The header is removed before the slot is overwritten and written only once the copy (or the
receive) is complete, so a torn snapshot is never visible. The file names live here alone: a
restarted process, the restore's inventory and the clean-up after a restore all find slots by
name, also those an earlier process wrote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

from trainer.atomic import read_json, write_json_atomic
from trainer.buffers import HostBuffer, Layout

_REPLICA = "replica."
_BUFFER, _HEADER = ".buf", ".json"


def own_prefix(rank: int) -> str:
    """The start of the file names of `rank`'s own slots."""
    return f"rank{rank:05d}."


def replica_prefix(src: int) -> str:
    """The start of the file names of the replica slots that hold `src`'s snapshots."""
    return f"{_REPLICA}of{src:05d}."


def own_files(root: Path, rank: int, i: int) -> tuple[Path, Path]:
    """Buffer and header of `rank`'s own slot `i`."""
    return _files(root, f"{own_prefix(rank)}slot{i}")


def replica_files(root: Path, src: int, i: int) -> tuple[Path, Path]:
    """Buffer and header of replica slot `i`, which holds `src`'s snapshots."""
    return _files(root, f"{replica_prefix(src)}slot{i}")


def _files(root: Path, stem: str) -> tuple[Path, Path]:
    return root / f"{stem}{_BUFFER}", root / f"{stem}{_HEADER}"


def buffers(root: Path, prefix: str = "") -> list[Path]:
    """The slot buffers in `root` whose names start with `prefix`."""
    return list(Path(root).glob(f"{prefix}*{_BUFFER}"))


def headers(root: Path) -> list[Path]:
    """Every slot header in `root`, own and replica, in name order."""
    return sorted(Path(root).glob(f"*{_HEADER}"))


def buffer_of(header: Path) -> Path:
    return header.with_suffix(_BUFFER)


def header_of(buffer: Path) -> Path:
    return buffer.with_suffix(_HEADER)


def is_replica(header: Path) -> bool:
    return header.name.startswith(_REPLICA)


def stamp(rank: int, world_size: int) -> dict:
    """What a header says besides its snapshot: whose shard, of which world, when."""
    return {"rank": rank, "world_size": world_size, "saved_at": time.time()}


class PendingCopy(NamedTuple):
    """A snapshot whose device-to-host copy is queued but not yet known to be complete."""

    step: int
    meta: dict
    copied: "torch.cuda.Event"  # recorded on the copy stream after the copy


@dataclass
class Slot:
    """One snapshot buffer and what it holds."""

    buffer: HostBuffer
    header: Path
    step: int = -1              # committed snapshot step; -1 while empty or being rewritten
    meta: Optional[dict] = None
    pins: int = 0               # readers (a durable write, a peer send) that need it unchanged
    pending: Optional[PendingCopy] = None  # until its copy is known to be complete
    guards: tuple = ()          # while pending: the events the optimizer must wait for
    staged_from: Optional[int] = None  # the device stage's fill its staged bytes came from

    def invalidate(self) -> None:
        self.header.unlink(missing_ok=True)
        self.step, self.meta, self.staged_from = -1, None, None

    def header_for(self, step: int, meta: dict, extra: dict) -> dict:
        """The header of this slot holding `step`: what `commit` writes, and a peer's replica."""
        return {"step": step, "meta": meta, "layout": self.buffer.layout.to_json(), **extra}

    def commit(self, step: int, meta: dict, extra: dict) -> None:
        self.adopt(self.header_for(step, meta, extra))

    def adopt(self, header: dict) -> None:
        """Write `header`, which now describes the buffer's bytes (a replica gets its sender's)."""
        write_json_atomic(self.header, header)
        self.step, self.meta = header["step"], header["meta"]

    def close(self, delete: bool) -> None:
        """Unmap the buffer; with `delete`, its files too."""
        self.buffer.close(delete=delete)
        if delete:
            self.header.unlink(missing_ok=True)


def warm_slots(root: Path, rank: int, pin: bool) -> None:
    """A restarted process: map and pin the slot of its predecessor's newest snapshot, the one
    it restores from, in the background while the process group and the model are built
    (HostBuffer.warm); the other slots are pinned after the first step (`OwnSlots.take`)."""
    found = [(f, read_json(header_of(f))) for f in buffers(root, f"{own_prefix(rank)}slot")]
    layouts = [Layout.from_json(h["layout"]) for _, h in found if h and "layout" in h]
    if not layouts:
        return
    found = [(f, h) for f, h in found if f.stat().st_size >= layouts[0].total_bytes]
    found.sort(key=lambda fh: fh[1].get("step", -1) if fh[1] else -1, reverse=True)
    HostBuffer.warm([(f, layouts[0]) for f, _ in found[:1]], pin)
