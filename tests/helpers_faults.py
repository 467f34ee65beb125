"""Faults made real for the tests: a small filesystem that fills up (a size-limited tmpfs, mounted where this
process may mount one; the test skips, saying why, where it may not)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(where: Path, size: str = "3m"):
    """A tmpfs of `size` mounted on `where` (made if missing), unmounted afterwards; pytest.skip with mount's own
    reason where mounting is not allowed (not root, no CAP_SYS_ADMIN, no mount command)."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a small filesystem with")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def leftovers(directory: Path) -> list[str]:
    """Temporary files a writer left behind in `directory` (atomic_write's NAME.XXXX.tmp, folders' .tmp-...)."""
    return sorted(p.name for p in directory.rglob("*") if ".tmp" in p.name)


def fill(where: Path, leave: int) -> None:
    """Take all the free space of the filesystem of `where` but `leave` bytes (a file named filler)."""
    import os

    free = shutil.disk_usage(where).free
    with open(where / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(1, free - leave))
