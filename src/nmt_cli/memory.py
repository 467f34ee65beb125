"""Device memory: the largest batch that fits (the probe behind `--max-tokens auto`), and what an out-of-memory
error tells the user to lower.

An estimate of memory (training/config.py's `train_memory_bytes`) is a fit to one GPU, one torch and one attention
kernel; the probe asks this GPU. `largest_fitting(fits, start, cap)` doubles a token count from `start` (or halves
it) until `fits(tokens)` changes its answer, then bisects between the last that fit and the first that did not, at
most MAX_PROBES tries. `fits` runs the real work on a synthetic batch: a training forward and backward with the
real loss, precision and optimizer state (`train_fits`, in training/probe.py), or a translation's encode and
full-length beam search (`translate_fits`), answering False on an out-of-memory error. The caller keeps SAFETY of
the answer: the batches of a real run are not the synthetic one, and the allocator fragments over hours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections.abc import Callable, Iterator

import torch

from nmt_cli.errors import DeviceError

SAFETY = 0.85  # the share of the largest batch that fitted which `--max-tokens auto` uses
MAX_PROBES = 10  # tries per search: a probe takes seconds, not minutes
RESOLUTION = 1 / 16  # bisection stops when the bracket is this close (relative), or at a 64-token step
PROBE_LONGEST_SOURCE = 256  # translation: the longest source a probe decodes (its output: a * 256 + b tokens)


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


def _try(run: Callable[[], None]) -> bool:
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


def _tokens(rows: int, length: int, vocab: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Random ordinary token ids [rows, length] (ids from 4: no PAD, BOS, EOS or UNK), ending with EOS."""
    from nmt_cli.config import EOS_ID

    ids = torch.randint(4, max(5, vocab), (rows, length), generator=generator).to(device)
    ids[:, -1] = EOS_ID
    return ids


# ---------------------------------------------------------------------------------------------------- translation


def translate_shapes(tokens: int, longest_source: int, max_sentences: int) -> list[tuple[int, int]]:
    """The (sentences, source length) batches of at most `tokens` padded source tokens that need the most memory:
    the longest sources, and the short ones that fill `max_sentences` (many sentences: the most rows of beams,
    logits and output positions per source token)."""
    shapes = [(max(1, min(max_sentences, tokens // longest_source)), longest_source)]
    short = max(1, tokens // max_sentences)
    if short < longest_source:
        shapes.append((max(1, min(max_sentences, tokens // short)), short))
    return shapes


def translate_fits(model, search, max_source: int, max_sentences: int, device: torch.device,
                   static: bool = False) -> Callable[[int], bool]:
    """A `fits(tokens)` for translation: the search `search` (its beam, sampling and length limits) over synthetic
    batches of `translate_shapes`, every output forced to its maximum length (no end of sentence before it), with
    batches one after the other (no joining), in the cache layout decoding will use (`static`: CUDA graphs' capacity
    buckets, more memory than the exact layout). The model's vocabulary size is read from its config."""
    from nmt_cli.decoding import decode_batches

    forced = dataclasses.replace(search, min_len=10**9, nbest=1)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    sampler = torch.Generator(device=device).manual_seed(0)  # not the translator's: its seeded stream stays intact

    def run(tokens: int) -> None:
        for sentences, length in translate_shapes(tokens, max_source, max_sentences):
            src = _tokens(sentences, length, vocab, device, generator)
            pad = torch.zeros(sentences, length, dtype=torch.bool, device=device)
            decode_batches(model, [(src, pad)], forced, generator=sampler, join_below=0.0, static=static)

    def fits(tokens: int) -> bool:
        with torch.inference_mode():
            return _try(lambda: run(tokens))

    return fits


def largest_translate_batch(model, search, max_source: int, max_sentences: int, device: torch.device,
                            cap: int, static: bool = False) -> int | None:
    """--max-tokens auto for translation: SAFETY x the largest batch (padded source tokens, at most `cap`) whose
    full-length search fits, at sources of min(`max_source`, PROBE_LONGEST_SOURCE) tokens and at `max_sentences`
    short ones; None when not even one sentence fits."""
    longest = max(1, min(max_source, PROBE_LONGEST_SOURCE))
    fits = translate_fits(model, search, longest, max_sentences, device, static)
    found = largest_fitting(fits, start=8192, cap=math.ceil(cap / SAFETY), floor=longest)
    return None if found is None else min(cap, max(longest, int(found * SAFETY)))
