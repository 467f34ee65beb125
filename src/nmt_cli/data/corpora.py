"""Named corpora (the registry), where their files come from (Hugging Face hub, local files, the embedded
sample), and streaming readers of sentence pairs.

A reader (`PairSource`) yields pairs in chunks, never the whole corpus: `TextPairSource` (two plain text files,
one sentence per line), `TableSource` (the hub's parquet files, or JSON lines with the same `translation` field)
and `MemorySource` (the generated sample corpus).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from urllib.parse import urlparse

from nmt_cli.errors import ConfigError, DataError, DownloadError

HUB_REPO = "wmt/wmt14"
# The commit "Convert dataset to Parquet (#8)" of the public dataset repository wmt/wmt14: one folder per pair
# (de-en/, fr-en/, ...) with train-0000i-of-0000N.parquet, validation-00000-of-00001.parquet (newstest2013) and
# test-00000-of-00001.parquet (newstest2014); one column `translation` = {lang: sentence}.
HUB_REVISION = "b199e406369ec1b7634206d3ded5ba45de2fe696"
SPLITS = ("train", "valid", "test")
HUB_SPLIT = {"train": "train", "valid": "validation", "test": "test"}

Progress = Callable[[str, int, "int | None"], None]  # (stage, done, total)


@dataclass(frozen=True)
class CorpusSpec:
    """A named corpus: canonical direction (src -> tgt), splits, default vocabulary and where to get it."""

    name: str
    src: str
    tgt: str
    description: str
    pairs: str
    vocab_size: int
    splits: dict[str, str]
    hub_config: str | None = None  # folder in HUB_REPO, e.g. "de-en"
    hub_train_shards: int = 0
    character_coverage: float = 1.0
    bpe_sample: int = 2_000_000

    def hub_files(self) -> dict[str, list[str]]:
        """{split: [file path in the hub repository]}."""
        if not self.hub_config:
            return {}
        c, n = self.hub_config, self.hub_train_shards
        return {"train": [f"{c}/train-{i:05d}-of-{n:05d}.parquet" for i in range(n)],
                "valid": [f"{c}/validation-00000-of-00001.parquet"],
                "test": [f"{c}/test-00000-of-00001.parquet"]}


CORPORA = {
    "wmt14-en-de": CorpusSpec(
        "wmt14-en-de", "en", "de", "WMT14 English-German (the paper's base/big en-de data)", "~4.5M", 37000,
        {"train": "Europarl v7, Common Crawl, News Commentary v9", "valid": "newstest2013", "test": "newstest2014"},
        hub_config="de-en", hub_train_shards=3, character_coverage=0.9999),
    "wmt14-en-fr": CorpusSpec(
        "wmt14-en-fr", "en", "fr", "WMT14 English-French (the paper's en-fr data)", "~36M", 32000,
        {"train": "Europarl, Common Crawl, UN, News Commentary, Gigaword", "valid": "newstest2013",
         "test": "newstest2014"},
        hub_config="fr-en", hub_train_shards=30, character_coverage=0.9999),
    "sample": CorpusSpec(
        "sample", "en", "de", "embedded English-German sample written for nmt (offline; for the demo)",
        "30k", 2000, {"train": "generated", "valid": "generated", "test": "generated"}),
}
REVERSED = {"wmt14-de-en": "wmt14-en-de", "wmt14-fr-en": "wmt14-en-fr"}


def known_names() -> list[str]:
    return sorted([*CORPORA, *REVERSED, "custom"])


def resolve(name: str) -> tuple[CorpusSpec | None, bool]:
    """(spec, reversed) for a corpus name; (None, False) for `custom`; ConfigError listing the known names."""
    if name == "custom":
        return None, False
    if name in CORPORA:
        return CORPORA[name], False
    if name in REVERSED:
        return CORPORA[REVERSED[name]], True
    raise ConfigError(f"unknown corpus '{name}'; known corpora: {', '.join(known_names())} (see nmt prepare --list)")


def corpus_table() -> list[dict]:
    """Rows for `nmt prepare --list`."""
    rows = []
    for spec in CORPORA.values():
        source = f"hf://{HUB_REPO}/{spec.hub_config}@{HUB_REVISION[:8]}" if spec.hub_config else "built in"
        rows.append({"name": spec.name, "direction": f"{spec.src}->{spec.tgt}", "pairs": spec.pairs,
                     "valid/test": f"{spec.splits['valid']} / {spec.splits['test']}",
                     "vocab": spec.vocab_size, "source": source, "description": spec.description})
    for alias, target in REVERSED.items():
        spec = CORPORA[target]
        rows.append({"name": alias, "direction": f"{spec.tgt}->{spec.src}", "pairs": spec.pairs,
                     "valid/test": f"{spec.splits['valid']} / {spec.splits['test']}", "vocab": spec.vocab_size,
                     "source": f"= {target} --reverse", "description": spec.description})
    rows.append({"name": "custom", "direction": "--src-lang -> --tgt-lang", "pairs": "-", "valid/test": "your files",
                 "vocab": 8000, "source": "--train/--valid/--test PREFIX", "description": "local text files"})
    return rows


# ------------------------------------------------------------------------------------------------ readers


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


def count_lines(path: Path) -> int:
    """Lines in a file (a last line without newline counts), reading bytes in 16 MiB blocks."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


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
        """The chunk's lines as str (without line ends); on invalid UTF-8 (strict), a DataError naming the line."""
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
        out = text.split("\n")
        if out and out[-1] == "":
            out.pop()
        return out


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
                n += _pyarrow_parquet().ParquetFile(f).metadata.num_rows
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
        pf = _pyarrow_parquet().ParquetFile(path)
        for batch in pf.iter_batches(batch_size=size, columns=["translation"]):
            col = batch.column(0)
            try:
                yield [_one_line(s) for s in col.field(self.src).to_pylist()], \
                      [_one_line(s) for s in col.field(self.tgt).to_pylist()]
            except KeyError as exc:
                raise DataError(f"{path} has no '{self.src}'/'{self.tgt}' translation fields") from exc

    def _jsonl_chunks(self, path: Path, size: int) -> Iterator[tuple[list[str], list[str]]]:
        with open(path, encoding="utf-8") as f:
            lineno = 0
            while lines := list(islice(f, size)):
                src, tgt = [], []
                for line in lines:
                    lineno += 1
                    try:
                        row = json.loads(line)["translation"]
                        src.append(_one_line(row[self.src]))
                        tgt.append(_one_line(row[self.tgt]))
                    except (json.JSONDecodeError, KeyError, TypeError) as exc:
                        raise DataError(f"{path}: line {lineno} is not a JSON object with translation."
                                        f"{self.src}/{self.tgt} ({exc})") from None
                yield src, tgt


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


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading the hub's parquet files needs pyarrow: pip install pyarrow (or pass text "
                          "files: nmt prepare custom --train PREFIX ...)") from None
    return pq


# ------------------------------------------------------------------------------------------ source choice


def text_sources(prefixes: dict[str, str | os.PathLike], src: str, tgt: str, errors: str) -> dict[str, PairSource]:
    """{split: TextPairSource(PREFIX.src, PREFIX.tgt)} for the given prefixes."""
    return {split: TextPairSource(split, f"{prefix}.{src}", f"{prefix}.{tgt}", errors)
            for split, prefix in prefixes.items()}


def from_dir_sources(spec: CorpusSpec, directory: str | os.PathLike, errors: str) -> dict[str, PairSource]:
    """A pre-downloaded named corpus: DIR/{train,valid,test}.{src,tgt} text files, or the hub layout
    (DIR/<pair>/*.parquet or *.jsonl, e.g. from `huggingface-cli download wmt/wmt14 --include 'de-en/*'`)."""
    d = Path(directory)
    if not d.is_dir():
        raise DataError(f"--from-dir {d} is not a directory")
    if all((d / f"{s}.{spec.src}").exists() for s in SPLITS):
        return text_sources({s: d / s for s in SPLITS}, spec.src, spec.tgt, errors)
    out: dict[str, PairSource] = {}
    for split in SPLITS:
        files = []
        for pattern in (f"{HUB_SPLIT[split]}-*.parquet", f"{HUB_SPLIT[split]}-*.jsonl", f"{HUB_SPLIT[split]}.jsonl"):
            files += sorted((d / (spec.hub_config or "")).glob(pattern)) or sorted(d.glob(pattern))
        if not files:
            raise DataError(f"--from-dir {d}: found neither {split}.{spec.src}/{split}.{spec.tgt} nor "
                            f"{spec.hub_config}/{HUB_SPLIT[split]}-*.parquet")
        out[split] = TableSource(split, files, spec.src, spec.tgt)
    return out


def hub_sources(spec: CorpusSpec, progress: Progress | None = None, cache_dir=None) -> dict[str, PairSource]:
    """Download (or find in the cache) the pinned hub files of `spec`; {split: TableSource}."""
    paths = download(spec, progress, cache_dir)
    return {split: TableSource(split, files, spec.src, spec.tgt) for split, files in paths.items()}


def download(spec: CorpusSpec, progress: Progress | None = None, cache_dir=None) -> dict[str, list[Path]]:
    """{split: local paths} of the corpus' hub files at the pinned revision: cached files are used as they are
    (no network needed); missing ones are downloaded (resumable, via huggingface_hub) and checked against the
    hub's sha256. Offline: one DownloadError at once saying what was tried and how to pass local files."""
    import huggingface_hub as hub

    wanted = spec.hub_files()
    local: dict[str, Path] = {}
    missing: list[str] = []
    for files in wanted.values():
        for name in files:
            try:
                local[name] = Path(hub.hf_hub_download(HUB_REPO, name, repo_type="dataset", revision=HUB_REVISION,
                                                       cache_dir=cache_dir, local_files_only=True))
            except Exception:  # not cached (LocalEntryNotFoundError and friends)
                missing.append(name)
    if missing:
        where = f"{HUB_REPO}@{HUB_REVISION[:8]} ({spec.hub_config}/, {len(missing)} files)"
        _check_online(where, spec)
        expected = _expected_sha256(missing)
        for i, name in enumerate(missing):
            label = f"download {name} ({i + 1}/{len(missing)})"
            try:
                path = Path(hub.hf_hub_download(HUB_REPO, name, repo_type="dataset", revision=HUB_REVISION,
                                                cache_dir=cache_dir, etag_timeout=10,
                                                tqdm_class=_progress_tqdm(progress, label)))
            except Exception as exc:
                raise DownloadError(f"downloading {name} from {where} failed ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''}); {_LOCAL_HINT}") from exc
            if name in expected:
                if progress:
                    progress(f"verify {name}", 0, None)
                got = sha256_file(path)
                if got != expected[name]:
                    raise DownloadError(f"{path} has sha256 {got[:12]}..., the hub says {expected[name][:12]}...; "
                                        f"delete it and run again (or pass local files: {_LOCAL_HINT})")
            local[name] = path
    return {split: [local[n] for n in files] for split, files in wanted.items()}


_LOCAL_HINT = ("pass local files with: nmt prepare custom --src-lang en --tgt-lang de --train PREFIX "
               "--valid PREFIX --test PREFIX, or --from-dir DIR")


def _check_online(where: str, spec: CorpusSpec) -> None:
    """Fail at once (not after the hub client's retries) when the hub cannot be reached."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise DownloadError(f"cannot download {where}: HF_HUB_OFFLINE is set and the files are not cached; "
                            + _LOCAL_HINT.replace("en --tgt-lang de", f"{spec.src} --tgt-lang {spec.tgt}"))
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise DownloadError(f"cannot reach {host} to download {where} ({exc.strerror or exc}); "
                            + _LOCAL_HINT.replace("en --tgt-lang de", f"{spec.src} --tgt-lang {spec.tgt}")) from None


def _expected_sha256(names: list[str]) -> dict[str, str]:
    """The hub's sha256 of each LFS file (empty when the hub does not say)."""
    from huggingface_hub import HfApi

    try:
        infos = HfApi().get_paths_info(HUB_REPO, names, revision=HUB_REVISION, repo_type="dataset")
    except Exception as exc:
        raise DownloadError(f"cannot list {HUB_REPO}@{HUB_REVISION[:8]} ({type(exc).__name__}); {_LOCAL_HINT}") from exc
    return {i.path: i.lfs.sha256 for i in infos if getattr(i, "lfs", None) is not None}


def _progress_tqdm(progress: Progress | None, label: str):
    """A tqdm class for huggingface_hub that forwards byte counts to `progress` and prints nothing itself."""
    if progress is None:
        return None
    from tqdm.auto import tqdm

    class _Forward(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["file"] = io.StringIO()
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            out = super().update(n)
            progress(label, int(self.n), int(self.total) if self.total else None)
            return out

    return _Forward
