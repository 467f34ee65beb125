"""Beam search's slot tables: where each row's ancestors' keys and values are, so that a beam reorder moves a small
table instead of the keys and values.

A cache segment keeps one slot per beam (B) at every position, each row writing its new position into its own slot.
`table` [R, C] says, for each row and position, which slot holds its ancestor's keys and values: a beam reorder
gathers the table's rows only. A row attends over all B slots of its sentence (the beams fold into the query
dimension), the slots not its ancestor's masked (`mask`), which reads the same memory as attention over gathered
keys, without the gather (docs/results-history.md#the-decoder-cache-slot-tables-merging-copies). A segment of one
row a sentence (greedy search, sampling of one) has no slot table.
"""

from __future__ import annotations

import torch
from torch import Tensor


class Slots:
    """The slot table of a segment of `beams` rows a sentence. `in_place`: reorders copy into the same table
    (the static layout: its address stays)."""

    def __init__(self, beams: int, in_place: bool, table: Tensor | None = None):
        self.beams, self.in_place = beams, in_place
        self.table = table  # [R, C] the slot of each row's ancestor at each position
        self.own: Tensor | None = None  # [R] each row's own slot (the one it writes): 0 .. B-1 per sentence

    def tensors(self) -> list[Tensor | None]:
        return [self.table, self.own]

    def make_room(self, sentences: int) -> None:
        """Before a step: the rows' own slots on the device (made here, not inside a step)."""
        rows = sentences * self.beams
        if self.own is None or self.own.size(0) != rows:
            self.own = torch.arange(self.beams, device=self.table.device).repeat(sentences)

    def resized(self, rows: int, capacity: int, drop: int, length: int, device) -> None:
        """A table of `capacity` positions, the filled ones (from column `drop` on, to column 0) copied."""
        table = torch.zeros((rows, capacity), dtype=torch.long, device=device)
        if self.table is not None and length > drop:
            table[:, : length - drop] = self.table[:, drop:length]
        self.table = table

    def record(self, layout, length: int, pos: Tensor) -> None:
        """At a step: each row's own slot holds its new position (written as the layout writes positions)."""
        layout.write(self.table, 1, self.own, length, pos)

    def mask(self, window: int, late: Tensor | None, early: Tensor | None) -> Tensor:
        """True where a row must not attend, over its sentence's [window, B] keys -> [N, 1, B, window x B]: the slots
        that do not hold the row's ancestor, and the columns `late` [window] (not decoded yet) and `early` [R,
        window] (before a merged row's start)."""
        b = self.beams
        n = self.table.size(0) // b
        mask = self.table[:, :window].view(n, b, window, 1) != self.own[:b]  # [N, B, window, B]
        if late is not None:
            mask |= late.view(1, 1, window, 1)
        if early is not None:
            mask |= early.view(n, b, window, 1)
        return mask.view(n, 1, b, window * b)

    def reorder(self, rows: Tensor, sentences_left: bool, filled: int | None = None) -> None:
        """Rows `rows` [R'] become the rows (in place where the layout wants it and no sentence left). `filled`: only
        the first `filled` positions are ever read before written (the exact layout): only they are copied."""
        if self.in_place and not sentences_left:
            self.table.copy_(self.table.index_select(0, rows))
        elif filled is None:
            self.table = self.table.index_select(0, rows)
        else:
            table = self.table.new_empty((rows.size(0), self.table.size(1)))
            torch.index_select(self.table[:, :filled], 0, rows, out=table[:, :filled])
            self.table = table

    @staticmethod
    def merged(parts: list[tuple[Slots | None, int, int, int]], capacity: int, length: int, beams: int,
               in_place: bool, device) -> Slots:
        """One table for merged segments' rows: `parts` (slots, rows, shift, filled length) in row order, each
        table's filled columns right-aligned at `length` (shifted by `shift`; columns before are 0, masked)."""
        table = torch.zeros((sum(rows for _, rows, _, _ in parts), capacity), dtype=torch.long, device=device)
        first = 0
        for slots, rows, shift, filled in parts:
            if filled:
                table[first : first + rows, shift:length] = slots.table[:, :filled]
            first += rows
        return Slots(beams, in_place, table)
