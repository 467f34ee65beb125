"""Row offsets of a merged cache segment: where each sentence's positions start in buffers it shares with sentences
that began earlier or later (continuous batching: cache.py's `merge`).

Merged rows are right-aligned: every row's newest position is the same buffer column, and a sentence that began
later reads from its offset on (the columns before it masked: `early`). A segment whose rows all start at column 0
has no offsets. When the first starters leave, the columns no kept row reads any more are dropped (`keep`).
"""

from __future__ import annotations

import torch
from torch import Tensor


class Offsets:
    """Per sentence, the first buffer column it reads (host ints), and the same per row on the device."""

    def __init__(self, starts: list[int]):
        self.starts = starts
        self._rows: Tensor | None = None  # [R] per row (made when needed, before a step)

    def tensors(self) -> list[Tensor | None]:
        return [self._rows]

    def rows(self, beams: int, device) -> Tensor:
        """Per row [R], the first buffer column it reads."""
        if self._rows is None or self._rows.size(0) != len(self.starts) * beams:
            start = torch.tensor(self.starts, dtype=torch.long, device=device)
            self._rows = start.repeat_interleave(beams)
        return self._rows

    def positions(self, pos: Tensor, beams: int) -> Tensor:
        """The position each row decodes at buffer column `pos` [1] -> [R]."""
        return pos - self.rows(beams, pos.device)

    def early(self, columns: Tensor, beams: int) -> Tensor:
        """[R, window] True at the columns before each row's start."""
        return columns < self.rows(beams, columns.device).unsqueeze(1)

    def keep(self, sentences: list[int]) -> tuple[Offsets | None, int]:
        """The sentences `sentences` stay -> their offsets (None where all start together) and the leading columns
        none of them reads, which the segment drops."""
        starts = [self.starts[i] for i in sentences]
        drop = min(starts)
        return Offsets.of([s - drop for s in starts]), drop

    @staticmethod
    def of(starts: list[int]) -> Offsets | None:
        """Offsets for `starts`, or None where every sentence starts at column 0."""
        return Offsets(starts) if any(starts) else None

    @staticmethod
    def merged(parts: list[tuple[Offsets | None, int, int]]) -> Offsets | None:
        """Merged segments' offsets: `parts` (offsets, sentences, shift) in row order, each shifted right."""
        starts: list[int] = []
        for offsets, sentences, shift in parts:
            starts += [s + shift for s in (offsets.starts if offsets is not None else [0] * sentences)]
        return Offsets.of(starts)
