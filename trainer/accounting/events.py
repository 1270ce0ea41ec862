"""The run's event log: one JSONL file per node, written by that node's processes only, and one
reader that merges the files by time.

Layout, in the `events/` directory beside results.json:

    events/node-00000.jsonl   node 0: its ranks (every restart), its launcher, its rank monitors
    events/node-00001.jsonl   node 1, ...
    events/job.jsonl          the job runner (`devtools.local`), where there is one

Why one file per node, not one per run or per rank: on a shared file system (FSx for Lustre)
appends from several clients to one file are serialized by the file's lock, which moves from
client to client at every append; one writer node per file keeps that lock on its node, so
appending costs one local write. One file per rank would be the same for the writers, but at
16,384 GPUs it puts 16,384 files in one directory (one metadata server's load at create, list and
open) and asks a reader to merge 16,384 streams; per node, the 8 ranks of a node share one file
and the directory holds a file per node. A process writes only to its own node's file, whatever
the world size (`process_log`).

Writing: each event is one line, written with a single O_APPEND write() on a descriptor opened
once per process (no open/close per event: two metadata calls each on Lustre). A short line is
atomic on POSIX file systems; a process that dies right after an event loses nothing, the line
is in the kernel's page cache. There is no fsync: it guards only against the node's own crash,
and with a checkpoint write filling the disk an fsync on the recovery path can wait seconds. A
line torn by a crash or a full disk is never glued to the next event: a writer that finds its
file not ending in a newline (or whose own write came out short) starts its next line with one.

Reading (`read_events`): every file is parsed line by line as bytes; a line that is not UTF-8,
not JSON or not an event (a JSON object with a numeric `t`, a string `event` and an integer
`rank`) is skipped and counted (`LogStats`), never fatal. Each file is put in time order through
a small window (`REORDER_SECONDS`: processes of one node stamp and append in slightly different
orders), and the files are merged with heapq.merge, so that a reader holds a window of events
per file, never the whole log. A live view (the trainer's TensorBoard and metrics, `watch`)
reads the log while it grows through `Follower`: the same lines, the same order, each event
released once no line still to come can sort before it.

    python -m trainer.accounting.events merge runs/<id>/events [--out events.jsonl]

writes one merged log, in time order.
"""

from __future__ import annotations

import argparse
import enum
import heapq
import itertools
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from config.contract import EVENTS_DIR_ENV, LAUNCHER_ID_ENV, NODE_RANK_ENV

DIRNAME = "events"  # beside results.json
MERGED_NAME = "events.jsonl"  # one file for the whole log: what `merge` writes beside the directory
JOB_LOG = "job.jsonl"
REORDER_SECONDS = 5.0  # how far out of time order one file's lines may be
MAX_LINE_BYTES = 1 << 20  # a longer line is damage, not an event
MERGE_FAN_IN = 256  # files merged at once; more are merged in passes (open-file limits)

Opener = Callable[[str, int, int], int]  # os.open's signature: the writer's file-system seam


class Detection(enum.StrEnum):
    """How a failure was detected: the `how` of the recovery layers' detection events, and the
    `detection` of results.json's faults[]."""

    EXCEPTION = "exception"  # a rank raised
    SOFT_TIMEOUT = "soft_timeout"  # the Wrapper: a rank made no progress within --soft_timeout
    HARD_TIMEOUT = "hard_timeout"  # the Wrapper: none within --hard_timeout; it killed the rank
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"  # a rank's heartbeats stopped (launcher or Wrapper)
    PROCESS_DEATH = "process_death"  # a process exited (exit code) or was killed (signal)
    JOB_RESTART = "job_restart"  # the job started again, nothing seen before (a node lost, say)
    NODE_LOST = "node_lost"  # a node no longer answers: its rendezvous keep-alive or its beat
    # in the store stopped (`nodewatch`)
    MONITOR_ERROR = "monitor_error"  # the Wrapper's monitor process failed
    UNKNOWN = "unknown"


def utc_stamp(t: float) -> str:
    """An event's time as rank-0 log lines show it: 2026-01-31T12:00:03Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def events_dir(output_dir: str | Path) -> Path:
    """The run's event directory, in the directory of results.json (`TrainConfig.output_dir`)."""
    return Path(output_dir) / DIRNAME


def node_log_name(node: int) -> str:
    return f"node-{node:05d}.jsonl"


def node_rank(environ: Mapping[str, str]) -> int:
    """This process's node: the launcher's --node_rank (NODE_RANK_ENV, stable across restarts),
    else torchelastic's GROUP_RANK (a launcher started by hand), else 0 (a single process)."""
    for name in (NODE_RANK_ENV, "GROUP_RANK"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 0


class EventLog:
    """Appends events to one file; `path` None records nothing (tests, runs without output).

    `fields` are added to every event (a launcher's `node`); `opener` is os.open, or a test's
    seam to count what a process opens."""

    def __init__(self, path: Optional[str | Path], rank: int, fields: Optional[dict] = None,
                 opener: Opener = os.open):
        self.path = Path(path) if path else None
        self.rank = rank
        self.fields = dict(fields or {})
        self._opener = opener
        self._fd: Optional[int] = None
        self._pid = -1
        self._newline_first = False  # the file ends in a torn line: start the next on a new one
        self._warned = False

    def emit(self, event: str, **fields: Any) -> dict:
        rec = {"t": time.time(), "event": event, "rank": self.rank, "pid": os.getpid(),
               **self.fields, **fields}
        if self.path is not None:
            self._append((json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode())
        return rec

    def _append(self, line: bytes) -> None:
        try:
            fd = self._open()
            data = b"\n" + line if self._newline_first else line
            self._newline_first = os.write(fd, data) < len(data)
        except OSError as exc:  # a full or failing disk: training goes on, events are lost
            self._newline_first = True
            if not self._warned:
                self._warned = True
                print(f"events: cannot write {self.path}: {exc}; events are being lost",
                      file=sys.stderr, flush=True)

    def _open(self) -> int:
        """The descriptor, opened once per process (a forked child opens its own: it may outlive
        or race its parent's)."""
        if self._fd is None or self._pid != os.getpid():
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = self._opener(str(self.path), os.O_RDWR | os.O_APPEND | os.O_CREAT
                                    | os.O_CLOEXEC, 0o644)
            self._pid = os.getpid()
            size = os.fstat(self._fd).st_size
            self._newline_first = size > 0 and os.pread(self._fd, 1, size - 1) != b"\n"
        return self._fd

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


def process_log(output_dir: Optional[str | Path], environ: Mapping[str, str] = os.environ,
                opener: Opener = os.open) -> EventLog:
    """A rank's log: its node's file, whatever the world size."""
    rank = int(environ.get("RANK", 0))
    if output_dir is None:
        return EventLog(None, rank)
    return EventLog(events_dir(output_dir) / node_log_name(node_rank(environ)), rank, opener=opener)


def launcher_log(environ: Mapping[str, str] = os.environ) -> EventLog:
    """A node's launcher's log (rank -1, its node and start named in every event): the node's
    file in the directory the launcher was given (EVENTS_DIR_ENV), else nothing."""
    directory = environ.get(EVENTS_DIR_ENV)
    node = node_rank(environ)
    return EventLog(Path(directory) / node_log_name(node) if directory else None, -1,
                    fields={"node": node, "launcher": environ.get(LAUNCHER_ID_ENV)})


def job_log(output_dir: str | Path) -> EventLog:
    """The job runner's log (rank -1): it restarts the whole job, as a Kubernetes Job would."""
    return EventLog(events_dir(output_dir) / JOB_LOG, -1)


# ---- reading ---------------------------------------------------------------------------------

@dataclass
class LogStats:
    """What a read met: files, events, and lines skipped as unreadable (the first one named)."""
    files: int = 0
    events: int = 0
    unreadable: int = 0
    first_unreadable: Optional[str] = None

    def skipped(self, where: str) -> None:
        self.unreadable += 1
        if self.first_unreadable is None:
            self.first_unreadable = where

    def warning(self) -> Optional[str]:
        """One line for a log that had unreadable lines, else None."""
        if not self.unreadable:
            return None
        return (f"events: skipped {self.unreadable} unreadable line(s) of {self.files} file(s) "
                f"(first: {self.first_unreadable})")

    def to_dict(self) -> dict:
        return {"files": self.files, "events": self.events, "unreadable_lines": self.unreadable}


def log_files(where: str | Path) -> list[Path]:
    """The files of a log: an events directory's *.jsonl, or one file (a merged log)."""
    p = Path(where)
    if p.is_dir():
        return sorted(f for f in p.iterdir() if f.suffix == ".jsonl" and f.is_file())
    return [p] if p.is_file() else []


def log_beside(results_path: str | Path) -> Path:
    """The log of the run whose results.json is `results_path`: its events directory, else a
    merged events.jsonl in its place."""
    d = Path(results_path).resolve().parent
    return d / DIRNAME if (d / DIRNAME).is_dir() else d / MERGED_NAME


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# The fields readers index by name, per event: an event without them is damage.
REQUIRED: dict[str, dict[str, Callable[[Any], bool]]] = {
    "step": {"step": _integer, "dt": _number},
    "train_start": {"step": _integer},
    "ckpt_save": {"step": _integer, "blocking_s": _number},
    "ckpt_drain": {"seconds": _number},
    "ckpt_commit": {"write_s": _number},
    "error": {"type": lambda x: isinstance(x, str), "message": lambda x: isinstance(x, str)},
}


def is_event(obj: Any) -> bool:
    """A JSON object with a numeric `t`, a string `event`, an integer `rank`, and the fields its
    readers need (REQUIRED)."""
    if not (isinstance(obj, dict) and _number(obj.get("t")) and isinstance(obj.get("event"), str)
            and _integer(obj.get("rank"))):
        return False
    return all(ok(obj.get(name)) for name, ok in REQUIRED.get(obj["event"], {}).items())


_START = b'{"t":'  # every writer's line begins so: a line glued onto a torn one still parses


def _decode(line: bytes) -> Optional[dict]:
    try:
        obj = json.loads(line)
    except ValueError:  # not UTF-8 (UnicodeDecodeError is one) or not JSON
        return None
    return obj if is_event(obj) else None


def _parse(path: Path, stats: LogStats) -> Iterator[dict]:
    """A file's events in file order; damaged lines skipped and counted (`_event_of`)."""
    try:
        f = path.open("rb")
    except OSError:
        stats.skipped(f"{path}: unreadable file")
        return
    with f:
        for number in itertools.count(1):
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass
                    stats.skipped(f"{path.name} line {number}")
                    continue
            except OSError as exc:  # a failing disk: what was read stands
                stats.skipped(f"{path.name} line {number}: {exc}")
                return
            if not line:
                return
            event = _event_of(line, stats, f"{path.name} line {number}")
            if event is not None:
                yield event


def _event_of(line: bytes, stats: LogStats, where: str) -> Optional[dict]:
    """One line's event, or None for a blank or damaged line (counted). An event written after
    a torn fragment on the same line (by a writer that could not know) is kept."""
    line = line.strip()
    if not line:
        return None
    event = _decode(line)
    if event is None:
        stats.skipped(where)
        start = line.rfind(_START)
        event = _decode(line[start:]) if start > 0 else None
        if event is None:
            return None
    stats.events += 1
    return event


def _in_time_order(events: Iterable[dict], window: float = REORDER_SECONDS) -> Iterator[dict]:
    """Events in time order, for a stream no event of which comes more than `window` seconds
    after a later-stamped one; holds only the events of the last `window` seconds."""
    heap: list[tuple[float, int, dict]] = []
    newest = -math.inf
    for seq, e in enumerate(events):
        heapq.heappush(heap, (e["t"], seq, e))
        newest = max(newest, e["t"])
        while heap[0][0] < newest - window:
            yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def _merged(files: Sequence[Path], stats: LogStats, fan_in: int) -> Iterator[dict]:
    if len(files) <= fan_in:
        yield from heapq.merge(*(_in_time_order(_parse(f, stats)) for f in files),
                               key=lambda e: e["t"])
        return
    # More files than may be open at once: merge groups into temporary files, then those.
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-events-") as tmp:
        parts = []
        for i in range(0, len(files), fan_in):
            part = Path(tmp) / f"part-{i // fan_in:05d}.jsonl"
            write_jsonl(_merged(files[i:i + fan_in], stats, fan_in), part)
            parts.append(part)
        inner = LogStats()  # the parts are our own output: count their lines once, above
        yield from _merged(parts, inner, fan_in)


def read_events(where: str | Path, stats: Optional[LogStats] = None,
                fan_in: int = MERGE_FAN_IN) -> Iterator[dict]:
    """Every readable event of a log (an events directory or one file), in time order, as a
    stream. `stats` counts files, events and skipped lines."""
    stats = stats if stats is not None else LogStats()
    files = log_files(where)
    stats.files += len(files)
    return _merged(files, stats, fan_in)


class Follower:
    """Reads a log while it is written: each `poll` returns the events appended since the last
    one, in time order. `where` is an events directory (files that appear later are followed
    too) or a list of files.

    An event is held while it is less than `window` seconds older than the newest event read
    or the clock (a line still to come may sort before it), or while a file still has unread
    bytes and its newest event read is older (`behind`: a poll reads at most `chunk` bytes of
    each file, so that catching up on a long log holds a chunk per file, never the log). A
    `final` poll holds nothing back but what an unread file may still precede."""

    def __init__(self, where: str | Path | Sequence[Path], stats: Optional[LogStats] = None,
                 window: float = REORDER_SECONDS, chunk: int = 2 * MAX_LINE_BYTES):
        self.where = where if isinstance(where, (str, Path)) else [Path(f) for f in where]
        self.stats = stats if stats is not None else LogStats()
        self.window, self.chunk = window, chunk
        self.behind = False  # some file had more bytes than the last poll read
        self._offsets: dict[Path, int] = {}
        self._lines: dict[Path, int] = {}
        self._newest_of: dict[Path, float] = {}
        self._skipping: set[Path] = set()  # inside a line longer than MAX_LINE_BYTES
        self._held: list[tuple[float, int, dict]] = []
        self._seq = itertools.count()
        self._newest = -math.inf

    def _files(self) -> list[Path]:
        if isinstance(self.where, list):
            return [f for f in self.where if f.is_file()]
        return log_files(self.where)

    def poll(self, final: bool = False, now: Optional[float] = None) -> list[dict]:
        bound, self.behind = math.inf, False
        for path in self._files():
            if path not in self._offsets:
                self._offsets[path], self._lines[path] = 0, 0
                self.stats.files += 1
            events, more = self._read(path, final)
            for e in events:
                heapq.heappush(self._held, (e["t"], next(self._seq), e))
                self._newest = max(self._newest, e["t"])
                self._newest_of[path] = max(self._newest_of.get(path, -math.inf), e["t"])
            if more:
                self.behind = True
                bound = min(bound, self._newest_of.get(path, -math.inf))
        clock = time.time() if now is None else now
        until = bound if final else min(bound, max(self._newest, clock) - self.window)
        out = []
        while self._held and self._held[0][0] <= until:
            out.append(heapq.heappop(self._held)[2])
        return out

    def _read(self, path: Path, final: bool) -> tuple[list[dict], bool]:
        """The complete lines appended to `path` since the last read (with `final`, a last
        line without its newline too), and whether more bytes follow them."""
        try:
            with path.open("rb") as f:
                f.seek(self._offsets[path])
                data = f.read(self.chunk)
        except OSError as exc:
            self.stats.skipped(f"{path}: {exc}")
            return [], False
        more = len(data) == self.chunk
        end = data.rfind(b"\n") + 1  # complete lines only: a writer may be mid-line
        if final and not more:
            end = len(data)
        if end == 0:
            if more:  # no end within a chunk: damage, not an event
                self._skipping.add(path)
                self._offsets[path] += len(data)
            return [], more
        self._offsets[path] += end
        lines = data[:end].split(b"\n")
        if data[:end].endswith(b"\n"):
            lines.pop()
        events = []
        for line in lines:
            self._lines[path] += 1
            where = f"{path.name} line {self._lines[path]}"
            if path in self._skipping or len(line) > MAX_LINE_BYTES:
                self._skipping.discard(path)  # the end of a line too long to be an event
                self.stats.skipped(where)
                continue
            event = _event_of(line, self.stats, where)
            if event is not None:
                events.append(event)
        return events, more


def write_jsonl(events: Iterable[dict], path: Path) -> int:
    """Write events one per line to `path` (atomically: a temporary file, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with tmp.open("w") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.accounting.events",
                                description="Tools for a run's event log.")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="write the per-node files of DIR as one log, in time order")
    m.add_argument("dir", help="a run's events directory (runs/<id>/events)")
    m.add_argument("--out", help=f"default: {MERGED_NAME} beside DIR")
    args = p.parse_args(argv)
    src = Path(args.dir)
    if not src.is_dir() or not log_files(src):
        print(f"{p.prog}: error: {src} is not an events directory (no *.jsonl file in it)",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else src.parent / MERGED_NAME
    stats = LogStats()
    n = write_jsonl(read_events(src, stats), out)
    print(f"wrote {n} events from {stats.files} files to {out}")
    if stats.warning():
        print(stats.warning(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
