"""The vocabulary shortlist: learned from pairs (data/shortlist.py), used by decoding on a CPU (decoding/candidates.py),
carried by checkpoints, averaging and exports, and `nmt shortlist`."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers_translate import make_checkpoint
from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.checkpoints.averaging import average_checkpoints
from nmt_cli.config import EOS_ID, PAD_ID, preset
from nmt_cli.data import shortlist as learned
from nmt_cli.decoding.candidates import MULTIPLE, Shortlisting
from nmt_cli.decoding.config import SearchConfig
from nmt_cli.decoding.scheduler import decode_batches
from nmt_cli.inference.ensemble import Ensemble
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints
from nmt_cli.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 300


def tiny(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(preset("tiny", vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4, dropout=0.0)).eval()


def sources(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(4, VOCAB, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist() + [EOS_ID]
            for _ in range(n)]
    width = max(map(len, seqs))
    src = torch.tensor([s + [PAD_ID] * (width - len(s)) for s in seqs])
    return src, src == PAD_ID


def run_nmt(*args, input=None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True, input=input,
                          timeout=120)


def random_shortlist(size: int = 6, seed: int = 3, group: int = 1000) -> Shortlisting:
    """Each source piece lists `size` random target pieces; 10 pieces are always allowed."""
    g = torch.Generator().manual_seed(seed)
    pieces = torch.randint(4, VOCAB, (VOCAB, size), generator=g).int()
    always = torch.cat([torch.arange(4), torch.randint(4, VOCAB, (10,), generator=g)])
    return Shortlisting(pieces, always, size, group)


# ---------------------------------------------------------------------------------------------------- learning


def test_learning_lists_the_pieces_that_occur_together_and_the_frequent_ones():
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(400):  # source piece 10 + k is always translated by target piece 50 + k; 5 and 6 are filler
        ks = rng.choice(20, size=3, replace=False)
        pairs.append((np.array([10 + k for k in ks] + [5]), np.array([50 + k for k in ks] + [6, 7])))
    for statistic in learned.STATISTICS:
        found = learned.learn(pairs, 100, statistic, stored=4, frequent=2)
        assert sorted(found.frequent.tolist()) == [6, 7]  # in every target
        for k in range(20):
            assert found.pieces[10 + k, 0] == 50 + k  # its translation first
        assert (found.pieces[:4] == -1).all() and found.pieces.max() < 100  # the specials list nothing
        assert not torch.isin(found.pieces, found.frequent).any()  # the frequent pieces are in every list anyway
        again = learned.Shortlist.from_dict(found.to_dict(), 100)
        assert again.same(found) and again.pairs == 400


def test_a_shortlist_that_does_not_fit_the_model_is_refused():
    found = learned.learn([(np.array([5]), np.array([6]))], 50)
    with pytest.raises(Exception, match="does not fit the model's 40-piece vocabulary"):
        learned.Shortlist.from_dict(found.to_dict(), 40)


# ---------------------------------------------------------------------------------------------------- columns


def test_candidates_hold_each_sentences_lists_the_prefix_and_the_pieces_always_allowed():
    short = random_shortlist(group=2)
    src, _ = sources(5)
    prefix = torch.tensor([[7, 8], [9, PAD_ID], [PAD_ID, PAD_ID], [11, PAD_ID], [PAD_ID, PAD_ID]])
    c = short.candidates(per=3)
    c.admit(src, prefix)
    assert c.width % MULTIPLE == 0 and c.ids.shape == (3, c.width)  # 5 sentences: groups of 2, 2 and 1
    for i in range(5):
        own = c.ids[int(c.of[i])]
        need = torch.cat([short.table[src[i]].flatten(), short.always, prefix[i]])
        assert torch.isin(need, own).all()
        assert own[:4].tolist() == [0, 1, 2, 3]  # the specials keep their columns
    columns = torch.randint(0, c.width, (5, 4))
    ids = c.to_ids(columns)
    rows = ids.repeat_interleave(3, dim=0)  # every row of a sentence: its group's columns
    assert torch.equal(c.to_columns(rows), columns.repeat_interleave(3, dim=0))
    c.keep([4, 0, 1])  # sentences leave: the others keep their columns
    assert c.to_ids(columns[[4, 0, 1]]).tolist() == ids[[4, 0, 1]].tolist()
    c.keep([0, 2])  # (sentences 4 and 1) two groups for two sentences: made again, one union
    assert c.ids.shape == (1, c.width)
    for i in (4, 1):
        assert torch.isin(torch.cat([short.table[src[i]].flatten(), short.always, prefix[i]]), c.ids[0]).all()


SEARCHES = [dict(beam=4, nbest=2), dict(beam=1), dict(beam=4, stop="top"), dict(beam=4, min_len=3),
            dict(beam=4, no_repeat_ngram=2), dict(beam=1, no_repeat_ngram=1), dict(sampling=True, nbest=2, seed=5),
            dict(sampling=True, topk=5, seed=6)]


class Masked:
    """`model` with every piece outside `allowed` at -inf: the full-vocabulary search a shortlist's search equals."""

    def __init__(self, model, allowed: torch.Tensor):
        self.model, self.allowed, self.config = model, allowed, model.config

    def encode(self, *args):
        return self.model.encode(*args)

    def init_cache(self, *args):
        return self.model.init_cache(*args)

    def step(self, tokens, cache):
        return self.model.step(tokens, cache).masked_fill(~self.allowed, float("-inf"))


@pytest.mark.parametrize("options", SEARCHES)
@pytest.mark.parametrize("ensemble", [False, True])
def test_a_search_over_the_candidates_equals_the_full_search_masked_to_them(options, ensemble):
    """Scoring only a sentence's candidates (columns mapped back to pieces, the constraints mapped to columns, the
    group's other columns impossible) is the full search with every other piece impossible: the same hypotheses
    and scores, in a batch as alone."""
    model = Ensemble([tiny(1), tiny(2)]) if ensemble else tiny(1)
    src, mask = sources(6)
    prefix = [[40 + i] * (i % 3) for i in range(6)]
    cfg = SearchConfig(**options, max_len_a=1.0, max_len_b=6)
    short = random_shortlist()
    for pre in (None, [prefix]):
        gen = None if not cfg.sampling else torch.Generator().manual_seed(cfg.seed)
        over = decode_batches(model, [(src, mask)], cfg, pre, generator=gen, shortlist=short)[0]
        for i, hyps in enumerate(over):
            allowed = short.allowed.clone()
            allowed[short.table[src[i]].flatten()] = True
            if pre:
                allowed[prefix[i]] = True
            assert int(allowed.sum()) < VOCAB // 2  # (a real restriction)
            assert all(allowed[h.tokens].all() for h in hyps)
            if cfg.sampling:  # the same distribution, in other columns: other draws
                continue
            alone = decode_batches(Masked(model, allowed), [(src[i : i + 1], mask[i : i + 1])], cfg,
                                   [[prefix[i]]] if pre else None)[0][0]
            assert [h.tokens for h in hyps] == [h.tokens for h in alone]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4)


@pytest.mark.parametrize("group", [1, 4])
def test_a_sentences_translation_does_not_depend_on_the_others(group):
    """In groups of one or several sentences, in a batch that joins others and loses finished sentences: each
    sentence gets what it gets decoded alone."""
    model = tiny(4)
    src, mask = sources(12, seed=7)
    cfg = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=6)
    short = random_shortlist(group=group)
    batches = [(src[:6], mask[:6]), (src[6:], mask[6:])]
    together = sum(decode_batches(model, batches, cfg, join_below=1.0, shortlist=short), [])
    for i in range(12):
        alone = decode_batches(model, [(src[i : i + 1], mask[i : i + 1])], cfg, shortlist=short)[0][0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], abs=1e-4)


# ---------------------------------------------------------------------------------------------------- checkpoints


def with_shortlist(path, toy_tokenizer_bytes, seed: int = 0, shortlist_seed: int = 0):
    make_checkpoint(path, toy_tokenizer_bytes, seed=seed)
    ckpt = checkpoint.load(path)
    rng = np.random.default_rng(shortlist_seed)
    vocab = ckpt.model_config.vocab_size
    pairs = [(rng.integers(4, vocab, 6), rng.integers(4, vocab, 6)) for _ in range(200)]
    ckpt.shortlist = learned.learn(pairs, vocab, frequent=4).to_dict()
    checkpoint.save(ckpt, path)
    return path


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_checkpoints_shortlist_is_used_on_a_cpu_and_can_be_turned_off(tmp_path, toy_tokenizer_bytes, precision,
                                                                          monkeypatch):
    path = with_shortlist(tmp_path / "m.pt", toy_tokenizer_bytes)
    cfg = SearchConfig(beam=4, max_len_a=1.0, max_len_b=5)
    on = Translator(load_checkpoints([path]), "cpu", precision, TranslateConfig(search=cfg, shortlist_size=3))
    off = Translator(load_checkpoints([path]), "cpu", precision, TranslateConfig(search=cfg, shortlist=False))
    assert on.shortlist is not None and on.shortlist.size == 3 and off.shortlist is None
    made = []
    real = Transformer.output_over
    monkeypatch.setattr(Transformer, "output_over", lambda self, ids: (made.append(len(ids)), real(self, ids))[1])
    lines = ["the dog sees a cat", "a red house", ""]
    assert len(on.translate(lines)) == 3 and made  # the projection over the candidates (int8: an int8 one)
    # packed or int8: the whole vocabulary's projection is made at its first use only, and with the shortlist never
    assert on.model.output_layer is None or on.model.output_layer._layer is None
    count = len(made)
    assert len(off.translate(lines)) == 3 and len(made) == count
    assert off.model.output_layer is None or off.model.output_layer._layer is not None
    plain = make_checkpoint(tmp_path / "plain.pt", toy_tokenizer_bytes)
    assert Translator(load_checkpoints([plain]), "cpu", precision).shortlist is None  # none: the whole vocabulary


def test_averaging_keeps_the_shortlist_its_inputs_share(tmp_path, toy_tokenizer_bytes):
    a = with_shortlist(tmp_path / "a.pt", toy_tokenizer_bytes, seed=0)
    b = with_shortlist(tmp_path / "b.pt", toy_tokenizer_bytes, seed=1)
    c = with_shortlist(tmp_path / "c.pt", toy_tokenizer_bytes, seed=2, shortlist_seed=9)
    kept = average_checkpoints([a, b]).shortlist
    assert kept is not None and torch.equal(kept["pieces"], checkpoint.load(a).shortlist["pieces"])
    assert average_checkpoints([a, c]).shortlist is None  # they differ: none rather than one of them


def test_nmt_shortlist_learns_from_a_corpus_and_removes(tmp_path, toy_tokenizer_bytes):
    from conftest import toy_pairs

    plain = make_checkpoint(tmp_path / "plain.pt", toy_tokenizer_bytes)
    pairs = toy_pairs(300, seed=2)
    (tmp_path / "corpus.en").write_text("".join(p[0] + "\n" for p in pairs))
    (tmp_path / "corpus.de").write_text("".join(p[1] + "\n" for p in pairs))
    r = run_nmt("shortlist", str(plain), "--train", str(tmp_path / "corpus"), "-o", str(tmp_path / "sl.pt"))
    assert r.returncode == 0, r.stderr
    assert "learned (dice) from 300 sentence pairs" in r.stderr
    ckpt = checkpoint.load(tmp_path / "sl.pt")
    found = learned.Shortlist.from_dict(ckpt.shortlist, ckpt.model_config.vocab_size)
    tok = ckpt.tokenizer_obj()
    dog, hund = tok.encode(["dog"])[0][-1], tok.encode(["Hund"], side="target")[0]
    assert set(hund) & set(found.pieces[dog].tolist()) | set(hund) & set(found.frequent.tolist())
    r = run_nmt("translate", "-m", str(tmp_path / "sl.pt"), "--max-len-b", "5", input="the dog\n")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr
    r = run_nmt("shortlist", str(tmp_path / "sl.pt"), "--remove", "-o", str(tmp_path / "none.pt"))
    assert r.returncode == 0 and checkpoint.load(tmp_path / "none.pt").shortlist is None
    r = run_nmt("shortlist", str(plain), "--train", str(tmp_path / "missing"), "-o", str(tmp_path / "x.pt"))
    assert r.returncode == 1 and "missing.en does not exist" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()
    r = run_nmt("shortlist", str(plain), "-o", str(tmp_path / "x.pt"))
    assert r.returncode == 2 and "--train PREFIX" in r.stderr


def test_the_ctranslate2_export_carries_the_shortlist_as_a_vocabulary_mapping(tmp_path, toy_tokenizer_bytes):
    pytest.importorskip("ctranslate2")
    from nmt_cli.export import ctranslate2 as ct2_export

    path = with_shortlist(tmp_path / "m.pt", toy_tokenizer_bytes)
    ckpt = checkpoint.load(path)
    out = ct2_export.export(ckpt, tmp_path / "ct2")
    lines = (out / "vmap.txt").read_text(encoding="utf-8").splitlines()
    vocab = ct2_export.vocabulary(ckpt)
    table = learned.Shortlist.from_dict(ckpt.shortlist, len(vocab))
    assert lines[0].split("\t") == ["", " ".join(vocab[i] for i in table.frequent.tolist())]
    keys = {line.split("\t")[0]: line.split("\t")[1].split() for line in lines[1:]}
    some = next(s for s in range(4, len(vocab)) if (table.pieces[s] >= 0).any())
    assert keys[vocab[some]] == [vocab[t] for t in table.pieces[some, : ct2_export.defaults.SHORTLIST_SIZE].tolist()
                                 if t >= 0]
    import ctranslate2
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
    translator = ctranslate2.Translator(str(out), device="cpu")
    result = translator.translate_batch([sp.encode("the dog", out_type=str)], use_vmap=True, max_decoding_length=5)
    assert len(result[0].hypotheses[0]) <= 5


def test_prepare_writes_the_shortlist_of_its_train_split(sample_data_dir):
    path = sample_data_dir / learned.FILE
    assert path.exists()
    found = learned.from_data_dir(sample_data_dir)
    assert found.pairs > 1000 and (found.pieces >= 0).any()
