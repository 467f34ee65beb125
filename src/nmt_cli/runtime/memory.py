"""Device memory: the largest batch that fits (the probe behind `--max-tokens auto`), and what an out-of-memory
error tells the user to lower.

An estimate of memory (training/config.py's `train_memory_bytes`) is a fit to one GPU, one torch and one attention
kernel; the probe asks this GPU. `largest_fitting(fits, start, cap)` doubles a token count from `start` (or halves
it) until `fits(tokens)` changes its answer, then bisects between the last that fit and the first that did not, at
most MAX_PROBES tries. `fits` runs the real work on a synthetic batch: a training forward and backward with the
real loss, precision and optimizer state (training/probe.py), or a translation's encode and full-length beam
search (inference/probe.py), answering False on an out-of-memory error. The caller keeps SAFETY of
the answer: the batches of a real run are not the synthetic one, and the allocator fragments over hours.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

import torch

from nmt_cli.errors import DeviceError

SAFETY = 0.85  # the share of the largest batch that fitted which `--max-tokens auto` uses
MAX_PROBES = 10  # tries per search: a probe takes seconds, not minutes
RESOLUTION = 1 / 16  # bisection stops when the bracket is this close (relative), or at a 64-token step


class OutOfMemory(DeviceError):
    """The device ran out of memory; the message names the option to lower."""


def is_out_of_memory(exc: BaseException | None) -> bool:
    """CUDA's out-of-memory error, Python's MemoryError, or the CPU allocator's refusal (a RuntimeError), also as
    the cause of another error (torch.compile wraps what fails inside compiled code). An OutOfMemory already says
    what to lower: it is not taken again."""
    for _ in range(4):
        if exc is None or isinstance(exc, OutOfMemory):
            return False
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc):
            return True
        exc = exc.__cause__
    return False


@contextlib.contextmanager
def out_of_memory_advice(message: Callable[[], str]) -> Iterator[None]:
    """Turn an out-of-memory error raised inside into OutOfMemory(message()): one line naming the option to lower
    (the CLI prints it; --debug shows the original traceback). Other errors pass unchanged."""
    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise OutOfMemory(message()) from exc


def free_cached() -> None:
    """Give the memory of a failed try back to the allocator's pool, and the pool back to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def largest_fitting(fits: Callable[[int], bool], start: int, cap: int, floor: int = 64,
                    max_probes: int = MAX_PROBES) -> int | None:
    """The largest token count in [floor, cap] for which `fits` held, searched in at most `max_probes` calls
    (`fits` is taken to be monotonic: more tokens never fit where fewer did not). None when not even `floor` fits;
    `floor` itself when the tries ran out halving down to it (`start` far too large).

    From `start` (clamped to the range): doubling while it fits (up to `cap`), or halving while it does not (down to
    `floor`); then bisection between the last count that fit and the first that did not, until they are within
    RESOLUTION of each other."""
    floor = max(1, min(floor, cap))
    tokens = min(max(start, floor), cap)
    probes = 0

    def test(n: int) -> bool:
        nonlocal probes
        probes += 1
        return fits(n)

    good, bad = None, None  # the largest count that fit, the smallest that did not
    if test(tokens):
        good = tokens
        while good < cap and probes < max_probes:
            tokens = min(2 * good, cap)
            if test(tokens):
                good = tokens
            else:
                bad = tokens
                break
        if bad is None:
            return good
    else:
        bad = tokens
        while bad > floor and probes < max_probes - 1:
            tokens = max(bad // 2, floor)
            if test(tokens):
                good = tokens
                break
            bad = tokens
        if good is None and bad > floor and test(floor):  # the last try: whether anything fits at all
            good = floor
        if good is None:
            return None
    while probes < max_probes and bad - good > max(64, RESOLUTION * good):
        tokens = (good + bad) // 2
        if test(tokens):
            good = tokens
        else:
            bad = tokens
    return good


def attempt(run: Callable[[], None]) -> bool:
    """Whether `run` completed without running out of memory (its memory is freed either way)."""
    try:
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return True
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        return False
    finally:
        free_cached()


def random_tokens(rows: int, length: int, vocab: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Random ordinary token ids [rows, length] (ids from 4: no PAD, BOS, EOS or UNK), ending with EOS."""
    from nmt_cli.config import EOS_ID

    ids = torch.randint(4, max(5, vocab), (rows, length), generator=generator).to(device)
    ids[:, -1] = EOS_ID
    return ids
