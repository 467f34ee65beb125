"""--max-tokens auto for translation: the largest batch of source tokens whose full-length search fits this GPU,
found by runtime/memory.py's search on synthetic batches of the shapes that need the most memory."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from nmt_cli.runtime.memory import SAFETY, attempt, largest_fitting, random_tokens

PROBE_LONGEST_SOURCE = 256  # the longest source a probe decodes (its output: a * 256 + b tokens)


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
    from nmt_cli.decoding.batch import Sources

    forced = dataclasses.replace(search, min_len=10**9, nbest=1)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    sampler = torch.Generator(device=device).manual_seed(0)  # not the translator's: its seeded stream stays intact

    def run(tokens: int) -> None:
        for sentences, length in translate_shapes(tokens, max_source, max_sentences):
            src = random_tokens(sentences, length, vocab, device, generator)
            pad = torch.zeros(sentences, length, dtype=torch.bool, device=device)
            batch = Sources(src, pad, [length] * sentences)  # (lengths on the host: no read-back)
            decode_batches(model, [batch], forced, generator=sampler, join_below=0.0, static=static)

    def fits(tokens: int) -> bool:
        with torch.inference_mode():
            return attempt(lambda: run(tokens))

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
