"""Length-bucketed token batching: budgets, no dropped example, multiples of 8, the vectorised packing equal to the
plain loop, shuffling and sharding."""

import numpy as np
import pytest

from nmt_cli.data.batching import (
    bucket_shape,
    epoch_batches,
    length_bucket,
    make_batches,
    padding_efficiency,
    shape_batches,
)
from nmt_cli.errors import ConfigError


def lengths(n, seed=0, low=2, high=120):
    rng = np.random.default_rng(seed)
    return rng.integers(low, high, n), rng.integers(low, high, n)


def reference_batches(src, tgt, max_tokens, multiple_of=8, max_sentences=None):
    """make_batches as a plain loop over the sentences (what nmt did before it was vectorised)."""
    order = np.lexsort((src, tgt))
    cap = max_sentences or len(order) or 1
    batches, start, n = [], 0, len(order)
    while start < n:
        end, longest = start, 0
        while end < n and end - start < cap:
            longest = max(longest, src[order[end]], tgt[order[end]])
            if (end - start + 1) * longest > max_tokens:
                break
            end += 1
        size = end - start
        if end < n and size > multiple_of:
            size -= size % multiple_of
        batches.append(order[start : start + size])
        start += size
    return batches


@pytest.mark.parametrize("trial", range(40))
def test_vectorised_packing_equals_the_plain_loop(trial):
    rng = np.random.default_rng(trial)
    n, high = int(rng.integers(1, 2500)), int(rng.integers(2, 300))
    src, tgt = rng.integers(1, high, n), rng.integers(1, high, n)
    if trial % 4 == 0:  # correlated lengths, as in real parallel text; many ties
        tgt = np.maximum(1, src + rng.integers(-3, 4, n))
    max_tokens = int(rng.integers(max(src.max(), tgt.max()), 6000))
    multiple_of = (8, 1, 3, 16)[trial % 4]
    max_sentences = None if trial % 3 else int(rng.integers(1, 64))
    if trial == 39:  # lengths beyond 16 bits take the other sort
        src, tgt, max_tokens = src * 1000, tgt * 1000, int(max(src.max(), tgt.max()) * 1000 * 3)
    got = make_batches(src, tgt, max_tokens, multiple_of, max_sentences)
    want = reference_batches(src, tgt, max_tokens, multiple_of, max_sentences)
    assert [b.tolist() for b in got] == [b.tolist() for b in want]


@pytest.mark.parametrize("n,max_tokens", [(1, 200), (7, 200), (1000, 4096), (2531, 25000), (333, 150)])
def test_every_example_exactly_once_and_within_budget(n, max_tokens):
    src, tgt = lengths(n, seed=n)
    batches = make_batches(src, tgt, max_tokens)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n))  # none dropped, none repeated
    for b in batches:
        assert len(b) * src[b].max() <= max_tokens
        assert len(b) * tgt[b].max() <= max_tokens


def test_batch_sizes_are_multiples_of_8_where_possible():
    src, tgt = lengths(5000, seed=1, low=10, high=30)
    batches = make_batches(src, tgt, 4096)
    sizes = [len(b) for b in batches]
    assert all(s % 8 == 0 for s in sizes[:-1])  # only the final remainder may be ragged
    assert sum(sizes) == 5000


def test_the_last_small_remainder_is_kept_not_dropped():
    # fairseq's known bug drops the remainder when rounding to a multiple of 8; here 13 examples of one length:
    src = tgt = np.full(13, 10)
    batches = make_batches(src, tgt, 1000)
    assert sum(len(b) for b in batches) == 13


def test_sorted_by_length_so_padding_is_small():
    rng = np.random.default_rng(2)
    src = rng.integers(2, 120, 4000)
    tgt = np.maximum(1, src + rng.integers(-3, 4, 4000))  # correlated lengths, as in real parallel text
    batches = make_batches(src, tgt, 4096)
    eff = padding_efficiency(batches, src, tgt)
    rng = np.random.default_rng(0)
    random_batches = np.array_split(rng.permutation(4000), len(batches))
    assert eff > 0.85 > padding_efficiency(random_batches, src, tgt)


def test_padding_efficiency_by_hand():
    src, tgt = np.array([2, 4]), np.array([3, 3])
    # one batch: padded (4 + 3) * 2 = 14 tokens, real 2 + 4 + 3 + 3 = 12
    assert padding_efficiency([np.array([0, 1])], src, tgt) == pytest.approx(12 / 14)


def test_max_sentences_caps_batch_size():
    src = tgt = np.full(100, 3)
    assert max(len(b) for b in make_batches(src, tgt, 10_000, max_sentences=16)) <= 16


def test_too_long_sentence_is_a_clear_error():
    with pytest.raises(ConfigError, match="max-tokens"):
        make_batches(np.array([5, 500]), np.array([5, 5]), 100)


def test_padding_efficiency_equals_the_sum_over_batches():
    src, tgt = lengths(3000, seed=9)
    batches = make_batches(src, tgt, 2048)
    real = sum(int(src[b].sum() + tgt[b].sum()) for b in batches)
    padded = sum(len(b) * int(src[b].max() + tgt[b].max()) for b in batches)
    assert padding_efficiency(batches, src, tgt) == pytest.approx(real / padded, rel=1e-12)


def test_epoch_shuffle_is_seeded_and_changes_per_epoch():
    src, tgt = lengths(3000, seed=3)
    batches = make_batches(src, tgt, 2048)
    e0 = [b.tolist() for b in epoch_batches(batches, epoch=0, seed=1)]
    assert e0 == [b.tolist() for b in epoch_batches(batches, epoch=0, seed=1)]
    assert e0 != [b.tolist() for b in epoch_batches(batches, epoch=1, seed=1)]
    assert e0 != [b.tolist() for b in epoch_batches(batches, epoch=0, seed=2)]
    assert sorted(map(tuple, e0)) == sorted(tuple(b.tolist()) for b in batches)


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_shards_are_disjoint_equal_length_and_complete(world_size):
    src, tgt = lengths(1001, seed=4)
    batches = make_batches(src, tgt, 1024)
    shards = [epoch_batches(batches, epoch=5, seed=0, rank=r, world_size=world_size) for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1
    seen = np.concatenate([np.concatenate(s) for s in shards])
    assert sorted(seen.tolist()) == list(range(1001))
    for s in shards:
        for b in s:
            assert len(b) * max(src[b].max(), tgt[b].max()) <= 1024


def test_too_few_examples_for_the_ranks_is_a_clear_error():
    batches = make_batches(np.array([3]), np.array([3]), 100)
    with pytest.raises(ConfigError, match="processes"):
        epoch_batches(batches, 0, 0, rank=0, world_size=2)


def test_length_buckets_are_few_and_never_shorter():
    buckets = [length_bucket(n) for n in range(1, 1025)]
    assert all(b >= n for n, b in enumerate(buckets, 1)) and buckets == sorted(buckets)
    assert len(set(buckets[:128])) == 12 and len(set(buckets[:256])) == 16
    assert all(b - n < 8 for n, b in enumerate(buckets[:64], 1))  # below 64: less than a step of 8 of padding
    assert all((b - n) / n < 0.25 for n, b in enumerate(buckets[64:], 65))


@pytest.mark.parametrize("n,max_tokens", [(1, 200), (7, 200), (1000, 4096), (20000, 25000), (333, 150)])
def test_shape_batches_keep_every_example_in_a_few_shapes_within_budget(n, max_tokens):
    src, tgt = lengths(n, seed=n, high=min(120, max_tokens))
    batches = shape_batches(src, tgt, max_tokens, max_length=1024)
    assert sorted(np.concatenate(batches).tolist()) == list(range(n))
    shapes = [bucket_shape(src[b], tgt[b], max_tokens, 1024) for b in batches]
    for b, (rows, length) in zip(batches, shapes, strict=True):
        assert len(b) <= rows and rows * length <= max_tokens
        assert max(src[b].max(), tgt[b].max()) <= length
    assert len(set(shapes)) <= 12
    short = [len(b) < rows for b, (rows, _) in zip(batches, shapes, strict=True)]
    assert sum(short) <= len(set(shapes))  # at most a bucket's leftover (the rest join the next bucket)
    assert padding_efficiency(batches, src, tgt, lambda b: bucket_shape(src[b], tgt[b], max_tokens, 1024)) <= 1.0
