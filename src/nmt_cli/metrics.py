"""Corpus-level translation metrics through sacrebleu: BLEU, chrF, chrF++, TER and the paper's tokenized BLEU.

Everything here is plain Python (no typer/rich): `nmt score` parses options, calls `score_systems`, and
renders the returned `ScoreReport`. Texts are lists of lines (one sentence per line); references are a
list of reference streams, each parallel to the hypotheses (sacrebleu's convention).

`tok-bleu` is the protocol of "Attention Is All You Need" (tensor2tensor's get_ende_bleu.sh, fairseq's
compound_split_bleu.sh): Moses-tokenize hypothesis and references, split hyphenated compounds
(`a-b` -> `a ##AT##-##AT## b`), then BLEU on whitespace tokens without smoothing, as multi-bleu.perl does.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from nmt_cli.errors import ConfigError, DataError, DownloadError
from nmt_cli.lines import open_input, read_text

# Canonical metric names accepted by `-m`, in display order.
METRIC_NAMES = ("bleu", "chrf", "chrf++", "ter", "tok-bleu")
_ALIASES = {"chrf2": "chrf", "chrf2++": "chrf++", "chrfpp": "chrf++", "tokbleu": "tok-bleu", "tok_bleu": "tok-bleu"}
# Seconds one network operation of sacrebleu's test-set download may block before we give up.
DOWNLOAD_TIMEOUT_S = 20.0
_COMPOUND_RE = re.compile(r"(\S)-(\S)")


@dataclass
class MetricScore:
    """One metric on one system. `mean`/`ci`/`p_value` are filled only by paired bootstrap resampling."""

    name: str  # display name as sacrebleu reports it: BLEU, chrF2, chrF2++, TER, tok-BLEU
    score: float
    detail: str  # sacrebleu's one-line rendering, e.g. "BLEU = 27.30 58.1/33.1/21.0/14.0 (BP = ...)"
    p_value: float | None = None
    mean: float | None = None
    ci: float | None = None

    def to_dict(self) -> dict:
        return {"score": self.score, "detail": self.detail, "p_value": self.p_value, "mean": self.mean,
                "ci": self.ci}


@dataclass
class SystemScores:
    """All metrics for one hypothesis file (`name` is the path as given, or `stdin`)."""

    name: str
    scores: dict[str, MetricScore] = field(default_factory=dict)


@dataclass
class ScoreReport:
    """Scores of every system, the signature of every metric, and whether paired bootstrap ran."""

    systems: list[SystemScores]
    signatures: dict[str, str]
    references: list[str]
    paired_bs: bool = False
    n_bootstrap: int = 0

    @property
    def metric_names(self) -> list[str]:
        return list(self.signatures)

    def to_dict(self) -> dict:
        return {
            "references": self.references,
            "paired_bs": self.paired_bs,
            "n_bootstrap": self.n_bootstrap if self.paired_bs else None,
            "baseline": self.systems[0].name if self.paired_bs else None,
            "signatures": self.signatures,
            "systems": [
                {"name": s.name, "scores": {k: v.to_dict() for k, v in s.scores.items()}} for s in self.systems
            ],
        }


# ---------------------------------------------------------------------------------------------- input


def parse_metric_names(values: Iterable[str]) -> list[str]:
    """Split `["bleu,chrf", "ter"]` or `["bleu chrf ter"]` into canonical names, deduplicated, in order.

    Raises ConfigError naming the unknown metric and the valid ones.
    """
    names: list[str] = []
    for value in values:
        for token in re.split(r"[,\s]+", value.strip()):
            if not token:
                continue
            name = _ALIASES.get(token.lower(), token.lower())
            if name not in METRIC_NAMES:
                raise ConfigError(f"unknown metric {token!r}: choose from {', '.join(METRIC_NAMES)}")
            if name not in names:
                names.append(name)
    return names


def is_metric_name(token: str) -> bool:
    """True when `token` (e.g. a stray positional after `-m bleu chrf ter`) names a metric."""
    return _ALIASES.get(token.lower(), token.lower()) in METRIC_NAMES


def read_lines(path: str, what: str = "hypothesis") -> list[str]:
    """A UTF-8 text file as lines (the rule of `nmt_cli.lines`), trailing whitespace stripped (as the sacrebleu
    CLI does)."""
    with open_input(path, what) as f:
        return lines_from_stream(f, str(path))


def lines_from_stream(stream: BinaryIO, name: str) -> list[str]:
    """Lines of an open binary stream (file or stdin); DataError if it is not UTF-8 or has no lines at all.

    A file of blank lines is valid input (a weak system may output nothing): it scores, it does not fail."""
    lines = [line.rstrip() for line in read_text(stream, name)]
    if not lines:
        raise DataError(f"{name} is empty: it holds no lines to score (one sentence per line expected)")
    return lines


def check_parallel(systems: Sequence[tuple[str, list[str]]], references: Sequence[list[str]],
                   ref_names: Sequence[str]) -> None:
    """DataError (with both counts) unless every hypothesis and reference has the same number of lines."""
    n_ref = len(references[0])
    for ref_name, ref in zip(ref_names, references, strict=True):
        if len(ref) != n_ref:
            raise DataError(f"references {ref_names[0]} ({_lines(n_ref)}) and {ref_name} ({_lines(len(ref))}) "
                            "differ in length; all references must be parallel")
    for name, hyp in systems:
        if len(hyp) != n_ref:
            raise DataError(f"{name} has {_lines(len(hyp))} but reference {ref_names[0]} has {n_ref}; "
                            "hypothesis and reference must be parallel, one sentence per line")


def _lines(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


# ------------------------------------------------------------------------------------------- test sets


def load_test_set(test_set: str, langpair: str | None) -> tuple[list[str], list[list[str]]]:
    """References of a standard test set (e.g. `wmt14`, `en-de`) through sacrebleu's own download/cache.

    Returns (reference file paths, reference streams). Offline, fails fast with a DownloadError that says
    how to pass `-r` instead. sacrebleu caches under $SACREBLEU (default ~/.sacrebleu).
    """
    from sacrebleu.dataset import DATASETS

    if test_set not in DATASETS:
        close = [n for n in DATASETS if n.startswith(test_set.split("/")[0])][:8]
        hint = f" (similar: {', '.join(close)})" if close else " (see `sacrebleu --list`)"
        raise ConfigError(f"unknown test set {test_set!r}{hint}")
    pairs = list(DATASETS[test_set].langpairs)
    pairs = [p for p in pairs if p != "docid"]
    if langpair is None or langpair not in pairs:
        what = "needs a language pair" if langpair is None else f"has no language pair {langpair!r}"
        raise ConfigError(f"test set {test_set} {what}: pass -l with one of {', '.join(sorted(pairs))}")
    try:
        paths = _with_socket_timeout(lambda: DATASETS[test_set].get_reference_files(langpair))
    except (Exception, SystemExit) as exc:  # URLError, timeouts, lock errors; sacrebleu may sys.exit on SSL
        reason = getattr(exc, "reason", None) or exc
        raise DownloadError(
            f"could not get test set {test_set} ({langpair}) through sacrebleu's download into "
            f"{_sacrebleu_dir()} ({reason}); offline, pass the reference file with -r ref.txt instead"
        ) from None
    return list(paths), [read_lines(p, "reference") for p in paths]


def _sacrebleu_dir() -> str:
    from sacrebleu.utils import SACREBLEU_DIR

    return os.environ.get("SACREBLEU", SACREBLEU_DIR)


def _with_socket_timeout(fn):
    """Run `fn` with a default socket timeout so a dead network fails in seconds, not minutes."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        return fn()
    finally:
        socket.setdefaulttimeout(previous)


# ------------------------------------------------------------------------------------- tokenized BLEU


def compound_split(line: str) -> str:
    """`a-b` -> `a ##AT##-##AT## b`, exactly as the Perl one-liner `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`."""
    return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def tokenize_for_bleu(lines: Sequence[str], lang: str) -> list[str]:
    """Moses-tokenize (sacremoses, no escaping) then compound-split each line: the paper's BLEU input."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [compound_split(tok.tokenize(line, escape=False, return_str=True)) for line in lines]


def tokenizer_language(langpair: str | None, ref_paths: Sequence[str] = ()) -> str | None:
    """Target language for Moses tokenization: `-l en-de` -> `de`, `-l de` -> `de`; else the first
    reference's suffix when it is a language sacremoses knows (`newstest2014.de` -> `de`); else None."""
    if langpair:
        return langpair.split("-")[-1].strip().lower() or None
    from sacremoses.corpus import NonbreakingPrefixes

    known = set(NonbreakingPrefixes().available_langs.values())
    for path in ref_paths[:1]:
        suffix = os.path.splitext(path)[1].lstrip(".").lower()
        if suffix in known:
            return suffix
    return None


def tok_bleu_signature(base: str, lang: str) -> str:
    """sacrebleu's BLEU signature plus the preprocessing that makes it the paper's (multi-bleu) number."""
    import sacremoses

    version = getattr(sacremoses, "__version__", "?")
    return f"{base}|pre:moses-{lang}+compound-split|sacremoses:{version}"


# -------------------------------------------------------------------------------------------- scoring


def _make_metric(name: str):
    """A fresh sacrebleu Metric object for a canonical name (tok-bleu: BLEU on pre-tokenized text)."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU()
    if name == "chrf":
        return CHRF()
    if name == "chrf++":
        return CHRF(word_order=2)
    if name == "ter":
        return TER()
    if name == "tok-bleu":
        # multi-bleu.perl: whitespace tokens, case-sensitive, closest ref length, no smoothing.
        return BLEU(tokenize="none", smooth_method="none", force=True)
    raise ConfigError(f"unknown metric {name!r}: choose from {', '.join(METRIC_NAMES)}")


def score_systems(
    systems: Sequence[tuple[str, list[str]]],
    references: Sequence[list[str]],
    ref_names: Sequence[str],
    metrics: Sequence[str] = ("bleu",),
    tok_lang: str | None = None,
    paired_bs: bool = False,
    n_bootstrap: int = 1000,
) -> ScoreReport:
    """Score each (name, hypothesis lines) against the references with every metric.

    With `paired_bs`, runs sacrebleu's paired bootstrap resampling (seed from $SACREBLEU_SEED, default
    12345) of every system against the first one, filling mean, 95% CI and p-value.
    `tok_lang` is the Moses tokenizer language, needed only for `tok-bleu`.
    """
    if not systems:
        raise DataError("no hypothesis to score: pass a file or pipe text on stdin")
    if not references:
        raise ConfigError("no reference: pass -r ref.txt (or a test set: -t wmt14 -l en-de)")
    if paired_bs and len(systems) < 2:
        raise ConfigError("--paired-bs compares systems: pass at least two hypothesis files (the first is the baseline)")
    check_parallel(systems, references, ref_names)
    metrics = list(metrics) or ["bleu"]
    if "tok-bleu" in metrics and not tok_lang:
        raise ConfigError("tok-bleu needs the target language for Moses tokenization: pass -l en-de (or -l de)")

    raw = [m for m in metrics if m != "tok-bleu"]
    groups: list[tuple[list[str], Sequence[tuple[str, list[str]]], Sequence[list[str]]]] = []
    if raw:
        groups.append((raw, systems, references))
    if "tok-bleu" in metrics:
        tok_systems = [(name, tokenize_for_bleu(hyp, tok_lang)) for name, hyp in systems]
        tok_refs = [tokenize_for_bleu(ref, tok_lang) for ref in references]
        groups.append((["tok-bleu"], tok_systems, tok_refs))

    report = ScoreReport([SystemScores(name) for name, _ in systems], {}, list(ref_names), paired_bs,
                         n_bootstrap)
    for names, group_systems, group_refs in groups:
        if paired_bs:
            _paired_scores(report, names, group_systems, group_refs, n_bootstrap, tok_lang)
        else:
            _plain_scores(report, names, group_systems, group_refs, tok_lang)
    return report


def _display_name(metric_name: str, sacrebleu_name: str) -> str:
    return "tok-BLEU" if metric_name == "tok-bleu" else sacrebleu_name


def _plain_scores(report: ScoreReport, names, systems, references, tok_lang) -> None:
    """Corpus scores through sacrebleu's `corpus_score`, one Metric object per metric name."""
    for name in names:
        metric = _make_metric(name)
        for entry, (_, hyp) in zip(report.systems, systems, strict=True):
            result = metric.corpus_score(hyp, references)
            key = _display_name(name, result.name)
            entry.scores[key] = MetricScore(key, float(result.score), _detail(key, result))
        signature = metric.get_signature().format()
        report.signatures[key] = tok_bleu_signature(signature, tok_lang) if name == "tok-bleu" else signature


def _paired_scores(report: ScoreReport, names, systems, references, n_bootstrap, tok_lang) -> None:
    """sacrebleu's PairedTest (bootstrap), baseline = first system; also sacrebleu's detail line per score."""
    from sacrebleu.significance import PairedTest

    metrics = {name: _make_metric(name) for name in names}
    sacre_names, details = {}, {}
    for name, metric in metrics.items():
        for entry, (_, hyp) in zip(report.systems, systems, strict=True):
            result = metric.corpus_score(hyp, references)
            sacre_names[name] = result.name
            details[(entry.name, name)] = _detail(_display_name(name, result.name), result)
    test = PairedTest(list(systems), metrics, references, test_type="bs", n_samples=n_bootstrap)
    signatures, results = test()
    for name in names:
        sacre_name = sacre_names[name]
        key = _display_name(name, sacre_name)
        sig = signatures[sacre_name].format()
        report.signatures[key] = tok_bleu_signature(sig, tok_lang) if name == "tok-bleu" else sig
        for entry, res in zip(report.systems, results[sacre_name], strict=True):
            entry.scores[key] = MetricScore(key, float(res.score), details[(entry.name, name)],
                                            res.p_value, _opt_float(res.mean), _opt_float(res.ci))


def _opt_float(x) -> float | None:
    return None if x is None else float(x)


def _detail(key: str, result) -> str:
    """sacrebleu's own one-line rendering of a score (BLEU: precisions, BP, ratio, lengths)."""
    text = result.format(width=2)
    return text.replace(result.name, key, 1) if key != result.name else text
