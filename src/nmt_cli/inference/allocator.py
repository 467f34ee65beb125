"""glibc's malloc, for CPU decoding's memory: large blocks in mappings of their own (`map_large_blocks`), and the
heap's free memory given back to the system (`give_back`).

A decoding step allocates and frees blocks of megabytes (logits over the vocabulary, the cache's buffers as they
grow). glibc serves them from its heap once freed ones have raised its mapping threshold (up to 32 MB), and the heap
then holds freed blocks it cannot return between live ones: on the Multi30k model 79 MB of a 514 MB peak was free
heap. Mapped blocks return to the system when freed. (CPU decoding once also set glibc to keep freed memory for the
next step; measured again it saved no wall time worth its peak memory.) Figures: docs/results.md#cpu-decoding-mechanisms.
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
LARGE_BLOCK = 1 << 20  # bytes: blocks this large or larger get a mapping of their own


def map_large_blocks(threshold: int = LARGE_BLOCK) -> None:
    """Serve every allocation of `threshold` bytes or more by a mapping of its own, returned to the system when
    freed (glibc's M_MMAP_THRESHOLD, which also stops glibc raising the threshold as blocks are freed).
    Process-wide; nothing where the C library is not glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, threshold)


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
