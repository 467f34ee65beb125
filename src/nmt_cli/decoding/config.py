"""Search settings, the finished hypothesis, the length penalty and maximum output lengths.

Scores: `score = sum(log p) / lp(len)`, where `len` counts the generated tokens including EOS (not BOS) and `lp` is
the GNMT form `((5 + len) / 6) ** alpha` or the fairseq form `len ** alpha`.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt_cli.errors import ConfigError
from nmt_cli.runtime import defaults

LENGTH_PENALTIES = ("gnmt", "fairseq")
STOP_RULES = ("beam", "top")


@dataclass
class SearchConfig:
    """Search settings. Defaults (nmt_cli/runtime/defaults.py) are the paper's: beam 4, alpha 0.6, max output length =
    source length + 50."""

    beam: int = defaults.BEAM
    alpha: float = defaults.LENPEN  # length penalty exponent (0 disables it)
    lp: str = defaults.LENPEN_FORM  # "gnmt": ((5 + len) / 6) ** alpha; "fairseq": len ** alpha
    max_len_a: float = defaults.MAX_LEN_A  # maximum output tokens = a * source tokens + b (both counting EOS)
    max_len_b: int = defaults.MAX_LEN_B
    nbest: int = 1  # hypotheses returned per sentence (at most `beam`)
    stop: str = defaults.STOP  # "beam": done when `beam` hypotheses ended (fairseq); "top": when the top candidate ended
    min_len: int = 0  # generated tokens (EOS excluded) before EOS is allowed
    no_repeat_ngram: int = 0  # > 0: no n-gram of this size occurs twice in a hypothesis
    sampling: bool = False  # draw `nbest` samples per sentence instead of searching
    topk: int = 0  # sampling: draw from the k most probable tokens only (0: all)
    topp: float = 1.0  # sampling: from the smallest set of tokens whose probability reaches p (1: all)
    temperature: float = 1.0  # sampling: divide the logits by it
    seed: int | None = None  # sampling: random seed (same seed, input and batching: same samples)

    def stops_at_top(self) -> bool:
        """Whether a sentence is also done once a step's best-ranked candidate has ended (and `nbest` have):
        `stop="top"`, and the default rule without a length penalty (`alpha` 0) for the best hypothesis alone
        (`nbest` 1), where stopping there gives the same output, only sooner. Scores are then sums of
        log-probabilities: every candidate a step continues with ranks below the one that ended, and adding
        log-probabilities (<= 0) only lowers it, so nothing found later can beat the best ended so far; the
        rule of `beam` would only collect worse ones. (CTranslate2 exits early under the same condition.)"""
        return self.stop == "top" or (self.alpha == 0 and self.nbest == 1 and not self.sampling)

    def validate(self) -> SearchConfig:
        if self.beam < 1:
            raise ConfigError(f"beam size must be at least 1, got {self.beam}")
        if self.nbest < 1:
            raise ConfigError(f"nbest must be at least 1, got {self.nbest}")
        if self.lp not in LENGTH_PENALTIES:
            raise ConfigError(f"unknown length penalty form {self.lp!r}; choose one of {', '.join(LENGTH_PENALTIES)}")
        if self.stop not in STOP_RULES:
            raise ConfigError(f"unknown stop rule {self.stop!r}; choose one of {', '.join(STOP_RULES)}")
        if self.alpha < 0:
            raise ConfigError(f"length penalty alpha must be >= 0, got {self.alpha}")
        if self.max_len_a < 0 or self.max_len_b < 0 or (self.max_len_a == 0 and self.max_len_b == 0):
            raise ConfigError("max-len-a and max-len-b must be >= 0 and not both 0")
        if self.min_len < 0:
            raise ConfigError(f"min-len must be >= 0, got {self.min_len}")
        if self.no_repeat_ngram < 0:
            raise ConfigError(f"no-repeat-ngram must be >= 0 (0 disables it), got {self.no_repeat_ngram}")
        if self.topk < 0:
            raise ConfigError(f"topk must be >= 0 (0 disables it), got {self.topk}")
        if not 0.0 < self.topp <= 1.0:
            raise ConfigError(f"topp must be in (0, 1], got {self.topp}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if (self.topk or self.topp < 1.0 or self.temperature != 1.0) and not self.sampling:
            raise ConfigError("topk, topp and temperature only apply with sampling; add --sampling")
        if self.sampling:
            self.nbest = max(1, self.nbest)
        elif not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"nbest must be between 1 and the beam size ({self.beam}), got {self.nbest}")
        return self


@dataclass
class Hypothesis:
    """One finished translation."""

    tokens: list[int]  # generated ids, without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / length penalty
    log_prob: float  # sum of log-probabilities (EOS included)


def length_penalty(length: int, alpha: float, form: str = "gnmt") -> float:
    """lp(len): GNMT ((5 + len) / 6) ** alpha (Wu et al., 2016) or fairseq len ** alpha."""
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "fairseq":
        return float(length) ** alpha
    raise ConfigError(f"unknown length penalty form {form!r}; choose one of {', '.join(LENGTH_PENALTIES)}")


def max_output_lengths(lengths: list[int], cfg: SearchConfig, limit: int | None) -> list[int]:
    """Maximum generated tokens (EOS included) per sentence of `lengths` source tokens (EOS included): a * source
    tokens + b, capped at `limit`, at least 1. On the host: the sources' lengths are known before decoding."""
    cap = limit if limit is not None else float("inf")
    return [max(1, min(int(n * cfg.max_len_a) + cfg.max_len_b, cap)) for n in lengths]
