"""Named corpora (the registry) and where their files come from (Hugging Face hub, local files, the embedded
sample); the readers of sentence pairs are in `readers.py`."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from nmt_cli.data.readers import PairSource, TableSource, TextPairSource, sha256_file
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
