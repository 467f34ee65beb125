"""`nmt translate` fuzzed (hypothesis): whatever bytes come in (invalid UTF-8, NUL, "\\r", lone surrogates, very
long lines, empty and whitespace-only lines, right-to-left text, emoji), it never crashes and writes exactly one
output line per input line, in valid UTF-8 (invalid input is replaced by U+FFFD with a warning)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers_translate import make_checkpoint
from nmt_cli.decoding import SearchConfig
from nmt_cli.inference.translate import (
    TranslateConfig,
    Translator,
    Warner,
    load_checkpoints,
    translate_stream,
)
from nmt_cli.lines import count_lines

pytestmark = pytest.mark.usefixtures("one_thread")

NASTY = ["", " ", "\t \t", "\x00", "a\x00b", "the\rcat", "\r", "\u2028", "\x0b\x0c\x85", "שלום עולם", "مرحبا بالعالم",
         "the \u202ecat\u202c dog", "🐈‍⬛ 👍🏽 🇩🇪", "\ufeffthe cat", "a" * 3000, "the cat " * 200]
# bytes that are not UTF-8: a lone surrogate as Python would encode it, a stray continuation byte, an overlong
# form, a truncated sequence, Latin-1
BAD_BYTES = [b"\xed\xa0\x80", b"\x80", b"\xc0\xaf", b"\xe2\x82", b"caf\xe9", b"\xff\xfe"]

text_line = st.one_of(st.sampled_from(NASTY), st.text(st.characters(exclude_characters="\n"), max_size=40))
byte_line = st.one_of(st.sampled_from(BAD_BYTES), st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")))
line = st.one_of(text_line.map(lambda s: s.encode("utf-8", "surrogatepass")), byte_line)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("fuzz") / "model.pt", toy_tokenizer_bytes, seed=0)


@pytest.fixture(scope="module")
def translator(ckpt):
    cfg = TranslateConfig(search=SearchConfig(beam=2, max_len_a=0.0, max_len_b=3), buffer_size=7)
    return Translator(load_checkpoints([ckpt]), "cpu", "fp32", cfg, Warner(lambda message: None))


def expected_lines(data: bytes) -> int:
    return data.count(b"\n") + (not data.endswith(b"\n") and data != b"")


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=st.lists(line, max_size=12), crlf=st.booleans(), final_newline=st.booleans())
@example(lines=[b"x" * (1 << 20), b"", b"the cat"], crlf=False, final_newline=True)  # a 1 MB line among others
@example(lines=[b"\r", b"\r\r", b"\x00\r"], crlf=True, final_newline=False)
def test_any_bytes_give_one_valid_output_line_per_input_line(translator, lines, crlf, final_newline):
    data = (b"\r\n" if crlf else b"\n").join(lines) + ((b"\r\n" if crlf else b"\n") if final_newline else b"")
    sink = io.BytesIO()
    translate_stream(translator, io.BytesIO(data), sink)
    out = sink.getvalue()
    out.decode("utf-8")  # raises on invalid UTF-8
    assert out.count(b"\n") == expected_lines(data) and (out == b"" or out.endswith(b"\n"))
    assert b"\r" not in out


@pytest.mark.slow
def test_the_command_on_every_kind_of_nasty_input_at_once(tmp_path, ckpt):
    """The CLI, stdin to stdout and file to file: exit 0, one line out per line in (`wc -l` plus an unterminated
    last line), warnings on stderr, nothing on stdout but translations."""
    data = b"\n".join([s.encode("utf-8", "surrogatepass") for s in NASTY] + BAD_BYTES + ["\ud800".encode(
        "utf-8", "surrogatepass"), b"y" * (1 << 20)])
    (tmp_path / "in.txt").write_bytes(data)
    args = [sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(ckpt), "--max-len-b", "3", "--beam", "1"]
    done = subprocess.run(args, input=data, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(b"\n") == count_lines(tmp_path / "in.txt") == expected_lines(data)
    done.stdout.decode("utf-8")
    assert b"UTF-8" in done.stderr and b"Traceback" not in done.stderr
    done = subprocess.run([*args, "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt")],
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_bytes().count(b"\n") == expected_lines(data)
