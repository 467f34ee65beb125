"""Atomic file writes, the one helper for every file nmt must never leave half-written (checkpoints, config.json,
a prepared directory's manifest, tokenizer and step records).

A temporary file NAME.PID@HOST.XXXX.tmp is written beside NAME, flushed and fsynced, then renamed over NAME (and
the rename made durable): a crash, a full disk or Ctrl-C at any moment leaves either the old file or the new one.

Only SIGKILL (or a power cut) leaves the temporary file behind. Its name says whose it was (`owner_tag`: process id
@ host; export/folder.py names its temporary folders the same way), so that the next writer of NAME removes the
ones whose process has ended (`owner_gone`), never one that a live writer still fills.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
_OWNER = re.compile(r"(\d+)@([A-Za-z0-9_-]+)")


def owner_tag() -> str:
    """This process as a name part: PID@HOST (the host's name with anything but letters, digits, - and _ as _)."""
    return f"{os.getpid()}@{_HOST}"


def owner_gone(tag: str) -> bool:
    """Whether the process that `owner_tag()` gave `tag` has ended. Only a process of this host can be known to
    have ended: a tag of another host (a shared filesystem) or not a tag at all is never gone. A process id that a
    new process has taken since reads as alive: its leftovers are kept, never a live writer's removed."""
    found = _OWNER.fullmatch(tag)
    if found is None or found.group(2) != _HOST:
        return False
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process (alive), or not a process id
        return False
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write_fn, on_error: Callable[[Path, OSError], Exception] | None = None
                 ) -> None:
    """Call write_fn(fileobj) on a temporary file beside `path`, fsync it, then os.replace it into place.

    The file gets the permissions of any new file (0666 less the umask), not mkstemp's 0600. A write that fails
    (disk full, read-only or unwritable directory) raises `on_error(path, exc)` when given, else the OSError.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_files(path)
        fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.{owner_tag()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        if on_error is None:
            raise
        raise on_error(path, exc) from exc
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        cause = os_error_behind(exc)
        if cause is not None and on_error is not None:
            raise on_error(path, cause) from exc
        if cause is not None and cause is not exc:
            raise cause from exc
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def remove_stale_files(path: Path) -> int:
    """Delete the temporary files NAME.PID@HOST.XXXX.tmp that killed writers of `path` left beside it (their process
    has ended on this host) -> how many."""
    pattern = re.compile(re.escape(f"{path.name}.") + r"([0-9]+@[A-Za-z0-9_-]+)\.[a-z0-9_]+\.tmp")
    removed = 0
    for p in path.parent.glob(glob.escape(path.name) + ".*.tmp"):
        found = pattern.fullmatch(p.name)
        if found and p.is_file() and owner_gone(found.group(1)):
            p.unlink(missing_ok=True)
            removed += 1
    return removed


def os_error_behind(exc: BaseException) -> OSError | None:
    """The OSError that `exc` is, or that it was raised while handling (its __cause__/__context__ chain): a writer
    library may hide the system's error behind its own (torch's zip writer, failing again as it closes after a full
    disk, raises RuntimeError "unexpected pos" whose context is the OSError "No space left on device"), or carry it
    only in its text (a library written in Rust, such as safetensors: "I/O error: ... (os error 28)")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        rust = _RUST_OS_ERROR.search(str(exc))  # safetensors' SafetensorError: "... (os error 28)"
        if rust:
            errno = int(rust.group(1))
            return OSError(errno, os.strerror(errno))
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else None if exc.__suppress_context__ else exc.__context__
    return None


def write_bytes(path: str | os.PathLike, data: bytes, on_error=None) -> None:
    atomic_write(path, lambda f: f.write(data), on_error)


def write_text(path: str | os.PathLike, text: str, on_error=None) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), on_error)


def remove_stale_tmp(directory: str | os.PathLike) -> tuple[int, int]:
    """Delete the temporary files a killed atomic_write left in `directory` (NAME.XXXX.tmp beside NAME):
    -> (files, bytes) removed. Call it only where no other process writes."""
    files = size = 0
    for p in Path(directory).glob("*.*.tmp"):
        if p.is_file():
            size += p.stat().st_size
            p.unlink(missing_ok=True)
            files += 1
    return files, size
