"""The one rule for splitting text into lines, shared by every command that reads text (prepare, translate,
score), from files and from stdin alike.

Only "\\n" ends a line. A "\\r" right before it is part of that line end ("\\r\\n": a file written on Windows
reads the same as on Unix) and is removed; every other "\\r" is text, and so are U+2028, U+2029, U+0085,
"\\x0b" and "\\x0c", which Python's `str.splitlines()` and its text-mode files (universal newlines) would
take for line ends. A last line without "\\n" counts. Line N is then the same line for every command, for
`wc -l` (plus an unterminated last line) and for `sed -n Np`.

Text is read as bytes (binary files and `sys.stdin.buffer`: nothing translates "\\r" on the way) and decoded
as UTF-8 after splitting; UTF-8 never puts a "\\n" byte inside a multi-byte character.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

from nmt_cli.errors import DataError


def strip_line_end(raw: bytes) -> bytes:
    """A line as a binary stream yields it (ending with b"\\n", except possibly the last) without its line end."""
    if raw.endswith(b"\n"):
        return raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    return raw


def iter_lines(stream: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary stream, without line ends (iterating a binary stream splits at b"\\n" only)."""
    for raw in stream:
        yield strip_line_end(raw)


def split(text: str) -> list[str]:
    """The lines of a decoded text, by the same rule ("" has no lines; a final "\\n" opens no new line)."""
    lines = text.split("\n")
    last = lines.pop()  # the text after the last "\n": a last line without line end, or ""
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if last:
        lines.append(last)
    return lines


def decode(raw: bytes, name: str, number: int) -> str:
    """One line as UTF-8; a DataError naming the input and the line number when it is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}: line {number} is not UTF-8 text ({exc.reason} at byte {exc.start}); convert it "
                        "to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def read_text(stream: BinaryIO, name: str) -> list[str]:
    """Every line of a binary stream, decoded (a DataError naming the line on invalid UTF-8)."""
    return [decode(raw, name, number) for number, raw in enumerate(iter_lines(stream), 1)]


def open_input(path: str | os.PathLike, what: str = "input") -> BinaryIO:
    """An input file opened for reading bytes; a one-line DataError saying why it cannot be."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"cannot read {what} {path}: no such file; check the path") from None
    except IsADirectoryError:
        raise DataError(f"cannot read {what} {path}: it is a directory; pass a text file") from None
    except OSError as exc:
        raise DataError(f"cannot read {what} {path}: {exc.strerror or exc}; check the file's permissions") from None


def count_lines(path: str | os.PathLike) -> int:
    """Lines in a file by the rule above, reading bytes in 16 MiB blocks."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")
