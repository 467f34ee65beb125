"""A vocabulary shortlist learned from the training pairs: for each source piece the target pieces most likely in
its translation, plus the most frequent target pieces. Decoding on a CPU scores only the union of a batch's lists
(decoding/candidates.py) instead of the whole vocabulary: the output projection, softmax and top-k over a few hundred
to a few thousand pieces instead of tens of thousands.

The statistic is counted over sentence pairs (a piece "occurs" in a sentence or not): c(s), c(t) and c(s, t), the
pairs whose source holds s and whose target holds t. Each source piece ranks the target pieces by one of:
- "dice": 2 c(s, t) / (c(s) + c(t)), which favours pieces that occur together and rarely apart;
- "cond": c(s, t) / c(s), the share of s's sentences whose translation holds t (a co-occurrence estimate of p(t|s)).
The frequent pieces are in every list anyway, so each source piece's ranking skips them; pairs seen once are
noise and are skipped when the piece has enough others. docs/results.md (Shortlist) says which statistic won, and
the sizes.

`learn` reads (source ids, target ids) pairs, at most `max_pairs` of them spread evenly over the corpus; counting
is vectorised in numpy (a few seconds for 200,000 pairs). The result travels in the checkpoint as plain tensors
(`to_dict`/`from_dict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmt_cli.errors import CheckpointError
from nmt_cli.runtime import defaults

STATISTICS = ("dice", "cond")
STATISTIC = "dice"  # the default (docs/results.md, Shortlist)
STORED = 32  # pieces kept per source piece (translation may use fewer: --shortlist-size)
SIZE = defaults.SHORTLIST_SIZE  # pieces used per source piece by default (docs/results.md, Shortlist)
FREQUENT = 256  # the most frequent target pieces, in every batch's candidates (at most 1/16 of the vocabulary)
MAX_PAIRS = 200_000  # pairs counted at most (spread evenly over the corpus)
_CHUNK = 10_000  # pairs counted at once


@dataclass
class Shortlist:
    """pieces [V, STORED] int32: per source piece id its target pieces, best first, -1 where fewer; frequent [F]
    int32: the most frequent target pieces, most frequent first."""

    pieces: torch.Tensor
    frequent: torch.Tensor
    statistic: str = STATISTIC
    pairs: int = 0  # sentence pairs it was counted over

    @property
    def stored(self) -> int:
        return self.pieces.size(1)

    def to_dict(self) -> dict:
        return {"pieces": self.pieces, "frequent": self.frequent, "statistic": self.statistic, "pairs": self.pairs}

    @classmethod
    def from_dict(cls, data: dict, vocab_size: int, where: str = "the checkpoint") -> Shortlist:
        try:
            out = cls(data["pieces"].to(torch.int32), data["frequent"].to(torch.int32), str(data["statistic"]),
                      int(data.get("pairs", 0)))
        except (KeyError, AttributeError, TypeError) as exc:
            raise CheckpointError(f"{where}: its shortlist is malformed ({exc}); drop it with nmt shortlist "
                                  "--remove, or learn it again") from exc
        if out.pieces.dim() != 2 or out.pieces.size(0) != vocab_size or (out.pieces.numel() and int(out.pieces.max()) >= vocab_size):
            raise CheckpointError(f"{where}: its shortlist does not fit the model's {vocab_size}-piece vocabulary; "
                                  "learn it again with nmt shortlist")
        return out

    def same(self, other: Shortlist | None) -> bool:
        return other is not None and same(self.to_dict(), other.to_dict())


def same(a: dict | None, b: dict | None) -> bool:
    """Whether two shortlists, as stored in checkpoints (`Shortlist.to_dict`), are the same."""
    if a is None or b is None:
        return False
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


def evenly(n: int, most: int) -> np.ndarray:
    """Indices of at most `most` of n items, spread evenly (all of them when n <= most)."""
    if n <= most:
        return np.arange(n)
    return np.linspace(0, n - 1, most).round().astype(np.int64)


def _sentence_sets(sentences: Sequence[np.ndarray], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ids of each sentence -> (ids, counts per sentence), sentence by sentence."""
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in sentences]) if len(sentences) else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(sentences), dtype=np.int64), lengths)
    keys = np.unique(owner * vocab + flat)
    return keys % vocab, np.bincount(keys // vocab, minlength=len(sentences))


def _pair_keys(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], vocab: int):
    """Every (source piece, target piece) pair of every sentence pair, once per pair of sentences, as s * V + t;
    and the distinct pieces of each side."""
    s_ids, s_len = _sentence_sets(src, vocab)
    t_ids, t_len = _sentence_sets(tgt, vocab)
    block = s_len * t_len  # pairs per sentence pair
    total = int(block.sum())
    s_rep = np.repeat(s_ids, np.repeat(t_len, s_len))  # each source piece once per target piece of its sentence
    start = np.cumsum(block) - block
    within = np.arange(total, dtype=np.int64) - np.repeat(start, block)
    t_first = np.cumsum(t_len) - t_len
    t_idx = np.repeat(t_first, block) + within % np.repeat(np.maximum(t_len, 1), block)
    return s_rep * vocab + t_ids[t_idx], s_ids, t_ids


def count(pairs: Sequence[tuple[np.ndarray, np.ndarray]], vocab: int):
    """Sentence-level counts -> (pair keys s * V + t, their counts c(s, t), c(s) [V], c(t) [V])."""
    c_s = np.zeros(vocab, np.int64)
    c_t = np.zeros(vocab, np.int64)
    keys, counts = [], []
    for start in range(0, len(pairs), _CHUNK):
        chunk = pairs[start : start + _CHUNK]
        k, s_ids, t_ids = _pair_keys([p[0] for p in chunk], [p[1] for p in chunk], vocab)
        c_s += np.bincount(s_ids, minlength=vocab)
        c_t += np.bincount(t_ids, minlength=vocab)
        u, c = np.unique(k, return_counts=True)
        keys.append(u)
        counts.append(c)
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), c_s, c_t
    k, c = np.concatenate(keys), np.concatenate(counts)
    if len(keys) > 1:  # merge the chunks' counts of the same pair
        order = np.argsort(k, kind="stable")
        k, c = k[order], c[order]
        first = np.concatenate([[True], k[1:] != k[:-1]])
        c = np.add.reduceat(c, np.flatnonzero(first))
        k = k[first]
    return k, c, c_s, c_t


def learn(pairs: Sequence[tuple[np.ndarray, np.ndarray]], vocab: int, statistic: str = STATISTIC,
          stored: int = STORED, frequent: int = FREQUENT, max_pairs: int = MAX_PAIRS,
          reserved: int = 4) -> Shortlist:
    """A shortlist from (source ids, target ids) pairs (no BOS/EOS), ids below `vocab`; the first `reserved` ids
    (the specials) are never listed: decoding adds them to every batch."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown shortlist statistic {statistic!r}; choose one of {', '.join(STATISTICS)}")
    chosen = evenly(len(pairs), max_pairs)
    sample = [pairs[int(i)] for i in chosen]
    keys, c_st, c_s, c_t = count(sample, vocab)
    order = np.argsort(-c_t, kind="stable")
    top = order[(order >= reserved) & (c_t[order] > 0)][: min(frequent, vocab // 16)]
    s, t = keys // vocab, keys % vocab
    common = np.zeros(vocab, bool)
    common[top] = True
    common[:reserved] = True
    keep = ~common[t] & (s >= reserved)
    s, t, c = s[keep], t[keep], c_st[keep].astype(np.float64)
    if statistic == "dice":
        score = 2 * c / (c_s[s] + c_t[t])
    else:
        score = c / c_s[s]
    score = np.where(c > 1, score, score - 2.0)  # pairs seen once come after every pair seen twice or more
    order = np.lexsort((-c, -score, s))  # by source piece, best first (ties: the more frequent pair)
    s, t = s[order], t[order]
    first = np.concatenate([[True], s[1:] != s[:-1]]) if len(s) else np.zeros(0, bool)
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(s)), 0))
    rank = np.arange(len(s)) - group_start
    take = rank < stored
    table = np.full((vocab, stored), -1, np.int32)
    table[s[take], rank[take]] = t[take]
    return Shortlist(torch.from_numpy(table), torch.from_numpy(top.astype(np.int32)), statistic, len(sample))


FILE = "shortlist.pt"  # a prepared data directory's shortlist (nmt prepare writes it; nmt train reads it)


def save(shortlist: Shortlist, path) -> None:
    """Write `shortlist` to `path` atomically (torch.save of plain tensors)."""
    from nmt_cli.atomic import atomic_write

    data = shortlist.to_dict()
    atomic_write(path, lambda f: torch.save(data, f))


def from_data_dir(data_dir, manifest: dict | None = None) -> Shortlist:
    """A prepared data directory's shortlist: its shortlist.pt, or (a directory prepared before nmt had them, or a
    multilingual one) learned now from its train split."""
    from pathlib import Path

    from nmt_cli.data.store import ParallelData, load_manifest

    manifest = manifest or load_manifest(data_dir)
    vocab = int(manifest["vocab_size"])
    path = Path(data_dir) / FILE
    if path.exists():
        try:
            data = torch.load(path, weights_only=True)
            return Shortlist.from_dict(data, vocab, str(path))
        except Exception:  # a damaged file: learned again below (it is only a cache of the train split)
            pass
    train = ParallelData(data_dir, "train", manifest)
    return learn(SplitPairs(train), vocab)


class SplitPairs:
    """A split as a sequence of (source ids, target ids), read on demand (learn samples from it)."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.data[j] for j in range(*i.indices(len(self)))]
        return self.data[i]
