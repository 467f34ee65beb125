"""`nmt translate`: streaming, order, bad input, checkpoints (missing, corrupt, averaged, ensembled), the CLI."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import toy_pairs
from helpers_translate import make_checkpoint
from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.checkpoints.averaging import average_checkpoints, fewer_message, last_checkpoints
from nmt_cli.decoding import SearchConfig
from nmt_cli.errors import CheckpointError, ConfigError, DeviceError
from nmt_cli.inference.translate import (
    TranslateConfig,
    Translator,
    Warner,
    load_checkpoints,
    read_chunks,
    translate_stream,
)
from nmt_cli.runtime import precision
from nmt_cli.runtime.defaults import MAX_TOKENS_PER_DEVICE

FAST = SearchConfig(beam=4, max_len_a=1.0, max_len_b=4)


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory, toy_tokenizer_bytes) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "model.pt", toy_tokenizer_bytes, seed=0)


@pytest.fixture()
def messages() -> list[str]:
    return []


def translator(path: Path, messages: list[str] | None = None, **config) -> Translator:
    cfg = TranslateConfig(search=config.pop("search", FAST), **config)
    return Translator(load_checkpoints([path]), "cpu", "fp32", cfg, Warner(None if messages is None else messages.append))


def lines(n: int, seed: int = 7) -> list[str]:
    return [p[0] for p in toy_pairs(n, seed)]


def run_stream(tr: Translator, text: bytes) -> list[str]:
    sink = io.BytesIO()
    translate_stream(tr, io.BytesIO(text), sink)
    return sink.getvalue().decode("utf-8").split("\n")[:-1]


def test_output_order_equals_input_order_whatever_the_chunking(ckpt_path):
    inputs = lines(30)
    alone = [translator(ckpt_path).translate([line])[0][0][1] for line in inputs]
    text = "\n".join(inputs).encode() + b"\n"
    for buffer_size, max_tokens in ((1000, 6000), (7, 6000), (1000, 20)):
        out = run_stream(translator(ckpt_path, buffer_size=buffer_size, max_tokens=max_tokens), text)
        assert out == alone, (buffer_size, max_tokens)


def test_joined_batches_translate_as_batch_by_batch(ckpt_path, monkeypatch):
    from nmt_cli.decoding.cache import DecoderCache

    joins = []
    real_join = DecoderCache.join
    monkeypatch.setattr(DecoderCache, "join", lambda self, other: (joins.append(1), real_join(self, other))[1])
    inputs = lines(60, seed=3)
    search = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=6)
    apart = translator(ckpt_path, search=search, nbest=2, max_tokens=60, join_batches=False).translate(inputs)
    assert not joins
    joined = translator(ckpt_path, search=search, nbest=2, max_tokens=60).translate(inputs)
    assert len(joins) >= 2  # continuous batching is the default
    assert [[t.text for t in ts] for ts in joined] == [[t.text for t in ts] for ts in apart]
    assert [t.score for ts in joined for t in ts] == pytest.approx([t.score for ts in apart for t in ts], abs=1e-4)


def test_output_is_flushed_chunk_by_chunk_before_the_input_ends(ckpt_path):
    inputs = [f"{s}\n".encode() for s in lines(10)]
    consumed = []

    def source():
        for i, line in enumerate(inputs):
            consumed.append(i)
            yield line

    class Sink(io.BytesIO):
        flushed_after: list[int] = []

        def flush(self):
            self.flushed_after.append(len(consumed))

    sink = Sink()
    stats = translate_stream(translator(ckpt_path, buffer_size=3), source(), sink)
    assert stats.lines == 10 and sink.getvalue().count(b"\n") == 10
    assert sink.flushed_after[:2] == [3, 6]  # the first lines were written when 3 of 10 lines were read


def test_empty_lines_give_empty_lines_and_keep_alignment(ckpt_path):
    inputs = ["the cat", "", "   ", "a dog sees the house", ""]
    out = run_stream(translator(ckpt_path), ("\n".join(inputs) + "\n").encode())
    assert len(out) == 5
    assert out[1] == out[4] == "" and out[2] == "   "  # (nothing to translate: as given)
    assert out[0] and out[3]
    assert out[3] == translator(ckpt_path).translate(["a dog sees the house"])[0][0][1]


NOTHING_TO_TRANSLATE = ["🙂", "42", "3.14 %", "...", "https://example.org/a-cat?dog=1", "www.example.org",
                        "cat@example.org", "🐶 🐱 !", ">>de<< 🙂"]


def test_lines_with_nothing_to_translate_come_back_as_given(ckpt_path):
    """As LibreTranslate: no letter (outside URLs and e-mail addresses), nothing for the model; a tag is not
    text. Lines with letters around them are translated as before, in their place."""
    tr = translator(ckpt_path)
    mixed = ["the cat sleeps", *NOTHING_TO_TRANSLATE, "a dog", "", "🙂 the dog"]
    out = tr.translate(mixed)
    assert [hs[0].text for hs in out[1:len(NOTHING_TO_TRANSLATE) + 1]] == [*NOTHING_TO_TRANSLATE[:-1], "🙂"]
    assert all(hs[0].score == 0.0 for hs in out[1:len(NOTHING_TO_TRANSLATE) + 1])
    alone = tr.translate(["the cat sleeps", "a dog", "🙂 the dog"])
    assert [out[i][0].text for i in (0, -3, -1)] == [hs[0].text for hs in alone]
    assert out[-1][0].text != "🙂 the dog" and out[-2][0].text == ""
    stream = run_stream(translator(ckpt_path), ("\n".join(mixed) + "\n").encode())
    assert stream == [hs[0].text for hs in out]


def test_split_sentences_translates_each_sentence_of_a_line(ckpt_path, tmp_path):
    """--split-sentences: a line is a paragraph, its sentences translated one by one (as lines) and joined back
    with its own spacing, one line out per line in; off, the line is one input (as before)."""
    pytest.importorskip("sentencex", reason="the sentences extra is not installed")
    paragraphs = ["the cat sleeps. a dog runs!  🙂 the old man.", "", "  the red house.", "a child eats"]
    sentences = ["the cat sleeps.", "a dog runs!", "🙂 the old man.", "the red house.", "a child eats"]
    one = {s: hs for s, hs in zip(sentences, translator(ckpt_path, nbest=2).translate(sentences), strict=True)}
    expected = [f"{one[sentences[0]][0].text} {one[sentences[1]][0].text}  {one[sentences[2]][0].text}", "",
                f"  {one[sentences[3]][0].text}", one[sentences[4]][0].text]
    out = translator(ckpt_path, split_sentences=True, nbest=2).translate(paragraphs)
    assert [hs[0].text for hs in out] == expected
    assert out[0][1].score == pytest.approx(sum(one[s][1].score for s in sentences[:3]))
    assert out[0][0].text != translator(ckpt_path).translate(paragraphs[:1])[0][0].text  # off: one input
    (tmp_path / "in.txt").write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    r = nmt("-m", str(ckpt_path), str(tmp_path / "in.txt"), "--split-sentences", "--beam", "4", "--max-len-b", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split("\n")[:-1] == expected
    r = nmt("-m", str(ckpt_path), str(tmp_path / "in.txt"), "--split-sentences", "--token-scores")
    assert r.returncode == 2 and b"--split-sentences" in r.stderr


def test_invalid_utf8_is_replaced_with_one_warning_and_a_summary(ckpt_path, messages):
    text = b"the cat\nthe \xff dog\n\xc3\x28 red\nold man\n"
    out = run_stream(translator(ckpt_path, messages), text)
    assert len(out) == 4
    assert len(messages) == 2 and "line 2" in messages[0] and "UTF-8" in messages[0] and "1 more" in messages[1]
    assert out[0] == translator(ckpt_path).translate(["the cat"])[0][0][1]


def test_read_chunks_strips_crlf_and_handles_a_missing_final_newline():
    chunks = list(read_chunks(io.BytesIO(b"a\r\nb\n\nc"), 2, Warner(lambda m: None)))
    assert chunks == [["a", "b"], ["", "c"]]


def test_overlong_line_is_truncated_with_a_warning(ckpt_path, messages):
    long_line = " ".join(["the big red dog"] * 40)  # far more than max_positions (64) tokens
    out = run_stream(translator(ckpt_path, messages), f"the cat\n{long_line}\nold man\n".encode())
    assert len(out) == 3 and out[1]
    assert len(messages) == 1 and "line 2" in messages[0] and "truncated" in messages[0]


def test_nbest_tsv_and_scores(ckpt_path):
    tr = translator(ckpt_path, nbest=3)
    rows = [r.split("\t") for r in run_stream(tr, b"the cat\n\nold man\n")]
    assert [(r[0], r[1]) for r in rows] == [("1", "1"), ("1", "2"), ("1", "3"), ("2", "1"), ("3", "1"), ("3", "2"),
                                            ("3", "3")]
    scores = [float(r[2]) for r in rows if r[0] == "1"]
    assert scores == sorted(scores, reverse=True) and rows[3][3] == ""
    best = run_stream(translator(ckpt_path, scores=True), b"the cat\n")[0].split("\t")
    assert float(best[0]) == pytest.approx(scores[0], abs=1e-4) and best[1] == rows[0][3]


def test_average_last_n_averages_weights(tmp_path, toy_tokenizer_bytes):
    run = tmp_path / "run"
    for step in (100, 200, 300):
        make_checkpoint(run / f"checkpoint_{step}.pt", toy_tokenizer_bytes, seed=step)
    make_checkpoint(run / "checkpoint_best.pt", toy_tokenizer_bytes, seed=9)
    picked = last_checkpoints(run, 2)
    assert [p.name for p in picked] == ["checkpoint_200.pt", "checkpoint_300.pt"]
    avg = average_checkpoints(picked)
    a, b = (checkpoint.load(p).model_state for p in picked)
    for key in ("embed.weight", "decoder_layers.0.ffn.fc1.weight"):
        torch.testing.assert_close(avg.model_state[key], (a[key] + b[key]) / 2)
    # fewer than asked for: the one rule of train, average and translate (those there, said in one line)
    notes = []
    assert len(load_checkpoints([run], average_last=5, note=notes.append)) == 1
    assert notes == [fewer_message(run, 3, 5)]
    with pytest.raises(CheckpointError, match="average-last"):
        load_checkpoints([run])


def test_ensemble_of_two_checkpoints_translates(tmp_path, toy_tokenizer_bytes, ckpt_path):
    other = make_checkpoint(tmp_path / "other.pt", toy_tokenizer_bytes, seed=5)
    cfg = TranslateConfig(search=FAST)
    tr = Translator(load_checkpoints([ckpt_path, other]), "cpu", "fp32", cfg)
    assert len(tr.translate(["the cat", "", "a dog"])) == 3


def test_bf16_and_device_errors(ckpt_path, monkeypatch):
    tr = Translator(load_checkpoints([ckpt_path]), "cpu", "bf16", TranslateConfig(search=FAST))
    assert len(tr.translate(["the cat", "old man"])) == 2
    for native in (True, False):  # bf16 on a CPU without native bf16 works, with one warning that it is slow
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda native=native: native)
        said = []
        Translator(load_checkpoints([ckpt_path]), "cpu", "bf16", TranslateConfig(search=FAST),
                   Warner(said.append))
        assert len(said) == (0 if native else 1) and all("--precision fp32" in m for m in said)
    with pytest.raises(DeviceError, match="fp16"):
        Translator(load_checkpoints([ckpt_path]), "cpu", "fp16")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="cuda"):
            Translator(load_checkpoints([ckpt_path]), "cuda", "fp32")


# ---------------------------------------------------------------------------------------------------- the CLI


def nmt(*args, input: bytes | None = None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", *args], capture_output=True,
                          input=input, timeout=120)


def test_cli_stdin_to_stdout_one_line_per_input_line(ckpt_path):
    text = b"the cat\n\nold \xff man\nthe dog sleeps\n"
    r = nmt("-m", str(ckpt_path), "--max-len-b", "3", input=text)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().count("\n") == 4 and r.stdout.decode().split("\n")[1] == ""
    assert b"warning" in r.stderr and b"UTF-8" in r.stderr


def test_cli_file_argument_and_output_file(ckpt_path, tmp_path):
    (tmp_path / "in.en").write_text("the cat\na dog\n")
    out = tmp_path / "out.de"
    r = nmt(str(tmp_path / "in.en"), "-o", str(out), "-m", str(ckpt_path), "--beam", "1", "--max-len-b", "3")
    assert r.returncode == 0, r.stderr
    assert out.read_text().count("\n") == 2 and r.stdout == b""


@pytest.mark.parametrize("content", [None, b"", b"this is not a checkpoint", b"PK\x03\x04 truncated zip"])
def test_cli_missing_or_corrupt_checkpoint_is_one_line_exit_1(tmp_path, content):
    path = tmp_path / "model.pt"
    if content is not None:
        path.write_bytes(content)
    r = nmt("-m", str(path), input=b"the cat\n")
    assert r.returncode == 1
    err = [ln for ln in r.stderr.decode().splitlines() if ln.strip()]
    assert len(err) == 1 and "model.pt" in err[0] and b"Traceback" not in r.stderr
    assert r.stdout == b""


def test_cli_nbest_larger_than_beam_is_a_usage_error(ckpt_path):
    r = nmt("-m", str(ckpt_path), "--beam", "2", "--nbest", "3", input=b"x\n")
    assert r.returncode == 2


def test_max_tokens_defaults_by_device_and_is_validated(ckpt_path):
    cfg = TranslateConfig(search=FAST)
    tr = Translator(load_checkpoints([ckpt_path]), "cpu", "fp32", cfg)
    assert tr.config.max_tokens == MAX_TOKENS_PER_DEVICE["cpu"] and cfg.max_tokens is None  # caller's config untouched
    assert translator(ckpt_path, max_tokens=123).config.max_tokens == 123
    with pytest.raises(ConfigError, match="max-tokens"):
        TranslateConfig(max_tokens=0).validate()


def test_cuda_graphs_on_a_cpu_is_a_note_and_changes_nothing(ckpt_path):
    """--cuda-graphs replays a GPU's decoding steps: on a CPU it says it has no effect, and the output is the
    same; the default (graphs on a GPU only) and --no-cuda-graphs say nothing."""
    text = "".join(line + "\n" for line in lines(8)).encode()
    base = [sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(ckpt_path), "--device", "cpu", "--beam", "2",
            "--max-len-b", "4"]
    plain = subprocess.run(base, input=text, capture_output=True)
    graphs = subprocess.run([*base, "--cuda-graphs"], input=text, capture_output=True)
    assert plain.returncode == graphs.returncode == 0, graphs.stderr.decode()
    assert graphs.stdout == plain.stdout and plain.stdout.count(b"\n") == 8
    assert b"--cuda-graphs has no effect" in graphs.stderr and b"cuda-graphs" not in plain.stderr
    off = subprocess.run([*base, "--no-cuda-graphs"], input=text, capture_output=True)
    assert off.returncode == 0 and off.stdout == plain.stdout and b"cuda-graphs" not in off.stderr


@pytest.mark.parametrize("options", [
    dict(search=SearchConfig(beam=4, nbest=3, max_len_a=1.0, max_len_b=6), token_scores=True, alignment="words",
         scores=True),
    dict(search=SearchConfig(beam=1, max_len_a=1.0, max_len_b=6)),
    dict(search=SearchConfig(beam=4, stop="top", lp="fairseq", min_len=2, max_len_a=1.0, max_len_b=6)),
    dict(search=SearchConfig(beam=4, no_repeat_ngram=2, max_len_a=1.0, max_len_b=6)),
    dict(search=SearchConfig(beam=1, sampling=True, seed=5, nbest=2, max_len_a=1.0, max_len_b=6)),
])
def test_translator_with_step_graphs_gives_what_it_gives_without(ckpt_path, options):
    """CUDA graphs are a GPU's default: the Translator's whole path through them (static caches, host checks every
    few steps, the steps through StepGraphs, run eagerly on a CPU) gives the same translations, scores, token
    scores and alignments as that path without graphs, for every search option, prefixes included; and, but for
    sampling (whose draws depend on which rows a step holds), as the default path."""
    from nmt_cli.decoding.graphs import GPU_CHECK_EVERY, StepGraphs

    inputs = lines(24)
    prefixes = ["" if i % 3 else "a" for i in range(len(inputs))]
    plain = translator(ckpt_path, workers=1, **options)
    static = translator(ckpt_path, workers=1, **options)
    static.decode_options = lambda: dict(static=True, check_every=GPU_CHECK_EVERY)
    graphed = translator(ckpt_path, workers=1, **options)
    graphed.graphs = StepGraphs("cpu")
    assert graphed.decode_options()["graphs"] is graphed.graphs
    search = options["search"]
    references = [static] if search.sampling else [static, plain]
    for kwargs in (dict(), dict(prefixes=prefixes)):
        got = graphed.translate(inputs, **kwargs)
        for reference in references:
            for a, b in zip(reference.translate(inputs, **kwargs), got, strict=True):
                assert [t.text for t in a] == [t.text for t in b]
                assert [t.score for t in a] == pytest.approx([t.score for t in b], abs=1e-5)
                assert [t.alignment for t in a] == [t.alignment for t in b]
                for x, y in zip(a, b, strict=True):
                    assert (x.token_scores is None) == (y.token_scores is None)
                    if x.token_scores is not None:
                        assert x.token_scores == pytest.approx(y.token_scores, abs=1e-5)
    graphable = not (search.sampling or search.no_repeat_ngram)  # those steps the host decides: never graphed
    assert (graphed.graphs.recorded >= 1) == graphable and graphed.graphs.broken is None
