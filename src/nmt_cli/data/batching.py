"""Length-bucketed token batching: pure functions over sentence lengths, shared by train and validation.

Sentences are sorted by length and packed greedily so that each batch holds at most `max_tokens` padded source
tokens and at most `max_tokens` padded target tokens. Batch sizes are rounded down to a multiple of 8 where that
is possible (the remainder starts the next batch), but no example is ever dropped.
"""

from __future__ import annotations

import numpy as np

from nmt_cli.errors import ConfigError


def make_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                 multiple_of: int = 8, max_sentences: int | None = None) -> list[np.ndarray]:
    """Indices of each batch, in length order. Lengths are as the model sees them (with EOS/BOS).

    A batch of n sentences costs n * max(src length) padded source tokens and n * max(tgt length) target tokens;
    both stay <= max_tokens. Raises ConfigError when one sentence alone exceeds max_tokens.
    """
    src_lengths = np.asarray(src_lengths, dtype=np.int64)
    tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError("src_lengths and tgt_lengths differ in length")
    too_long = np.maximum(src_lengths, tgt_lengths) > max_tokens
    if too_long.any():
        i = int(np.argmax(too_long))
        raise ConfigError(
            f"sentence {i} has {int(max(src_lengths[i], tgt_lengths[i]))} tokens, more than --max-tokens "
            f"{max_tokens} allows in one batch; raise --max-tokens or prepare with a lower --max-len")
    order = np.lexsort((src_lengths, tgt_lengths))  # by target length, then source length
    cap = max_sentences or len(order) or 1
    batches: list[np.ndarray] = []
    start, n = 0, len(order)
    s_sorted, t_sorted = src_lengths[order], tgt_lengths[order]
    while start < n:
        end, s_max, t_max = start, 0, 0
        while end < n and end - start < cap:
            s_new, t_new = max(s_max, s_sorted[end]), max(t_max, t_sorted[end])
            if (end - start + 1) * max(s_new, t_new) > max_tokens:
                break
            s_max, t_max, end = s_new, t_new, end + 1
        size = end - start
        if end < n and size > multiple_of:
            size -= size % multiple_of  # round down; the rest starts the next batch
        batches.append(order[start : start + size])
        start += size
    return batches


def epoch_batches(batches: list[np.ndarray], epoch: int, seed: int, rank: int = 0,
                  world_size: int = 1) -> list[np.ndarray]:
    """This rank's batches for `epoch`: shuffled from (seed, epoch), disjoint across ranks, equal in number.

    When the number of batches does not divide by world_size, the largest batches are split in two (which keeps
    every example and every token budget) until it does.
    """
    rng = np.random.default_rng([seed, epoch])
    shuffled = [batches[i] for i in rng.permutation(len(batches))]
    if world_size > 1:
        while len(shuffled) % world_size:
            j = max(range(len(shuffled)), key=lambda k: len(shuffled[k]))
            if len(shuffled[j]) < 2:
                raise ConfigError(f"too few examples ({sum(map(len, shuffled))}) to give each of {world_size} "
                                  "processes a batch; use fewer processes or more data")
            big = shuffled.pop(j)
            half = len(big) // 2
            shuffled[j:j] = [big[:half], big[half:]]
    return shuffled[rank::world_size]


def padding_efficiency(batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> float:
    """Non-pad tokens / all tokens (source + target) over `batches`."""
    real = padded = 0
    for b in batches:
        s, t = src_lengths[b], tgt_lengths[b]
        real += int(s.sum() + t.sum())
        padded += len(b) * int(s.max() + t.max())
    return real / padded if padded else 1.0
