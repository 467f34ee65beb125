"""`nmt prepare` of several directions into one data directory: the data of one multilingual model.

    nmt prepare custom --pairs en-de,en-fr,en-cs --train PREFIX --valid PREFIX -o DIR   (PREFIX.en shared)
    nmt prepare wmt14-en-de,wmt14-en-fr -o DIR                                          (named corpora combined)

The tag convention is OPUS-MT's (Marian's): with two or more target languages, the target language's `>>xx<<` tag
starts the source, so exports to CTranslate2 and MarianMT read it unchanged and `nmt translate --tgt-lang` is the
same for nmt's models and imported OPUS-MT ones. A model of one target language (many-to-one) has no tags.

Steps, as for one direction (prepare.py):
  1. check    every direction's inputs opened and counted before anything is written
  2. bpe      one sentencepiece BPE over all languages, learned on a sample balanced across languages by
              temperature (below); the tags are user-defined symbols: whole pieces that never split
  3. encode   each direction cleaned as for one direction, its sources tagged, appended to {split}.src/.tgt
              (the raw kept text to raw/{split}.{src}-{tgt}.{lang})
  4. manifest with each direction's counts, the rows it occupies and the tag convention

Temperature: language l with n_l sentences is sampled with probability proportional to (n_l / n) ** (1 / T). T = 1
samples as the data is (a language with 1% of the text gets 1% of the vocabulary's evidence, and its words are cut
into characters); T = inf samples languages equally. T = 5 is the value of Arivazhagan et al. (2019, "Massively
Multilingual Neural Machine Translation in the Wild") and M2M-100 (Fan et al., 2020), whose vocabularies and
training batches are drawn that way: small languages are raised a lot and big ones still get more.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt_cli import atomic
from nmt_cli.data import readers
from nmt_cli.data.clean import CleanConfig, CleanCounts, Normalizer, length_mask, text_filter
from nmt_cli.data.hub_corpora import Progress
from nmt_cli.data.readers import PairSource
from nmt_cli.data.store import MANIFEST, SPM_MODEL, SPM_TARGET, VOCAB_JSON, BinaryWriter
from nmt_cli.data.tokenizer import Tokenizer, train_bpe
from nmt_cli.errors import ConfigError, DataError

TEMPERATURE = 5.0  # of the BPE sample over languages (see the module's docstring); nmt train's default too
SIDES = ("src", "tgt")  # the file names of a multilingual directory's sides: {split}.src.bin, {split}.tgt.bin


@dataclass
class Direction:
    """One direction of the data: its corpus name, languages, inputs per split, and its tag (None: one target)."""

    name: str
    src: str
    tgt: str
    sources: dict[str, PairSource]
    file_langs: tuple[str, str]  # the languages of the sources' two sides, as read
    vocab_size: int
    coverage: float
    bpe_sample: int
    origin: dict
    tag: str | None = None

    @property
    def key(self) -> str:
        return f"{self.src}-{self.tgt}"


def is_multilingual(opts) -> bool:
    return bool(opts.pairs) or "," in (opts.corpus or "")


def parse_pairs(pairs: str) -> list[tuple[str, str]]:
    """`en-de,en-fr` -> [("en", "de"), ("en", "fr")]; a ConfigError naming a malformed or repeated pair."""
    out: list[tuple[str, str]] = []
    for item in pairs.split(","):
        parts = item.strip().split("-")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"--pairs: {item.strip()!r} is not a pair SRC-TGT (e.g. --pairs en-de,en-fr)")
        a, b = parts
        if a == b:
            raise ConfigError(f"--pairs: {item.strip()} has the same language on both sides")
        if (a, b) in out:
            raise ConfigError(f"--pairs: {a}-{b} is given twice")
        out.append((a, b))
    return out


def plan_directions(opts, plan_one, progress: Progress | None, warn) -> list[Direction]:
    """The directions of a multilingual `nmt prepare`, each planned as a one-direction run would be (`plan_one`:
    prepare._plan), their tags set when there are several target languages."""
    if opts.pairs and opts.corpus != "custom":
        raise ConfigError("--pairs is for nmt prepare custom; combine named corpora by name instead "
                          "(nmt prepare wmt14-en-de,wmt14-en-fr -o DIR)")
    if opts.tokenizer_from is not None:
        raise ConfigError("--tokenizer-from takes one model's tokenizer, which has no tags for the directions of "
                          "new data; prepare several directions without it")
    if opts.pairs:
        if opts.src_lang or opts.tgt_lang:
            raise ConfigError("--pairs names the directions; drop --src-lang and --tgt-lang")
        runs = [dataclasses.replace(opts, pairs=None, src_lang=a, tgt_lang=b) for a, b in parse_pairs(opts.pairs)]
    else:
        names = [n.strip() for n in opts.corpus.split(",")]
        if any(n == "custom" or not n for n in names):
            raise ConfigError("combine named corpora (nmt prepare wmt14-en-de,wmt14-en-fr); for your own files use "
                              "nmt prepare custom --pairs en-de,en-fr --train PREFIX ...")
        if len(set(names)) != len(names):
            raise ConfigError(f"{opts.corpus}: a corpus is named twice")
        if opts.src_lang or opts.tgt_lang or opts.train or opts.from_dir:
            raise ConfigError("combined corpora are read as named (their own directions); drop --src-lang, "
                              "--tgt-lang, --train/--valid/--test and --from-dir")
        runs = [dataclasses.replace(opts, corpus=n) for n in names]
    directions = []
    for run in runs:
        p = plan_one(run, progress, warn)
        name = p.name if not opts.pairs else f"custom {run.src_lang}-{run.tgt_lang}"
        directions.append(Direction(name, p.src, p.tgt, p.sources, p.file_langs, p.vocab_size, p.coverage,
                                    p.bpe_sample, p.origin))
    keys = [d.key for d in directions]
    for k in keys:
        if keys.count(k) > 1:
            raise ConfigError(f"two corpora give the direction {k}; keep one")
    targets = list(dict.fromkeys(d.tgt for d in directions))
    if len(targets) > 1:
        for d in directions:
            d.tag = f">>{d.tgt}<<"
    return directions


def weights(sizes: dict[str, int], temperature: float) -> dict[str, float]:
    """Sampling probabilities of each key (a language, a direction) from its size: (n_k / n) ** (1 / T),
    normalized. T = 1: as the data is; T -> inf: uniform."""
    total = sum(sizes.values())
    raw = {k: (n / total) ** (1.0 / temperature) if n else 0.0 for k, n in sizes.items()}
    norm = sum(raw.values())
    return {k: v / norm for k, v in raw.items()}


def _side_streams(directions: list[Direction], totals: dict[str, dict[str, int]]) -> dict[str, list[tuple]]:
    """{language: [(source, side index, lines)]} of the training data, a file shared by several directions (the
    English of en-de and en-fr in one PREFIX.en) once."""
    streams: dict[str, list[tuple]] = {}
    seen: set = set()
    for d in directions:
        source = d.sources["train"]
        for side, lang in enumerate(d.file_langs):
            paths = getattr(source, "paths", None)
            ident = str(Path(paths[side]).resolve()) if paths else (d.key, side)
            if ident in seen:
                continue
            seen.add(ident)
            streams.setdefault(lang, []).append((source, side, totals[d.key]["train"]))
    return streams


def bpe_sample(directions: list[Direction], totals: dict[str, dict[str, int]], k: int, seed: int, chunk: int,
               normalize: bool, counter: list[int]):
    """Sentences to learn the joint BPE from: k in all, each language's share by temperature (`weights`), drawn
    uniformly from its lines (at most all of them); streamed, one chunk held at a time."""
    streams = _side_streams(directions, totals)
    sizes = {lang: sum(n for *_, n in s) for lang, s in streams.items()}
    shares = weights(sizes, TEMPERATURE)
    rng = np.random.default_rng(seed)
    for lang, lang_streams in streams.items():
        want = min(sizes[lang], max(1, round(k * shares[lang])))
        norm = Normalizer(lang, lang, normalize)
        for source, side, n in lang_streams:  # the language's lines spread over its streams by their sizes
            take = min(n, round(want * n / sizes[lang]))
            picked = np.sort(rng.choice(n, size=take, replace=False)) if take < n else np.arange(n)
            start, j = 0, 0
            for pair in source.chunks(chunk):
                lines = pair[side]
                end = start + len(lines)
                hi = int(np.searchsorted(picked, end))
                chosen = [lines[i - start] for i in picked[j:hi].tolist()]
                j, start = hi, end
                for x in norm(chosen, chosen)[0]:
                    if x := x.strip():
                        counter[0] += 1
                        yield x
                if j >= len(picked):
                    break


def learn_bpe(opts, directions: list[Direction], totals, out: Path, stamps, workers: int, digest,
              progress: Progress | None, reused: list[str]) -> Tokenizer:
    """Step 2: one BPE model over every language (reused when its inputs and options match), tags as symbols."""
    vocab = opts.vocab_size or max(d.vocab_size for d in directions)
    coverage = min(d.coverage for d in directions)
    sample = opts.bpe_sample or max(d.bpe_sample for d in directions)
    tags = [d.tag for d in directions if d.tag]
    key = digest({"v": 1, "inputs": [d.sources["train"].fingerprint() for d in directions], "vocab": vocab,
                  "sample": sample, "seed": opts.seed, "norm": opts.normalize_punct, "coverage": coverage,
                  "errors": opts.errors, "tags": tags, "temperature": TEMPERATURE})
    spm_path = out / SPM_MODEL
    if stamps.get("bpe", key, [spm_path]):
        reused.append("bpe")
        model_bytes = spm_path.read_bytes()
    else:
        stamps.drop("bpe")
        given = [0]
        if progress:
            progress("learn bpe", 0, None)
        model_bytes = train_bpe(bpe_sample(directions, totals, sample, opts.seed, opts.chunk_size,
                                           opts.normalize_punct, given),
                                vocab, character_coverage=coverage, num_threads=workers, symbols=tags)
        atomic.write_bytes(spm_path, model_bytes)
        stamps.put("bpe", key, {"sentences": given[0]})
    for stale in (SPM_TARGET, VOCAB_JSON):
        (out / stale).unlink(missing_ok=True)
    return Tokenizer(model_bytes)


def encode_split(split: str, directions: list[Direction], tok: Tokenizer, out: Path, cfg: CleanConfig,
                 normalize: bool, workers: int, chunk: int, totals, progress: Progress | None) -> dict:
    """Step 3 for one split: every direction that has it, cleaned as one direction is, its sources tagged, one
    after the other into {split}.src/.tgt; -> {direction: counts, tokens, start row} and the inputs' checksums."""
    raw_dir = out / "raw"
    raw_dir.mkdir(exist_ok=True)
    writers = [BinaryWriter(out / f"{split}.{side}", tok.vocab_size) for side in SIDES]
    raws: list[Path] = []
    per: dict[str, dict] = {}
    try:
        for d in directions:
            if split not in d.sources:
                continue
            a, b = d.file_langs
            flip = a != d.src  # a named corpus read in its own order, trained the other way
            tag = [] if d.tag is None else [tok.sp.piece_to_id(d.tag)]
            counts, start = CleanCounts(), writers[0].n_sentences
            tokens = [writers[0].n_tokens, writers[1].n_tokens]
            normalizer = Normalizer(d.src, d.tgt, normalize)
            paths = [raw_dir / f"{split}.{d.key}.{lang}.tmp" for lang in (d.src, d.tgt)]
            raws += paths
            with open(paths[0], "w", encoding="utf-8") as fs, open(paths[1], "w", encoding="utf-8") as ft:
                for x, y in d.sources[split].chunks(chunk):
                    src, tgt = (y, x) if flip else (x, y)
                    src, tgt = text_filter(src, tgt, counts, drop_empty=split == "train")
                    src, tgt = normalizer(src, tgt)
                    ids_s, ids_t = tok.encode(src, num_threads=workers), tok.encode(tgt, num_threads=workers)
                    if split == "train":
                        keep = length_mask(np.fromiter(map(len, ids_s), np.int64, len(ids_s)),
                                           np.fromiter(map(len, ids_t), np.int64, len(ids_t)), cfg, counts)
                        idx = np.flatnonzero(keep).tolist()
                        src, tgt = [src[i] for i in idx], [tgt[i] for i in idx]
                        ids_s, ids_t = [ids_s[i] for i in idx], [ids_t[i] for i in idx]
                    writers[0].add_many([tag + ids for ids in ids_s])
                    writers[1].add_many(ids_t)
                    for f, lines in ((fs, src), (ft, tgt)):
                        if lines:
                            f.write("\n".join(lines) + "\n")
                    counts.kept += len(src)
                    if progress:
                        progress(f"encode {split} {d.key}", counts.read, totals[d.key][split])
            if counts.read != totals[d.key][split]:
                raise DataError(f"{d.name} {split}: read {counts.read} pairs but counted {totals[d.key][split]} "
                                "before; the input changed while nmt prepare was reading it")
            per[d.key] = {"counts": counts.to_dict(), "start": start,
                          "tokens": [writers[0].n_tokens - tokens[0], writers[1].n_tokens - tokens[1]],
                          "inputs": d.sources[split].checksums}
    except BaseException:
        for w in writers:
            w.abort()
        for p in raws:
            p.unlink(missing_ok=True)
        raise
    for w in writers:
        w.close()
    for p in raws:
        p.replace(p.with_suffix(""))
    return per


def split_files(out: Path, split: str, directions: list[Direction]) -> list[Path]:
    return [out / f"{split}.{side}.{ext}" for side in SIDES for ext in ("bin", "idx")] + \
           [out / "raw" / f"{split}.{d.key}.{lang}" for d in directions if split in d.sources
            for lang in (d.src, d.tgt)]


def manifest_fields(directions: list[Direction], results: dict[str, dict]) -> dict:
    """What a multilingual manifest has beyond one direction's: each direction's rows and counts, the tags, and
    the totals per split that nmt train reads as for one direction."""
    langs = lambda side: list(dict.fromkeys(getattr(d, side) for d in directions))  # noqa: E731
    src, tgt = langs("src"), langs("tgt")
    splits, dirs = {}, []
    for d in directions:
        entry = {"src": d.src, "tgt": d.tgt, "tag": d.tag, "corpus": d.name, "origin": d.origin, "splits": {}}
        for split, per in results.items():
            if d.key not in per:
                continue
            r = per[d.key]
            c = r["counts"]
            entry["splits"][split] = {"start": r["start"], "read": c["read"], "kept": c["kept"],
                                      "dropped": c["dropped"], "src_tokens": r["tokens"][0],
                                      "tgt_tokens": r["tokens"][1]}
        dirs.append(entry)
    for split in results:
        rows = [e["splits"][split] for e in dirs if split in e["splits"]]
        splits[split] = {"read": sum(r["read"] for r in rows), "kept": sum(r["kept"] for r in rows),
                         "dropped": {k: sum(r["dropped"][k] for r in rows) for k in rows[0]["dropped"]},
                         "src_tokens": sum(r["src_tokens"] for r in rows),
                         "tgt_tokens": sum(r["tgt_tokens"] for r in rows)}
    tags = {d.tgt: d.tag for d in directions if d.tag}
    return {
        "src_lang": src[0] if len(src) == 1 else "mul", "tgt_lang": tgt[0] if len(tgt) == 1 else "mul",
        "sides": list(SIDES), "splits": splits, "directions": dirs,
        "tags": {"convention": "opus-mt", "where": "the target language's tag starts the source",
                 "tags": tags} if tags else None,
        "corpus": ",".join(dict.fromkeys(d.name.split(" ")[0] for d in directions)),
    }


def write_manifest(out: Path, manifest: dict) -> None:
    atomic.write_text(out / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def checksums(out: Path, results: dict, directions: list[Direction]) -> dict:
    files = [out / SPM_MODEL] + [f for split in results for f in split_files(out, split, directions)[:4]]
    return {f.name: "sha256:" + readers.sha256_file(f) for f in files}



def sampled_rows(manifest: dict, temperature: float, seed: int) -> np.ndarray | None:
    """The training rows of one epoch of a multilingual directory, each direction's share of them by temperature
    over the directions' sizes (`weights`); None for one direction. Only ever up-sampled: every pair is in every
    epoch, and a smaller direction is repeated (whole copies and a random remainder, drawn with `seed`) until the
    shares are the temperature's, so no data is left out and the batches are made once."""
    dirs = [d for d in manifest.get("directions", []) if "train" in d["splits"]]
    if len(dirs) < 2:
        return None
    sizes = {f"{d['src']}-{d['tgt']}": int(d["splits"]["train"]["kept"]) for d in dirs}
    shares = weights(sizes, temperature)
    scale = max(n / shares[k] for k, n in sizes.items() if n)  # rows per unit of share: the largest n / q
    rng = np.random.default_rng(seed)
    parts = []
    for d in dirs:
        n, start = sizes[f"{d['src']}-{d['tgt']}"], int(d["splits"]["train"]["start"])
        if not n:
            continue
        want = max(n, round(scale * shares[f"{d['src']}-{d['tgt']}"]))
        copies, rest = divmod(want, n)
        rows = np.concatenate([np.tile(np.arange(n), copies), np.sort(rng.choice(n, size=rest, replace=False))])
        parts.append(start + rows)
    return np.concatenate(parts)
