"""glibc's malloc, set for CPU decoding: keep freed memory for the next step instead of giving it back to the system.

A decoding step allocates and frees tensors of megabytes (logits of rows x vocabulary, cache buffers), and glibc by
default maps blocks above a threshold afresh each time and returns the top of its heap once 128 KB of it is free
(both thresholds adapt, slowly): each time the memory comes back, the kernel hands out zeroed pages again, one fault
a 4 KB page, which a fresh process (what `nmt translate` runs) pays on its first pass. So blocks up to 32 MB are
taken from the heap, 1 GB may be free before it is trimmed and each growth pads 128 MB: fewer page faults and less
system time, at a slightly higher peak. Blocks above those 32 MB (the self-attention buffers of a large batch of
beams: decoding/cache.py) come from the heap too (none mapped), since mapped afresh they fault on every pass. The
measurements: docs/results-history.md#keeping-freed-memory-glibc-malloc-settings. This holds for the heap of the
main thread; glibc grows another thread's heap in blocks of 64 MB and maps anything larger afresh whatever these settings say, which is why a larger
model decodes on one stream (decoding/streams.py). What the memory reaches stays the process's (the peak of a
long-running `nmt serve`, too), as with PyTorch's own caching allocator on GPUs.

`keep_freed_memory()` sets these once per process through `mallopt` where the C library is glibc; a setting given in
the environment (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`: glibc
reads them at start) is left as it is.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters (glibc's malloc.h), the environment variable that sets each, and nmt's value
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4
SETTINGS = (
    (M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 32 << 20),  # glibc's largest on 64-bit systems
    (M_MMAP_MAX, "MALLOC_MMAP_MAX_", 0),  # and none mapped afresh above it either
    (M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 1 << 30),
    (M_TOP_PAD, "MALLOC_TOP_PAD_", 128 << 20),
)
_applied: list[str] | None = None


def keep_freed_memory() -> list[str]:
    """Set glibc's malloc as the module docstring says (once per process); -> the environment names of the settings
    made now or before ([] where the C library is not glibc)."""
    global _applied
    if _applied is None:
        _applied = []
        libc = _glibc()
        if libc is not None:
            for param, env, value in SETTINGS:
                if env not in os.environ and libc.mallopt(param, value) == 1:
                    _applied.append(env)
    return list(_applied)


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
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc
