"""glibc's malloc: give the heap's free memory back to the system (malloc_trim), for a process that dropped a large
model and keeps running without it (nmt serve's HTTP process, serve/remote.py).

(CPU decoding once also set glibc to keep freed memory for the next step; measured again it saved no wall time worth
its peak memory: docs/results.md#cpu-decoding-mechanisms.)
"""

from __future__ import annotations

import ctypes
import sys


def give_back() -> None:
    """Return the heap's free memory to the system now (glibc's malloc_trim; nothing elsewhere): for a process that
    dropped a large model it keeps running without (nmt serve's HTTP process, serve/remote.py)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only)
    except (OSError, AttributeError):
        return None
    return libc
