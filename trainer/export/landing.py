"""Where an export is written until it is complete, and how it lands under its name.

Each export stages in a directory of its own beside the target (`.<name>.partial-XXXXXXXX`,
unique to the process), and lands with one rename, which succeeds only while nothing holds the
target's name (a non-empty directory is never replaced): two exports to one `--out` never share
or mix files, and a crash leaves a staging directory, never a half export under the name.

One export to a target runs at a time: it holds a lock (`flock` on `.<name>.lock` beside the
target) from before it reads a shard until it has landed, and a second one is refused at once
with one line. Holding the lock, an export removes the staging directories that crashed exports
to the same target left. Where the file system offers no `flock`, the rename alone keeps two
exports apart, and stale staging directories stay.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from trainer.atomic import fsync_dir
from trainer.durable.store import CheckpointError, StorageError, os_error
from trainer.errors import ConfigError
from trainer.export.progress import size
from trainer.export.source import ExportError

NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_OS_ERROR_TEXT = re.compile(r"os error (\d+)")  # how safetensors (Rust) reports an I/O error


def partial_prefix(out: Path) -> str:
    return f".{out.name}.partial-"


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


class Staging:
    """The directory an export is written into, and the bytes it is known to need."""

    def __init__(self, out: Path, path: Path):
        self.out, self.path, self.needed = out, path, 0

    def expect(self, nbytes: int) -> None:
        """The export will write `nbytes` (its tensors): refused now, before anything is
        written, where the storage has less room left."""
        self.needed = nbytes
        free = _free_bytes(self.path)
        if free is not None and free < nbytes:
            raise StorageError(f"writing the export to {self.out} failed: No space left on "
                               f"device: it needs {size(nbytes)}, {self.out.parent} has "
                               f"{size(free)} free")

    def short_of_room(self) -> bool:
        """Whether the storage has less room left than the export still needed: what a writer
        that reports a short write without its cause (torch's zip writer) met."""
        free = _free_bytes(self.path)
        written = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        return free is not None and free < self.needed - written


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Staging]:
    """A new, empty directory to write the export of `out` into; once the block ends without an
    error, it is renamed to `out`. Any error removes it, and a write the storage refused
    becomes `StorageError` (one line naming the path, exit code 2)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError.of(exc, f"creating {out.parent}") from None
    with _locked(out) as locked:
        if out.exists():
            raise ExportError(f"{out} exists: remove it, or export elsewhere")
        if locked:
            _remove_stale(out)
        stage = Staging(out, Path(tempfile.mkdtemp(dir=out.parent, prefix=partial_prefix(out))))
        try:
            _readable_as_umask_allows(stage.path)
            yield stage
            fsync_dir(stage.path)
            _land(stage.path, out)
        except BaseException as exc:  # DCP's CheckpointException is a BaseException too
            failure = storage_failure(exc, stage) if _may_be_storage(exc) else None
            shutil.rmtree(stage.path, ignore_errors=True)
            if failure is not None:
                raise failure from None
            raise


def _may_be_storage(exc: BaseException) -> bool:
    """Not an interruption, and not an error that names its cause already (a bad setting, a
    damaged checkpoint, a refusal of the storage said by the writer itself)."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, ConfigError,
                                CheckpointError))


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[bool]:
    """Hold the lock of `out`'s exports; yields False where the file system has no flock. The
    lock file goes when the export ends; one opened just before that is found replaced, and
    opened again."""
    path = lock_path(out)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise StorageError.of(exc, f"creating the lock of {out}", path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ExportError(f"another export to {out} is running ({_holder(path)}): wait for "
                              "it to end, or export elsewhere") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in NO_FLOCK:
                raise
            path.unlink(missing_ok=True)
            yield False
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the lock file of an export that has just ended: take the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        yield True
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "its process is starting"
    except OSError:
        return "its process is unknown"


def _remove_stale(out: Path) -> None:
    """Staging directories of crashed exports to `out`: no export to it runs but this one."""
    for stale in out.parent.glob(partial_prefix(out) + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _readable_as_umask_allows(path: Path) -> None:
    """mkdtemp creates the directory for its owner alone; the export is for everyone the
    process's umask allows, as a directory it made itself would be."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)


def _land(partial: Path, out: Path) -> None:
    """Rename the complete export to its name, unless another export took the name meanwhile."""
    try:
        os.rename(partial, out)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise ExportError(f"{out} was created by another export meanwhile; this one is "
                              "discarded") from None
        raise
    fsync_dir(out.parent)


def storage_failure(exc: BaseException, stage: Staging) -> Optional[StorageError]:
    """The storage's refusal behind a failed write of the export, as one line naming the path;
    None for any other failure. The writers report it differently: torch as an OSError, or as
    a short write without its cause; safetensors as text with the OS error's number."""
    what = f"writing the export to {stage.out}"
    cause = os_error(exc)
    if cause is None and (found := _OS_ERROR_TEXT.search(str(exc))):
        cause = OSError(int(found[1]), os.strerror(int(found[1])))
    if cause is None and stage.short_of_room():
        cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None if cause is None else StorageError.of(cause, what, stage.path)


def _free_bytes(path: Path) -> Optional[int]:
    """The bytes this process may still write where `path` is; None where it cannot tell."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
