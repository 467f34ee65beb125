"""Multilingual data and models: nmt prepare --pairs (one BPE over all languages, tagged sources, a manifest of
directions), sampling directions by temperature, per-direction validation, and translating with --tgt-lang."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import toy_pairs
from nmt_cli.data.multilingual import Direction, bpe_sample, sampled_rows, weights
from nmt_cli.data.prepare import PrepareOptions, prepare
from nmt_cli.data.readers import TextPairSource
from nmt_cli.data.store import ParallelData, read_tokenizer
from nmt_cli.errors import ConfigError, DataError

TARGETS = {"de": lambda de: de, "fr": lambda de: " ".join(w[::-1] for w in de.split()),  # three "languages" from
           "cs": lambda de: de.upper()}  # one English side: the toy German, its words spelled backwards, upper-cased


def write_corpus(folder: Path, sizes=(("train", 300), ("valid", 30), ("test", 20))) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        pairs = toy_pairs(n, seed=len(split) + n)
        (folder / f"{split}.en").write_text("".join(p[0] + "\n" for p in pairs))
        for lang, make in TARGETS.items():
            (folder / f"{split}.{lang}").write_text("".join(make(p[1]) + "\n" for p in pairs))
    return folder


def run_nmt(*args, **kw):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kw)


def prepare_multi(tmp_path: Path, pairs: str = "en-de,en-fr,en-cs", **kw):
    raw = tmp_path / "raw"
    if not raw.exists():
        write_corpus(raw)
    return prepare(PrepareOptions("custom", str(tmp_path / "data"), pairs=pairs, train=str(raw / "train"),
                                  valid=str(raw / "valid"), test=str(raw / "test"), vocab_size=120, workers=1, **kw))


def test_prepare_pairs_writes_one_vocabulary_tagged_sources_and_a_manifest_of_directions(tmp_path):
    result = prepare_multi(tmp_path)
    m = result.manifest
    assert (m["src_lang"], m["tgt_lang"], m["sides"]) == ("en", "mul", ["src", "tgt"])
    assert m["tags"]["convention"] == "opus-mt" and m["tags"]["tags"] == {k: f">>{k}<<" for k in TARGETS}
    assert [(d["src"], d["tgt"], d["tag"]) for d in m["directions"]] == [("en", k, f">>{k}<<") for k in TARGETS]
    tok = read_tokenizer(result.out_dir)
    assert tok.languages == ["de", "fr", "cs"]
    for split in ("train", "valid", "test"):
        data = ParallelData(result.out_dir, split)
        assert len(data) == m["splits"][split]["kept"] == sum(d["splits"][split]["kept"] for d in m["directions"])
        rows = data.directions(split)
        assert list(rows) == ["en-de", "en-fr", "en-cs"]
        for d in m["directions"]:
            key, part = f"{d['src']}-{d['tgt']}", d["splits"][split]
            view = rows[key]
            assert len(view) == part["kept"] and int(view.src.lengths.sum()) == part["src_tokens"]
            # every source of the direction starts with its tag, one whole piece; its target is that language's
            assert {tok.piece(int(view.src[i][0])) for i in range(len(view))} == {d["tag"]}
            refs = (result.out_dir / "raw" / f"{split}.{key}.{d['tgt']}").read_text().splitlines()
            assert tok.decode([view.tgt[i].tolist() for i in range(len(view))]) == refs
            sources = (result.out_dir / "raw" / f"{split}.{key}.en").read_text().splitlines()
            assert [view.src[i].tolist() for i in range(3)] == tok.encode([f"{d['tag']} {s}" for s in sources[:3]])
    # the valid and test splits keep every line, in order: the English side is the same for all three directions
    valid = ParallelData(result.out_dir, "valid").directions("valid")
    assert [valid["en-de"].src[i][1:].tolist() for i in range(30)] == [valid["en-cs"].src[i][1:].tolist()
                                                                     for i in range(30)]
    again = prepare_multi(tmp_path)
    assert again.reused == ["bpe", "encode train", "encode valid", "encode test"]


def test_one_target_language_needs_no_tags(tmp_path):
    raw = write_corpus(tmp_path / "raw")
    (raw / "train.es").write_text((raw / "train.en").read_text())
    (raw / "valid.es").write_text((raw / "valid.en").read_text())
    r = prepare(PrepareOptions("custom", str(tmp_path / "data"), pairs="en-de,es-de", train=str(raw / "train"),
                               valid=str(raw / "valid"), vocab_size=120, workers=1))
    assert r.manifest["tags"] is None and (r.manifest["src_lang"], r.manifest["tgt_lang"]) == ("mul", "de")
    assert read_tokenizer(r.out_dir).languages == []


def test_bad_pairs_are_one_line_naming_the_pair_or_the_file_and_write_nothing(tmp_path):
    raw = write_corpus(tmp_path / "raw")
    out = tmp_path / "out"
    base = ["prepare", "custom", "--train", raw / "train", "--valid", raw / "valid", "-o", out]
    cases = [("en-de,en-de", "en-de is given twice"), ("en-en", "en-en has the same language on both sides"),
             ("en-de,fr", "'fr' is not a pair SRC-TGT"), ("en-de,en-it", "train.it does not exist")]
    for pairs, message in cases:
        r = run_nmt(*base, "--pairs", pairs)
        assert r.returncode == 1 and r.stderr.startswith("error:") and message in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1 and not out.exists(), r.stderr
    (raw / "train.fr").write_text("one line\n")
    r = run_nmt(*base, "--pairs", "en-de,en-fr")
    assert r.returncode == 1 and "train.en has 300 lines but" in r.stderr and "train.fr has 1" in r.stderr
    assert not out.exists()
    with pytest.raises(ConfigError, match="drop --src-lang"):
        prepare(PrepareOptions("custom", str(out), pairs="en-de,en-fr", src_lang="en", train=str(raw / "train"),
                               valid=str(raw / "valid")))
    with pytest.raises(ConfigError, match="--pairs is for nmt prepare custom"):
        prepare(PrepareOptions("sample", str(out), pairs="en-de,en-fr"))
    with pytest.raises(ConfigError, match="a corpus is named twice"):
        prepare(PrepareOptions("sample,sample", str(out)))


def test_cli_reports_each_direction_on_its_own_line(tmp_path):
    raw = write_corpus(tmp_path / "raw")
    r = run_nmt("prepare", "custom", "--pairs", "en-de,en-fr", "--train", raw / "train", "--valid", raw / "valid",
                "--vocab-size", 100, "--workers", 1, "-o", tmp_path / "data", env={"COLUMNS": "150",
                                                                                   **_env()})
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stderr.splitlines() if line.startswith(("│ en-de", "│ en-fr"))]
    assert len(rows) == 4 and "tags >>de<<, >>fr<<" in r.stderr, r.stderr


def _env():
    import os

    return dict(os.environ)


def test_temperature_weights_and_epoch_rows():
    assert weights({"a": 900, "b": 100}, 1.0) == pytest.approx({"a": 0.9, "b": 0.1})
    assert weights({"a": 900, "b": 100}, 1e9) == pytest.approx({"a": 0.5, "b": 0.5})
    t5 = weights({"a": 900, "b": 100}, 5.0)
    assert t5["b"] == pytest.approx(0.1 ** 0.2 / (0.9 ** 0.2 + 0.1 ** 0.2))
    manifest = {"directions": [{"src": "en", "tgt": "de", "splits": {"train": {"start": 0, "kept": 900}}},
                               {"src": "en", "tgt": "fr", "splits": {"train": {"start": 900, "kept": 100}}}]}
    assert np.array_equal(np.sort(sampled_rows(manifest, 1.0, 1)), np.arange(1000))  # as the data is
    rows = sampled_rows(manifest, 5.0, 1)
    counts = np.bincount(rows, minlength=1000)
    assert counts[:900].tolist() == [1] * 900  # the larger direction is never cut
    fr = int(counts[900:].sum())
    assert fr / len(rows) == pytest.approx(t5["b"], abs=1e-3) and counts[900:].min() >= fr // 100
    assert counts[900:].max() - counts[900:].min() <= 1  # whole copies and a remainder drawn without repeats
    assert np.array_equal(rows, sampled_rows(manifest, 5.0, 1)) and sampled_rows({"directions": []}, 5.0, 1) is None


def test_train_validates_each_direction_and_translates_into_the_language_asked(tmp_path):
    from nmt_cli import Translator
    from nmt_cli.training.config import TrainConfig
    from nmt_cli.training.launch import train

    data = prepare_multi(tmp_path).out_dir
    run = tmp_path / "run"
    cfg = TrainConfig(str(data), str(run), preset="tiny", max_tokens=512, update_freq=1, warmup=20, lr=3e-3,
                      precision="fp32", threads=1, log_every=10, max_steps=300, save_every=300, valid_every=150,
                      average_last=1, model={"d_model": 64, "d_ff": 128, "n_heads": 4, "encoder_layers": 2,
                                             "decoder_layers": 2})
    result = train(cfg)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["kind"] == "valid"][-1]
    assert list(valid["directions"]) == ["en-de", "en-fr", "en-cs"]
    assert valid["valid_nll"] == pytest.approx(np.mean([d["valid_nll"] for d in valid["directions"].values()]))
    assert result.valid["valid_nll"] == valid["valid_nll"]
    tr = Translator.load(run / "checkpoint_last.pt", device="cpu", beam=2)
    assert tr.tokenizer.languages == ["de", "fr", "cs"]
    raw = tmp_path / "raw"
    src = (raw / "train.en").read_text().splitlines()[:40]
    outputs = {lang: tr.translate_best(src, tgt_lang=lang) for lang in TARGETS}
    # each output is in the language asked: the model tells the three "languages" apart by their tags alone
    german = (raw / "train.de").read_text().split()
    for lang, make in TARGETS.items():
        words = {make(w) for w in german}
        said = [w for h in outputs[lang] for w in h.split()]
        inside = sum(w in words for w in said)
        assert len(said) >= len(src) and inside >= 0.95 * len(said), (lang, inside, len(said), outputs[lang][:3])
    assert tr.translate_best(src[:5], tgt_lang="fra") == outputs["fr"][:5]  # ISO 639-3 finds >>fr<<
    with pytest.raises(ConfigError, match="choose one of de, fr, cs"):
        tr.translate_best(src[:1])
    with pytest.raises(DataError):
        ParallelData(data, "nope")


def test_the_bpe_sample_gives_each_language_its_temperature_share(tmp_path):
    """en-de with 1000 pairs and en-fr with 100 (another English file): the sample's sentences per language follow
    (n_l / n) ** (1 / 5), each drawn from that language's lines."""
    for name, n, lang in (("big", 1000, "de"), ("small", 100, "fr")):
        (tmp_path / f"{name}.en").write_text("".join(f"en {name} {i}\n" for i in range(n)))
        (tmp_path / f"{name}.{lang}").write_text("".join(f"{lang} {i}\n" for i in range(n)))
    dirs = [Direction(name, "en", lang, {"train": TextPairSource("train", tmp_path / f"{name}.en",
                                                                 tmp_path / f"{name}.{lang}")},
                      ("en", lang), 100, 1.0, 400, {}) for name, lang in (("big", "de"), ("small", "fr"))]
    totals = {"en-de": {"train": 1000}, "en-fr": {"train": 100}}
    counter = [0]
    lines = list(bpe_sample(dirs, totals, 400, seed=1, chunk=64, normalize=False, counter=counter))
    assert counter[0] == len(lines) and len(set(lines)) == len(lines)  # drawn without repeats
    shares = weights({"en": 1100, "de": 1000, "fr": 100}, 5.0)
    counts = {lang: sum(line.startswith(lang + " ") for line in lines) for lang in ("en", "de", "fr")}
    assert counts == {lang: pytest.approx(400 * shares[lang], abs=1) for lang in counts}
    assert counts["fr"] > 400 * 100 / 2200 * 2  # far more than the data's own share of French
