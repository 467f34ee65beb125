"""A WMT-sized English-German corpus synthesised from the real corpora in ../shared/data, laid out as the pinned
wmt/wmt14 de-en files in a huggingface_hub cache, so `nmt prepare wmt14-en-de` runs on it offline exactly as on
the real download (same shards, parquet, cache check, vocabulary, BPE sample).

The real data cannot be downloaded here. Training pairs cycle through Europarl v7 (20,000 pairs, part of WMT14's
training data) and IWSLT16 TED talks (19,689 pairs); every pair is varied so that the corpus is not 100 copies of
40k sentences: each number gets a new random value (the same on both sides), and each capitalised word found on
both sides (names: "Herr Barroso" / "Mr Barroso") is replaced, with probability 0.7, by a generated name from a
pool of 500,000. The vocabulary and the sentence lengths stay those of real parliament and TED text; BPE, the
encoder and the length filter see realistic input. Valid and test are the real newstest2013 and newstest2014.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

from nmt_cli.data.readers import sha256_file

REVISION = "b199e406369ec1b7634206d3ded5ba45de2fe696"  # the revision nmt pins for wmt14 (nmt_cli.data.corpora)
FOLDER = "de-en"
SHARDS = 3
_NUM = re.compile(r"\d+")
_CAP = re.compile(r"\b[A-Z][a-z]{3,}\b")
_SYL = ("ka ro mi ne lu ta vo se di ba fe gu ho ji ki la ma no pe ri su te vi wa ze an el in or us "
        "ber dor gan hel kin lor mar nor pol rin sar tor val win").split()


def pool(data: Path) -> list[tuple[str, str]]:
    """(en, de) pairs of Europarl v7 (first 20k) and the IWSLT16 training sample, non-empty."""
    pairs = []
    for src, tgt in ((data / "europarl_v7_ende_20k/train.en", data / "europarl_v7_ende_20k/train.de"),
                     (data / "iwslt16_deen/train_sample.en", data / "iwslt16_deen/train_sample.de")):
        en = src.read_text(encoding="utf-8").splitlines()
        de = tgt.read_text(encoding="utf-8").splitlines()
        pairs += [(e.strip(), d.strip()) for e, d in zip(en, de, strict=True) if e.strip() and d.strip()]
    return pairs


def names(n: int, rng: random.Random) -> list[str]:
    return ["".join(rng.choice(_SYL) for _ in range(rng.randint(2, 4))).capitalize() for _ in range(n)]


def vary(en: str, de: str, rng: random.Random, name_pool: list[str]) -> tuple[str, str]:
    """The pair with new numbers and some names replaced, consistently on both sides."""
    mapping = {}
    for num in set(_NUM.findall(en)) | set(_NUM.findall(de)):
        mapping[num] = str(rng.randrange(10 ** max(len(num) - 1, 0), 10 ** len(num)))
    for word in set(_CAP.findall(en)) & set(_CAP.findall(de)):
        if rng.random() < 0.7:
            mapping[word] = rng.choice(name_pool)
    if not mapping:
        return en, de
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda m: mapping[m.group(1)], en), pattern.sub(lambda m: mapping[m.group(1)], de)


def write_cache(cache: Path, n_pairs: int, data: Path, seed: int = 1, batch: int = 100_000) -> dict:
    """Write the synthesised corpus into `cache` as wmt/wmt14 at REVISION; returns counts and sizes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    base = pool(data)
    name_pool = names(500_000, rng)
    struct = pa.struct([("de", pa.string()), ("en", pa.string())])
    repo = cache / "datasets--wmt--wmt14"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    files = {}
    words = 0
    per_shard = -(-n_pairs // SHARDS)
    i = 0
    for shard in range(SHARDS):
        tmp = repo / "blobs" / f"shard{shard}.tmp"
        with pq.ParquetWriter(tmp, pa.schema([("translation", struct)])) as writer:
            end = min(n_pairs, (shard + 1) * per_shard)
            while i < end:
                rows = []
                for _ in range(min(batch, end - i)):
                    en, de = vary(*base[i % len(base)], rng, name_pool)
                    words += en.count(" ") + 1
                    rows.append({"de": de, "en": en})
                    i += 1
                writer.write_table(pa.table({"translation": pa.array(rows, type=struct)}))
        files[f"{FOLDER}/train-{shard:05d}-of-{SHARDS:05d}.parquet"] = tmp
    for split, name in (("validation", "valid"), ("test", "test")):
        en = (data / f"wmt14_newstest_ende/{name}.en").read_text(encoding="utf-8").splitlines()
        de = (data / f"wmt14_newstest_ende/{name}.de").read_text(encoding="utf-8").splitlines()
        tmp = repo / "blobs" / f"{split}.tmp"
        pq.write_table(pa.table({"translation": pa.array([{"de": d, "en": e} for e, d in zip(en, de, strict=True)],
                                                         type=struct)}), tmp)
        files[f"{FOLDER}/{split}-00000-of-00001.parquet"] = tmp
    size = 0
    for name, tmp in files.items():  # blobs named by sha256, snapshot links: the client's own layout
        sha = sha256_file(tmp)
        blob = repo / "blobs" / sha
        shutil.move(tmp, blob)
        size += blob.stat().st_size
        link = repo / "snapshots" / REVISION / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return {"pairs": n_pairs, "parquet_bytes": size, "en_words_per_pair": words / max(n_pairs, 1),
            "distinct_base_pairs": len(base)}
