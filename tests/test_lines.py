"""One line-splitting rule (only "\\n" ends a line; "\\r\\n" is one line end) for every command that reads text:
prepare, translate and score, from files and from stdin."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt_cli import lines, metrics
from nmt_cli.data.prepare import PrepareOptions, prepare
from nmt_cli.data.readers import TableSource, TextPairSource
from nmt_cli.inference.translate import Warner, read_chunks

# Bytes -> the lines every reader must see. Python's str.splitlines() and text-mode files split most of these.
CASES = [
    (b"", []),
    (b"\n", [""]),
    (b"one\ntwo\n", ["one", "two"]),
    (b"one\ntwo", ["one", "two"]),  # no final newline: the last line counts
    (b"one\r\ntwo\r\n", ["one", "two"]),  # Windows line ends
    (b"a\rb\nc\n", ["a\rb", "c"]),  # a bare \r is text
    (b"a\r\r\nb", ["a\r", "b"]),  # only the \r of the \r\n is removed
    (b"end\r", ["end\r"]),  # a last \r without \n ends nothing
    ("a\u2028b\u2029c\n".encode(), ["a\u2028b\u2029c"]),  # line and paragraph separators
    ("a\u0085b\n".encode(), ["a\u0085b"]),  # NEL
    (b"a\x0cb\x0bc\x1cd\n", ["a\x0cb\x0bc\x1cd"]),  # form feed, vertical tab, file separator
    (b"\n\n\nx", ["", "", "", "x"]),
]
IDS = [repr(raw)[:24] for raw, _ in CASES]
# One input holding every kind of character above, for the commands.
MIXED_LINES = ["der Hund\rsieht die Katze", "die zwei\u2028Katzen sehen den Hund", "drei\u0085Häuser und ein Mann",
               "vier\x0cBücher und ein Kind", "", "die fünf Bäume sind alt"]
MIXED = "\n".join(MIXED_LINES[:2]).encode() + b"\r\n" + "\n".join(MIXED_LINES[2:]).encode()  # no final newline


@pytest.mark.parametrize(("raw", "expected"), CASES, ids=IDS)
def test_the_rule_on_bytes_text_and_files(tmp_path, raw, expected):
    assert [b.decode() for b in lines.iter_lines(io.BytesIO(raw))] == expected
    assert lines.split(raw.decode()) == expected
    assert lines.read_text(io.BytesIO(raw), "x") == expected
    path = tmp_path / "f.txt"
    path.write_bytes(raw)
    assert lines.count_lines(path) == len(expected)


@pytest.mark.parametrize(("raw", "expected"), CASES, ids=IDS)
def test_translate_reads_by_the_rule(raw, expected):
    chunks = list(read_chunks(io.BytesIO(raw), 2, Warner(lambda m: None)))
    assert [line for chunk in chunks for line in chunk] == expected


NONEMPTY = [(i, c) for i, c in zip(IDS, CASES, strict=True) if c[1]]


@pytest.mark.parametrize(("raw", "expected"), [c for _, c in NONEMPTY], ids=[i for i, _ in NONEMPTY])
def test_score_reads_files_and_streams_by_the_rule(tmp_path, raw, expected):
    path = tmp_path / "hyp.txt"
    path.write_bytes(raw)
    stripped = [line.rstrip() for line in expected]  # score strips trailing whitespace, as sacrebleu's CLI does
    assert metrics.read_lines(str(path)) == stripped
    assert metrics.lines_from_stream(io.BytesIO(raw), "stdin") == stripped


@pytest.mark.parametrize(("raw", "expected"), CASES, ids=IDS)
def test_prepare_reads_text_pairs_by_the_rule(tmp_path, raw, expected):
    (tmp_path / "c.en").write_bytes(raw)
    (tmp_path / "c.de").write_bytes(raw)
    source = TextPairSource("train", tmp_path / "c.en", tmp_path / "c.de")
    assert source.count() == len(expected)
    got = [pair for src, tgt in source.chunks(2) for pair in zip(src, tgt, strict=True)]
    assert got == [(e, e) for e in expected]


def test_prepare_reads_json_lines_by_the_rule(tmp_path):
    rows = [json.dumps({"translation": {"en": s, "de": s}}, ensure_ascii=False) for s in ["a\u2028b", "c\x0cd"]]
    path = tmp_path / "train.jsonl"
    path.write_bytes("\r\n".join(rows).encode() + b"\n")
    source = TableSource("train", [path], "en", "de")
    assert source.count() == 2
    assert [src for src, _ in source.chunks(10)] == [["a\u2028b", "c\x0cd"]]


def test_prepare_keeps_the_lines_of_a_custom_corpus(tmp_path):
    """End to end: the raw valid text nmt prepare writes holds one line per input line, whatever the characters
    inside the lines (valid is never filtered; surrounding whitespace is stripped)."""
    train = [f"the dog {i} sees a cat" for i in range(40)]
    for prefix, text in (("train", "\n".join(train).encode() + b"\n"), ("valid", MIXED)):
        (tmp_path / f"{prefix}.en").write_bytes(text)
        (tmp_path / f"{prefix}.de").write_bytes(text)
    out = tmp_path / "out"
    r = prepare(PrepareOptions("custom", str(out), src_lang="en", tgt_lang="de", train=str(tmp_path / "train"),
                               valid=str(tmp_path / "valid"), vocab_size=40, workers=1))
    assert r.manifest["splits"]["valid"]["read"] == len(MIXED_LINES)
    with open(out / "raw" / "valid.de", "rb") as f:
        assert lines.read_text(f, "valid.de") == [s.strip() for s in MIXED_LINES]


def _nmt(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], input=stdin, capture_output=True,
                          timeout=120)


def test_score_counts_the_same_lines_from_stdin_and_from_a_file(tmp_path):
    """The issue's case: a bare \\r made stdin 3 lines and the file 4."""
    ref = tmp_path / "ref.txt"
    ref.write_bytes(MIXED)
    from_file = _nmt("score", ref, "-r", ref)
    from_stdin = _nmt("score", "-r", ref, stdin=MIXED)
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_file.stderr + from_stdin.stderr
    assert from_file.stdout.split()[3] == from_stdin.stdout.split()[3] == b"100.0"


def test_translate_writes_one_line_per_input_line_from_stdin_and_from_a_file(tmp_path, toy_tokenizer_bytes):
    from helpers_translate import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "model.pt", toy_tokenizer_bytes)
    (tmp_path / "in.txt").write_bytes(MIXED)
    args = ("translate", "-m", ckpt, "--beam", "1", "--max-len-b", "2")
    from_stdin = _nmt(*args, stdin=MIXED)
    from_file = _nmt(*args, tmp_path / "in.txt")
    from_dash = _nmt(*args, "-", stdin=MIXED)  # '-' is stdin, as for nmt score
    assert from_stdin.returncode == 0 and from_file.returncode == 0, from_stdin.stderr + from_file.stderr
    assert from_stdin.stdout == from_file.stdout == from_dash.stdout
    assert from_stdin.stdout.count(b"\n") == len(MIXED_LINES)


def test_read_text_names_the_line_that_is_not_utf8():
    with pytest.raises(Exception, match=r"stdin: line 2 is not UTF-8"):
        lines.read_text(io.BytesIO(b"ok\nGr\xf6\xdfe\n"), "stdin")
    with pytest.raises(Exception, match="no such file"):
        lines.open_input(Path("/nonexistent/x.txt"))
