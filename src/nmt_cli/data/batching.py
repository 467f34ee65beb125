"""Length-bucketed token batching: pure functions over sentence lengths, shared by train and validation.

Sentences are sorted by length and packed greedily so that each batch holds at most `max_tokens` padded source
tokens and at most `max_tokens` padded target tokens. Batch sizes are rounded down to a multiple of 8 where that
is possible (the remainder starts the next batch), but no example is ever dropped. The packing is numpy work, one
step per batch rather than per sentence (docs/results.md#training-start-up has its time at WMT scale).

Compiled training (`nmt train --compile`) batches differently, `shape_batches`: torch.compile specialises its code to
each input shape, so every batch of a compiled run is padded to one of a few shapes, [rows(L), L] for source and
target alike, L from `length_bucket`. Eager training keeps `make_batches`' tighter padding.

Training deals the batches to updates and processes (`epoch_order`, `deal`): each epoch one seeded shuffle of all
batches, the same on every process; an update takes the next processes x update-freq of them, and each process its
share. So W processes with update-freq F see the same sentences in every update as any W' x F' = W x F.
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
    return LengthOrder(src_lengths, tgt_lengths).batches(max_tokens, multiple_of, max_sentences)


class LengthOrder:
    """The sentences sorted by (target, source) length, ready to be packed into batches of any budget (sorting is
    the costly part: done once for several budgets)."""

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray):
        self.src = np.asarray(src_lengths, dtype=np.int64)
        self.tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if len(self.src) != len(self.tgt):
            raise ValueError("src_lengths and tgt_lengths differ in length")
        self.order = _length_order(self.src, self.tgt)
        self.key = np.maximum(self.src, self.tgt)[self.order]  # what a sentence costs a batch: its longer side

    def sizes(self, max_tokens: int, multiple_of: int = 8, max_sentences: int | None = None) -> np.ndarray:
        """The number of sentences of each batch, batch after batch in length order (`make_batches`' packing)."""
        _check_lengths(self.src, self.tgt, max_tokens)
        return _pack(self.key, max_tokens, multiple_of, max_sentences or len(self.key) or 1)

    def batches(self, max_tokens: int, multiple_of: int = 8, max_sentences: int | None = None) -> list[np.ndarray]:
        return split(self.order, self.sizes(max_tokens, multiple_of, max_sentences))


def split(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """`indices` cut into consecutive batches of `sizes` (views; faster than np.split, which does the same)."""
    ends = np.cumsum(sizes).tolist()
    return [indices[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)] if ends else []


def _length_order(src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """np.lexsort((src, tgt)): by target length, then source length, ties in index order. Two stable sorts of
    16-bit keys where lengths fit (numpy sorts those by radix: several times faster than lexsort)."""
    if len(src) and max(int(src.max()), int(tgt.max())) < 1 << 16 and min(int(src.min()), int(tgt.min())) >= 0:
        by_src = np.argsort(src.astype(np.uint16), kind="stable")
        return by_src[np.argsort(tgt[by_src].astype(np.uint16), kind="stable")]
    return np.lexsort((src, tgt))


def _pack(key: np.ndarray, max_tokens: int, multiple_of: int, cap: int) -> np.ndarray:
    """Greedy packing of sentences whose costs, in batch order, are `key`: a batch takes the next sentences while
    (their number x the largest cost among them) stays <= max_tokens and their number <= cap; then its size is
    rounded down to a multiple of `multiple_of` when above it (except the last batch). One numpy step per batch:
    a window of the next sentences, its running maximum times 1, 2, 3, ... (increasing), and the first position
    over the budget. The batch's first sentence bounds the window (at most max_tokens // key[start] sentences
    fit); the window starts at about the previous batch's size and doubles until the batch ends inside it."""
    n = len(key)
    counts = np.arange(1, min(cap, max_tokens) + 1, dtype=np.int64)
    sizes: list[int] = []
    start, guess = 0, 64
    while start < n:
        limit = min(cap, n - start, max_tokens // max(1, int(key[start])))
        width = min(limit, guess)
        while True:
            cost = np.maximum.accumulate(key[start : start + width]) * counts[:width]
            size = int(cost.searchsorted(max_tokens, "right"))  # sentences within the budget
            if size < width or width == limit:
                break
            width = min(limit, 2 * width)
        if start + size < n and size > multiple_of:
            size -= size % multiple_of  # round down; the rest starts the next batch
        sizes.append(size)
        start += size
        guess = size + size // 2 + multiple_of
    return np.array(sizes, dtype=np.int64)


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
    distinct, which = np.unique(longest, return_inverse=True)
    length = np.array([bucket_shape(n, n, max_tokens, max_length)[1] for n in distinct], dtype=np.int64)[which]
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


def epoch_order(batches: list[np.ndarray], epoch: int, seed: int) -> list[np.ndarray]:
    """All the batches of `epoch` in training order: shuffled from (seed, epoch), the same on every process."""
    rng = np.random.default_rng([seed, epoch])
    return [batches[i] for i in rng.permutation(len(batches))]


def deal(update: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Process `rank`'s micro-batches of one update (`update`: the micro-batches of all processes, in epoch order):
    the rank-th of world_size equal runs, so a full update of world_size x F micro-batches gives each process F of
    them in turn. An epoch's last update may hold fewer: there the processes past its end get empty micro-batches
    (no sentence; `collate` makes one row of padding of them, which adds nothing to the loss, the gradients or the
    token counts), so that every process runs as many forward/backward passes as the others, and the sentences of
    an update never depend on world_size."""
    per_rank = -(-len(update) // world_size)
    mine = list(update[rank * per_rank : (rank + 1) * per_rank])
    return mine + [np.zeros(0, dtype=np.int64)] * (per_rank - len(mine))


def padding_efficiency(batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray,
                       shape=None) -> float:
    """Non-pad tokens / all tokens (source + target) over `batches`, padded to their longest sentences or, given
    `shape` (batch indices -> (rows, length)), to that shape."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return 1.0
    if shape is None:
        sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        return flat_padding_efficiency(np.concatenate(batches), sizes, src_lengths, tgt_lengths)
    real = sum(int(src_lengths[b].sum() + tgt_lengths[b].sum()) for b in batches)
    return real / sum(2 * rows * length for rows, length in map(shape, batches))


def flat_padding_efficiency(indices: np.ndarray, sizes: np.ndarray, src_lengths: np.ndarray,
                            tgt_lengths: np.ndarray) -> float:
    """`padding_efficiency` of the batches `split(indices, sizes)` (none empty), padded to their longest sentences."""
    s, t = np.asarray(src_lengths)[indices], np.asarray(tgt_lengths)[indices]
    starts = np.cumsum(sizes) - sizes
    padded = int((sizes * (np.maximum.reduceat(s, starts) + np.maximum.reduceat(t, starts))).sum())
    return (int(s.sum()) + int(t.sum())) / padded if padded else 1.0
