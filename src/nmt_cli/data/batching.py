"""Length-bucketed token batching: pure functions over sentence lengths, shared by train and validation.

Sentences are sorted by length and packed greedily so that each batch holds at most `max_tokens` padded source
tokens and at most `max_tokens` padded target tokens. Batch sizes are rounded down to a multiple of 8 where that
is possible (the remainder starts the next batch), but no example is ever dropped.

Compiled training (`nmt train --compile`) batches differently, `shape_batches`: torch.compile specialises its code to
each input shape, so every batch of a compiled run is padded to one of a few shapes, [rows(L), L] for source and
target alike, L from `length_bucket`. Eager training keeps `make_batches`' tighter padding.
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
    _check_lengths(src_lengths, tgt_lengths, max_tokens)
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


def _check_lengths(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int) -> None:
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError("src_lengths and tgt_lengths differ in length")
    too_long = np.maximum(src_lengths, tgt_lengths) > max_tokens
    if too_long.any():
        i = int(np.argmax(too_long))
        raise ConfigError(
            f"sentence {i} has {int(max(src_lengths[i], tgt_lengths[i]))} tokens, more than --max-tokens "
            f"{max_tokens} allows in one batch; raise --max-tokens or prepare with a lower --max-len")


def length_bucket(length: int) -> int:
    """The padded length of a compiled batch whose longest sentence (source or target) has `length` tokens: a
    multiple of 8 up to 64, then four steps per doubling (80, 96, 112, 128, 160, 192, ...). Few shapes (12 up to
    128 tokens, 16 up to 256) and little padding: at most 7 tokens below 64, at most 1/4 (1/8 on average) above."""
    step = max(8, 1 << max(0, (int(length) - 1).bit_length() - 3))
    return -(-int(length) // step) * step


def bucket_rows(length: int, max_tokens: int, multiple_of: int = 8) -> int:
    """The rows of every compiled batch of padded length `length`: as many as `max_tokens` allows, rounded down to
    a multiple of `multiple_of` where there are that many."""
    rows = max(1, max_tokens // length)
    return rows - rows % multiple_of if rows > multiple_of else rows


def bucket_shape(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                 max_length: int | None = None) -> tuple[int, int]:
    """(rows, length) of the compiled batch holding sentences of these lengths: its bucket of their longest
    length, never above `max_length` (the model's positions) nor `max_tokens`."""
    longest = int(max(np.max(src_lengths), np.max(tgt_lengths)))
    length = max(longest, min(length_bucket(longest), max_tokens, max_length or max_tokens))
    return bucket_rows(length, max_tokens), length


def shape_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                  max_length: int | None = None) -> list[np.ndarray]:
    """Indices of each batch of compiled training: the sentences whose longest side falls in one `length_bucket`,
    in (target, source) length order, `bucket_rows` at a time, so that every batch pads to its bucket's one
    (rows, length) shape (`bucket_shape`). The few sentences left over in a bucket join the next one, where they
    are padded a little longer, rather than make a batch of mostly empty rows; only the longest bucket's remainder
    is completed with empty rows. No example is dropped.
    Raises ConfigError as `make_batches` when one sentence alone exceeds max_tokens."""
    src_lengths = np.asarray(src_lengths, dtype=np.int64)
    tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
    _check_lengths(src_lengths, tgt_lengths, max_tokens)
    longest = np.maximum(src_lengths, tgt_lengths)
    bucket_of = {int(n): bucket_shape(n, n, max_tokens, max_length) for n in np.unique(longest)}
    length = np.array([bucket_of[int(n)][1] for n in longest], dtype=np.int64)
    order = np.lexsort((src_lengths, tgt_lengths, length))  # by bucket, then target and source length
    batches: list[np.ndarray] = []
    carry = order[:0]
    for bucket in np.unique(length):
        members = np.concatenate([carry, order[length[order] == bucket]])
        rows = bucket_rows(int(bucket), max_tokens)
        full = len(members) - len(members) % rows
        batches.extend(members[i : i + rows] for i in range(0, full, rows))
        carry = members[full:]  # too few for a batch: they join the next bucket's (padded a little longer)
    if len(carry):
        batches.append(carry)  # the last bucket's remainder: empty rows complete its shape
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


def padding_efficiency(batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray,
                       shape=None) -> float:
    """Non-pad tokens / all tokens (source + target) over `batches`, padded to their longest sentences or, given
    `shape` (batch indices -> (rows, length)), to that shape."""
    real = padded = 0
    for b in batches:
        s, t = src_lengths[b], tgt_lengths[b]
        real += int(s.sum() + t.sum())
        if shape is None:
            padded += len(b) * int(s.max() + t.max())
        else:
            rows, length = shape(b)
            padded += 2 * rows * length
    return real / padded if padded else 1.0
