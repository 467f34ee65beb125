"""Greedy and beam search: scripted decoders with known answers, and invariances on a real tiny Transformer."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID, preset
from nmt_cli.decoding import beam as beam_module
from nmt_cli.decoding import cache as cache_module
from nmt_cli.decoding import layout as layout_module
from nmt_cli.decoding.cache import DecoderCache
from nmt_cli.decoding.config import SearchConfig, length_penalty, max_output_lengths
from nmt_cli.decoding.graphs import StepGraphs
from nmt_cli.decoding.scheduler import beam_search, decode_batches, search
from nmt_cli.decoding.state import SearchState
from nmt_cli.errors import ConfigError
from nmt_cli.inference.ensemble import Ensemble
from nmt_cli.model import Transformer

A, B, C = 4, 5, 6  # scripted token ids (0-3 are pad, unk, bos, eos)
V = 8


class ScriptedCache:
    """Per-row (source id, generated prefix), behind the search's Cache interface (nmt_cli.decoding.cache.Cache)."""

    def __init__(self, src_ids: list[int]):
        self.rows_ = [(s, ()) for s in src_ids]

    def rows(self) -> int:
        return len(self.rows_)

    def reorder(self, index: torch.Tensor, keep=None) -> None:
        self.rows_ = [self.rows_[i] for i in index.tolist()]

    def repeat_beams(self, k: int) -> None:
        self.rows_ = [r for r in self.rows_ for _ in range(k)]

    def expect(self, positions: int) -> None:
        pass

    def join(self, other):
        self.rows_ += other.rows_
        return self

    def order(self, keep: list[int]) -> list[int]:
        return keep[::-1]  # any order of the kept sentences must do: this one reverses them


class ScriptedModel:
    """A decoder whose next-token probabilities are given by hand: script[(source id, prefix)] = {token: p}.

    Unscripted prefixes end the sentence (EOS with probability 1).
    """

    def __init__(self, script: dict[tuple[int, tuple[int, ...]], dict[int, float]]):
        self.script = script
        self.calls = 0  # decoder rows computed, to check finished sentences leave the batch

    def encode(self, src, src_pad_mask=None):
        return src[:, :1].float().unsqueeze(-1)  # [B, 1, 1]: the first source id identifies the sentence

    def init_cache(self, memory, src_pad_mask=None, static=False):
        return ScriptedCache([int(x) for x in memory[:, 0, 0]])

    def _logits(self, src_id: int, prefix: tuple[int, ...]) -> torch.Tensor:
        probs = torch.zeros(V)
        for tok, p in self.script.get((src_id, prefix), {EOS_ID: 1.0}).items():
            probs[tok] = p
        return probs.log()

    def step(self, tokens, cache):
        self.calls += tokens.size(0)
        cache.rows_ = [(s, p + (int(t),)) for (s, p), t in zip(cache.rows_, tokens, strict=True)]
        return torch.stack([self._logits(s, p[1:]) for s, p in cache.rows_])  # [R, V] (BOS dropped)


def _src(*ids: int) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[i, EOS_ID] for i in ids])
    return src, src == PAD_ID


# Greedy takes A (0.6) and then must continue with a flat distribution; the best sequence is B EOS (0.4 * 0.9).
GARDEN_PATH = {
    (10, ()): {A: 0.6, B: 0.4},
    (10, (A,)): {A: 0.36, B: 0.34, C: 0.3},
    (10, (B,)): {EOS_ID: 0.9, C: 0.1},
    (10, (A, A)): {EOS_ID: 1.0},
    (10, (A, B)): {EOS_ID: 1.0},
}


def test_beam_finds_the_best_sequence_greedy_misses():
    model = ScriptedModel(GARDEN_PATH)
    src, mask = _src(10)
    cfg = SearchConfig(beam=2, alpha=0.0, nbest=2)
    best, second = beam_search(model, src, mask, cfg)[0]
    assert best.tokens == [B] and best.log_prob == pytest.approx(math.log(0.4 * 0.9), abs=1e-6)
    assert second.tokens == [A, A] and second.score == pytest.approx(math.log(0.6 * 0.36), abs=1e-6)
    greedy = search(model, src, mask, dataclasses.replace(cfg, beam=1, nbest=1))[0][0]
    assert greedy.tokens == [A, A] and greedy.log_prob == pytest.approx(math.log(0.6 * 0.36), abs=1e-6)


def _short_vs_long(p_short: float) -> dict:
    """Exactly two finite hypotheses: [A] (len 2 with EOS, prob p) and [B, B, B] (len 4, prob 1 - p)."""
    return {
        (20, ()): {A: p_short, B: 1 - p_short},
        (20, (A,)): {EOS_ID: 1.0},
        (20, (B,)): {B: 1.0},
        (20, (B, B)): {B: 1.0},
        (20, (B, B, B)): {EOS_ID: 1.0},
    }


@pytest.mark.parametrize("form", ["gnmt", "fairseq"])
def test_length_penalty_changes_the_winner_exactly_at_the_formula_crossover(form):
    p = 0.55
    model = ScriptedModel(_short_vs_long(p))
    short, long = math.log(p), math.log(1 - p)
    # short / lp(2) = long / lp(4)  <=>  short / long = (lp(2) / lp(4)) with lp = base ** alpha
    ratio = (7 / 9) if form == "gnmt" else (2 / 4)
    crossover = math.log(short / long) / math.log(ratio)
    src, mask = _src(20)
    for alpha, winner in ((0.0, [A]), (crossover - 0.01, [A]), (crossover + 0.01, [B, B, B]), (3.0, [B, B, B])):
        hyps = beam_search(model, src, mask, SearchConfig(beam=2, alpha=alpha, lp=form, nbest=2))[0]
        assert hyps[0].tokens == winner, (alpha, crossover)
        by_tokens = {tuple(h.tokens): h.score for h in hyps}
        assert by_tokens[(A,)] == pytest.approx(short / length_penalty(2, alpha, form), abs=1e-6)
        assert by_tokens[(B, B, B)] == pytest.approx(long / length_penalty(4, alpha, form), abs=1e-6)


def test_stop_top_ends_a_sentence_when_its_best_candidate_ends():
    # GARDEN_PATH, beam 2: at step 2 the best candidate is [B] EOS (0.36): "top" stops there, "beam" goes on to
    # finish a second hypothesis ([A, A] at step 3) and computes more decoder rows (with a length penalty; without
    # one "beam" stops there too: the next test).
    runs = {}
    for stop in ("beam", "top"):
        model = ScriptedModel(GARDEN_PATH)
        hyps = beam_search(model, *_src(10), SearchConfig(beam=2, alpha=0.5, stop=stop))[0]
        runs[stop] = (hyps[0].tokens, model.calls)
    assert runs["beam"][0] == runs["top"][0] == [B]
    # Decoder rows: 2 a step (the beams, from the first step on): 2 vs 3 steps.
    assert runs["top"][1] == 2 + 2 and runs["beam"][1] == 2 + 2 + 2
    # The rule is the OpenNMT-py/CTranslate2 one, not an exact bound: with a strong length penalty the longer
    # [B, B, B] wins a full beam, but "top" has stopped when [A] EOS (0.55) led at step 2.
    model = ScriptedModel(_short_vs_long(0.55))
    full = beam_search(model, *_src(20), SearchConfig(beam=2, alpha=3.0, stop="beam"))[0][0]
    early = beam_search(model, *_src(20), SearchConfig(beam=2, alpha=3.0, stop="top"))[0][0]
    assert (full.tokens, early.tokens) == ([B, B, B], [A])


def test_without_a_length_penalty_the_best_hypothesis_is_final_when_it_leads():
    """alpha 0, one hypothesis: scores only fall as hypotheses grow, so once a step's best candidate has ended no
    later one can beat it, and the default rule stops there (as "top" does) instead of finishing `beam`."""
    calls = {}
    for nbest in (1, 2):
        model = ScriptedModel(GARDEN_PATH)
        hyps = beam_search(model, *_src(10), SearchConfig(beam=2, alpha=0.0, nbest=nbest))[0]
        calls[nbest] = (hyps[0].tokens, model.calls)
    assert calls[1] == ([B], 2 + 2) and calls[2] == ([B], 2 + 2 + 2)  # two hypotheses: the second is found later
    # On a random tiny model, many sentences: the same best hypothesis (tokens and score) as the full rule gives,
    # in fewer decoder rows. (EOS's output bias makes sentences end at many lengths, not only at the maximum.)
    torch.manual_seed(11)
    model = Transformer(preset("tiny", vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4, dropout=0.0,
                               output_bias=True)).eval()
    model.output_bias[EOS_ID] = 3.0
    src, mask, _ = mixed_batch(40, seed=12)
    rows = {}
    real_step = model.step

    def counting(tokens, cache):
        rows[nbest] = rows.get(nbest, 0) + tokens.numel()
        return real_step(tokens, cache)

    model.step = counting
    found = {}
    for nbest in (1, 4):
        found[nbest] = search(model, src, mask, SearchConfig(beam=4, alpha=0.0, nbest=nbest, max_len_a=1.0,
                                                             max_len_b=10))
    assert len({len(hyps[0].tokens) for hyps in found[1]}) > 3
    for one, full in zip(found[1], found[4], strict=True):
        assert one[0].tokens == full[0].tokens
        assert one[0].score == pytest.approx(full[0].score, abs=1e-5)
    assert rows[1] < rows[4]


def test_stop_top_waits_for_nbest_hypotheses():
    model = ScriptedModel(GARDEN_PATH)
    hyps = beam_search(model, *_src(10), SearchConfig(beam=2, alpha=0.0, nbest=2, stop="top"))[0]
    assert [h.tokens for h in hyps] == [[B], [A, A]]


def test_sentences_finish_independently_and_leave_the_batch():
    script = {**GARDEN_PATH, **_short_vs_long(0.9)}
    script.update({(30, ()): {A: 1.0}, **{(30, (A,) * n): {A: 1.0} for n in range(1, 12)}})  # runs to max length
    model = ScriptedModel(script)
    src, mask = _src(10, 20, 30)
    cfg = SearchConfig(beam=2, alpha=0.0, max_len_a=0.0, max_len_b=8)
    out = beam_search(model, src, mask, cfg)
    assert [h[0].tokens for h in out] == [[B], [A], [A] * 7]  # max 8 tokens: 7 + forced EOS
    # Rows computed: sentence 30 runs all 8 steps (2 beams); the others stop within 4 steps.
    assert model.calls <= 2 * 8 + 2 * 2 * 4


def test_length_penalty_formulas():
    assert length_penalty(7, 0.6, "gnmt") == pytest.approx(2.0**0.6)
    assert length_penalty(7, 0.6, "fairseq") == pytest.approx(7**0.6)
    assert length_penalty(10, 0.0) == 1.0
    with pytest.raises(ConfigError):
        length_penalty(3, 1.0, "other")


def test_max_output_length_is_source_plus_50_capped_by_the_model():
    lengths = [4, 2]  # [5, 6, 7, EOS] and [5, EOS]
    assert max_output_lengths(lengths, SearchConfig(), limit=None) == [54, 52]
    assert max_output_lengths(lengths, SearchConfig(), limit=30) == [30, 30]
    assert max_output_lengths([3, 10], SearchConfig(max_len_a=1.5, max_len_b=-12), limit=None) == [1, 3]


@pytest.mark.parametrize("bad", [dict(beam=0), dict(nbest=5), dict(lp="x"), dict(alpha=-1.0), dict(stop="x")])
def test_bad_search_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        SearchConfig(**bad).validate()


# ---------------------------------------------------------------------------------------------- tiny Transformer

VOCAB = 40


def tiny(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(preset("tiny", vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4, dropout=0.0)).eval()


def mixed_batch(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """n sources of lengths 1..12 (+EOS), right-padded. -> src [n, S], mask [n, S], the unpadded sources."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(4, VOCAB, (int(torch.randint(1, 13, (1,), generator=g)),), generator=g).tolist() + [EOS_ID]
            for _ in range(n)]
    width = max(map(len, seqs))
    src = torch.tensor([s + [PAD_ID] * (width - len(s)) for s in seqs])
    return src, src == PAD_ID, seqs


SHORT = dict(max_len_a=1.0, max_len_b=6)


def test_beam_1_equals_greedy():
    model = tiny()
    src, mask, _ = mixed_batch(9)
    cfg = SearchConfig(beam=1, **SHORT)
    beam = beam_search(model, src, mask, cfg)
    greedy = search(model, src, mask, cfg)  # beam 1: greedy search (Sampling without sampling)
    assert [h[0].tokens for h in beam] == [h[0].tokens for h in greedy]
    for b, g in zip(beam, greedy, strict=True):
        assert b[0].score == pytest.approx(g[0].score, abs=1e-5)


class FullCache:
    """The uncached reference behind the Cache interface: each row's own encoder output, padding and tokens so far."""

    def __init__(self, memory: list, mask: list, tokens: list):
        self.memory, self.mask, self.tokens = memory, mask, tokens

    def rows(self) -> int:
        return len(self.memory)

    def reorder(self, index, keep=None) -> None:
        index = index.tolist()
        self.memory, self.mask = [self.memory[i] for i in index], [self.mask[i] for i in index]
        self.tokens = [list(self.tokens[i]) for i in index]

    def repeat_beams(self, k: int) -> None:
        self.reorder(torch.tensor([i for i in range(self.rows()) for _ in range(k)]))

    def expect(self, positions: int) -> None:
        pass

    def join(self, other):
        self.memory, self.mask, self.tokens = self.memory + other.memory, self.mask + other.mask, self.tokens + other.tokens
        return self

    def order(self, keep: list[int]) -> list[int]:
        return keep[::-1]  # any order of the kept sentences must do: this one reverses them


class FullRecompute:
    """A real Transformer whose step re-runs the decoder over each row's whole prefix (no key/value cache)."""

    def __init__(self, model: Transformer):
        self.model, self.config = model, model.config

    def encode(self, src, src_pad_mask=None):
        return self.model.encode(src, src_pad_mask)

    def init_cache(self, memory, src_pad_mask=None, static=False):
        masks = [None if src_pad_mask is None else src_pad_mask[i : i + 1] for i in range(memory.size(0))]
        return FullCache([memory[i : i + 1] for i in range(memory.size(0))], masks, [[] for _ in range(memory.size(0))])

    def step(self, tokens, cache):
        out = []
        for r, token in enumerate(tokens.tolist()):
            cache.tokens[r].append(token)
            prefix = torch.tensor([cache.tokens[r]], device=tokens.device)
            out.append(self.model.decode(prefix, cache.memory[r], cache.mask[r])[0, -1])
        return torch.stack(out)


@pytest.mark.parametrize("beam,stop", [(1, "beam"), (4, "beam"), (4, "top")])
@pytest.mark.parametrize("join", [0.0, 1.0])
def test_engine_equals_full_recompute(beam, stop, join):
    """The cached, joined engine gives what re-running the whole decoder on every prefix gives."""
    model = tiny(seed=2)
    src, mask, seqs = mixed_batch(12, seed=3)
    cfg = SearchConfig(beam=beam, nbest=beam, stop=stop, **SHORT)
    batches = [(src[:6], mask[:6]), (src[6:], mask[6:])]
    cached = decode_batches(model, batches, cfg, join_below=join)
    full = decode_batches(FullRecompute(model), batches, cfg, join_below=join)
    for c, f in zip(sum(cached, []), sum(full, []), strict=True):
        assert [h.tokens for h in c] == [h.tokens for h in f]
        assert [h.score for h in c] == pytest.approx([h.score for h in f], abs=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_the_exact_cache_reads_no_position_it_did_not_write(beam, monkeypatch):
    """The exact layout's buffers are left uninitialised (cache.py: `Segment._new`): filled with NaN instead, every
    buffer made on the way (growth, beams repeated, joins merged, sentences leaving, columns dropped) gives the same
    hypotheses and scores, so no step reads a position nobody wrote."""
    monkeypatch.setattr(cache_module, "MERGE_GAP", 8)  # joins merge into the running segment
    model = tiny(seed=2)
    src, mask, _ = mixed_batch(12, seed=3)
    cfg = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=20)
    batches = [(src[:6], mask[:6]), (src[6:9], mask[6:9]), (src[9:], mask[9:])]
    clean = decode_batches(model, batches, cfg, join_below=1.0)
    made = []
    new = cache_module.Segment._new

    def poisoned(self, shape):
        made.append(shape)
        return new(self, shape).fill_(float("nan"))

    monkeypatch.setattr(cache_module.Segment, "_new", poisoned)
    dirty = decode_batches(model, batches, cfg, join_below=1.0)
    assert len(made) >= 3
    for c, d in zip(sum(clean, []), sum(dirty, []), strict=True):
        assert [h.tokens for h in c] == [h.tokens for h in d]
        assert [h.score for h in c] == [h.score for h in d]


@pytest.mark.parametrize("beam", [1, 4])
def test_mapped_buffers_are_made_for_the_longest_sentence_at_once(beam, monkeypatch):
    """Where a segment's keys-and-values buffers are mapped (layout.py: memory only where written), the first ones
    hold every position its longest sentence may decode, so they never grow (no copy of what was written); with
    sentences leaving (their gathers copy the written positions only), joins merging, columns dropped, the
    hypotheses are those of buffers that grow by buckets."""
    monkeypatch.setattr(cache_module, "MERGE_GAP", 8)  # joins merge into the running segment
    model = tiny(seed=2)
    src, mask, _ = mixed_batch(12, seed=3)
    cfg = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=20)
    batches = [(src[:6], mask[:6]), (src[6:9], mask[6:9]), (src[9:], mask[9:])]
    made: list[tuple[int, int, int]] = []  # every new set of buffers: (positions written, capacity, columns dropped)
    grow = cache_module.Segment._grow

    def tracked(self, capacity, drop=0):
        made.append((self.length, capacity, drop))
        return grow(self, capacity, drop)

    monkeypatch.setattr(cache_module.Segment, "_grow", tracked)
    by_buckets = decode_batches(model, batches, cfg, join_below=1.0)  # tiny buffers: from the heap
    assert {capacity for length, capacity, _ in made if length == 0} == {16}
    assert any(length and not drop for length, _, drop in made)  # they grew
    made.clear()
    monkeypatch.setattr(layout_module, "MAPPED_BYTES", 0)  # every buffer mapped
    at_once = decode_batches(model, batches, cfg, join_below=1.0)
    first = max(max_output_lengths([int((~m).sum()) for m in mask[:6]], cfg, None))
    assert made[0][:2] == (0, 32) and first == 32  # the first batch's longest sentence, at its first step
    assert not any(length and not drop for length, _, drop in made)  # never grew
    for a, b in zip(sum(by_buckets, []), sum(at_once, []), strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_rows_are_padded_by_at_most_an_eighth_and_few_rows_not_at_all():
    from nmt_cli.decoding.step import padded_rows

    assert [padded_rows(r, 32) for r in (1, 4, 12, 15)] == [1, 4, 12, 15]  # one sentence's rows: as they are
    assert padded_rows(100, 32) == 104 and padded_rows(410, 32) == 416 and padded_rows(800, 32) == 800
    for rows in range(1, 2000):
        padded = padded_rows(rows, 32)
        assert rows <= padded <= rows * 9 / 8 and (rows < 256 or padded % 32 == 0)
        assert padded_rows(rows, 1) == rows


@pytest.mark.parametrize("join,static", [(0.0, False), (1.0, False), (1.0, True)])
def test_rows_padded_for_the_products_change_nothing(join, static):
    """`row_multiple` pads a step's rows with zero rows (so that oneDNN's products see few shapes): the same
    hypotheses and scores, with joined batches (one or several cache segments) and in the static layout."""
    model = tiny(seed=2)
    src, mask, _ = mixed_batch(12, seed=3)
    cfg = SearchConfig(beam=4, nbest=4, **SHORT)
    batches = [(src[:6], mask[:6]), (src[6:], mask[6:])]
    plain = decode_batches(model, batches, cfg, join_below=join, static=static)
    model.row_multiple = 32
    steps = []
    original = model.static_step
    model.static_step = lambda tokens, cache: steps.append(tokens.size(0)) or original(tokens, cache)
    padded = decode_batches(model, batches, cfg, join_below=join, static=static)
    assert any(rows % 32 for rows in steps)  # padding happened
    for p, q in zip(sum(plain, []), sum(padded, []), strict=True):
        assert [h.tokens for h in p] == [h.tokens for h in q]
        assert [h.score for h in p] == pytest.approx([h.score for h in q], abs=1e-5)


@pytest.mark.parametrize("beam,stop", [(1, "beam"), (4, "beam"), (4, "top")])
def test_sentence_alone_equals_sentence_in_a_large_mixed_batch(beam, stop):
    model = tiny(seed=4)
    src, mask, seqs = mixed_batch(40, seed=5)
    cfg = SearchConfig(beam=beam, nbest=min(beam, 2), stop=stop, **SHORT)
    batched = search(model, src, mask, cfg)
    for i in range(0, 40, 7):
        alone_src = torch.tensor([seqs[i]])
        alone = search(model, alone_src, alone_src == PAD_ID, cfg)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-4)


@pytest.mark.parametrize("stop,nbest", [("beam", 2), ("top", 1)])
def test_joined_batches_equal_batches_one_after_the_other(monkeypatch, stop, nbest):
    """Continuous batching: batches that join a running one (other source lengths, own positions, started at a later
    step, its first sentences still going) give what each batch gives alone, and parts leave as they finish."""
    model = tiny(seed=6)
    src, mask, seqs = mixed_batch(30, seed=7)
    cfg = SearchConfig(beam=4, nbest=nbest, stop=stop, max_len_a=1.0, max_len_b=8)
    order = sorted(range(30), key=lambda i: -len(seqs[i]))  # longest first, as the Translator batches
    groups = [order[i : i + 6] for i in range(0, 30, 6)]

    def batch(rows):
        width = max(len(seqs[i]) for i in rows)
        b = torch.tensor([seqs[i] + [PAD_ID] * (width - len(seqs[i])) for i in rows])
        return b, b == PAD_ID

    joins = []
    real_join = DecoderCache.join
    monkeypatch.setattr(DecoderCache, "join", lambda self, other: (joins.append(1), real_join(self, other))[1])
    joined = decode_batches(model, [batch(g) for g in groups], cfg, join_below=1.0)
    assert len(joins) >= 3  # every batch after the first joined a running one
    count = len(joins)
    apart = decode_batches(model, [batch(g) for g in groups], cfg, join_below=0.0)
    assert len(joins) == count and len(joined) == len(apart) == len(groups)
    for j, a, g in zip(joined, apart, groups, strict=True):
        alone = beam_search(model, *batch(g), cfg)
        for hj, ha, hb in zip(j, a, alone, strict=True):
            assert [h.tokens for h in hj] == [h.tokens for h in ha] == [h.tokens for h in hb]
            assert [h.score for h in hj] == pytest.approx([h.score for h in hb], abs=1e-4)
            assert [h.log_prob for h in hj] == pytest.approx([h.log_prob for h in hb], abs=1e-4)


@pytest.mark.parametrize("options", [dict(beam=1), dict(beam=4, min_len=3), dict(beam=4, no_repeat_ngram=2),
                                     dict(beam=1, min_len=2, no_repeat_ngram=1), dict(beam=4, nbest=4)])
@pytest.mark.parametrize("ensemble", [False, True])
def test_every_search_joins_batches_with_the_same_outputs(options, ensemble):
    """Continuous batching is the one loop's: greedy search, the step-counting constraints (counted from each
    sentence's own start), forced prefixes and ensembles give with joining what they give batch by batch."""
    model = tiny(seed=6)
    if ensemble:
        model = Ensemble([model, tiny(seed=7)])
    src, mask, seqs = mixed_batch(24, seed=8)
    cfg = SearchConfig(**options, max_len_a=1.0, max_len_b=8)
    batches = [(src[i : i + 6], mask[i : i + 6]) for i in range(0, 24, 6)]
    prefixes = [[[5 + (i % 3)] * (i % 3) for i in range(j, j + 6)] for j in range(0, 24, 6)]
    for pre in (None, prefixes):
        joined = decode_batches(model, batches, cfg, pre, join_below=1.0)
        apart = decode_batches(model, batches, cfg, pre, join_below=0.0)
        for j, a in zip(sum(joined, []), sum(apart, []), strict=True):
            assert [h.tokens for h in j] == [h.tokens for h in a]
            assert [h.score for h in j] == pytest.approx([h.score for h in a], abs=1e-4)
        if pre:
            assert all(h[0].tokens[: len(p)] == p for h, p in zip(sum(joined, []), sum(pre, []), strict=True))


@pytest.mark.parametrize("check_every", [2, 5])
def test_checking_every_k_steps_gives_the_same_outputs(check_every):
    """Done sentences wait for the host's next check in place, masked: nothing they do after is recorded."""
    from nmt_cli.inference.ensemble import Ensemble

    src, mask, _ = mixed_batch(20, seed=10)
    batches = [(src[:10], mask[:10]), (src[10:], mask[10:])]
    for model in (tiny(seed=9), Ensemble([tiny(seed=9), tiny(seed=19)])):  # (a GPU checks every 4 steps on all)
        for cfg in (SearchConfig(beam=4, nbest=2, **SHORT), SearchConfig(beam=4, stop="top", **SHORT),
                    SearchConfig(beam=1, **SHORT)):
            every = decode_batches(model, batches, cfg, check_every=1)
            sparse = decode_batches(model, batches, cfg, check_every=check_every)
            assert [[h.tokens for h in hs] for hs in sum(every, [])] == \
                [[h.tokens for h in hs] for hs in sum(sparse, [])]


def test_outputs_respect_max_length_and_never_hold_specials():
    model = tiny(seed=6)
    src, mask, seqs = mixed_batch(12, seed=7)
    cfg = SearchConfig(beam=3, nbest=3, max_len_a=0.5, max_len_b=3)
    for hyps, s in zip(beam_search(model, src, mask, cfg), seqs, strict=True):
        assert len(hyps) == 3 and [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert len(h.tokens) + 1 <= int(0.5 * len(s)) + 3
            assert not {PAD_ID, BOS_ID, EOS_ID} & set(h.tokens)


def test_ensemble_of_one_model_twice_equals_the_model():
    model = tiny(seed=8)
    src, mask, _ = mixed_batch(5, seed=9)
    cfg = SearchConfig(beam=4, **SHORT)
    single = beam_search(model, src, mask, cfg)
    double = beam_search(Ensemble([model, model]), src, mask, cfg)
    assert [h[0].tokens for h in single] == [h[0].tokens for h in double]
    assert [h[0].score for h in single] == pytest.approx([h[0].score for h in double], abs=1e-4)


def test_ensemble_averages_log_probabilities():
    m1, m2 = tiny(seed=10), tiny(seed=11)
    src, mask, _ = mixed_batch(2, seed=12)
    tgt = torch.full((2, 1), BOS_ID)
    ens = Ensemble([m1, m2])
    got = ens.decode(tgt, ens.encode(src, mask), mask)
    want = [torch.log_softmax(m.decode(tgt, m.encode(src, mask), mask), -1) for m in (m1, m2)]
    torch.testing.assert_close(got, (want[0] + want[1]) / 2)


def test_beam_search_with_block_topk_or_one_topk_equals_plain_topk(monkeypatch):
    torch.manual_seed(13)
    model = Transformer(preset("tiny", vocab_size=1024, d_model=32, d_ff=64, n_heads=4, dropout=0.0)).eval()
    g = torch.Generator().manual_seed(14)
    src = torch.randint(4, 1024, (10, 9), generator=g)
    src[:, -1] = EOS_ID
    cfg = SearchConfig(beam=4, nbest=4, max_len_a=1.0, max_len_b=5)
    flat = beam_search(model, src, src == PAD_ID, cfg)  # 10 x 4 x 1024 log-probabilities: one top-k
    monkeypatch.setattr(beam_module, "FLAT_MAX", 0)
    blocked = beam_search(model, src, src == PAD_ID, cfg)
    monkeypatch.setattr(beam_module, "_block_size", lambda width, k: None)
    plain = beam_search(model, src, src == PAD_ID, cfg)
    assert [[h.tokens for h in hs] for hs in blocked] == [[h.tokens for h in hs] for hs in plain]
    assert [[h.tokens for h in hs] for hs in flat] == [[h.tokens for h in hs] for hs in plain]


@pytest.mark.parametrize("flat_max", [0, 1 << 30])  # blocks (or each beam's own topk), or one topk a sentence
@pytest.mark.parametrize("width", [8000, 37000, 1000, 997])  # blocks of 64, 50, 50; 997 (prime): each beam's own topk
def test_candidates_are_the_best_over_beams_times_vocabulary(width, flat_max, monkeypatch):
    monkeypatch.setattr(beam_module, "FLAT_MAX", flat_max)
    g = torch.Generator().manual_seed(width)
    state = SearchState(4, 5, [3] * 5, None, 0, "cpu")
    state.scores = torch.randn(5, 4, generator=g) * 3
    state.scores[0, 1:] = float("-inf")  # a sentence at its first step: one live beam
    lprobs = torch.randn(20, width, generator=g).log_softmax(-1)
    lprobs[4:8, 100] = 5.0  # one token far ahead in every beam of sentence 1
    scores, beams, tokens = beam_module.candidates(state, lprobs)
    total = (lprobs.view(5, 4, width) + state.scores.unsqueeze(2)).view(5, -1)
    want, _ = total.topk(8, dim=1)
    torch.testing.assert_close(scores, want)
    rows = torch.arange(5).unsqueeze(1) * 4 + beams
    torch.testing.assert_close(lprobs[rows, tokens] + state.scores.gather(1, beams), scores)
    assert all(len(set(zip(b, t, strict=True))) == 8 for b, t in zip(beams.tolist(), tokens.tolist(), strict=True))


@pytest.mark.parametrize("beam", [1, 4])
def test_a_search_through_the_compiled_static_step_equals_the_eager_one(beam):
    """The proof that the step is ready for CUDA graphs: beam search and greedy search (continuous batching
    included) run through `torch.compile(fullgraph=True, dynamic=False)` of the static step, which fails on any
    graph break, and give the eager static step's outputs; those equal the default (exact) layout's. The light
    `aot_eager` backend keeps it quick; the number of distinct graphs stays small (buckets, halving batches)."""
    torch._dynamo.reset()
    model = tiny(seed=12)
    src, mask, _ = mixed_batch(16, seed=13)
    cfg = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=10)
    batches = [(src[:8], mask[:8]), (src[8:], mask[8:])]
    exact = decode_batches(model, batches, cfg)
    static = decode_batches(model, batches, cfg, static=True)
    model.compile_step(backend="aot_eager")
    try:
        compiled = decode_batches(model, batches, cfg, static=True)
    finally:
        model.compile_step(backend=None)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tokens = [[[h.tokens for h in hs] for hs in sum(result, [])] for result in (exact, static, compiled)]
    assert tokens[2] == tokens[1] == tokens[0]
    for c, s in zip(sum(compiled, []), sum(static, []), strict=True):
        assert [h.score for h in c] == [h.score for h in s]
    assert 1 <= graphs <= 24, graphs


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
def test_attention_through_sdpa_gives_the_same_search(beam, static, monkeypatch):
    """decoding.attention.SDPA_DECODING (decoding's attention as one scaled_dot_product_attention call, for GPUs to measure):
    the same hypotheses and, to rounding, the same scores as the five-operation attention, with beams folded into
    cross-attention's queries, joined batches, and the static layout's masked columns."""
    from nmt_cli.decoding import attention as decoding_attention

    model = tiny(seed=21)
    src, mask, _ = mixed_batch(16, seed=22)
    cfg = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=10)
    batches = [(src[:8], mask[:8]), (src[8:], mask[8:])]
    plain = decode_batches(model, batches, cfg, static=static)
    monkeypatch.setattr(decoding_attention, "SDPA_DECODING", True)
    sdpa = decode_batches(model, batches, cfg, static=static)
    for a, b in zip(sum(plain, []), sum(sdpa, []), strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("options", [dict(beam=4, nbest=2), dict(beam=1), dict(beam=4, stop="top")])
def test_a_live_feed_gives_what_the_batches_give(options, monkeypatch):
    """A server's live feed (decode_batches(feed=, on_done=)): batches that arrive while a search runs join it at
    a host check, every sentence is reported once, as it finishes, with the hypotheses the batches give alone;
    the feed is waited on only when nothing runs, and decoding ends when `wait` says so. Small batches joining
    merge into the running cache segment and take their first step there (MERGE_GAP raised: here they join up to
    9 steps apart)."""
    monkeypatch.setattr(cache_module, "MERGE_GAP", 64)
    model = tiny(seed=6)
    segments = []
    real_step = Transformer.static_step
    monkeypatch.setattr(Transformer, "static_step",
                        lambda self, tokens, cache: (segments.append(len(cache.segments)), real_step(self, tokens,
                                                                                                      cache))[1])
    src, mask, _ = mixed_batch(24, seed=8)
    cfg = SearchConfig(**options, max_len_a=1.0, max_len_b=8)
    batches = [(src[i : i + 6], mask[i : i + 6]) for i in range(0, 24, 6)]
    alone = sum(decode_batches(model, batches, cfg, join_below=0.0), [])

    class Feed:
        def __init__(self):
            self.queue, self.polls, self.waits, self.running = list(batches), 0, 0, []

        def poll(self, running):
            self.polls += 1
            self.running.append(running)
            return self.queue.pop(0) if self.queue and self.polls % 3 == 0 else None  # every third check

        def wait(self):
            self.waits += 1
            return self.queue.pop(0) if self.queue else None

        def abandoned(self, sentences):
            return [k for k, s in enumerate(sentences) if s in self.gone]

    feed, done = Feed(), {}
    feed.gone = set()
    order = []

    def on_done(i, hyps):
        assert i not in done
        done[i] = hyps
        order.append(i)

    assert decode_batches(model, [], cfg, feed=feed, on_done=on_done) == []
    assert sorted(done) == list(range(24))
    assert feed.waits == 2  # the first batch, then the end; the other three joined a running search
    assert max(feed.running) > 6  # a joined batch ran beside the one before it
    assert set(segments) == {1}  # 4 batches, one cache segment: each merged before its first step
    assert order != sorted(order) or options.get("beam") == 1  # sentences report as they finish, not in order
    for i, a in enumerate(alone):
        assert [h.tokens for h in done[i]] == [h.tokens for h in a]
        assert [h.score for h in done[i]] == pytest.approx([h.score for h in a], abs=1e-4)

    # sentences nobody waits for any more leave at the next check, unreported; the others are unchanged
    feed, done, order = Feed(), {}, []
    feed.gone = {1, 2, 13, 20}
    decode_batches(model, [], cfg, feed=feed, on_done=on_done)
    assert sorted(done) == sorted(set(range(24)) - feed.gone)
    for i in done:
        assert [h.tokens for h in done[i]] == [h.tokens for h in alone[i]]


def test_joins_merge_by_age_into_a_few_segments(monkeypatch):
    """A batch joins the newest segment when their lengths differ by at most MERGE_GAP positions, else keeps a
    segment of its own (which later joins then merge into): a server's segments are generations a few steps apart,
    and what it decodes equals each batch alone."""
    model = tiny(seed=6)
    segments = []
    real_step = Transformer.static_step
    monkeypatch.setattr(Transformer, "static_step",
                        lambda self, tokens, cache: (segments.append([s.length for s in cache.segments]),
                                                     real_step(self, tokens, cache))[1])
    src, mask, _ = mixed_batch(8, seed=8)
    cfg = SearchConfig(beam=2, max_len_a=0.0, max_len_b=30)
    batches = [(src[i : i + 2], mask[i : i + 2]) for i in range(0, 8, 2)]
    alone = sum(decode_batches(model, batches, cfg, join_below=0.0), [])
    joins = iter([2, 3, 9])  # the checks (steps) at which the 2nd, 3rd and 4th batch join

    class Feed:
        def __init__(self):
            self.queue, self.checks, self.due = list(batches), 0, next(joins)

        def poll(self, running):
            self.checks += 1
            if self.queue and self.checks == self.due:
                self.due = next(joins, None)
                return self.queue.pop(0)
            return None

        def wait(self):
            return self.queue.pop(0) if self.checks == 0 else None

        def abandoned(self, sentences):
            return []

    done = {}
    segments.clear()
    decode_batches(model, [], cfg, feed=Feed(), on_done=lambda i, hyps: done.setdefault(i, hyps))
    # lengths of the segments at each step: batch 2 joins 2 steps after batch 1 and merges (gap 2 <= 4), batch 3
    # joins one step later and merges (gap 3), batch 4 six steps after that and keeps its own segment (gap 9 > 4)
    assert segments[:9] == [[t] for t in range(9)]  # batches 2 and 3 merged into batch 1's segment
    assert segments[9] == [9, 0]  # batch 4 keeps its own
    assert max(len(s) for s in segments) == 2
    assert sorted(done) == list(range(8))
    for i, a in enumerate(alone):
        assert [h.tokens for h in done[i]] == [h.tokens for h in a]


def test_sampling_keeps_the_sentences_order_and_beam_search_takes_the_caches(monkeypatch):
    """Sampling's draws go to rows in order, so when sentences leave the others keep their order (a seed draws what
    it drew before); beam search lets the cache choose the order that moves it least (`Cache.order`)."""
    model = tiny()
    src, mask, _ = mixed_batch(6)
    asked = []
    real = DecoderCache.order
    monkeypatch.setattr(DecoderCache, "order", lambda self, keep: asked.append(keep) or real(self, keep))
    cfg = SearchConfig(sampling=True, nbest=2, seed=3, **SHORT)
    search(model, src, mask, cfg)
    assert asked == []
    beam_search(model, src, mask, SearchConfig(beam=2, **SHORT))
    assert asked  # sentences left the batch before the end, in the cache's order


@pytest.mark.parametrize("check_every", [1, 4])
@pytest.mark.parametrize("options", [dict(beam=4, nbest=4), dict(beam=1), dict(beam=4, stop="top"),
                                     dict(beam=4, nbest=2, min_len=3)])
def test_the_graphed_step_gives_the_eager_outputs(options, check_every):
    """The whole step that a GPU records as a CUDA graph (decoding/graphs.py), run on CPU as the recorded function
    (`replay=False`: the step number a tensor, the state's replaced tensors copied back into the ones it began
    with, finished sentences leaving after the step): the same hypotheses and scores as the static and exact
    layouts, batches joining; most steps are replays of a few recorded ones."""
    model = tiny(seed=12)
    src, mask, _ = mixed_batch(16, seed=13)
    batches = [(src[:8], mask[:8]), (src[8:], mask[8:])]
    cfg = SearchConfig(max_len_a=1.0, max_len_b=10, **options)
    exact = decode_batches(model, batches, cfg)
    static = decode_batches(model, batches, cfg, static=True, check_every=check_every)
    graphs = StepGraphs("cpu")
    graphed = decode_batches(model, batches, cfg, static=True, check_every=check_every, graphs=graphs)
    tokens = [[[h.tokens for h in hs] for hs in sum(result, [])] for result in (exact, static, graphed)]
    assert tokens[2] == tokens[1] == tokens[0]
    for g, s in zip(sum(graphed, []), sum(static, []), strict=True):
        assert [h.score for h in g] == [h.score for h in s]
    assert 1 <= graphs.recorded < graphs.replayed


def _pieces(seg) -> list:
    """A cache segment and the pieces it composes (its layout, beam slots and row offsets, where present)."""
    return [seg, *(piece for piece in (seg.layout, seg.slots, seg.offsets) if piece is not None)]


def _every_tensor(*objects) -> tuple:
    """The address, shape and strides of every tensor among `objects`' attributes (the reference for graph keys)."""
    parts: list = []
    for obj in objects:
        for value in vars(obj).values():
            for x in value if isinstance(value, list) else [value]:  # (kv: one tensor a layer)
                if isinstance(x, torch.Tensor):
                    parts.append((x.data_ptr(), x.shape, x.stride()))
                elif x is None:
                    parts.append(None)
    return tuple(parts)


@pytest.mark.parametrize("options", [dict(beam=4, nbest=2), dict(beam=1)])
def test_graph_keys_change_whenever_any_tensor_of_the_state_or_cache_does(options, monkeypatch):
    """A graph's key is a few ints the state and the cache keep (`SearchState.key`, `Cache.key`), not a walk over
    their attributes; keys that are equal must mean every tensor of both is the same (address, shape and strides),
    through joins that merge and joins that do not, sentences leaving, a bucket outgrown."""
    from nmt_cli.decoding import graphs as graphs_module

    seen: dict[tuple, tuple] = {}
    real_key = graphs_module.step_key

    def checked(state, cache, cfg, search):
        key = real_key(state, cache, cfg, search)
        reference = _every_tensor(state, *(part for seg in cache.segments for part in _pieces(seg)))
        owned = [(state, state.key()), *((part, seg.key()) for seg in cache.segments for part in _pieces(seg))]
        for obj, own in owned:
            for name, value in vars(obj).items():  # every tensor a step may read is in its owner's key
                for x in value if isinstance(value, list) else [value]:  # (kv: one tensor a layer)
                    if isinstance(x, torch.Tensor) and name not in ("_room", "_kv_room", "src_pad"):
                        assert x.data_ptr() in own, f"{type(obj).__name__}.{name} is not in its key"
        assert seen.setdefault(key, reference) == reference, "equal keys over different tensors"
        return key

    monkeypatch.setattr("nmt_cli.decoding.scheduler.step_key", checked)
    model = tiny(seed=21)
    src, mask, _ = mixed_batch(24, seed=22)
    batches = [(src[i : i + 6], mask[i : i + 6]) for i in range(0, 24, 6)]
    cfg = SearchConfig(max_len_a=1.5, max_len_b=12, **options)  # outputs past 16 positions: a bucket outgrown
    graphs = StepGraphs("cpu")
    decode_batches(model, batches, cfg, static=True, check_every=2, join_below=1.0, graphs=graphs)
    assert len(seen) > 3 and graphs.replayed > graphs.recorded


def test_a_graphed_step_keeps_every_address_and_the_host_decides_the_rest():
    """After a step, the state holds the same tensors and the cache the same buffers (a beam reorder moves the slot
    tables in place: one graph replayed); the steps the host decides (a forced prefix token, a row at its maximum length,
    sampling, n-gram bans) are not graphed, and their outputs stay what they are without graphs."""
    from nmt_cli.decoding.graphs import graphable, in_place, step_key
    from nmt_cli.decoding.scheduler import algorithm, decode_step

    model = tiny(seed=3)
    src, mask, _ = mixed_batch(4, seed=4)
    cfg = SearchConfig(beam=4, max_len_a=1.0, max_len_b=10)
    search = algorithm(cfg)
    cache = model.init_cache(model.encode(src, mask), mask, static=True)
    state = SearchState(4, 4, max_output_lengths((~mask).sum(1).tolist(), cfg, None), None, 0, "cpu")
    cache.repeat_beams(4)
    cache.make_room(model.config.max_positions)
    state.first_rows()
    keys = []
    for t in range(4):
        cache.make_room(model.config.max_positions)
        keys.append(step_key(state, cache, cfg, search))
        with torch.inference_mode():
                in_place(lambda t_: decode_step(model, cache, state, cfg, search, t_), state)(torch.tensor([t]))
        cache.advance(device=False)
    assert keys[0] == keys[1] == keys[2] == keys[3]
    assert graphable(model, cache, state, cfg, 1)
    assert not graphable(model, cache, state, cfg, min(state.max_len_host) - 1)  # EOS forced on a row
    for other in (dict(sampling=True, seed=1), dict(no_repeat_ngram=2)):
        assert not graphable(model, cache, state, SearchConfig(**{**cfg.__dict__, **other}), 1)
    state.prefix, state.begin = torch.tensor([[5, 6]] * 4), [0] * 4
    assert not graphable(model, cache, state, cfg, 1) and graphable(model, cache, state, cfg, 2)
    prefix = [[[5, 6], [], [7], []]]
    for options in (dict(beam=4), dict(beam=4, no_repeat_ngram=2), dict(beam=4, sampling=True, seed=3, nbest=2)):
        c = SearchConfig(max_len_a=1.0, max_len_b=10, **options)
        plain = decode_batches(model, [(src, mask)], c, prefix, static=True)
        graphed = decode_batches(model, [(src, mask)], c, prefix, static=True, graphs=StepGraphs("cpu"))
        assert [[h.tokens for h in hs] for hs in plain[0]] == [[h.tokens for h in hs] for hs in graphed[0]]


@pytest.mark.parametrize("ensemble", [False, True])
@pytest.mark.parametrize("options", [dict(beam=4, nbest=2), dict(beam=1), dict(sampling=True, seed=1, nbest=2),
                                     dict(beam=4, no_repeat_ngram=2, min_len=2)])
def test_no_step_reads_the_device_between_host_checks(options, ensemble, monkeypatch):
    """Every search, exact and static layouts, prefixes included: the host reads device values (tolist, item, bool,
    int, float, numpy) and makes tensors from host values only at batch starts and host checks, never per step
    (counted through hooks: a run of 20 steps does as many as one of 3). On a GPU each read waits for the device:
    beam search's read where a CPU's is free (beam.READ_DEVICES) is turned off here, as on a GPU."""
    from nmt_cli.decoding import beam as beam_module
    from nmt_cli.decoding.batch import Sources
    from nmt_cli.inference.ensemble import Ensemble

    monkeypatch.setattr(beam_module, "READ_DEVICES", ())

    counts = {"reads": 0, "made": 0}
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, **kw: (
            counts.__setitem__("reads", counts["reads"] + 1), _real(self, *a, **kw))[1])
    real_tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **kw: (counts.__setitem__("made", counts["made"] + 1),
                                                           real_tensor(*a, **kw))[1])
    model = Ensemble([tiny(seed=9), tiny(seed=19)]) if ensemble else tiny(seed=9)
    src, mask, seqs = mixed_batch(8, seed=10)
    batch = Sources(src, mask, [len(s) for s in seqs])
    seen = []
    for steps in (3, 20):
        counts.update(reads=0, made=0)
        cfg = SearchConfig(max_len_a=0.0, max_len_b=steps, **options)
        for static in (False, True):  # one host check: at the last step
            decode_batches(model, [batch], cfg, [[[5, 6]] + [[]] * 7], check_every=10**6, static=static)
        seen.append(dict(counts))
    assert seen[0] == seen[1] and seen[0]["reads"] > 0


def test_the_cache_protocol_names_every_method_the_loop_calls():
    """decoding/cache.py's Cache protocol is the whole of what the loop and the graphed step ask of a cache; the
    ensemble's cache implements all of it."""
    import ast
    import inspect

    from nmt_cli.decoding import cache as cache_module
    from nmt_cli.decoding import graphs, scheduler
    from nmt_cli.inference.ensemble import EnsembleCache

    protocol = {name for name, _ in inspect.getmembers(cache_module.Cache, inspect.isfunction)}
    called = set()
    for module in (scheduler, graphs):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "cache":
                called.add(node.func.attr)
    assert called and called <= protocol, called - protocol
    assert protocol <= set(dir(EnsembleCache)) and protocol <= set(dir(cache_module.DecoderCache))
