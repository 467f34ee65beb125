"""nmt prepare: the pipeline on the sample corpus and local files, cleaning counts, reuse, bad input,
interrupted runs, --from-dir. The hub path (through the real huggingface_hub client) is in test_hub.py."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nmt_cli.data import corpora
from nmt_cli.data.prepare import PrepareOptions, prepare
from nmt_cli.data.store import MANIFEST, ParallelData, load_manifest
from nmt_cli.data.tokenizer import FEW_LINES, Tokenizer
from nmt_cli.errors import ConfigError, DataError

SMALL = {"train": 1500, "valid": 60, "test": 60}


def sample_opts(out, **kw):
    return PrepareOptions("sample", str(out), vocab_size=kw.pop("vocab_size", 300), sample_sizes=SMALL,
                          workers=1, **kw)


def write_pair(prefix: Path, src: list[str], tgt: list[str], langs=("en", "de")):
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, lines in zip(langs, (src, tgt), strict=True):
        Path(f"{prefix}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "data"
    prepare(sample_opts(out))
    return out


def test_sample_manifest_and_store(sample_dir):
    m = load_manifest(sample_dir)
    assert m["format_version"] == 1 and m["corpus"] == "sample"
    assert (m["src_lang"], m["tgt_lang"]) == ("en", "de")
    assert m["vocab_size"] == Tokenizer((sample_dir / "spm.model").read_bytes()).vocab_size
    for split, n in SMALL.items():
        s = m["splits"][split]
        assert s["read"] == n and s["kept"] + sum(s["dropped"].values()) == n
        assert len(ParallelData(sample_dir, split, m)) == s["kept"]
        for lang in ("en", "de"):
            assert len((sample_dir / "raw" / f"{split}.{lang}").read_text().splitlines()) == s["kept"]
    for name, digest in m["checksums"].items():
        assert hashlib.sha256((sample_dir / name).read_bytes()).hexdigest() == digest.split(":")[1]
    assert m["options"]["vocab_size"] == 300 and m["versions"]["sentencepiece"]


def test_binarized_ids_decode_to_the_raw_text(sample_dir):
    tok = Tokenizer((sample_dir / "spm.model").read_bytes())
    data = ParallelData(sample_dir, "valid")
    en = (sample_dir / "raw" / "valid.en").read_text().splitlines()
    de = (sample_dir / "raw" / "valid.de").read_text().splitlines()
    for i in range(0, len(data), 7):
        s, t = data[i]
        assert tok.decode([s.tolist()]) == [en[i]]
        assert tok.decode([t.tolist()]) == [de[i]]
    assert 2 not in data[0][0] and 3 not in data[0][0]  # no BOS/EOS on disk


def test_a_few_lines_are_cut_as_a_batch_would_cut_them(sample_dir):
    """Fewer than FEW_LINES lines go through sentencepiece one at a time (a server's requests), more as a batch:
    the same ids and the same text either way."""
    tok = Tokenizer((sample_dir / "spm.model").read_bytes())
    en = (sample_dir / "raw" / "valid.en").read_text().splitlines()[: 4 * FEW_LINES]
    assert len(en) > FEW_LINES
    ids = tok.encode(en)
    assert [tok.encode([line])[0] for line in en] == ids
    assert [tok.decode([seq])[0] for seq in ids] == tok.decode(ids) == en


def test_rerun_reuses_steps_and_force_redoes_them(tmp_path):
    out = tmp_path / "d"
    first = prepare(sample_opts(out))
    assert first.reused == []
    mtime = (out / "train.de.bin").stat().st_mtime_ns
    again = prepare(sample_opts(out))
    assert again.reused == ["bpe", "encode train", "encode valid", "encode test"]
    assert (out / "train.de.bin").stat().st_mtime_ns == mtime
    assert again.manifest["splits"] == first.manifest["splits"]
    forced = prepare(sample_opts(out, force=True))
    assert forced.reused == []
    other = prepare(sample_opts(out, vocab_size=320))  # new BPE -> everything re-encoded
    assert other.reused == [] and other.manifest["options"]["vocab_size"] == 320


def test_reverse_swaps_direction(tmp_path):
    out = tmp_path / "rev"
    m = prepare(sample_opts(out, reverse=True)).manifest
    assert (m["src_lang"], m["tgt_lang"]) == ("de", "en")
    data = ParallelData(out, "test", m)
    tok = Tokenizer((out / "spm.model").read_bytes())
    assert tok.decode([data[0][0].tolist()])[0] == (out / "raw" / "test.de").read_text().splitlines()[0]


def test_reversed_corpus_names_resolve():
    spec, rev = corpora.resolve("wmt14-de-en")
    assert spec.name == "wmt14-en-de" and rev
    assert corpora.resolve("wmt14-en-fr")[0].vocab_size == 32000
    assert corpora.resolve("wmt14-en-de")[0].vocab_size == 37000
    with pytest.raises(ConfigError, match="wmt14-en-de.*sample|sample.*wmt14-en-de"):
        corpora.resolve("wmt15-xx")


def test_custom_files_cleaning_counts(tmp_path):
    rng = np.random.default_rng(0)
    words = "the a dog cat house sees big small runs and with".split()
    src = [" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(300)]
    tgt = [s.replace("the", "der").replace("dog", "Hund") for s in src]
    src[10], tgt[10] = "", "leer"  # empty source
    src[20], tgt[20] = "  ", "  "  # whitespace only
    src[30], tgt[30] = " ".join(["dog"] * 80), " ".join(["Hund"] * 80)  # too long (> max_len)
    src[40], tgt[40] = "the dog", "der Hund " * 6  # extreme ratio
    write_pair(tmp_path / "c" / "train", src, tgt)
    write_pair(tmp_path / "c" / "valid", ["a dog", "", "the cat"], ["ein Hund", "", "die Katze"])
    out = tmp_path / "out"
    r = prepare(PrepareOptions("custom", str(out), src_lang="en", tgt_lang="de", train=str(tmp_path / "c/train"),
                               valid=str(tmp_path / "c/valid"), vocab_size=60, max_len=40, ratio=2.0, workers=1))
    tr = r.manifest["splits"]["train"]
    assert tr["read"] == 300
    assert tr["dropped"]["empty"] == 2 and tr["dropped"]["too_long"] == 1 and tr["dropped"]["ratio"] >= 1
    assert tr["kept"] == 300 - sum(tr["dropped"].values())
    kept = (out / "raw" / "train.en").read_text().splitlines()
    assert len(kept) == tr["kept"] and "the dog" not in kept and src[0] in kept
    va = r.manifest["splits"]["valid"]
    assert va == {**va, "read": 3, "kept": 3}  # valid/test are never filtered: references stay complete
    assert "test" not in r.manifest["splits"]


def test_different_line_counts_is_an_error_and_writes_nothing(tmp_path):
    write_pair(tmp_path / "train", ["a", "b", "c"], ["x", "y"])
    write_pair(tmp_path / "valid", ["a"], ["x"])
    out = tmp_path / "out"
    with pytest.raises(DataError) as exc:
        prepare(PrepareOptions("custom", str(out), src_lang="en", tgt_lang="de", train=str(tmp_path / "train"),
                               valid=str(tmp_path / "valid")))
    msg = str(exc.value)
    assert "train.en" in msg and "train.de" in msg and "3" in msg and "2" in msg
    assert not out.exists()


def test_invalid_utf8_names_file_and_line_or_is_replaced(tmp_path):
    write_pair(tmp_path / "train", ["good one", "good two", "bad three", "four"], ["gut", "gut", "schlecht", "vier"])
    p = tmp_path / "train.de"
    p.write_bytes(p.read_bytes().replace(b"schlecht", b"schl\xffcht"))
    write_pair(tmp_path / "valid", ["a"], ["x"])
    args = dict(src_lang="en", tgt_lang="de", train=str(tmp_path / "train"), valid=str(tmp_path / "valid"),
                vocab_size=40, workers=1)
    with pytest.raises(DataError, match=r"train\.de: line 3 is not valid UTF-8.*--errors replace"):
        prepare(PrepareOptions("custom", str(tmp_path / "o1"), **args))
    assert not (tmp_path / "o1").exists()  # the failed run removed the (empty) OUT and OUT/.steps it made
    prepare(PrepareOptions("custom", str(tmp_path / "o2"), errors="replace", **args))
    assert "schl\ufffdcht" in (tmp_path / "o2" / "raw" / "train.de").read_text()


def test_missing_file_empty_corpus_and_missing_options(tmp_path):
    write_pair(tmp_path / "valid", ["a"], ["x"])
    base = dict(src_lang="en", tgt_lang="de", valid=str(tmp_path / "valid"))
    with pytest.raises(DataError, match="nope.en does not exist"):
        prepare(PrepareOptions("custom", str(tmp_path / "o"), train=str(tmp_path / "nope"), **base))
    write_pair(tmp_path / "empty", [], [])
    with pytest.raises(DataError, match="empty"):
        prepare(PrepareOptions("custom", str(tmp_path / "o"), train=str(tmp_path / "empty"), **base))
    with pytest.raises(ConfigError, match="--src-lang"):
        prepare(PrepareOptions("custom", str(tmp_path / "o"), train=str(tmp_path / "valid")))


def test_interrupted_encoding_leaves_nothing_trusted(tmp_path, monkeypatch):
    out = tmp_path / "d"
    calls = {"n": 0}
    real = Tokenizer.encode

    def flaky(self, lines, num_threads=-1, side="source"):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of a split
        return real(self, lines, num_threads, side)

    monkeypatch.setattr(Tokenizer, "encode", flaky)
    with pytest.raises(KeyboardInterrupt):
        prepare(sample_opts(out, chunk_size=500))
    assert not (out / MANIFEST).exists()
    assert not (out / "train.en.bin").exists() and not list(out.rglob("*.tmp"))
    with pytest.raises(DataError, match="no manifest.json"):
        load_manifest(out)
    monkeypatch.setattr(Tokenizer, "encode", real)
    r = prepare(sample_opts(out, chunk_size=500))
    assert r.reused == ["bpe"] and ParallelData(out, "train").src.lengths.sum() > 0


def test_truncated_output_is_redone(tmp_path):
    out = tmp_path / "d"
    prepare(sample_opts(out))
    (out / "valid.de.bin").unlink()
    r = prepare(sample_opts(out))
    assert "encode valid" not in r.reused and "encode train" in r.reused
    assert len(ParallelData(out, "valid")) == SMALL["valid"]


def test_from_dir_with_text_files(tmp_path):
    from nmt_cli.data.sample_corpus import write_sample

    write_sample(tmp_path / "wmt", {"train": 500, "valid": 30, "test": 30})
    r = prepare(PrepareOptions("wmt14-de-en", str(tmp_path / "o"), from_dir=str(tmp_path / "wmt"),
                               vocab_size=200, workers=1))
    m = r.manifest
    assert (m["corpus"], m["src_lang"], m["tgt_lang"]) == ("wmt14-de-en", "de", "en")
    assert m["origin"]["kind"] == "from-dir" and m["splits"]["test"]["kept"] == 30


# ----------------------------------------------------------------------------------------------- the CLI


def run_nmt(*args):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_list_and_errors(tmp_path):
    r = run_nmt("prepare", "--list")
    assert r.returncode == 0
    for name in ("wmt14-en-de", "wmt14-en-fr", "wmt14-de-en", "sample", "custom"):
        assert name in r.stdout
    r = run_nmt("prepare", "wmt99", "-o", str(tmp_path / "x"))
    assert r.returncode == 1 and "unknown corpus" in r.stderr and "wmt14-en-de" in r.stderr
    r = run_nmt("prepare", "sample", "-o", str(tmp_path / "x"), "--errors", "sometimes")
    assert r.returncode == 2
    write_pair(tmp_path / "t", ["a", "b"], ["x"])
    r = run_nmt("prepare", "custom", "--src-lang", "en", "--tgt-lang", "de", "--train", str(tmp_path / "t"),
                "--valid", str(tmp_path / "t"), "-o", str(tmp_path / "y"))
    assert r.returncode == 1 and "t.en has 2 lines but" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.startswith("error:") and len(r.stderr.splitlines()) == 1  # no blank line before it


def test_empty_valid_is_refused_with_one_line(tmp_path):
    write_pair(tmp_path / "train", ["a dog", "the cat"], ["ein Hund", "die Katze"])
    write_pair(tmp_path / "valid", [], [])
    r = run_nmt("prepare", "custom", "--src-lang", "en", "--tgt-lang", "de", "--train", str(tmp_path / "train"),
                "--valid", str(tmp_path / "valid"), "-o", str(tmp_path / "o"))
    assert r.returncode == 1 and r.stderr.startswith("error:") and len(r.stderr.splitlines()) == 1, r.stderr
    assert "valid data of custom is empty" in r.stderr and "valid.en" in r.stderr and "--valid" in r.stderr
    assert not (tmp_path / "o").exists()
    with pytest.raises(DataError, match="test data of custom is empty.*leave --test out"):
        prepare(PrepareOptions("custom", str(tmp_path / "o"), src_lang="en", tgt_lang="de",
                               train=str(tmp_path / "train"), valid=str(tmp_path / "train"),
                               test=str(tmp_path / "valid")))


def test_failed_run_in_an_existing_dir_keeps_its_files_and_leaves_no_empty_steps(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    write_pair(tmp_path / "train", ["good", "bad"], ["gut", "schlecht"])
    (tmp_path / "train.de").write_bytes(b"gut\nschl\xffcht\n")
    write_pair(tmp_path / "valid", ["a"], ["x"])
    with pytest.raises(DataError, match="not valid UTF-8"):
        prepare(PrepareOptions("custom", str(out), src_lang="en", tgt_lang="de", train=str(tmp_path / "train"),
                               valid=str(tmp_path / "valid")))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_cli_prepares_sample_with_summary(tmp_path):
    r = run_nmt("prepare", "sample", "-o", str(tmp_path / "s"), "--vocab-size", "500")
    assert r.returncode == 0, r.stderr
    assert "train" in r.stderr and "kept" in r.stderr
    m = json.loads((tmp_path / "s" / MANIFEST).read_text())
    assert m["splits"]["train"]["read"] >= 10_000 and m["vocab_size"] <= 500
    assert (tmp_path / "s" / "raw" / "test.en").exists() and (tmp_path / "s" / "raw" / "test.de").exists()


@pytest.mark.skipif(not (corpora.Path(__file__).resolve().parents[2] / "shared/data/multi30k").is_dir(),
                    reason="../shared/data is absent")
def test_multi30k_custom(tmp_path):
    d = Path(__file__).resolve().parents[2] / "shared/data/multi30k"
    r = prepare(PrepareOptions("custom", str(tmp_path / "m"), src_lang="en", tgt_lang="de", train=str(d / "train"),
                               valid=str(d / "valid"), test=str(d / "test"), vocab_size=8000))
    s = r.manifest["splits"]
    assert s["train"]["read"] == 29000 and s["valid"]["kept"] == 1014 and s["test"]["kept"] == 1000


def test_from_dir_with_hub_parquet_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nmt_cli.data.sample_corpus import generate

    data = generate({"train": 300, "valid": 20, "test": 20}, seed=4)
    spec = corpora.CORPORA["wmt14-en-de"]
    struct = pa.struct([("de", pa.string()), ("en", pa.string())])
    for split, names in spec.hub.files.items():
        for i, name in enumerate(names):
            rows = data[split][i :: len(names)]
            path = tmp_path / "hub" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            table = pa.table({"translation": pa.array([{"de": d, "en": e} for e, d in rows], type=struct)})
            pq.write_table(table, path, row_group_size=50)
    m = prepare(PrepareOptions("wmt14-en-de", str(tmp_path / "o"), from_dir=str(tmp_path / "hub"), vocab_size=200,
                               workers=1, chunk_size=64)).manifest
    assert m["splits"]["train"]["read"] == 300 and m["splits"]["test"]["kept"] == 20
    first_test_pair = data["test"][0]  # shard order = file order; the single test shard keeps row order
    assert (tmp_path / "o" / "raw" / "test.en").read_text().splitlines()[0] == first_test_pair[0]


def test_bpe_sample_is_exactly_k_pairs_spread_over_the_corpus_and_streamed():
    from nmt_cli.data.clean import Normalizer
    from nmt_cli.data.prepare import _bpe_sentences
    from nmt_cli.data.readers import MemorySource

    source = MemorySource("train", [(f"s{i}", f"t{i}") for i in range(10_000)], {})

    def sample(k, seed=1):
        given = [0]
        out = list(_bpe_sentences(source, 10_000, k, seed, Normalizer("en", "de", False), 700, None, given))
        assert given[0] == len(out)
        return out

    got = sample(1000)
    firsts = [x for x in got if x.startswith("s")]
    assert len(got) == 2000 and len(set(firsts)) == 1000
    assert {f"t{x[1:]}" for x in firsts} == {x for x in got if x.startswith("t")}  # both sides of each pair
    per_tenth = np.histogram([int(x[1:]) for x in firsts], bins=10, range=(0, 10_000))[0]
    assert per_tenth.min() > 60 and per_tenth.max() < 140  # uniform over the corpus, not its head
    assert sample(1000) == got and sample(1000, seed=2) != got
    assert len(sample(10_000)) == 20_000


def test_damaged_parquet_is_one_line(tmp_path):
    spec = corpora.CORPORA["wmt16-en-ro"]
    for name in spec.hub.names():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(DataError, match=r"train-00000-of-00001.parquet cannot be read as a parquet file"):
        prepare(PrepareOptions("wmt16-en-ro", str(tmp_path / "o"), from_dir=str(tmp_path)))
    assert not (tmp_path / "o").exists()
