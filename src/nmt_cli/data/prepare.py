"""The `nmt prepare` pipeline: read -> clean -> learn joint BPE -> encode -> binarize -> manifest.

Steps and their reuse:
  1. check   every input is opened and counted before anything is written (line counts must match).
  2. bpe     joint sentencepiece BPE on a bounded uniform sample of the training pairs (both sides) -> spm.model
  3. encode  per split, streaming in chunks: clean, encode on all cores, append to {split}.{lang}.bin/.idx and
             the kept raw text to raw/{split}.{lang}
  4. manifest.json, written last and atomically: a directory without it is never trusted.
Each finished step leaves a stamp in `.steps/` (its options and input fingerprints); a re-run with the same
options and inputs reuses the step, `force=True` redoes it. Every file is written under a temporary name and
renamed when complete, so an interrupted run never leaves a file that a later run trusts.
Memory stays bounded: only one chunk of pairs (and the BPE sample) is held at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from nmt_cli import atomic
from nmt_cli.data import corpora, multilingual, readers, shortlist
from nmt_cli.data import sample_corpus as sample
from nmt_cli.data.clean import CleanConfig, CleanCounts, Normalizer, length_mask, text_filter
from nmt_cli.data.hub_corpora import Progress, Warn
from nmt_cli.data.readers import PairSource
from nmt_cli.data.store import MANIFEST, SPM_MODEL, SPM_TARGET, VOCAB_JSON, BinaryWriter, ParallelData
from nmt_cli.data.tokenizer import Tokenizer, train_bpe
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.runtime import cpus

FORMAT_VERSION = 1
STEPS_DIR = ".steps"
DEFAULT_CUSTOM_VOCAB = 8000


@dataclass
class PrepareOptions:
    """Everything `nmt prepare` can be told. `train`/`valid`/`test` are file prefixes (PREFIX.lang)."""

    corpus: str
    out_dir: str
    src_lang: str | None = None
    tgt_lang: str | None = None
    pairs: str | None = None  # custom data of several directions, "en-de,en-fr" (data/multilingual.py)
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    from_dir: str | None = None
    reverse: bool = False
    vocab_size: int | None = None
    tokenizer_from: str | None = None  # encode with this model's tokenizer (checkpoint, MarianMT, hf:) instead of BPE
    max_len: int = 250
    ratio: float = 1.5
    normalize_punct: bool = False
    bpe_sample: int | None = None  # max sentences (both sides together) for learning BPE
    workers: int = 0  # 0: all cores
    errors: str = "strict"
    force: bool = False
    seed: int = 1
    chunk_size: int = 50_000
    sample_sizes: dict[str, int] | None = None  # sample corpus only (tests use smaller ones)
    cache_dir: str | None = None  # huggingface_hub cache

    def __post_init__(self):
        if self.errors not in ("strict", "replace"):
            raise ConfigError(f"--errors must be strict or replace, not {self.errors!r}")
        if self.tokenizer_from is not None and self.vocab_size is not None:
            raise ConfigError("--tokenizer-from takes the model's vocabulary; drop --vocab-size")
        if self.vocab_size is not None and self.vocab_size < 8:
            raise ConfigError(f"--vocab-size {self.vocab_size} is too small; use at least a few hundred")
        if self.max_len < 1 or self.ratio < 1 or self.chunk_size < 1:
            raise ConfigError("--max-len must be >= 1 and --ratio >= 1")


@dataclass
class PrepareResult:
    out_dir: Path
    manifest: dict
    reused: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    cpu: dict[str, float] = field(default_factory=dict)  # process CPU seconds (all threads) per stage


# -------------------------------------------------------------------------------------------- planning


@dataclass
class _Plan:
    name: str
    file_langs: tuple[str, str]  # languages of the corpus sides as read
    src: str  # model source language
    tgt: str
    vocab_size: int
    coverage: float
    bpe_sample: int
    sources: dict[str, PairSource]
    origin: dict = field(default_factory=dict)


def _plan(opts: PrepareOptions, progress: Progress | None, warn: Warn | None) -> _Plan:
    spec, reversed_name = corpora.resolve(opts.corpus)
    local = {s: getattr(opts, s) for s in corpora.SPLITS if getattr(opts, s)}
    if spec is None:  # custom
        if not (opts.src_lang and opts.tgt_lang):
            raise ConfigError("nmt prepare custom needs --src-lang and --tgt-lang (e.g. --src-lang en --tgt-lang de)")
        if "train" not in local or "valid" not in local:
            raise ConfigError("nmt prepare custom needs --train PREFIX and --valid PREFIX (files PREFIX.<lang>); "
                              "--test PREFIX is optional")
        a, b = opts.src_lang, opts.tgt_lang
        if a == b:
            raise ConfigError(f"--src-lang and --tgt-lang are both '{a}'")
        sources = corpora.text_sources(local, a, b, opts.errors)
        vocab, coverage, bpe_sample = DEFAULT_CUSTOM_VOCAB, 1.0, 2_000_000
        origin = {"kind": "local", "prefixes": local}
    else:
        a, b = spec.src, spec.tgt
        for flag, lang in (("--src-lang", opts.src_lang), ("--tgt-lang", opts.tgt_lang)):
            if lang and lang not in (a, b):
                raise ConfigError(f"{flag} {lang} is not a language of {spec.name} ({a}, {b})")
        vocab, coverage, bpe_sample = spec.vocab_size, spec.character_coverage, spec.bpe_sample
        if local:
            if "train" not in local or "valid" not in local:
                raise ConfigError("local files for a named corpus need at least --train and --valid prefixes")
            sources = corpora.text_sources(local, a, b, opts.errors)
            origin = {"kind": "local", "prefixes": local}
        elif opts.from_dir:
            sources = corpora.from_dir_sources(spec, opts.from_dir, opts.errors)
            origin = {"kind": "from-dir", "dir": str(Path(opts.from_dir).resolve())}
        elif spec.name == "sample":
            sizes = opts.sample_sizes or sample.DEFAULT_SIZES
            splits = sample.generate(sizes, sample.DEFAULT_SEED)
            ident = {"generator": "nmt_cli.data.sample_corpus", "version": sample.SAMPLE_VERSION,
                     "seed": sample.DEFAULT_SEED, "sizes": sizes}
            sources = {s: readers.MemorySource(s, pairs, {**ident, "split": s}) for s, pairs in splits.items()}
            origin = {"kind": "generated", **ident}
        else:
            sources = corpora.hub_sources(spec, opts.corpus, progress, opts.cache_dir, warn)
            origin = {"kind": "hub", "repo": spec.hub.repo, "revision": spec.hub.revision,
                      "files": {split: list(names) for split, names in spec.hub.files.items()}}
    src, tgt = (a, b)
    if opts.src_lang and spec is not None and opts.src_lang != a:
        src, tgt = b, a
    if reversed_name != opts.reverse:
        src, tgt = tgt, src
    return _Plan(opts.corpus, (a, b), src, tgt, opts.vocab_size or vocab, coverage,
                 opts.bpe_sample or bpe_sample, sources, origin)


# ------------------------------------------------------------------------------------------------ steps


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


class _Stamps:
    """Per-step stamps in OUT/.steps/: {key, ...result}; a step is reused when its key and files match."""

    def __init__(self, out: Path, force: bool):
        self.dir = out / STEPS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.force = force

    def get(self, step: str, key: str, files: list[Path]) -> dict | None:
        path = self.dir / f"{step}.json"
        if self.force or not path.exists() or not all(f.exists() for f in files):
            return None
        try:
            stamp = json.loads(path.read_text())
        except json.JSONDecodeError:
            return None
        return stamp if stamp.get("key") == key else None

    def put(self, step: str, key: str, result: dict) -> None:
        atomic.write_text(self.dir / f"{step}.json", json.dumps({"key": key, **result}, indent=1))

    def drop(self, step: str) -> None:
        (self.dir / f"{step}.json").unlink(missing_ok=True)


def _bpe_sentences(source: PairSource, n_pairs: int, k: int, seed: int, normalizer: Normalizer,
                   chunk: int, progress: Progress | None, counter: list[int]) -> Iterator[str]:
    """Both sides of a uniform random sample of k of the n training pairs, streamed straight into sentencepiece
    (the sample is never held as a Python list: 0.5 GB less at 2M sentences). For each chunk a hypergeometric
    draw says how many of its pairs are in the sample, so exactly k are taken, every k-subset equally likely,
    with memory bounded by one chunk whatever n. `counter[0]` counts the sentences given."""
    rng = np.random.default_rng(seed)
    need, left, done = k, n_pairs, 0
    for src, tgt in source.chunks(chunk):
        m = min(len(src), left)
        take = m if need >= left else int(rng.hypergeometric(need, left - need, m)) if m else 0
        picked = np.sort(rng.choice(m, size=take, replace=False)).tolist() if take < m else range(m)
        s, t = normalizer([src[i] for i in picked], [tgt[i] for i in picked])
        for x in s + t:
            if x := x.strip():
                counter[0] += 1
                yield x
        need, left, done = need - take, left - m, done + len(src)
        if progress:
            progress("bpe sample", done, n_pairs)
        if need <= 0 or left <= 0:
            break
    if progress:
        progress("learn bpe", 0, None)


def _learn_bpe(opts: PrepareOptions, plan: _Plan, totals: dict[str, int], out: Path, normalizer: Normalizer,
               stamps: _Stamps, workers: int, progress: Progress | None, reused: list[str]) -> Tokenizer:
    """Step 2: learn (or reuse) the joint BPE model of the training data -> OUT/spm.model."""
    train = plan.sources["train"]
    bpe_key = _digest({"v": FORMAT_VERSION, "input": train.fingerprint(), "vocab": plan.vocab_size,
                       "sample": plan.bpe_sample, "seed": opts.seed, "norm": opts.normalize_punct,
                       "coverage": plan.coverage, "errors": opts.errors})
    spm_path = out / SPM_MODEL
    if stamps.get("bpe", bpe_key, [spm_path]):
        reused.append("bpe")
        model_bytes = spm_path.read_bytes()
    else:
        stamps.drop("bpe")
        k = min(totals["train"], max(1, plan.bpe_sample // 2))
        given, failed = [0], []

        def sentences():  # sentencepiece turns an error raised while it reads into its own: keep ours
            try:
                yield from _bpe_sentences(train, totals["train"], k, opts.seed, normalizer, opts.chunk_size,
                                          progress, given)
            except BaseException as exc:
                failed.append(exc)
                raise

        try:
            model_bytes = train_bpe(sentences(), plan.vocab_size, character_coverage=plan.coverage,
                                    num_threads=workers)
        except (DataError, RuntimeError):
            if failed:
                raise failed[0] from None
            if given[0] == 0:
                raise DataError(f"the training data of {plan.name} has no non-empty sentence to learn BPE "
                                "from") from None
            raise
        if failed:
            raise failed[0]
        atomic.write_bytes(spm_path, model_bytes)
        stamps.put("bpe", bpe_key, {"sentences": given[0]})
    for stale in (SPM_TARGET, VOCAB_JSON):  # an imported tokenizer's files from an earlier run
        (out / stale).unlink(missing_ok=True)
    return Tokenizer(model_bytes)


def _model_tokenizer(model: str, out: Path) -> Tokenizer:
    """Step 2 with --tokenizer-from: the tokenizer of `model` (a checkpoint, a MarianMT folder or hf:...), written
    into OUT as nmt train reads it (spm.model; for an imported tokenizer spm.target.model and vocab.json too)."""
    from nmt_cli.importers import pretrained

    tok = pretrained.load(model)[0].tokenizer_obj()
    atomic.write_bytes(out / SPM_MODEL, tok.model_bytes)
    if tok.joint:
        for stale in (SPM_TARGET, VOCAB_JSON):
            (out / stale).unlink(missing_ok=True)
    else:
        atomic.write_bytes(out / SPM_TARGET, tok.target_bytes or tok.model_bytes)
        atomic.write_text(out / VOCAB_JSON, json.dumps(tok.vocab, ensure_ascii=False))
    return tok


def _encode_split(split: str, source: PairSource, plan: _Plan, tok: Tokenizer, out: Path, cfg: CleanConfig,
                  normalizer: Normalizer, workers: int, chunk: int, total: int,
                  progress: Progress | None) -> dict:
    """Clean, encode and binarize one split; returns its stamp result (counts, tokens, checksums)."""
    a, b = plan.file_langs
    counts = CleanCounts()
    is_train = split == "train"
    raw_dir = out / "raw"
    raw_dir.mkdir(exist_ok=True)
    raw_tmp = [raw_dir / f"{split}.{lang}.tmp" for lang in (a, b)]
    writers = [BinaryWriter(out / f"{split}.{lang}", tok.vocab_size) for lang in (a, b)]
    files = [open(p, "w", encoding="utf-8") for p in raw_tmp]
    try:
        for src, tgt in source.chunks(chunk):
            src, tgt = text_filter(src, tgt, counts, drop_empty=is_train)
            src, tgt = normalizer(src, tgt)
            ids_s = tok.encode(src, num_threads=workers, side="source" if a == plan.src else "target")
            ids_t = tok.encode(tgt, num_threads=workers, side="target" if b == plan.tgt else "source")
            if is_train:
                keep = length_mask(np.fromiter(map(len, ids_s), np.int64, len(ids_s)),
                                   np.fromiter(map(len, ids_t), np.int64, len(ids_t)), cfg, counts)
                if not keep.all():
                    idx = np.flatnonzero(keep).tolist()
                    src, tgt = [src[i] for i in idx], [tgt[i] for i in idx]
                    ids_s, ids_t = [ids_s[i] for i in idx], [ids_t[i] for i in idx]
            writers[0].add_many(ids_s)
            writers[1].add_many(ids_t)
            for f, lines in zip(files, (src, tgt), strict=True):
                if lines:
                    f.write("\n".join(lines) + "\n")
            counts.kept += len(src)
            if progress:
                progress(f"encode {split}", counts.read, total)
        if counts.read != total:
            raise DataError(f"{split}: read {counts.read} pairs but counted {total} before; the input changed "
                            "while nmt prepare was reading it")
    except BaseException:
        for w in writers:
            w.abort()
        for f, p in zip(files, raw_tmp, strict=True):
            f.close()
            p.unlink(missing_ok=True)
        raise
    for f in files:
        f.flush()
        os.fsync(f.fileno())
        f.close()
    n_tokens = {lang: w.n_tokens for lang, w in zip((a, b), writers, strict=True)}
    for w in writers:
        w.close()
    for p in raw_tmp:
        os.replace(p, p.with_suffix(""))
    return {"counts": counts.to_dict(), "tokens": n_tokens, "inputs": source.checksums}


class _Clock:
    """Wall and process-CPU seconds per stage (`lap(name)`: the time since the previous lap)."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._start = self._last = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.wall[name], self.cpu[name] = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now

    def total(self) -> None:
        self.lap("manifest")
        self.wall["total"] = self._last[0] - self._start[0]
        self.cpu["total"] = self._last[1] - self._start[1]


def _split_files(out: Path, split: str, langs: tuple[str, str]) -> list[Path]:
    return [out / f"{split}.{lang}.{ext}" for lang in langs for ext in ("bin", "idx")] + \
           [out / "raw" / f"{split}.{lang}" for lang in langs]


def prepare(opts: PrepareOptions, progress: Progress | None = None, warn: Warn | None = None) -> PrepareResult:
    """Run the pipeline; returns the manifest (also written to OUT_DIR/manifest.json) and what was reused.
    `warn` receives one-line warnings (default: printed to stderr)."""
    clock = _Clock()
    out = Path(opts.out_dir)
    _check_out_dir(out)
    if multilingual.is_multilingual(opts):
        return _prepare_many(opts, out, progress, warn or _warn_stderr, clock)
    plan = _plan(opts, progress, warn or _warn_stderr)
    clock.lap("download")

    # 1. check every input before writing anything
    totals = {}
    for split, source in plan.sources.items():
        if progress:
            progress(f"count {split}", 0, None)
        totals[split] = source.count()
    if totals.get("train", 0) == 0:
        raise DataError(f"the training data of {plan.name} is empty; pass a non-empty --train corpus")
    for split, fix in _EMPTY_FIX.items():
        if totals.get(split, 1) == 0:
            raise DataError(f"the {split} data of {plan.name} is empty ({_where(plan.sources[split])}); {fix}")
    clock.lap("check")

    created = _make_dir(out)
    try:
        return _build(opts, plan, totals, out, progress, clock)
    except OSError as exc:  # a full disk, a directory made read-only meanwhile: what is done so far is kept
        _remove_empty_dirs(out, created)
        where = exc.filename or out
        raise DataError(f"cannot write {where}: {exc.strerror or exc}; {out} has no manifest.json yet, so nothing "
                        "reads it. Free disk space, then run the same command again: it resumes") from exc
    except BaseException:
        _remove_empty_dirs(out, created)
        raise


# An empty valid split is refused rather than accepted with a warning: nmt train validates on it (validation
# loss, checkpoint_best.pt, --patience, BLEU), and a run that silently trains without them is worse than an error.
_EMPTY_FIX = {"valid": "nmt train validates on it (validation loss, checkpoint_best.pt, --patience): pass a "
                       "non-empty --valid corpus (a few hundred held-out pairs)",
              "test": "pass a non-empty --test corpus, or leave --test out (the test split is optional)"}


def _where(source: PairSource) -> str:
    paths = getattr(source, "paths", None) or getattr(source, "files", None)
    return " and ".join(str(p) for p in paths[:2]) if paths else source.name


def _warn_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _check_out_dir(out: Path) -> None:
    """-o must be a directory (or creatable) that this user can write: checked before anything is downloaded."""
    if out.exists() and not out.is_dir():
        raise DataError(f"-o {out} exists and is not a directory; choose another output directory")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise DataError(f"-o {out}: {parent} is not a writable directory; choose an output directory you can write")


def _make_dir(out: Path) -> bool:
    """Create the data directory (and its parents) -> whether it was created here; one line where it cannot be."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the data directory {out}: {exc.strerror or exc}; pick another -o") from None
    return created


def _remove_empty_dirs(out: Path, created: bool) -> None:
    """After a failed run: remove the empty folders it made (.steps/, raw/, and OUT itself if this run created it)
    so no empty OUT/.steps/ is left behind; files of finished steps stay for the next run to reuse."""
    for d in (out / STEPS_DIR, out / "raw", *([out] if created else [])):
        try:
            d.rmdir()  # only succeeds when empty
        except OSError:
            pass


def _build(opts: PrepareOptions, plan: _Plan, totals: dict[str, int], out: Path, progress: Progress | None,
           clock: _Clock) -> PrepareResult:
    """Steps 2-4 into OUT (which exists)."""
    (out / MANIFEST).unlink(missing_ok=True)  # untrusted until this run finishes
    stamps = _Stamps(out, opts.force)
    workers = opts.workers or cpus.default_threads().threads
    reused: list[str] = []
    a, b = plan.file_langs

    # 2. joint BPE, or the tokenizer of the model to fine-tune
    normalizer = Normalizer(a, b, opts.normalize_punct)
    if opts.tokenizer_from is not None:
        stamps.drop("bpe")
        tok = _model_tokenizer(opts.tokenizer_from, out)
    else:
        tok = _learn_bpe(opts, plan, totals, out, normalizer, stamps, workers, progress, reused)
    spm_sha = hashlib.sha256(tok.model_bytes if tok.joint else repr(tok.key()).encode()).hexdigest()
    clock.lap("bpe")

    # 3. encode + binarize, per split
    cfg = CleanConfig(opts.max_len, opts.ratio, opts.normalize_punct)
    results = {}
    for split, source in plan.sources.items():
        key = _digest({"v": FORMAT_VERSION, "input": source.fingerprint(), "spm": spm_sha, "langs": [a, b],
                       "clean": asdict(cfg) if split == "train" else None, "norm": opts.normalize_punct,
                       "errors": opts.errors})
        stamp = stamps.get(f"encode-{split}", key, _split_files(out, split, (a, b)))
        if stamp:
            reused.append(f"encode {split}")
        else:
            stamps.drop(f"encode-{split}")
            stamp = _encode_split(split, source, plan, tok, out, cfg, normalizer, workers, opts.chunk_size,
                                  totals[split], progress)
            stamp["outputs"] = {f.name: "sha256:" + readers.sha256_file(f)
                                for f in _split_files(out, split, (a, b))[:4]}
            stamps.put(f"encode-{split}", key, stamp)
        results[split] = stamp
        clock.lap(f"encode {split}")

    # 4. the vocabulary shortlist (data/shortlist.py), from the train split just written; the manifest, last
    manifest = _manifest(opts, plan, tok, out, results)
    if progress:
        progress("shortlist", 0, None)
    shortlist.save(shortlist.learn(shortlist.SplitPairs(ParallelData(out, "train", manifest)), int(manifest["vocab_size"])),
                   out / shortlist.FILE)
    clock.lap("shortlist")
    atomic.write_text(out / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    clock.total()
    return PrepareResult(out, manifest, reused, clock.wall, clock.cpu)


def _manifest(opts: PrepareOptions, plan: _Plan, tok: Tokenizer, out: Path, results: dict) -> dict:
    import sentencepiece

    from nmt_cli import __version__

    splits = {}
    checksums = {name: "sha256:" + readers.sha256_file(out / name) for name in (SPM_MODEL, SPM_TARGET, VOCAB_JSON)
                 if (out / name).is_file()}
    inputs = {}
    for split, r in results.items():
        c = r["counts"]
        splits[split] = {"read": c["read"], "kept": c["kept"], "dropped": c["dropped"],
                         "src_tokens": r["tokens"][plan.src], "tgt_tokens": r["tokens"][plan.tgt]}
        checksums.update(r.get("outputs", {}))
        inputs[split] = r.get("inputs", {})
    options = {k: v for k, v in asdict(opts).items() if k not in ("out_dir", "force", "cache_dir")}
    options.update(vocab_size=plan.vocab_size, bpe_sample=plan.bpe_sample, character_coverage=plan.coverage)
    if opts.tokenizer_from is not None:  # no BPE was learned
        options.update(vocab_size=tok.vocab_size, bpe_sample=None, character_coverage=None)
    return {
        "format_version": FORMAT_VERSION,
        "corpus": plan.name,
        "src_lang": plan.src,
        "tgt_lang": plan.tgt,
        "vocab_size": tok.vocab_size,
        "spm_model": SPM_MODEL,
        "special_ids": {"pad": tok.pad_id, "unk": tok.unk_id, "bos": tok.bos_id, "eos": tok.eos_id},
        "splits": splits,
        "checksums": checksums,
        "inputs": inputs,
        "origin": plan.origin,
        "options": options,
        "versions": {"nmt": __version__, "sentencepiece": sentencepiece.__version__, "numpy": np.__version__,
                     "python": platform.python_version(), "sample": sample.SAMPLE_VERSION},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _prepare_many(opts: PrepareOptions, out: Path, progress: Progress | None, warn: Warn,
                  clock: _Clock) -> PrepareResult:
    """Several directions into one data directory (data/multilingual.py): the same checks, reuse and atomic
    files as one direction, one BPE model for all, the directions one after the other in each split."""
    directions = multilingual.plan_directions(opts, _plan, progress, warn)
    clock.lap("download")
    totals: dict[str, dict[str, int]] = {}
    for d in directions:
        totals[d.key] = {}
        for split, source in d.sources.items():
            if progress:
                progress(f"count {split} {d.key}", 0, None)
            totals[d.key][split] = n = source.count()
            if n == 0 and split in ("train", *_EMPTY_FIX):
                fix = _EMPTY_FIX.get(split, "pass a non-empty --train corpus")
                raise DataError(f"the {split} data of {d.name} is empty ({_where(source)}); {fix}")
    if any("valid" not in d.sources for d in directions):
        raise DataError("every direction needs a valid split (nmt train validates each direction on its own)")
    clock.lap("check")
    created = _make_dir(out)
    try:
        (out / MANIFEST).unlink(missing_ok=True)
        stamps = _Stamps(out, opts.force)
        workers = opts.workers or cpus.default_threads().threads
        reused: list[str] = []
        tok = multilingual.learn_bpe(opts, directions, totals, out, stamps, workers, _digest, progress, reused)
        clock.lap("bpe")
        cfg = CleanConfig(opts.max_len, opts.ratio, opts.normalize_punct)
        spm_sha = hashlib.sha256(tok.model_bytes).hexdigest()
        results = {}
        for split in corpora.SPLITS:
            if not any(split in d.sources for d in directions):
                continue
            key = _digest({"v": FORMAT_VERSION, "spm": spm_sha, "norm": opts.normalize_punct, "errors": opts.errors,
                           "clean": asdict(cfg) if split == "train" else None,
                           "inputs": [[d.key, d.tag, d.sources[split].fingerprint()] for d in directions
                                      if split in d.sources]})
            stamp = stamps.get(f"encode-{split}", key, multilingual.split_files(out, split, directions))
            if stamp:
                reused.append(f"encode {split}")
            else:
                stamps.drop(f"encode-{split}")
                stamp = {"directions": multilingual.encode_split(split, directions, tok, out, cfg,
                                                                 opts.normalize_punct, workers, opts.chunk_size,
                                                                 totals, progress)}
                stamps.put(f"encode-{split}", key, stamp)
            results[split] = stamp["directions"]
            clock.lap(f"encode {split}")
        plan = _Plan(opts.corpus, ("src", "tgt"), "src", "tgt", opts.vocab_size or max(d.vocab_size for d in directions),
                     min(d.coverage for d in directions), opts.bpe_sample or max(d.bpe_sample for d in directions), {})
        manifest = _manifest(opts, plan, tok, out, {})
        manifest.update(multilingual.manifest_fields(directions, results))
        manifest["checksums"] = multilingual.checksums(out, results, directions)
        manifest["inputs"] = {split: {k: v for r in per.values() for k, v in r["inputs"].items()}
                              for split, per in results.items()}
        manifest["origin"] = {"kind": "directions"}
        manifest["options"]["temperature"] = multilingual.TEMPERATURE
        multilingual.write_manifest(out, manifest)
    except BaseException:
        _remove_empty_dirs(out, created)
        raise
    clock.total()
    return PrepareResult(out, manifest, reused, clock.wall, clock.cpu)
