"""Buffers for a rank's flat shard, shared by the durable tier (which stages into them) and the
snapshot tiers (whose slots they are), so they belong to neither.

A host buffer is file-backed (`/dev/shm` by default) and mapped shared, so that
- the device-to-host copy runs at pinned-memory speed (the mapping is registered with CUDA),
- the background writer process maps the same pages instead of receiving pickled tensors,
- the copy outlives the training process: it doubles as the node-local snapshot tier.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

ALIGN = 64  # bytes; keeps every view aligned for its dtype and for vectorized copies


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


@dataclass(frozen=True)
class Field:
    """One tensor's place in a flat shard buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a shard lives inside the flat buffer."""

    fields: tuple[Field, ...]
    total_bytes: int

    @staticmethod
    def of(tensors: Mapping[str, torch.Tensor]) -> "Layout":
        fields, offset = [], 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            fields.append(Field(name, dtype_name(t.dtype), tuple(t.shape), offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return Layout(tuple(fields), max(offset, ALIGN))

    def to_json(self) -> dict:
        return {"total_bytes": self.total_bytes, "fields": [asdict(f) for f in self.fields]}

    @staticmethod
    def from_json(d: Mapping) -> "Layout":
        fields = tuple(Field(f["name"], f["dtype"], tuple(f["shape"]), f["offset"], f["nbytes"])
                       for f in d["fields"])
        return Layout(fields, int(d["total_bytes"]))

    def views(self, flat: torch.Tensor, start: int = 0) -> dict[str, torch.Tensor]:
        """Typed views into a flat uint8 tensor holding this layout from byte `start` on."""
        out = {}
        for s in self.fields:
            if s.offset < start:
                continue
            raw = flat[s.offset - start:s.offset - start + s.nbytes]
            out[s.name] = raw.view(dtype_of(s.dtype)).view(s.shape)
        return out

    def suffix_start(self, share: float) -> int:
        """Where the tensors holding the last `share` of the bytes begin (a tensor's start)."""
        if share <= 0:
            return self.total_bytes
        cut = self.total_bytes * (1.0 - share)
        return next((s.offset for s in self.fields if s.offset >= cut), self.total_bytes)


def map_file(path: Path, nbytes: int, writable: bool) -> torch.Tensor:
    """A flat uint8 tensor over `path` (MAP_SHARED when writable, so other processes see it)."""
    return torch.from_file(str(path), shared=writable, size=nbytes, dtype=torch.uint8)


@functools.lru_cache(maxsize=None)
def host_copy_stream(device: torch.device) -> "Optional[torch.cuda.Stream]":
    """The one stream of a process for its device-to-host copies (step figures, snapshots,
    checkpoint staging); None on CPUs. The copy engine runs such copies one at a time whatever
    their stream, so a small copy on the compute stream would hold that stream's kernels
    behind a 7 GB snapshot copy; on one stream of their own they run in the order queued, a
    step's figures before the snapshot queued after them, and the compute stream never waits."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def _current_device() -> Optional[int]:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


class HostBuffer:
    """A shared, optionally CUDA-pinned, file-backed buffer holding one shard layout.

    One per file and process (`HostBuffer.open`): an in-process restart gets back the very
    buffer an interrupted attempt mapped and registered, instead of mapping the file a second
    time. A mapping dropped while still registered with CUDA would leave its address range
    registered, and the next mapping placed there fails with CUDA error 712.
    """

    _open: dict[Path, "HostBuffer"] = {}
    _warming: dict[Path, threading.Thread] = {}
    _lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, layout: Layout, pin: bool) -> "HostBuffer":
        key = Path(path).resolve()
        with cls._lock:
            warming = cls._warming.pop(key, None)
        if warming is not None:
            warming.join()
        with cls._lock:
            buf = cls._open.get(key)
        if buf is not None and buf.layout == layout:
            if pin:
                buf._pin()
            return buf
        if buf is not None:
            buf.close()
        buf = cls(key, layout, pin)  # outside the lock: open_all builds buffers in parallel
        with cls._lock:
            cls._open[key] = buf
        return buf

    @classmethod
    def opened(cls, directory: Path) -> dict[Path, "HostBuffer"]:
        """The buffers of `directory` this process has open, by resolved path."""
        root = Path(directory).resolve()
        with cls._lock:
            return {p: b for p, b in cls._open.items() if p.parent == root}

    @classmethod
    def warming(cls, directory: Path) -> set[threading.Thread]:
        """The background threads of `warm` still mapping buffers of `directory`."""
        root = Path(directory).resolve()
        with cls._lock:
            return {t for p, t in cls._warming.items() if p.parent == root}

    @classmethod
    def open_all(cls, paths: Sequence[Path], layout: Layout, pin: bool) -> list["HostBuffer"]:
        """`open` of several buffers at once: first-touching and pinning gigabytes runs on
        every buffer in parallel (both release the GIL)."""
        device = _current_device() if pin else None
        if len(paths) < 2:
            return [cls.open(p, layout, pin) for p in paths]

        def one(path: Path) -> "HostBuffer":
            if device is not None:
                torch.cuda.set_device(device)
            return cls.open(path, layout, pin)

        with ThreadPoolExecutor(len(paths), thread_name_prefix="buffer-open") as pool:
            return list(pool.map(one, paths))

    @classmethod
    def warm(cls, files: Sequence[tuple[Path, Layout]], pin: bool) -> None:
        """Map and pin, on a background thread, buffers that an earlier process left: a
        restarted process calls this before it builds its process group and model, and its
        `open` then finds them ready instead of pinning gigabytes on the restart's critical
        path. Best effort: whatever fails here, `open` does again and reports."""
        todo = [(Path(p).resolve(), layout) for p, layout in files]
        with cls._lock:
            todo = [(p, lay) for p, lay in todo if p not in cls._open and p not in cls._warming]
        if not todo:
            return
        device = _current_device() if pin else None

        def run() -> None:
            if device is not None:
                torch.cuda.set_device(device)
            for path, layout in todo:
                try:
                    buf = cls(path, layout, pin)
                except Exception:  # noqa: BLE001 - open() retries and raises
                    continue
                with cls._lock:
                    kept = cls._open.setdefault(path, buf)
                if kept is not buf:
                    buf.close()

        thread = threading.Thread(target=run, daemon=True, name="buffer-warm")
        with cls._lock:
            cls._warming.update({p: thread for p, _ in todo})
        thread.start()

    def __init__(self, path: Path, layout: Layout, pin: bool):
        self.path = Path(path)
        self.layout = layout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists() or self.path.stat().st_size < layout.total_bytes
        self.flat = map_file(self.path, layout.total_bytes, writable=True)
        if fresh:
            # Touch every page now, at start-up: first-touch faults of gigabytes would
            # otherwise land inside the first checkpoint's stall.
            self.flat.fill_(0)
        self.views = layout.views(self.flat)
        self._pinned = False
        self._pinning: Optional[threading.Thread] = None  # a later pin (`pin_later`) running
        self.pin_s = 0.0  # what cudaHostRegister took (0: not pinned, or by a warming thread)
        if pin:
            self._pin()

    @classmethod
    def pin_later(cls, bufs: Sequence["HostBuffer"]) -> None:
        """Pin `bufs` one after another on a background thread. A relaunched worker pins the
        slot it restores from before its first step and the others after it: pinning gigabytes
        beside NCCL's start doubled the process group's time (bench.nccl_costs)."""
        todo = [b for b in bufs if not b._pinned and b._pinning is None]
        if not todo:
            return
        device = _current_device()

        def run() -> None:
            if device is not None:
                torch.cuda.set_device(device)
            for buf in todo:
                try:
                    buf._pin()
                except RuntimeError:  # left unpinned: copies into it still work, slower
                    pass
                finally:
                    buf._pinning = None

        thread = threading.Thread(target=run, daemon=True, name="buffer-pin")
        for buf in todo:
            buf._pinning = thread
        thread.start()

    @property
    def pin_pending(self) -> bool:
        """Whether a later pin of this buffer is still running: a copy into it would wait."""
        return self._pinning is not None

    def _pin(self) -> None:
        if self._pinned:
            return
        t0 = time.perf_counter()
        rc = torch.cuda.cudart().cudaHostRegister(self.flat.data_ptr(), self.layout.total_bytes, 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister of {self.layout.total_bytes} bytes at "
                               f"{self.path} failed with CUDA error {int(rc)}")
        self.pin_s = time.perf_counter() - t0
        self._pinned = True

    def stage(self, tensors: Mapping[str, torch.Tensor], stream: "torch.cuda.Stream | None" = None,
              wait: bool = True, names: Optional[Sequence[str]] = None) -> "torch.cuda.Event | None":
        """Copy `tensors` (those in `names`, default all) into the buffer. On a CUDA stream the
        copy is ordered after the work queued so far; with `wait=False` it returns the event
        that marks its completion."""
        views = self.views if names is None else {n: self.views[n] for n in names}
        if stream is None:
            for name, dst in views.items():
                dst.copy_(tensors[name])
            return None
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            for name, dst in views.items():
                dst.copy_(tensors[name], non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        if wait:
            done.synchronize()
        return done

    def close(self, delete: bool = False) -> None:
        """Unregister, then unmap (in that order, see the class docstring); with `delete`, remove
        the file too."""
        with HostBuffer._lock:
            if HostBuffer._open.get(self.path) is self:
                del HostBuffer._open[self.path]
        if self.flat is None:
            return
        pinning = self._pinning
        if pinning is not None and pinning is not threading.current_thread():
            pinning.join()  # unregistered after, never during, its registration
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.flat.data_ptr())
            self._pinned = False
        self.views = {}
        self.flat = None  # type: ignore[assignment]
        if delete:
            self.path.unlink(missing_ok=True)


_FILL_IDS = itertools.count(1)  # across stages: a stage made anew never matches an old slot


class DeviceStage:
    """A device-memory copy of a shard layout's tensors from byte `start` on (all of them by
    default), for snapshots of every step.

    Copying the state to host memory takes about as long as a step's forward and backward
    (7.4 GB at ~55 GB/s), and the optimizer may not change the state before the copy has
    read it: the step waits on the GPU. Copying to device memory first takes milliseconds;
    the optimizer goes on at once, and the copy to the host slot runs from here in the
    background as one large transfer. It costs that much more device memory. Staging only a
    suffix (`--snapshot_staging split`) halves both the device memory and the device-to-device
    copy; the rest goes straight to the host, within the next forward and backward pass.
    """

    def __init__(self, layout: Layout, device: torch.device, start: int = 0):
        self.layout, self.start = layout, start
        self.flat = torch.empty(layout.total_bytes - start, dtype=torch.uint8, device=device)
        self.views = layout.views(self.flat, start)
        self._copied_out: "torch.cuda.Event | None" = None  # the last copy out, reading `flat`
        self._filled: "torch.cuda.Event | None" = None  # the last copy in
        self.fill_id = 0  # its last fill's, unique in the process: a slot drained from it matches
        # The copy into the stage runs beside the next forward pass: on the compute stream
        # it would run between two steps and lengthen every one of them.
        self._side = torch.cuda.Stream(device) if self.flat.is_cuda else None

    def fill(self, tensors: Mapping[str, torch.Tensor]) -> "torch.cuda.Event | None":
        """Copy `tensors` here, beside the compute stream, once the last copy out has read the
        stage. Returns the event that marks the stage filled (the optimizer must wait for it);
        None on CPU: done."""
        sources = [tensors[n] for n in self.views]
        self.fill_id = next(_FILL_IDS)
        if self._side is None:
            torch._foreach_copy_(list(self.views.values()), sources)
            return None
        self._side.wait_stream(torch.cuda.current_stream(self.flat.device))  # the state is final
        if self._copied_out is not None:  # the previous copy out may still read the stage
            self._side.wait_event(self._copied_out)
        with torch.cuda.stream(self._side):  # the whole state is on the device (fused Adam)
            torch._foreach_copy_(list(self.views.values()), sources, non_blocking=True)
            self._filled = torch.cuda.Event()
            self._filled.record(self._side)
        return self._filled

    def read_views(self) -> dict[str, torch.Tensor]:
        """The stage's tensors, to be read on the current stream: it waits for the last fill.
        The next fill waits for that stream in turn (`fill`)."""
        if self._side is not None and self._filled is not None:
            torch.cuda.current_stream(self.flat.device).wait_event(self._filled)
        return self.views

    def drain(self, dst: HostBuffer, stream: "torch.cuda.Stream | None") -> "torch.cuda.Event | None":
        """Copy the last fill to `dst` on `stream`. Returns the event that marks `dst` complete;
        None on CPU: done."""
        if stream is None or self._side is None:
            dst.flat[self.start:].copy_(self.flat)
            return None
        stream.wait_event(self._filled)
        with torch.cuda.stream(stream):
            dst.flat[self.start:].copy_(self.flat, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        self._copied_out = done
        return done
