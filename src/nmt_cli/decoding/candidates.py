"""The target pieces a running search may produce, when the model has a vocabulary shortlist (data/shortlist.py):
for each sentence the lists of its source pieces, plus the pieces always allowed (the frequent ones, the specials,
language tags, its prefix). The step's output projection, log-softmax and search run over these columns only.

Sentences are scored in groups of up to GROUP sentences (those that started together, in order), each group's
projection over the union of its sentences' candidates: a group's union stays small where a whole batch's would
cover most of the vocabulary. Each row then keeps its own sentence's candidates only (the others -inf, `mask`), so
a sentence's translation does not depend on which sentences share its batch or group (offline, joined, served). Every group has the same number of columns W (a multiple of MULTIPLE, filled up with the lowest ids
missing: sentencepiece numbers pieces by frequency, roughly), so that the step's logits are one [R, W] tensor; a
group's columns are its sorted ids, so the specials (ids 0-3) keep their columns and the constraints on PAD, BOS and
EOS need no mapping. `to_ids` maps a sentence's columns back to pieces, `to_columns` a row's pieces to columns.

Groups are made when sentences start (`admit`) and keep their columns while sentences leave (`keep`); once they
hold half as many sentences as they could, they are made again from the sentences left.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

GROUP = 16  # sentences scored over one union of candidates (docs/results.md, Shortlist)
MULTIPLE = 64  # columns come in multiples of this (beam.py's top-k by blocks, and oneDNN's products, want them)


@dataclass(frozen=True)
class Shortlisting:
    """How a model's shortlist is used, made once per translator: `pieces` [V, k'] (the shortlist's table, -1 where a
    piece lists fewer), of which the first `size` per source piece count, and `always` the ids every batch may
    produce (the frequent pieces, the specials, language tags)."""

    pieces: Tensor
    always: Tensor
    size: int
    group: int = GROUP
    table: Tensor = field(init=False)  # [V, size] long
    allowed: Tensor = field(init=False)  # `always` as a [V] mask

    def __post_init__(self):
        object.__setattr__(self, "table", self.pieces[:, : self.size].long().contiguous())
        allowed = torch.zeros(self.pieces.size(0), dtype=torch.bool)
        allowed[self.always.long()] = True
        object.__setattr__(self, "allowed", allowed)

    def candidates(self, per: int) -> Candidates:
        """The columns of one search (one decoding loop) of `per` rows a sentence."""
        return Candidates(self.table, self.allowed, per, self.group)


class Candidates:
    """The columns of one running search: `pieces` [V, k] each source piece's list, `always` [V] the mask of the
    pieces every sentence may produce, `per` rows a sentence, groups of up to `group` sentences."""

    def __init__(self, pieces: Tensor, always: Tensor, per: int, group: int = GROUP):
        self.vocab = pieces.size(0)
        self.pieces, self.always, self.per, self.group = pieces, always, per, group
        self.rows = torch.zeros(0, self.vocab, dtype=torch.bool)  # each running sentence's own candidates [N, V]
        self.of = torch.zeros(0, dtype=torch.long)  # each running sentence's group [N]
        self.masks: list[Tensor] = []  # each group's candidates [V] (its columns: the ids set, sorted)
        self.width = 0  # W: columns per group
        self.ids = torch.zeros(0, 0, dtype=torch.long)  # each group's columns' pieces [G, W]
        self.columns = torch.zeros(0, self.vocab, dtype=torch.long)  # each group's column of every piece [G, V]
        self._outputs: dict[int, list] = {}  # per model: each group's output projection over its columns
        self._layout: tuple | None = None  # each group's rows, made once per set of sentences

    # ------------------------------------------------------------------ the sentences

    def admit(self, src: Tensor, prefix: Tensor | None = None) -> None:
        """Sentences join (after the running ones): src [n, S] their source ids (PAD, EOS and -1 lists are harmless:
        the specials are always in), `prefix` [n, P] the target pieces they are forced to begin with."""
        src = src.cpu()
        n = src.size(0)
        listed = self.pieces.index_select(0, src.reshape(-1)).view(n, -1).clamp_(min=0)
        rows = torch.zeros(n, self.vocab, dtype=torch.bool).scatter_(1, listed, True)
        if prefix is not None:
            rows.scatter_(1, prefix.cpu(), True)
        rows |= self.always
        first = len(self.masks)
        groups = -(-n // self.group)
        size = -(-n // groups)  # groups of equal size, as near as can be
        of = torch.arange(n) // size + first
        self.masks += [rows[i : i + size].any(0) for i in range(0, n, size)]
        self.rows, self.of = torch.cat([self.rows, rows]), torch.cat([self.of, of])
        self._columns(first)

    def keep(self, keep: list[int]) -> None:
        """Only sentences `keep` (indices, in their new order) stay. Groups keep their columns; once they are twice
        as many as the sentences need, they are made again."""
        index = torch.tensor(keep, dtype=torch.long)
        self.rows, self.of = self.rows.index_select(0, index), self.of.index_select(0, index)
        self._layout = None
        if not keep:
            self.masks, self._outputs = [], {}
            self.ids = torch.zeros(0, 0, dtype=torch.long)
            return
        used = torch.unique(self.of)
        if len(used) > 1 and len(used) >= 2 * -(-len(keep) // self.group):
            # regroup, in the sentences' order: their own candidates, in new unions
            n = len(keep)
            groups = -(-n // self.group)
            size = -(-n // groups)
            self.of = torch.arange(n) // size
            self.masks = [self.rows[i : i + size].any(0) for i in range(0, n, size)]
            self.width = 0
            self._columns(0)

    # ------------------------------------------------------------------ a step

    def output(self, model):
        """`model`'s output projection over each row's columns: a function x [R, D] -> logits [R, W]."""
        layers = self._outputs.get(id(model))
        if layers is None or len(layers) < len(self.masks):
            layers = (layers or []) + [model.output_over(ids) for ids in self.ids[len(layers or []) :]]
            self._outputs[id(model)] = layers
        groups, rows, others, _ = self._groups()

        def project(x: Tensor) -> Tensor:
            if len(groups) == 1:
                out = layers[groups[0]](x)
            else:
                out = x.new_empty(x.size(0), self.width)
                for g, r in zip(groups, rows, strict=True):
                    out.index_copy_(0, r, layers[g](x.index_select(0, r)))
            out[: others.size(0)].masked_fill_(others, float("-inf"))  # each row: its own sentence's candidates
            return out  # (rows past the sentences': padding, dropped by the step)

        return project

    def to_ids(self, columns: Tensor) -> Tensor:
        """Columns of each sentence's rows [N, X] -> their pieces."""
        return self.ids.index_select(0, self.of).gather(1, columns)

    def to_columns(self, ids: Tensor) -> Tensor:
        """Pieces of each row [R] or [R, X] -> their columns in the row's group (PAD's column, 0, where absent)."""
        group = self._groups()[3]  # [R]
        return self.columns[group.view(-1, *([1] * (ids.dim() - 1))), ids]

    # ------------------------------------------------------------------ inside

    def _groups(self) -> tuple[list[int], list[Tensor], Tensor, Tensor]:
        """The groups with sentences now, each one's rows (in the step's row order), the columns of each row that
        are not its own sentence's candidates [R, W], and each row's group [R] (made once per set of sentences)."""
        if self._layout is None:
            groups = torch.unique(self.of).tolist()
            row_group = self.of.repeat_interleave(self.per)
            rows = [] if len(groups) == 1 else [(row_group == g).nonzero().squeeze(1) for g in groups]
            own = self.rows.gather(1, self.ids.index_select(0, self.of))  # [N, W]
            self._layout = (groups, rows, (~own).repeat_interleave(self.per, dim=0), row_group)
        return self._layout

    def _columns(self, first: int) -> None:
        """Columns for the groups from `first` on; all of them again if they need more than the width so far."""
        need = max(int(m.sum()) for m in self.masks[first:])
        need = min(need - need % -MULTIPLE, self.vocab)
        if need > self.width:
            self.width, first, self._outputs = need, 0, {}
        ids, columns = [], []
        for mask in self.masks[first:]:
            short = self.width - int(mask.sum())
            if short:  # filled up with the lowest ids missing
                mask = mask.clone()
                mask[(~mask).nonzero().squeeze(1)[:short]] = True
            own = mask.nonzero().squeeze(1)
            ids.append(own)
            column = torch.zeros(self.vocab, dtype=torch.long)
            column[own] = torch.arange(own.numel())
            columns.append(column)
        keep = self.ids[:first] if first else self.ids.new_zeros(0, self.width)
        self.ids = torch.cat([keep, torch.stack(ids)])
        self.columns = torch.cat([self.columns[:first], torch.stack(columns)])
        self._layout = None
