"""The durable checkpoint directory: per-rank shards, an atomic verified commit, discovery.

Layout of `--checkpoint_dir`:

    step_00000500/rank_00000.pt      one torch.save file per rank (its shard, nothing gathered)
    step_00000500/rank_00000.json    written after the shard is complete: bytes and sha256
    step_00000500/MANIFEST.json      written last, by rank 0, once every rank's marker checks out
    latest                           {"step": 500}; moved atomically after the manifest

A checkpoint exists only once its MANIFEST.json does, so a crash at any instant leaves the
previous one as the resume point. Loading verifies each shard's size and sha256 against the
manifest; a corrupt newer checkpoint is skipped with a warning that names it, never silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from trainer.atomic import fsync_dir, write_json_atomic
from trainer.errors import FinalError

if TYPE_CHECKING:
    from trainer.durable.landing import Landed

STEP_DIR = re.compile(r"step_(\d{8})")
MANIFEST = "MANIFEST.json"
LATEST = "latest"
_HASH_CHUNK = 64 << 20
SLOW_WRITE_ENV = "NVRX_EKS_SLOW_WRITE_S"


class CheckpointError(RuntimeError):
    """A checkpoint problem that must stop training instead of silently losing work."""


class RestoreError(CheckpointError, FinalError):
    """Committed checkpoints that no rank set can restore (or none, where --resume required asks
    for one): starting from step 0 would silently discard their work, and no restart repairs
    them, so the run stops before training. Every rank raises it with the same message."""

    same_on_every_rank = True


class StorageError(CheckpointError, FinalError):
    """The checkpoint storage refused a write: full, read-only, not a directory. No restart
    fixes that, so training stops with the cause and the path; earlier checkpoints stay."""

    @staticmethod
    def of(exc: OSError, what: str, path: "str | Path | None" = None) -> "StorageError":
        where = exc.filename or path
        return StorageError(f"{what} failed: {exc.strerror or exc}" + (f": {where}" if where else ""))


def error_file(buffer_path: str | Path) -> Path:
    """Where a background writer leaves the cause of its failure: beside its host buffer (the
    checkpoint storage itself may be the thing that is full)."""
    return Path(f"{buffer_path}.error")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def shard_name(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


def marker_name(rank: int) -> str:
    return f"rank_{rank:05d}.json"


class _HashingWriter:
    """A file wrapper for torch.save that hashes every byte on its way to disk."""

    def __init__(self, f):
        self._f = f
        self.sha = ChunkedSha256()
        self.bytes = 0

    def write(self, data) -> int:
        mv = memoryview(data).cast("B")
        borrowed = self.sha.update(mv)
        n = self._f.write(mv)  # the disk write overlaps the hashing of the same bytes
        for fut in borrowed:
            fut.result()  # those chunks were views of `data`: done before torch reuses it
        self.bytes += mv.nbytes
        return n

    def flush(self) -> None:
        self._f.flush()


class ChunkedSha256:
    """sha256 over the sha256 digests of consecutive 64 MiB chunks, hashed on worker threads.

    One sha256 stream runs at about 1 GB/s, slower than a shard's disk write; chunks hash on
    several cores (hashlib releases the GIL), and the digest does not depend on how the bytes
    arrive, so reader and writer agree.
    """

    def __init__(self, workers: int = 8):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: list = []
        self._pending = bytearray()

    def update(self, data: memoryview) -> list:
        """Queue `data` for hashing; returns the futures that still read from `data` itself."""
        if self._pending:
            take = min(_HASH_CHUNK - len(self._pending), data.nbytes)
            self._pending += data[:take]
            data = data[take:]
            if len(self._pending) == _HASH_CHUNK:
                self._futures.append(self._pool.submit(_digest, bytes(self._pending)))
                self._pending = bytearray()
        borrowed = []
        while data.nbytes >= _HASH_CHUNK:
            borrowed.append(self._pool.submit(_digest, data[:_HASH_CHUNK]))
            data = data[_HASH_CHUNK:]
        self._futures.extend(borrowed)
        self._pending += data
        return borrowed

    def hexdigest(self) -> str:
        return _combine(self.digests())

    def digests(self) -> list[bytes]:
        """Each chunk's digest, in order: what a reader of part of the file verifies against."""
        if self._pending:
            self._futures.append(self._pool.submit(_digest, bytes(self._pending)))
            self._pending = bytearray()
        self._pool.shutdown()
        return [f.result() for f in self._futures]


def _digest(chunk: bytes) -> bytes:
    return hashlib.sha256(chunk).digest()


def _combine(digests: list[bytes]) -> str:
    return "chunked-sha256:" + hashlib.sha256(b"".join(digests)).hexdigest()


def file_sha256(path: Path, workers: int = 8) -> str:
    """The chunked sha256 of a file, its chunks read and hashed in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = list(pool.map(lambda off: _digest(os.pread(fd, _HASH_CHUNK, off)),
                                    range(0, size, _HASH_CHUNK)))
    finally:
        os.close(fd)
    return _combine(digests)


@dataclass(frozen=True)
class ShardWrite:
    """Everything a writer needs, small enough to pickle: the data stays in the host buffer."""

    buffer_path: str
    layout: dict
    meta: dict
    out_dir: str
    rank: int
    step: int
    world_size: int
    landed: Optional["Landed"] = None  # the store counter the writer adds to once it is durable


def write_shard(req: ShardWrite) -> dict:
    """Write one rank's shard from its host buffer, fsync it, then publish its marker.

    Runs in NVRx's persistent checkpoint worker (async) or inline (sync).
    """
    error_file(req.buffer_path).unlink(missing_ok=True)
    try:
        return _write_shard(req)
    except Exception as exc:
        cause = os_error(exc)
        if cause is None:
            raise
        err = StorageError.of(cause, f"writing rank {req.rank}'s shard of step {req.step}",
                              Path(req.out_dir) / shard_name(req.rank))
        error_file(req.buffer_path).write_text(str(err))  # read by the trainer (async)
        raise err from exc


def os_error(exc: BaseException) -> Optional[OSError]:
    """The storage error behind `exc`: torch.save reports a failed write as a RuntimeError
    whose context is the OSError."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _write_shard(req: ShardWrite) -> dict:
    import torch

    from trainer.buffers import Layout, map_file
    from trainer.phases import injected_delay

    t0 = time.time()
    time.sleep(injected_delay("write"))  # test hook: a slow file system
    out = Path(req.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / marker_name(req.rank)).unlink(missing_ok=True)  # a stale one must never be committed
    layout = Layout.from_json(req.layout)
    flat = map_file(Path(req.buffer_path), layout.total_bytes, writable=False)
    # One flat byte tensor: torch.save refuses differently typed views of one storage, and the
    # loader rebuilds the typed views from the layout without copying.
    payload = {"flat": flat, "meta": req.meta, "layout": req.layout}
    final = out / shard_name(req.rank)
    tmp = out / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            hw = _HashingWriter(f)
            torch.save(payload, hw)
            if SLOW_WRITE_ENV in os.environ:  # fault-injection knob: a wider window for crash tests
                time.sleep(float(os.environ[SLOW_WRITE_ENV]))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, final)
    fsync_dir(out)
    chunks = hw.sha.digests()
    marker = {"step": req.step, "rank": req.rank, "world_size": req.world_size,
              "file": final.name, "bytes": hw.bytes, "sha256": _combine(chunks),
              "chunk_bytes": _HASH_CHUNK, "chunks": [d.hex() for d in chunks],
              "write_seconds": time.time() - t0, "done_at": time.time()}
    write_json_atomic(out / marker_name(req.rank), marker)
    if req.landed is not None:  # only now: the counter says the marker can be read
        req.landed.signal()
    return marker


class ShardFile:
    """One saved shard, read through its marker's chunk digests: every byte it hands out has
    been checked, and only the chunks that hold the requested bytes are read.

    A resume at the same world size reads the whole file (`load_all`); a resume at another
    one reads, from each saved shard that overlaps its rows, only those rows (`get`)."""

    def __init__(self, path: Path, marker: dict):
        import torch

        self.path, self.marker = path, marker
        self.bytes = int(marker["bytes"])
        self.chunk_bytes = int(marker.get("chunk_bytes", _HASH_CHUNK))
        self._digests = [bytes.fromhex(d) for d in marker.get("chunks", [])]
        if _combine(self._digests) != marker["sha256"]:
            raise CheckpointError(f"{path}: its marker's chunk digests do not combine to its "
                                  "sha256")
        size = path.stat().st_size if path.is_file() else -1
        if size != self.bytes:
            raise CheckpointError(f"{path}: {size} bytes on disk, its marker says {self.bytes}")
        self._fd: Optional[int] = os.open(path, os.O_RDONLY)
        self._cache: dict[int, bytes] = {}
        try:
            self._data_start = self._locate_flat()
            self._chunks(0, self._data_start)  # the pickle before the data: checked before read
            obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except CheckpointError:
            self.close()
            raise
        except Exception as exc:  # a corrupt zip raises many different types
            self.close()
            raise CheckpointError(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from None
        from trainer.buffers import Layout

        self.meta, self.layout = obj["meta"], Layout.from_json(obj["layout"])
        self._mapped = obj["flat"]  # mapped, not read: `load_all` reads it, `get` never does
        self.params: dict[str, dict] = self.meta["params"]
        self._fields = {f.name: f for f in self.layout.fields}

    def _locate_flat(self) -> int:
        """Where the flat tensor's bytes start in the file (torch.save stores them uncompressed,
        as the zip entry `*/data/0`)."""
        import zipfile

        try:
            with zipfile.ZipFile(self.path) as z:
                info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
        except (zipfile.BadZipFile, StopIteration, OSError) as exc:
            raise CheckpointError(f"{self.path}: not a shard file ({exc})") from None
        header = os.pread(self._fd, 30, info.header_offset)
        name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
        return info.header_offset + 30 + name_len + extra_len

    def _chunks(self, lo: int, hi: int) -> bytes:
        """File bytes [lo, hi), from whole chunks each checked against its digest."""
        out = bytearray()
        for i in range(lo // self.chunk_bytes, -(-hi // self.chunk_bytes)):
            data = self._cache.get(i)
            if data is None:
                try:
                    data = os.pread(self._fd, self.chunk_bytes, i * self.chunk_bytes)
                except OSError as exc:  # the checkpoint's storage, named as such
                    raise CheckpointError(f"{self.path}: cannot be read ({exc.strerror or exc})") \
                        from None
                if i >= len(self._digests) or _digest(data) != self._digests[i]:
                    raise CheckpointError(f"{self.path}: sha256 of chunk {i} does not match its marker")
                self._cache = {i: data}  # requests come in file order: one chunk is enough
            start = i * self.chunk_bytes
            out += data[max(lo - start, 0):min(hi - start, len(data))]
        return bytes(out)

    def load_all(self) -> None:
        """Check the whole file (chunks hashed in parallel), then serve `get` from the mapping."""
        digest = file_sha256(self.path)
        if digest != self.marker["sha256"]:
            raise CheckpointError(f"{self.path}: sha256 {digest[:12]}... does not match its "
                                  f"marker ({self.marker['sha256'][:12]}...)")
        self._views = self.layout.views(self._mapped)

    def get(self, key: str, lo: int = 0, hi: Optional[int] = None) -> "torch.Tensor":
        """Rows [lo, hi) of tensor `key` (all of a 0-dim one)."""
        import torch

        from trainer.buffers import dtype_of

        views = getattr(self, "_views", None)
        if views is not None:
            t = views[key]
            return t if t.dim() == 0 else t[lo:hi]
        f = self._fields[key]
        dtype = dtype_of(f.dtype)
        row = f.nbytes // f.shape[0] if f.shape else f.nbytes
        stop = (f.shape[0] if hi is None else hi) if f.shape else 1
        begin = self._data_start + f.offset + (lo if f.shape else 0) * row
        raw = self._chunks(begin, begin + (stop - (lo if f.shape else 0)) * row)
        t = torch.frombuffer(bytearray(raw), dtype=dtype)
        return t.reshape(-1, *f.shape[1:]) if f.shape else t.reshape(())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class CheckpointStore:
    """The directory protocol: commit, discovery, verification, retention. No torch.distributed."""

    def __init__(self, root: str | Path, retain: int = 2, warn: Callable[[str], None] = print):
        self.root = Path(root)
        self.retain = retain
        self.warn = warn

    # -- discovery ---------------------------------------------------------------------------
    def step_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = STEP_DIR.fullmatch(p.name)
            if m and p.is_dir():
                out.append((int(m[1]), p))
        return sorted(out)

    def committed(self) -> list[tuple[int, Path]]:
        return [(s, p) for s, p in self.step_dirs() if (p / MANIFEST).is_file()]

    def read_manifest(self, path: Path) -> dict:
        """A manifest whose shards are all present at their recorded sizes, or CheckpointError."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: unreadable manifest ({exc})") from None
        for shard in manifest.get("shards", []):
            f = path / shard["file"]
            size = f.stat().st_size if f.is_file() else -1
            if size != shard["bytes"]:
                raise CheckpointError(f"{f}: {size} bytes on disk, manifest says {shard['bytes']}")
        if len(manifest.get("shards", [])) != manifest.get("world_size"):
            raise CheckpointError(f"{path}: manifest lists {len(manifest.get('shards', []))} "
                                  f"shards for world size {manifest.get('world_size')}")
        return manifest

    def candidates(self) -> list[tuple[int, Path, dict]]:
        """Committed checkpoints that pass the cheap checks, newest first; warns about the rest."""
        return self.survey()[0]

    def survey(self) -> tuple[list[tuple[int, Path, dict]], list[tuple[int, str]]]:
        """Committed checkpoints that pass the cheap checks, newest first, and those that fail
        them, each with why (warned about as well): a restore that finds no candidate must
        still tell a directory of damaged checkpoints from an empty one."""
        good, bad = [], []
        for step, path in reversed(self.committed()):
            try:
                good.append((step, path, self.read_manifest(path)))
            except CheckpointError as exc:
                self.warn(f"skipping checkpoint {path}: {exc}")
                bad.append((step, str(exc)))
        return good, bad

    def latest_step(self) -> Optional[int]:
        c = self.committed()
        return c[-1][0] if c else None

    # -- commit ------------------------------------------------------------------------------
    def ready_markers(self, step: int, world_size: int) -> Optional[list[dict]]:
        """Every rank's marker for `step`, each matching its shard file, or None if not yet."""
        found: dict[int, dict] = {}
        if self.collect_markers(step, world_size, found):
            return None
        return [found[r] for r in range(world_size)]

    def collect_markers(self, step: int, world_size: int, found: dict[int, dict]) -> list[int]:
        """Read the markers of `step` not yet in `found` into it, each checked against its shard
        file; returns the ranks still missing. Called again with the same `found`, it reads only
        those: rank 0 reads each marker once per checkpoint, however late some appear."""
        path = self.root / step_dir_name(step)
        missing = []
        for r in range(world_size):
            if r in found:
                continue
            m = path / marker_name(r)
            if not m.is_file():
                missing.append(r)
                continue
            marker = json.loads(m.read_text())
            shard = path / marker["file"]
            if marker["world_size"] != world_size:
                missing.append(r)  # written by an attempt with another world size
                continue
            if marker["step"] != step or not shard.is_file() or shard.stat().st_size != marker["bytes"]:
                raise CheckpointError(f"{m}: marker does not match {shard}")
            found[r] = marker
        return missing

    def commit(self, step: int, markers: list[dict], extra: dict) -> Path:
        """Publish a checkpoint: manifest last, then the `latest` pointer, then retention."""
        path = self.root / step_dir_name(step)
        manifest = {"step": step, "world_size": len(markers), "committed_at": time.time(),
                    "shards": [{k: m[k] for k in ("rank", "file", "bytes", "sha256")}
                               for m in markers], **extra}
        try:
            write_json_atomic(path / MANIFEST, manifest)
            write_json_atomic(self.root / LATEST, {"step": step, "dir": path.name})
        except OSError as exc:
            raise StorageError.of(exc, f"committing checkpoint step {step}", path / MANIFEST) from exc
        self.prune()
        return path

    def commit_complete(self) -> list[int]:
        """Commit every uncommitted checkpoint whose shards all landed (rank 0, before a restore).

        A crash can come after every rank wrote its shard but before rank 0 saw the last marker;
        that checkpoint is complete and verified, so it is published instead of thrown away.
        """
        done = []
        for step, path in self.step_dirs():
            first = path / marker_name(0)
            if (path / MANIFEST).is_file() or not first.is_file():
                continue
            try:
                world = json.loads(first.read_text())["world_size"]
                markers = self.ready_markers(step, world)
            except (OSError, ValueError, KeyError, CheckpointError):
                continue
            if markers is not None:
                self.commit(step, markers, {"committed_by": "recovery"})
                done.append(step)
        return done

    def prune(self) -> None:
        """Keep the newest `retain` committed checkpoints; drop abandoned partial ones below them."""
        committed = self.committed()
        keep_from = committed[-self.retain][0] if len(committed) >= self.retain else -1
        newest = committed[-1][0] if committed else -1
        for step, path in self.step_dirs():
            done = (path / MANIFEST).is_file()
            if (done and step < keep_from) or (not done and step < newest):
                shutil.rmtree(path, ignore_errors=True)

    def discard_after(self, step: int) -> None:
        """Set aside everything newer than the resume point: it belongs to a dead timeline, and
        its markers must never be committed with the shards that replace it. Partial checkpoints
        go; committed ones that no rank could load are renamed `<dir>.skipped` for inspection."""
        for s, path in self.step_dirs():
            if s <= step:
                continue
            if (path / MANIFEST).is_file():
                aside = path.with_name(path.name + ".skipped")
                shutil.rmtree(aside, ignore_errors=True)
                path.rename(aside)
            else:
                shutil.rmtree(path, ignore_errors=True)

    # -- load --------------------------------------------------------------------------------
    def marker(self, step: int, rank: int) -> dict:
        """Rank `rank`'s marker of committed step `step`: its size and chunk digests."""
        m = self.root / step_dir_name(step) / marker_name(rank)
        try:
            return json.loads(m.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{m}: unreadable marker ({exc})") from None

    def open_shard(self, step: int, rank: int) -> ShardFile:
        """Saved rank `rank`'s shard of committed step `step`, read through its marker: one
        file opened, nothing of any other rank."""
        marker = self.marker(step, rank)
        return ShardFile(self.root / step_dir_name(step) / marker["file"], marker)


@dataclass
class SaveStats:
    """What results.json reports about checkpointing."""

    count: int = 0
    blocking_seconds: list[float] = field(default_factory=list)
    write_seconds: list[float] = field(default_factory=list)
    bytes_per_rank: int = 0

    def to_json(self) -> dict[str, Any]:
        n = len(self.blocking_seconds)
        total = sum(self.blocking_seconds)
        return {"count": self.count, "blocking_seconds_total": total,
                "blocking_seconds_mean": total / n if n else 0.0,
                "write_seconds_mean": (sum(self.write_seconds) / len(self.write_seconds)
                                       if self.write_seconds else 0.0),
                "bytes_per_rank": self.bytes_per_rank}
