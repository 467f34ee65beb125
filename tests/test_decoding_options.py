"""Decoding options: sampling (distribution, top-k, top-p, temperature, seeds), --min-len, --no-repeat-ngram,
forced prefixes, token scores and alignments, on scripted decoders with known answers and a tiny Transformer."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from collections import Counter

import pytest
import torch

from conftest import toy_pairs
from helpers_translate import make_checkpoint
from nmt_cli.config import EOS_ID, UNK_ID
from nmt_cli.decoding import SearchConfig, search
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.inference import alignment
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints, translate_stream
from test_search import A, B, C, ScriptedModel, _src

D = 7
FIRST = {A: 0.5, B: 0.3, C: 0.2}  # the first token's distribution; then EOS
ONE_STEP = {(30, ()): FIRST}


def _first_tokens(cfg: SearchConfig, n: int = 4000, seed: int = 0) -> Counter:
    hyps = search(ScriptedModel(ONE_STEP), *_src(30), SearchConfig(**{**cfg.__dict__, "nbest": n,
                                                                              "seed": seed}))[0]
    assert len(hyps) == n
    return Counter(h.tokens[0] for h in hyps)


def _assert_frequencies(counts: Counter, expected: dict[int, float]) -> None:
    n = sum(counts.values())
    assert set(counts) <= {t for t, p in expected.items() if p > 0}  # excluded tokens never appear
    for token, p in expected.items():
        sigma = math.sqrt(p * (1 - p) / n) or 1e-9
        assert abs(counts[token] / n - p) < 4 * sigma + 1e-9, (token, counts[token] / n, p)


def test_sampling_draws_from_the_model_distribution():
    _assert_frequencies(_first_tokens(SearchConfig(sampling=True)), FIRST)


def test_top_k_top_p_and_temperature_reshape_the_distribution():
    two = {A: 0.5 / 0.8, B: 0.3 / 0.8, C: 0.0}
    _assert_frequencies(_first_tokens(SearchConfig(sampling=True, topk=2)), two)
    _assert_frequencies(_first_tokens(SearchConfig(sampling=True, topp=0.6)), two)  # A 0.5 < 0.6: B needed too
    _assert_frequencies(_first_tokens(SearchConfig(sampling=True, topp=0.45)), {A: 1.0, B: 0.0, C: 0.0})
    z = sum(p**0.5 for p in FIRST.values())  # temperature 2: p ** (1 / 2), renormalised
    _assert_frequencies(_first_tokens(SearchConfig(sampling=True, temperature=2.0)),
                        {t: p**0.5 / z for t, p in FIRST.items()})


def test_sampling_is_reproducible_with_a_seed_and_scores_are_the_models():
    a = search(ScriptedModel(ONE_STEP), *_src(30), SearchConfig(sampling=True, nbest=50, seed=7))[0]
    b = search(ScriptedModel(ONE_STEP), *_src(30), SearchConfig(sampling=True, nbest=50, seed=7))[0]
    c = search(ScriptedModel(ONE_STEP), *_src(30), SearchConfig(sampling=True, nbest=50, seed=8))[0]
    assert [h.tokens for h in a] == [h.tokens for h in b] != [h.tokens for h in c]
    top = search(ScriptedModel(ONE_STEP), *_src(30), SearchConfig(sampling=True, nbest=20, topk=1, seed=1))[0]
    for h in top:  # the score is the unfiltered model's log-probability, whatever the sampling distribution
        assert h.tokens == [A] and h.log_prob == pytest.approx(math.log(0.5), abs=1e-6)


def test_sampling_options_need_sampling_and_valid_values():
    with pytest.raises(ConfigError, match="--sampling"):
        SearchConfig(topk=5).validate()
    for bad in (dict(topp=0.0), dict(topp=1.5), dict(temperature=0.0), dict(topk=-1)):
        with pytest.raises(ConfigError):
            SearchConfig(sampling=True, **bad).validate()
    SearchConfig(sampling=True, nbest=8, beam=4).validate()  # samples are not bounded by the beam


EARLY_EOS = {(40, ()): {EOS_ID: 0.9, A: 0.1}, (40, (A,)): {EOS_ID: 0.9, B: 0.1}, (40, (A, B)): {EOS_ID: 1.0}}


@pytest.mark.parametrize("run", ["greedy", "beam", "sample"])
def test_min_len_forbids_eos_until_n_tokens(run):
    src, mask = _src(40)
    cfg = SearchConfig(beam=1 if run == "greedy" else 2, min_len=2, sampling=run == "sample", seed=0)
    hyps = search(ScriptedModel(EARLY_EOS), src, mask, cfg)[0]
    assert hyps[0].tokens == [A, B]
    assert search(ScriptedModel(EARLY_EOS), src, mask, SearchConfig(beam=cfg.beam))[0][0].tokens == []


class LoopModel(ScriptedModel):
    """Loves to repeat "A B": after A mostly B, otherwise mostly A; C and D are the alternatives; EOS is rare."""

    def __init__(self):
        super().__init__({})

    def _logits(self, src_id, prefix):
        probs = torch.full((8,), 1e-6)
        probs[EOS_ID] = 1e-3
        if prefix and prefix[-1] == A:
            probs[B], probs[D] = 0.9, 0.1
        else:
            probs[A], probs[C] = 0.9, 0.1
        return (probs / probs.sum()).log()


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("beam", [1, 3])
def test_no_repeat_ngram_never_repeats_an_n_gram(n, beam):
    src, mask = _src(50)
    free = search(LoopModel(), src, mask, SearchConfig(beam=beam, max_len_a=0, max_len_b=8))[0][0]
    assert free.tokens[:4] == [A, B, A, B]  # without the option it repeats
    hyps = search(LoopModel(), src, mask, SearchConfig(beam=beam, max_len_a=0, max_len_b=8,
                                                       no_repeat_ngram=n, nbest=min(beam, 2)))[0]
    for h in hyps:
        grams = [tuple(h.tokens[i : i + n]) for i in range(len(h.tokens) - n + 1)]
        assert len(grams) == len(set(grams)), h.tokens
    if beam == 1:  # greedy follows the loop up to the first repeat
        assert hyps[0].tokens[:3] == [A, B, A]


@pytest.mark.parametrize("run", ["greedy", "beam", "sample"])
def test_a_forced_prefix_starts_every_output(run):
    src, mask = _src(10, 40, 10)
    prefixes = [[C, C], [], [D]]
    cfg = SearchConfig(beam=1 if run == "greedy" else 3, nbest=1, sampling=run == "sample", seed=0)
    out = search(ScriptedModel({**EARLY_EOS}), src, mask, cfg, prefixes)
    for hyps, prefix in zip(out, prefixes, strict=True):
        assert hyps[0].tokens[: len(prefix)] == prefix
    assert out[1][0].tokens == []  # no prefix: unchanged (EOS at once)
    # the forced tokens' log-probabilities count: the scripted model gives an unscripted prefix EOS with p 1
    assert out[0][0].log_prob == -math.inf or out[0][0].log_prob < 0
    with pytest.raises(ConfigError, match="one prefix per input line"):
        search(ScriptedModel(EARLY_EOS), src, mask, SearchConfig(beam=1), [[C]])


# ---- the Translator and the CLI ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "m.pt", toy_tokenizer_bytes, seed=3)


@pytest.fixture(scope="module")
def ckpt2(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt2") / "m.pt", toy_tokenizer_bytes, seed=9)


def _translator(ckpt, **kw) -> Translator:
    search_cfg = kw.pop("search", SearchConfig(beam=4, max_len_a=1.0, max_len_b=6))
    models = ckpt if isinstance(ckpt, list) else [ckpt]
    return Translator(load_checkpoints(models), "cpu", "fp32", TranslateConfig(search=search_cfg, **kw))


def test_translator_keeps_each_prefix_verbatim(ckpt):
    lines = [p[0] for p in toy_pairs(6, seed=4)]
    prefixes = ["die Katze", "", "ein  Hund", "", "", "Haus"]
    out = _translator(ckpt).translate(lines, prefixes=prefixes)
    for hyps, prefix in zip(out, prefixes, strict=True):
        assert hyps[0].text.startswith(prefix)  # verbatim, even the double space
    sink = io.BytesIO()
    text = "".join(line + "\n" for line in lines).encode()
    translate_stream(_translator(ckpt), io.BytesIO(text), sink, prefixes=io.BytesIO(b"die\n\n\n\n\nHaus"))
    outs = sink.getvalue().decode().splitlines()
    assert len(outs) == 6 and outs[0].startswith("die") and outs[5].startswith("Haus")  # (no final newline)
    with pytest.raises(DataError, match="prefix file ends at line 1"):
        translate_stream(_translator(ckpt), io.BytesIO(text), io.BytesIO(), prefixes=io.BytesIO(b"die\n"))


@pytest.mark.parametrize("members", [1, 2])
def test_token_scores_sum_to_the_hypothesis_log_prob_and_links_are_valid(ckpt, ckpt2, members):
    """One model, and an ensemble of two: the teacher-forced token scores are the search's own (before, an
    ensemble's came from its first member and did not add up to the hypothesis' log-probability)."""
    lines = [p[0] for p in toy_pairs(8, seed=5)]
    tr = _translator([ckpt, ckpt2][:members], token_scores=True, alignment="pieces")
    sources = tr.encode(lines, 1)
    hyps = tr.translate_ids(sources)
    outputs = tr.translate(lines)
    for src, hs, out in zip(sources, hyps, outputs, strict=True):
        h, o = hs[0], out[0]
        assert len(o.token_scores) == len(h.tokens) + 1  # pieces and EOS
        assert sum(o.token_scores) == pytest.approx(h.log_prob, abs=1e-3)  # teacher-forced == the search's
        links = [tuple(map(int, pair.split("-"))) for pair in o.alignment.split()]
        assert [j for _, j in links] == list(range(len(h.tokens)))
        assert all(0 <= i < len(src) - 1 for i, _ in links)  # never the source's EOS


def test_alignment_formats_and_unknown_word_replacement():
    src_pieces = ["\u2581the", "\u2581gre", "en", "\u2581Zorg"]  # words: the, green, Zorg
    tgt_pieces = ["\u2581die", "\u2581gr\u00fcne", "\u2581", "<unk>"]  # (sentencepiece: '▁' then '<unk>')
    links = [0, 2, 3, 3]
    assert alignment.pharaoh(links) == "0-0 2-1 3-2 3-3"
    assert alignment.pharaoh(links, src_pieces, tgt_pieces) == "0-0 1-1 2-2"
    assert alignment.word_index(["\u2581a", "b", "\u2581c", "\u2581d", "e"]) == [0, 0, 1, 2, 2]
    replaced = alignment.replace_unk([10, 11, 12, UNK_ID], tgt_pieces, links, src_pieces, ["the", "green", "Zorg"])
    assert replaced == "die grüne Zorg"
    assert alignment.replace_unk([10, 11], tgt_pieces[:2], links[:2], src_pieces, ["the"]) is None


def test_cli_decoding_options_and_tsv_columns(ckpt, tmp_path):
    inputs = "".join(p[0] + "\n" for p in toy_pairs(5, seed=6))
    (tmp_path / "prefix.txt").write_text("die\n\nein\n\n\n")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(ckpt), "--max-len-b", "5",
                               *map(str, args)], input=inputs, capture_output=True, text=True, timeout=120)

    r = run("--sampling", "--nbest", "3", "--topk", "5", "--seed", "1", "--token-scores", "--print-alignment", "words")
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert len(rows) == 15 and all(len(row) == 6 for row in rows)  # line, rank, score, text, scores, links
    assert [int(row[1]) for row in rows[:3]] == [1, 2, 3]
    assert r.stdout == run("--sampling", "--nbest", "3", "--topk", "5", "--seed", "1", "--token-scores",
                           "--print-alignment", "words").stdout  # same seed: same samples
    r = run("--prefix", tmp_path / "prefix.txt", "--min-len", "2", "--no-repeat-ngram", "2")
    assert r.returncode == 0, r.stderr
    outs = r.stdout.splitlines()
    assert outs[0].startswith("die") and outs[2].startswith("ein") and len(outs) == 5
    r = run("--topk", "3")
    assert r.returncode == 1 and "--sampling" in r.stderr
    r = run("--nbest", "9")
    assert r.returncode == 2 and "exceeds --beam" in r.stderr


def test_unknown_target_tokens_are_replaced_from_the_source(ckpt, monkeypatch):
    """A model forced to emit <unk> for the second source word: --replace-unk copies that word."""
    tr = _translator(ckpt, replace_unk=True, search=SearchConfig(beam=1, max_len_a=0, max_len_b=3))
    real = tr.translate_ids

    def with_unk(sources, prefixes=None):
        hyps = real(sources, prefixes)
        for hs in hyps:
            hs[0].tokens = [hs[0].tokens[0] if hs[0].tokens else 10, UNK_ID]
        return hyps

    line = "the Zorglub sleeps"
    pieces = [tr.tokenizer.sp.id_to_piece(i) for i in tr.encode([line], 1)[0][:-1]]
    second_word = alignment.word_index(pieces).index(1)  # the first piece of "Zorglub"
    monkeypatch.setattr(tr, "translate_ids", with_unk)
    monkeypatch.setattr(alignment, "analyse", lambda model, src, hyps, layer: [
        alignment.Analysis([0.0] * (len(h) + 1), [0] + [second_word] * (len(h) - 1)) for h in hyps])
    out = tr.translate([line])[0][0]
    assert out.text.endswith("Zorglub") and "\u2047" not in out.text
