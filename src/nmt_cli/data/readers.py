"""Streaming readers of sentence pairs: a reader (`PairSource`) yields pairs in chunks, never the whole corpus.

`TextPairSource` (two plain text files, one sentence per line), `TableSource` (the hub's parquet files, or JSON
lines with the same `translation` field) and `MemorySource` (the generated sample corpus). Each records the
sha256 of what it read (`checksums`) once it has been read to the end.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from nmt_cli.errors import ConfigError, DataError
from nmt_cli.lines import count_lines, decode, iter_lines, split


@dataclass
class PairSource:
    """Streaming reader of sentence pairs (in the corpus' own src/tgt languages)."""

    name: str
    checksums: dict[str, str] = field(default_factory=dict)

    def count(self) -> int:  # number of pairs; raises DataError on unusable input
        raise NotImplementedError

    def fingerprint(self) -> dict:  # cheap identity of the input (paths, sizes, mtimes) for step reuse
        raise NotImplementedError

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:  # ([src], [tgt]) lines, no newline
        raise NotImplementedError


def _file_id(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class TextPairSource(PairSource):
    """Two plain text files, one sentence per line, same line count. `errors`: strict (DataError naming file
    and line on invalid UTF-8) or replace (U+FFFD)."""

    def __init__(self, name: str, src_path: str | os.PathLike, tgt_path: str | os.PathLike, errors: str = "strict"):
        super().__init__(name)
        self.paths = (Path(src_path), Path(tgt_path))
        self.errors = errors
        self._count: int | None = None

    def count(self) -> int:
        if self._count is None:
            for p in self.paths:
                if not p.is_file():
                    raise DataError(f"{p} does not exist; check the --{self.name} prefix (PREFIX.{p.suffix[1:]})")
            n_src, n_tgt = (count_lines(p) for p in self.paths)
            if n_src != n_tgt:
                raise DataError(f"{self.paths[0]} has {n_src} lines but {self.paths[1]} has {n_tgt}; a parallel "
                                "corpus needs the same line count on both sides")
            self._count = n_src
        return self._count

    def fingerprint(self) -> dict:
        return {"kind": "text", "files": [_file_id(p) for p in self.paths]}

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        hashes = [hashlib.sha256(), hashlib.sha256()]
        with open(self.paths[0], "rb") as fs, open(self.paths[1], "rb") as ft:
            start = 0
            while True:
                raw = [list(islice(fs, size)), list(islice(ft, size))]
                if not raw[0] and not raw[1]:
                    break
                out = []
                for h, lines, path in zip(hashes, raw, self.paths, strict=True):
                    blob = b"".join(lines)
                    h.update(blob)
                    out.append(self._decode(blob, lines, path, start))
                yield out[0], out[1]
                start += len(raw[0])
        self.checksums = {str(p): "sha256:" + h.hexdigest() for p, h in zip(self.paths, hashes, strict=True)}

    def _decode(self, blob: bytes, lines: list[bytes], path: Path, start: int) -> list[str]:
        """The chunk's lines as str, split by the rule of `nmt_cli.lines` (only "\\n" ends a line, "\\r\\n" is one
        line end); on invalid UTF-8 (strict), a DataError naming the line."""
        try:
            text = blob.decode("utf-8", self.errors)
        except UnicodeDecodeError:
            for i, line in enumerate(lines):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}: line {start + i + 1} is not valid UTF-8 ({exc.reason} at byte "
                                    f"{exc.start}); fix the file or pass --errors replace") from None
            raise
        return split(text)


class TableSource(PairSource):
    """Rows with a `translation` field {lang: sentence}: parquet files (pyarrow, imported when needed) as on
    the Hugging Face hub, or JSON lines (.jsonl), as `datasets` exports them."""

    def __init__(self, name: str, files: list[Path], src: str, tgt: str):
        super().__init__(name)
        self.files, self.src, self.tgt = [Path(f) for f in files], src, tgt

    def count(self) -> int:
        n = 0
        for f in self.files:
            if not f.is_file():
                raise DataError(f"{f} does not exist")
            if f.suffix == ".parquet":
                n += _open_parquet(f).metadata.num_rows
            else:
                n += count_lines(f)
        return n

    def fingerprint(self) -> dict:
        return {"kind": "table", "langs": [self.src, self.tgt], "files": [_file_id(f) for f in self.files]}

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        for f in self.files:
            yield from (self._parquet_chunks(f, size) if f.suffix == ".parquet" else self._jsonl_chunks(f, size))
        self.checksums = {str(f): "sha256:" + sha256_file(f) for f in self.files}

    def _parquet_chunks(self, path: Path, size: int) -> Iterator[tuple[list[str], list[str]]]:
        batches = iter(_open_parquet(path).iter_batches(batch_size=size, columns=["translation"]))
        while True:
            try:
                batch = next(batches, None)
                if batch is None:
                    return
                col = batch.column(0)
                src, tgt = col.field(self.src).to_pylist(), col.field(self.tgt).to_pylist()
            except KeyError as exc:
                raise DataError(f"{path} has no '{self.src}'/'{self.tgt}' translation fields") from exc
            except (OSError, ValueError) as exc:  # pyarrow's ArrowIOError / ArrowInvalid: a damaged file
                raise DataError(_unreadable(path, exc)) from None
            yield [_one_line(x) for x in src], [_one_line(x) for x in tgt]

    def _jsonl_chunks(self, path: Path, size: int) -> Iterator[tuple[list[str], list[str]]]:
        with open(path, "rb") as f:
            lineno = 0
            lines_iter = iter_lines(f)
            while lines := list(islice(lines_iter, size)):
                src, tgt = [], []
                for line in lines:
                    lineno += 1
                    try:
                        row = json.loads(decode(line, str(path), lineno))["translation"]
                        src.append(_one_line(row[self.src]))
                        tgt.append(_one_line(row[self.tgt]))
                    except (json.JSONDecodeError, KeyError, TypeError) as exc:
                        raise DataError(f"{path}: line {lineno} is not a JSON object with translation."
                                        f"{self.src}/{self.tgt} ({exc})") from None
                yield src, tgt


def _open_parquet(path: Path):
    """A pyarrow ParquetFile read one row group at a time (pre_buffer=False: pyarrow's default reads ahead every
    row group of the file, so peak memory grew with the file: 261 MiB for a 1.5M-pair shard, 52 MiB without)."""
    try:
        return pyarrow_parquet().ParquetFile(path, pre_buffer=False)
    except (OSError, ValueError) as exc:
        raise DataError(_unreadable(path, exc)) from None


def _unreadable(path: Path, exc: Exception) -> str:
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return (f"{path} cannot be read as a parquet file with a `translation` column ({detail}); download it again "
            "or pass other files")


def _one_line(s: str | None) -> str:
    """A sentence as one line (newlines inside a table cell would break the line-aligned text files)."""
    return "" if s is None else s.replace("\r", " ").replace("\n", " ")


class MemorySource(PairSource):
    """Pairs held in memory (the generated sample corpus: small by construction)."""

    def __init__(self, name: str, pairs: list[tuple[str, str]], identity: dict):
        super().__init__(name)
        self.pairs, self.identity = pairs, identity

    def count(self) -> int:
        return len(self.pairs)

    def fingerprint(self) -> dict:
        return {"kind": "memory", **self.identity}

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        h = hashlib.sha256()
        for i in range(0, len(self.pairs), size):
            part = self.pairs[i : i + size]
            for s, t in part:
                h.update(f"{s}\t{t}\n".encode())
            yield [p[0] for p in part], [p[1] for p in part]
        self.checksums = {self.name: "sha256:" + h.hexdigest()}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def pyarrow_parquet():
    """pyarrow.parquet (a dependency of nmt-cli); a ConfigError saying how to repair a broken install."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(f"reading the hub's parquet files needs pyarrow, which cannot be imported ({exc}); "
                          "reinstall it: pip install 'pyarrow>=16' (or pass text files: nmt prepare custom "
                          "--train PREFIX ...)") from None
    return pq
