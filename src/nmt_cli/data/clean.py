"""Cleaning rules for parallel text, with a count for every reason a pair is dropped (nothing silently).

Text level (before BPE): surrounding whitespace is stripped; pairs with an empty side are dropped ("empty");
optional Moses punctuation normalization (sacremoses). Token level (after BPE, training split only, as in
fairseq's WMT recipe): pairs with a side longer than `max_len` BPE tokens ("too_long") or whose longer side has
more than `ratio` times the tokens of the shorter side ("ratio") are dropped. Valid and test splits are never
length-filtered: their references must stay complete.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

REASONS = ("empty", "too_long", "ratio")


@dataclass(frozen=True)
class CleanConfig:
    max_len: int = 250  # BPE tokens per side
    ratio: float = 1.5  # longest / shortest side in BPE tokens
    normalize_punct: bool = False

    def __post_init__(self):
        if self.max_len < 1:
            raise ValueError("max_len must be >= 1")
        if self.ratio < 1.0:
            raise ValueError("ratio must be >= 1")


@dataclass
class CleanCounts:
    """read / kept / dropped-by-reason counts of one split."""

    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {"read": self.read, "kept": self.kept, "dropped": {r: int(self.dropped[r]) for r in REASONS}}


class Normalizer:
    """Moses punctuation normalization per language (sacremoses), or identity when disabled."""

    def __init__(self, src_lang: str, tgt_lang: str, enabled: bool):
        self.enabled = enabled
        if enabled:
            from sacremoses import MosesPunctNormalizer

            self._src = MosesPunctNormalizer(lang=src_lang)
            self._tgt = MosesPunctNormalizer(lang=tgt_lang)

    def __call__(self, src: list[str], tgt: list[str]) -> tuple[list[str], list[str]]:
        if not self.enabled:
            return src, tgt
        return [self._src.normalize(s) for s in src], [self._tgt.normalize(t) for t in tgt]


def text_filter(src: list[str], tgt: list[str], counts: CleanCounts, drop_empty: bool = True
                ) -> tuple[list[str], list[str]]:
    """Strip whitespace; drop (and count) pairs with an empty side when `drop_empty`."""
    src = [s.strip() for s in src]
    tgt = [t.strip() for t in tgt]
    counts.read += len(src)
    if not drop_empty:
        return src, tgt
    keep = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s and t]
    if len(keep) == len(src):
        return src, tgt
    counts.dropped["empty"] += len(src) - len(keep)
    return [src[i] for i in keep], [tgt[i] for i in keep]


def length_mask(src_lengths: np.ndarray, tgt_lengths: np.ndarray, cfg: CleanConfig, counts: CleanCounts
                ) -> np.ndarray:
    """Boolean keep-mask [N] over token lengths; counts the dropped pairs by reason (too_long first)."""
    s = np.asarray(src_lengths, dtype=np.int64)
    t = np.asarray(tgt_lengths, dtype=np.int64)
    too_long = np.maximum(s, t) > cfg.max_len
    longer, shorter = np.maximum(s, t), np.maximum(np.minimum(s, t), 1)
    bad_ratio = ~too_long & (longer > cfg.ratio * shorter)
    counts.dropped["too_long"] += int(too_long.sum())
    counts.dropped["ratio"] += int(bad_ratio.sum())
    return ~(too_long | bad_ratio)
