"""Length-bucketed token batching: budgets, no dropped example, multiples of 8, the vectorised packing equal to the
plain loop, shuffling and dealing updates to processes."""

import numpy as np
import pytest

from nmt_cli.data.batching import (
    bucket_shape,
    deal,
    epoch_order,
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
    e0 = [b.tolist() for b in epoch_order(batches, epoch=0, seed=1)]
    assert e0 == [b.tolist() for b in epoch_order(batches, epoch=0, seed=1)]
    assert e0 != [b.tolist() for b in epoch_order(batches, epoch=1, seed=1)]
    assert e0 != [b.tolist() for b in epoch_order(batches, epoch=0, seed=2)]
    assert sorted(map(tuple, e0)) == sorted(tuple(b.tolist()) for b in batches)


def _updates(order, per_update, world_size):
    """Every update of an epoch as each rank sees it: [[rank 0's batches, rank 1's, ...], ...]."""
    return [[deal(order[k : k + per_update], r, world_size) for r in range(world_size)]
            for k in range(0, len(order), per_update)]


def test_any_processes_times_update_freq_of_one_product_sees_the_same_sentences_in_every_update():
    src, tgt = lengths(1001, seed=4)
    order = epoch_order(make_batches(src, tgt, 1024), epoch=5, seed=0)
    assert len(order) % 8  # an epoch's last update is partial
    by_world = {w: _updates(order, 8, w) for w in (1, 2, 8)}  # 8 x 1, 2 x 4, 1 x 8
    for updates in by_world.values():
        assert len(updates) == -(-len(order) // 8)
        for ranks, ref in zip(updates, by_world[1], strict=True):
            assert sorted(np.concatenate([b for r in ranks for b in r]).tolist()) == sorted(
                np.concatenate(ref[0]).tolist())
            assert len({len(r) for r in ranks}) == 1 and all(len(r) >= 1 for r in ranks)  # as many passes each
            assert sum(len(b) == 0 for r in ranks for b in r) < len(ranks)  # empty ones only to even the passes
            for r in ranks:
                for b in r:
                    assert len(b) * max(src[b].max(initial=0), tgt[b].max(initial=0)) <= 1024
    full = by_world[2][0]  # a full update: each rank its 4 batches, in order
    assert [b.tolist() for b in full[0] + full[1]] == [b.tolist() for b in order[:8]]


def test_an_update_short_of_batches_gives_the_other_ranks_empty_ones():
    batches = make_batches(np.array([3]), np.array([3]), 100)  # one sentence, 8 processes
    shares = [deal(batches, r, world_size=8) for r in range(8)]
    assert [len(share) for share in shares] == [1] * 8
    assert shares[0][0].tolist() == [0] and all(len(share[0]) == 0 for share in shares[1:])


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
