"""Search settings, the finished hypothesis, the length penalty, maximum output lengths and a batch of sources.

Scores: `score = sum(log p) / lp(len)`, where `len` counts the generated tokens including EOS (not BOS) and `lp` is
the GNMT form `((5 + len) / 6) ** alpha` or the fairseq form `len ** alpha`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from nmt_cli.config import PAD_ID
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


class Sources(NamedTuple):
    """A batch for decode_batches: source ids [B, S], right-padded, and their padding mask [B, S] (True at padding)
    on the decoding device; their lengths on the host (so that the search never reads them back); optionally the
    batch already encoded (its decoder cache: a server encodes arriving sentences while the search decodes) and the
    target ids each output must start with (one list per sentence)."""

    src: Tensor
    src_pad_mask: Tensor | None
    lengths: list[int]
    cache: object = None
    prefix: list[list[int]] | None = None


def source_batch(seqs: list[list[int]], device) -> Sources:
    """`seqs` (token ids with EOS, none empty) as a Sources batch on `device`, padded on the host and copied once
    (asynchronously from page-locked memory to a GPU). No padding mask where every sequence has the batch's length
    (one sentence, always): the encoder and every step's encoder-decoder attention then mask nothing."""
    lengths = [len(s) for s in seqs]
    width = max(lengths)
    src = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for row, s in enumerate(seqs):
        src[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    mask = None if min(lengths) == width else to_device(src == PAD_ID, device)
    return Sources(to_device(src, device), mask, lengths)


class Kept(list):
    """The sentences that stay when others leave (indices, a host list), with their device copy made once for the
    search, the state and the cache alike (`on`)."""

    _copy: Tensor | None = None

    def on(self, device) -> Tensor:
        if self._copy is None:
            self._copy = to_device(torch.tensor(self, dtype=torch.long), device)
        return self._copy


def index_on(keep: list[int], device) -> Tensor:
    """`keep` as a device index: a Kept list's one copy, else a new one."""
    return keep.on(device) if isinstance(keep, Kept) else to_device(torch.tensor(keep, dtype=torch.long), device)


def to_device(x: Tensor, device) -> Tensor:
    """A host tensor on `device`: on a GPU through page-locked memory, without waiting for the device."""
    if torch.device(device).type != "cuda":
        return x
    return x.pin_memory().to(device, non_blocking=True)


def layout_key(*tensors: Tensor | None) -> tuple:
    """Each tensor's address, shape and strides as ints (0 for an absent one): what a recorded CUDA graph depends on."""
    out: list[int] = []
    for x in tensors:
        out += (0,) if x is None else (x.data_ptr(), *x.shape, *x.stride())
    return tuple(out)
