"""Several models presented as one to the search: the next-token distribution is the average of their
log-probabilities (renormalised by the search's log-softmax). Each model keeps its own decoder cache; all must share
one vocabulary. `EnsembleCache` implements the search's `Cache` interface by doing each operation on every member's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.decoding.cache import DecoderCache


class EnsembleCache:
    def __init__(self, caches: list[DecoderCache]):
        self.caches = caches

    def rows(self) -> int:
        return self.caches[0].rows()

    def reorder(self, rows: Tensor, keep: list[int] | None = None) -> None:
        for c in self.caches:
            c.reorder(rows, keep)

    def repeat_beams(self, k: int) -> None:
        for c in self.caches:
            c.repeat_beams(k)

    def expect(self, positions: int) -> None:
        for c in self.caches:
            c.expect(positions)

    def join(self, other: EnsembleCache) -> EnsembleCache:
        self.caches = [c.join(o) for c, o in zip(self.caches, other.caches, strict=True)]
        return self

    def order(self, keep: list[int]) -> list[int]:
        return self.caches[0].order(keep)  # the members' caches have the same segments

    def make_room(self, max_positions: int) -> None:
        for c in self.caches:
            c.make_room(max_positions)

    def advance(self, host: bool = True, device: bool = True) -> None:
        for c in self.caches:
            c.advance(host, device)

    def key(self) -> tuple:
        return tuple(c.key() for c in self.caches)


class Ensemble:
    def __init__(self, models: list):
        self.models = list(models)
        self.config = min((m.config for m in self.models), key=lambda c: c.max_positions)

    def encode(self, src: Tensor, src_pad_mask: Tensor | None = None) -> list[Tensor]:
        return [m.encode(src, src_pad_mask) for m in self.models]

    def init_cache(self, memory: list[Tensor], src_pad_mask: Tensor | None = None, static: bool = False,
                   ) -> EnsembleCache:
        return EnsembleCache([m.init_cache(x, src_pad_mask, static)
                              for m, x in zip(self.models, memory, strict=True)])

    def step(self, tokens: Tensor, cache: EnsembleCache, candidates=None) -> Tensor:
        """Mean next-token log-probabilities [R, V] over the members (each extends its own cache); over a
        shortlist's columns [R, C] with `candidates` (each member's projection over them)."""
        outs = [F.log_softmax(m.step(tokens, c, candidates).float(), dim=-1)
                for m, c in zip(self.models, cache.caches, strict=True)]
        return torch.stack(outs).mean(0)

    def decode(self, tgt: Tensor, memory: list[Tensor], src_pad_mask: Tensor | None = None) -> Tensor:
        """Mean log-probabilities [B, T, V] at every position of `tgt` (teacher forcing)."""
        outs = [F.log_softmax(m.decode(tgt, x, src_pad_mask).float(), dim=-1)
                for m, x in zip(self.models, memory, strict=True)]
        return torch.stack(outs).mean(0)
