"""Named corpora (the registry) and where their files come from: the Hugging Face hub (`hub_corpora.py`), local files,
the embedded sample. The readers of sentence pairs are in `readers.py`.

Each hub corpus is pinned to a commit of a public dataset repository whose file layout was checked against the
hub's public pages (file listings of the pinned trees, the `dataset_info` of the dataset cards): see the comment
above each entry. A corpus has a canonical direction (src -> tgt); its reverse is a second name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.data import hub_corpora as hub_
from nmt_cli.data.hub_corpora import HubFiles, Progress
from nmt_cli.data.readers import PairSource, TableSource, TextPairSource, pyarrow_parquet
from nmt_cli.errors import ConfigError, DataError

SPLITS = ("train", "valid", "test")
HUB_SPLIT = {"train": "train", "valid": "validation", "test": "test"}


@dataclass(frozen=True)
class CorpusSpec:
    """A named corpus: canonical direction (src -> tgt), sizes, standard test set, default BPE and its source."""

    name: str
    src: str
    tgt: str
    description: str
    pairs: int  # training pairs as published (before cleaning)
    vocab_size: int
    splits: dict[str, str]  # split -> what it is, e.g. "newstest2014 (3,003)"
    results: str  # the published results this test set belongs to
    hub: HubFiles | None = None
    download: str = ""  # size of the hub files, as the dataset card states it
    character_coverage: float = 1.0
    bpe_sample: int = 2_000_000


def _wmt_layout(folder: str, train_shards: int) -> dict[str, tuple[str, ...]]:
    """The layout of the converted wmt/wmtNN repositories: FOLDER/{train-i-of-n,validation-*,test-*}.parquet,
    one column `translation` = {lang: sentence}."""
    n = train_shards
    return {"train": tuple(f"{folder}/train-{i:05d}-of-{n:05d}.parquet" for i in range(n)),
            "valid": (f"{folder}/validation-00000-of-00001.parquet",),
            "test": (f"{folder}/test-00000-of-00001.parquet",)}


# wmt/wmt14 at b199e406 = "Convert dataset to Parquet (#8)"; checked: its tree de-en/ holds train-0000{0,1,2}-of-00003,
# validation-00000-of-00001 and test-00000-of-00001 .parquet, fr-en/ 30 train shards (commit "Add fr-en data
# files"); the card's dataset_info: de-en 4,508,785 / 3,000 / 3,003 pairs (download 818 MB), fr-en 40,836,715.
WMT14 = "b199e406369ec1b7634206d3ded5ba45de2fe696"
# wmt/wmt16 at 3923157a: its tree ro-en/ holds train-00000-of-00001 (108 MB), validation- and test-00000-of-00001
# .parquet (commit "Add ro-en data files"); dataset_info: 610,320 / 1,999 / 1,999 pairs, download 109 MB.
WMT16 = "3923157a85dd2f15031c2b4657a7ba7193237544"
# wmt/wmt17 at 4d4005cd: its tree de-en/ holds train-0000{0..3}-of-00004, validation- and test-00000-of-00001
# .parquet (commit "Add de-en data files"); dataset_info: 5,906,184 / 2,999 / 3,004 pairs, download 1.01 GB.
WMT17 = "4d4005cd782764492c32328b406483170bc41f25"
# IWSLT/iwslt2017 is a loading script; its parquet export lives on the refs/convert/parquet branch: commit 3309978
# ("Update parquet files") renamed iwslt2017-de-en/iwslt2017-{train,validation,test}.parquet to {split}/0000.parquet
# (checked: the trees of iwslt2017-de-en/train and /validation, train 26.4 MB); 9ca48082, the branch's head when
# checked ("Delete old duckdb index files"), only removed index files. 206,112 / 888 / 8,079 pairs: dev2010 as
# validation, tst2010-2015 concatenated as test, as the loading script builds them.
IWSLT17 = "9ca48082a7aae6d0a9d18efb292c50eacd10d2e8"

CORPORA = {
    "wmt14-en-de": CorpusSpec(
        "wmt14-en-de", "en", "de", "WMT14 English-German (the paper's base/big en-de data)", 4_508_785, 37000,
        {"train": "Europarl v7, Common Crawl, News Commentary v9", "valid": "newstest2013 (3,000)",
         "test": "newstest2014 (3,003)"},
        "Vaswani et al. 2017: base 27.3, big 28.4 BLEU (tokenized, compound-split); Ott et al. 2018: 29.3",
        HubFiles("wmt/wmt14", WMT14, _wmt_layout("de-en", 3)), "818 MB", character_coverage=0.9999),
    "wmt14-en-fr": CorpusSpec(
        "wmt14-en-fr", "en", "fr", "WMT14 English-French (the paper's en-fr data)", 40_836_715, 32000,
        {"train": "Europarl, Common Crawl, UN, News Commentary, Gigaword", "valid": "newstest2013 (3,000)",
         "test": "newstest2014 (3,003)"},
        "Vaswani et al. 2017: base 38.1, big 41.8 BLEU; Ott et al. 2018: 43.2",
        HubFiles("wmt/wmt14", WMT14, _wmt_layout("fr-en", 30)), "30 shards", character_coverage=0.9999),
    "wmt16-en-ro": CorpusSpec(
        "wmt16-en-ro", "en", "ro", "WMT16 English-Romanian (Europarl v8, SETimes2)", 610_320, 32000,
        {"train": "Europarl v8, SETimes2", "valid": "newsdev2016 (1,999)", "test": "newstest2016 (1,999)"},
        "Sennrich et al. 2016 (WMT16 Edinburgh): en->ro 28.1, ro->en 33.3 BLEU",
        HubFiles("wmt/wmt16", WMT16, _wmt_layout("ro-en", 1)), "109 MB", character_coverage=0.9999),
    "wmt17-en-de": CorpusSpec(
        "wmt17-en-de", "en", "de", "WMT17 English-German (WMT14's data with News Commentary v12, Rapid)",
        5_906_184, 37000,
        {"train": "Europarl v7, Common Crawl, News Commentary v12, Rapid 2016", "valid": "newstest2016 (2,999)",
         "test": "newstest2017 (3,004)"},
        "WMT17 news task (Bojar et al. 2017); Sennrich et al. 2017 (Edinburgh's WMT17 systems)",
        HubFiles("wmt/wmt17", WMT17, _wmt_layout("de-en", 4)), "1.01 GB", character_coverage=0.9999),
    "iwslt17-de-en": CorpusSpec(
        "iwslt17-de-en", "de", "en", "IWSLT 2017 German-English TED talks (small: trains in hours on a GPU)",
        206_112, 10000,
        {"train": "TED talks", "valid": "dev2010 (888)", "test": "tst2010-2015 (8,079)"},
        "IWSLT 2017 evaluation campaign (Cettolo et al. 2017); licence CC BY-NC-ND 4.0",
        HubFiles("IWSLT/iwslt2017", IWSLT17,
                 {s: (f"iwslt2017-de-en/{HUB_SPLIT[s]}/0000.parquet",) for s in SPLITS}), "28 MB"),
    "sample": CorpusSpec(
        "sample", "en", "de", "embedded English-German sample written for nmt (offline; for the demo)",
        30_000, 2000, {"train": "generated", "valid": "generated (800)", "test": "generated (800)"},
        "make demo: sacreBLEU 99.8 (docs/results.md#quality)"),
}
REVERSED = {"wmt14-de-en": "wmt14-en-de", "wmt14-fr-en": "wmt14-en-fr", "wmt16-ro-en": "wmt16-en-ro",
            "wmt17-de-en": "wmt17-en-de", "iwslt17-en-de": "iwslt17-de-en"}


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
    names = [(n, n, False) for n in CORPORA] + [(alias, target, True) for alias, target in REVERSED.items()]
    for name, target, rev in sorted(names, key=lambda x: (x[1] != "sample", x[1], x[2])):
        spec = CORPORA[target]
        if rev:
            source = f"= {target} --reverse"
        elif spec.hub:
            folder = spec.hub.names()[0].split("/")[0]
            source = f"hf://{spec.hub.repo}/{folder}@{spec.hub.revision[:8]}" + (
                f" ({spec.download})" if spec.download else "")
        else:
            source = "built in"
        rows.append({"name": name, "direction": f"{spec.tgt}->{spec.src}" if rev else f"{spec.src}->{spec.tgt}",
                     "pairs": f"{spec.pairs:,}", "valid / test": f"{spec.splits['valid']} / {spec.splits['test']}",
                     "vocab": spec.vocab_size, "published results": spec.results, "source": source,
                     "description": spec.description})
    rows.append({"name": "custom", "direction": "--src-lang -> --tgt-lang", "pairs": "-",
                 "valid / test": "your files", "vocab": 8000, "published results": "-",
                 "source": "--train/--valid/--test PREFIX", "description": "local text files"})
    return rows


# ------------------------------------------------------------------------------------------ source choice


def text_sources(prefixes: dict[str, str | os.PathLike], src: str, tgt: str, errors: str) -> dict[str, PairSource]:
    """{split: TextPairSource(PREFIX.src, PREFIX.tgt)} for the given prefixes."""
    return {split: TextPairSource(split, f"{prefix}.{src}", f"{prefix}.{tgt}", errors)
            for split, prefix in prefixes.items()}


def from_dir_sources(spec: CorpusSpec, directory: str | os.PathLike, errors: str) -> dict[str, PairSource]:
    """A pre-downloaded named corpus: DIR/{train,valid,test}.{src,tgt} text files, or the hub layout: the pinned
    file names under DIR (e.g. from `hf download wmt/wmt14 --repo-type dataset --include 'de-en/*' --local-dir
    DIR`), under DIR without their first folder, or *.parquet / *.jsonl files named by split."""
    d = Path(directory)
    if not d.is_dir():
        raise DataError(f"--from-dir {d} is not a directory")
    if all((d / f"{s}.{spec.src}").exists() for s in SPLITS):
        return text_sources({s: d / s for s in SPLITS}, spec.src, spec.tgt, errors)
    out: dict[str, PairSource] = {}
    for split in SPLITS:
        files = _hub_layout_files(spec, d, split)
        if not files:
            example = spec.hub.files[split][0] if spec.hub else f"{HUB_SPLIT[split]}-*.parquet"
            raise DataError(f"--from-dir {d}: found neither {split}.{spec.src}/{split}.{spec.tgt} nor {example}")
        out[split] = TableSource(split, files, spec.src, spec.tgt)
    return out


def _hub_layout_files(spec: CorpusSpec, d: Path, split: str) -> list[Path]:
    if spec.hub:
        names = spec.hub.files[split]
        for rel in (names, [n.split("/", 1)[-1] for n in names]):
            if all((d / r).is_file() for r in rel):
                return [d / r for r in rel]
    folder = d / (spec.hub.names()[0].split("/")[0] if spec.hub else "")
    for pattern in (f"{HUB_SPLIT[split]}-*.parquet", f"{HUB_SPLIT[split]}-*.jsonl", f"{HUB_SPLIT[split]}.jsonl"):
        files = sorted(folder.glob(pattern)) or sorted(d.glob(pattern))
        if files:
            return files
    return []


def local_hint(spec: CorpusSpec, name: str) -> str:
    """How to prepare `spec` without the hub (ends the one-line download errors; `nmt prepare --help` and
    docs/prepare.md say how to download the files elsewhere)."""
    return f"download the files where there is network and pass them: nmt prepare {name} --from-dir DIR"


def hub_sources(spec: CorpusSpec, name: str, progress: Progress | None = None, cache_dir=None,
                warn: hub_.Warn | None = None) -> dict[str, PairSource]:
    """The pinned hub files of `spec` (checked in the cache, or downloaded), as {split: TableSource}. The parquet
    reader is imported first: nothing is downloaded that could not be read."""
    assert spec.hub is not None
    pyarrow_parquet()
    paths = hub_.fetch(spec.hub, cache_dir, progress, warn, hint=local_hint(spec, name))
    return {split: TableSource(split, files, spec.src, spec.tgt) for split, files in paths.items()}
