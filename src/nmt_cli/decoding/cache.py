"""The decoder cache: the interface the search uses (`Cache`), and its one implementation (`DecoderCache`).

A `DecoderCache` holds one or more `Segment`s, in row order: one per batch that joined (continuous batching), each
with its own positions and source. A segment keeps
  - the self-attention keys and values of each decoder layer in a preallocated buffer `kv[layer]` [2, R, H, C, K],
    written at position `pos` (by index from a [1] tensor in the static layout, so a step never reads a Python int
    to know where);
  - the encoder-decoder keys and values `cross` [L, 2, N, H, S, K], computed once per sentence and shared by its
    `beams` consecutive rows (R = N x beams, sentence-major; attention folds the beams into the query dimension);
  - the source padding mask, laid out once as [N x H, 1, S] for attention.

Two layouts, one code path:
  - exact (CPU eager, the default): attention reads exactly the `length + 1` filled positions, and every reorder
    gathers them into the spare buffer with room for exactly one more, so the keys and values a step reads are
    contiguous (up to 2x faster on CPU than a slice of a larger buffer). Shapes change every step, which costs
    nothing in eager mode.
  - static (for torch.compile and CUDA graphs): the capacity C comes from a few buckets (16, 32, 64, ...), attention
    reads all C positions with the unfilled ones masked, a beam reorder gathers and copies back in place (the
    buffers keep their addresses), and a step's shapes change only when a bucket does. With SPARE_REORDER the
    reorder gathers into a second buffer of the same shape instead and the two swap (`spare`: half the memory
    traffic, but twice the cache and two CUDA graphs a bucket; slower on an H200), the graph's step leaving the
    swap to the host (`reorder(..., swap=False)`, then `swap()`): a replay runs no Python.
The host side (`make_room`, `advance`) runs around the step; the step itself (`Transformer.static_step`) reads only
tensors and bucket-level ints.

Joined batches merge: a batch that joins becomes part of the segment before it (`DecoderCache.merge`) when their
lengths differ by at most MERGE_GAP positions, so the columns its rows attend to in vain are few: a server's
requests, a few sentences every step or two, share one segment per few steps of age (a step runs attention once per
layer per segment), and no row reads much more than its own positions. A batch that merges takes its first step
inside the merged segment (`merges_on_join`); one that does not keeps a segment of its own. The merged rows are right-aligned: every
row's newest position is the same buffer column, and a sentence that has decoded fewer positions starts later,
`offsets[n]` columns in (zeros there, masked). Sources are padded to the longest. When the sentences that started
first leave, the columns no row reads any more are dropped by the next reorder's gather.

Sentences that leave do not move the others' encoder-decoder keys and values: the sentences past the kept count fill
the holes (`order`), so only they are copied, and the view shrinks. (Its sources stay as many: reading only as many
as the kept sentences have changes the sums of attention, and with them 3 of 4000 n-best lines.) A merge writes the
joining sentences' keys and values after the running ones, into room left in the same buffer (made with half as
many sentences again to spare, and sources rounded up to CROSS_SOURCES). In a server, where a few sentences leave
and join every step or two, copying every running sentence's keys and values instead took ~5% of the decoding
thread (py-spy). The self-attention buffers likewise: once a join has merged into a segment, its buffers keep as
many rows spare (`spare_rows`: the largest join so far; exact layout), and a later join of that size writes its
rows there while the running ones stay in place (1.02-1.09x a server's throughput at 32 clients, 8 runs in turn).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# A joining batch merges when its length is within MERGE_GAP positions of the running segment's (merged, its rows
# attend over the older rows' columns, masked, for as long as those run). Measured with 32 clients into a server's
# engine (docs/results.md#serving): merging any small join into one segment (the rule before: or gap x rows <= 4096)
# read 2.56x the columns the rows own and ran 0.95-0.97x as fast as gaps of 4 (3.4 segments a step, 1.19x the
# columns); gaps of 0-6 measured alike, 8 0.97x, 12 0.95x.
MERGE_GAP = 4
CROSS_SOURCES = 16  # a merged segment's room for sources: their count rounded up to a multiple of this
# Static layout: a beam reorder gathers into a spare buffer and swaps (one pass over the cache), or, False (the
# default), gathers and copies back in place (two passes, one address: a CUDA graph a bucket instead of two, and no
# second cache). On an H200 (bench/graph_ab.py, base shape, fp16, 3003 newstest2014 lines, 2026-11-26) in place ran
# 1.10x and 1.18x as fast as the spare buffers in two rounds, recording 30 graphs instead of 124, with the same
# 3003 best hypotheses.
SPARE_REORDER = False


class Cache(Protocol):
    """What a search asks of a decoder cache (DecoderCache; ensemble.EnsembleCache composes several)."""

    def rows(self) -> int:
        """Decoder rows (sentences x beams, over all segments)."""

    def reorder(self, rows: Tensor, keep: list[int] | None = None) -> None:
        """The new rows are old rows `rows` [R']. `keep` None: every row keeps its sentence (beams move within their
        sentences). Else the sentences kept (indices over all segments, in the order of `order`), `rows`
        sentence-major over them, `beams` rows each."""

    def repeat_beams(self, k: int, newest: bool = False) -> None:
        """Each row becomes k consecutive rows (of the same sentence); `newest`: only the segment that joined last."""

    def join(self, other: Cache) -> Cache:
        """This cache's rows, then `other`'s, decoded as one batch; returns the joined cache (this one)."""

    def merges_on_join(self, beams: int) -> bool:
        """Whether the rows that joined last, before their first step, become part of the running rows' cache
        once they are `beams` a sentence (then the search repeats them first and decodes all rows as one)."""

    def order(self, keep: list[int]) -> list[int]:
        """The sentences `keep` (ascending) in the order they take when the others leave (a permutation of it: the
        one that moves the least; `reorder`'s `keep` is then in this order)."""


class Segment:
    """One batch's rows in the cache (see the module docstring). cross [L, 2, N, H, S, K], src_pad [N, S] or None."""

    def __init__(self, cross: Tensor, src_pad: Tensor | None, static: bool):
        self.cross = cross
        self._room = cross  # the buffer `cross` is the leading [:, :, :N, :, :S] part of (room to join into)
        self.static = static
        self.beams = 1
        self.length = 0  # positions decoded (host)
        self.pos = torch.zeros(1, dtype=torch.long, device=cross.device)  # the same, on the device
        self.kv: list[Tensor] | None = None  # per layer [2, R, H, C, K], positions [0, length) filled
        self._flat: list[list[Tensor | None]] = [[None, None] for _ in range(cross.size(0))]  # exact: per layer, the
        # two buffers its `kv` alternates between
        self._in_use = 0
        self.spare_rows = 0  # exact layout: rows each buffer keeps free after the segment's (for joins to merge into)
        self._full: list[Tensor] | None = None  # exact layout: per layer the buffer [2, R + spare, H, C, K] `kv` is
        # the first R rows of
        self._arange: Tensor | None = None  # static layout: [C] position indices, for the mask
        self.spare: list[Tensor] | None = None  # static layout, beams: per layer the buffer a reorder gathers into
        self.offsets: list[int] | None = None  # host, per sentence: the first column it reads (merged; None: all 0)
        self._row_start: Tensor | None = None  # the same per row [R] on the device (made when needed)
        self._set_pad(src_pad)

    def _set_pad(self, src_pad: Tensor | None) -> None:
        self.src_pad = src_pad
        heads = self.cross.size(3)
        self.pad = None if src_pad is None else src_pad.repeat_interleave(heads, 0).unsqueeze(1)  # [N*H, 1, S]

    @property
    def sentences(self) -> int:
        return self.cross.size(2)

    @property
    def rows(self) -> int:
        return self.sentences * self.beams

    @property
    def window(self) -> int:
        """Positions a step's self-attention reads: the filled ones (exact) or the capacity (static)."""
        return self.capacity if self.static else self.length + 1

    @property
    def capacity(self) -> int:
        return self.kv[0].size(3)

    def write(self, kv: Tensor, new: Tensor) -> None:
        """Write one layer's new keys and values new [2, R, H, 1, K] into kv [2, R, H, C, K] at the position: by
        index (the `pos` tensor) in the static layout; in the exact one by a slice at `length`, which measured ~2x
        faster on CPU than index_copy_."""
        if self.static:
            kv.index_copy_(3, self.pos, new)
        else:
            kv.narrow(3, self.length, 1).copy_(new)

    def row_start(self) -> Tensor | None:
        """Per row [R], the first buffer column it reads (merged segments), or None when every row reads from 0."""
        if self.offsets is None:
            return None
        if self._row_start is None or self._row_start.size(0) != self.rows:
            start = torch.tensor(self.offsets, dtype=torch.long, device=self.cross.device)
            self._row_start = start.repeat_interleave(self.beams)
        return self._row_start

    def positions(self) -> Tensor:
        """The position each row decodes at this step: [1] (the same for all) or [R] (merged rows)."""
        start = self.row_start()
        return self.pos if start is None else self.pos - start

    def self_mask(self) -> Tensor | None:
        """True at the buffer columns a step must not attend to, broadcastable to [R x H, 1, window]: static
        layout, the columns past the position ([1, 1, C]); merged rows, the columns before each row's start
        ([R x H, 1, window]); None when neither."""
        start = self.row_start()
        mask = (self._arange > self.pos).view(1, 1, -1) if self.static else None
        if start is None:
            return mask
        window, heads = self.window, self.cross.size(3)
        cols = self._arange if self.static else torch.arange(window, device=start.device)
        early = (cols < start.unsqueeze(1)).unsqueeze(1).expand(-1, heads, -1).reshape(-1, 1, window)
        return early if mask is None else early | mask

    def make_room(self) -> None:
        """Before a step: a buffer with room for position `length` (host; grows at bucket boundaries), and merged
        rows' starts on the device (made here, so that the step itself creates no tensor from host values)."""
        self.row_start()
        need = self.length + 1
        if self.kv is None or self.capacity < need:
            capacity = _bucket(need) if self.static else max(16, 2 * need)
            grown = self._layout(self.rows, capacity)
            if self.kv is not None:
                for new, old in zip(grown, self.kv, strict=True):
                    new[..., : self.length, :] = old[..., : self.length, :]
            self.kv = grown
        if SPARE_REORDER and self.static and self.beams > 1:
            self._spare_buffers()  # made here, outside a graph's recording

    def _layout(self, rows: int, capacity: int) -> list[Tensor]:
        """Per layer a [2, rows, H, capacity, K] buffer: static, a new zeroed one (masked positions must hold no
        NaN); exact, a view of the layer's flat buffer not backing `kv` (grown when too small, smaller again when 4x
        too large: a joined batch's long-lived last rows would otherwise keep its first steps' memory). One buffer
        per layer, not one for all: buffers L times larger measured 1.5x slower to gather into on CPU (fresh pages
        from the allocator on every resize)."""
        _, _, _, heads, _, d_k = self.cross.shape
        if self.static:
            self._arange = torch.arange(capacity, device=self.cross.device)
            return [self.cross.new_zeros((2, rows, heads, capacity, d_k)) for _ in self._flat]
        self._in_use = spare = 1 - self._in_use
        shape = (2, rows + self.spare_rows, heads, capacity, d_k)
        need = 2 * shape[1] * heads * capacity * d_k
        self._full = []
        for flat in self._flat:
            if flat[spare] is None or not need <= flat[spare].numel() <= 4 * need + 4096:
                flat[spare] = self.cross.new_empty(need + need // 4)  # room to grow a few steps
            self._full.append(flat[spare][:need].view(shape))
        return [full.narrow(1, 0, rows) for full in self._full]

    def _spare_buffers(self) -> list[Tensor]:
        """The buffers a beam reorder gathers into (SPARE_REORDER), made to the cache's shape when it has none."""
        if self.spare is None or self.spare[0].shape != self.kv[0].shape:
            self.spare = [torch.empty_like(kv) for kv in self.kv]  # (a reorder writes every position of them)
        return self.spare

    def swap(self) -> None:
        """The spare buffers (a beam reorder's gather, `reorder(..., swap=False)`) become the cache."""
        self.kv, self.spare = self.spare, self.kv

    def advance(self, host: bool = True, device: bool = True) -> None:
        """After a step: one position more, on the host (`length`) and on the device (`pos`; a CUDA graph's step
        moves only this one, the host its own after the replay: graphs.py)."""
        if host:
            self.length += 1
        if device:
            self.pos += 1

    def reorder(self, rows: Tensor, sentences: Tensor | None, kept: list[int] | None = None,
                swap: bool = True) -> None:
        """Rows `rows` [R'] (local) become the rows; `sentences` (local, or None: unchanged) the sentences, `kept`
        the same on the host. Merged rows: the columns no kept row reads any more are dropped. `swap` False (with
        SPARE_REORDER, a static layout's beam reorder in a CUDA graph): the rows are gathered into `spare`, and
        `swap()` makes it the cache afterwards."""
        drop = 0
        if sentences is not None:
            self._keep_cross(sentences, kept)
            self._set_pad(None if self.src_pad is None else self.src_pad.index_select(0, sentences))
            if self.offsets is not None:
                offsets = [self.offsets[i] for i in (kept if kept is not None else sentences.tolist())]
                drop = min(offsets)
                self.offsets = [o - drop for o in offsets] if any(o > drop for o in offsets) else None
                self._row_start = None
        if self.kv is None:
            return
        if self.static and rows.numel() == self.kv[0].size(1) and not drop:  # as many rows: beams moved
            if not SPARE_REORDER:
                for kv in self.kv:  # in place: the buffers keep their addresses
                    kv.copy_(kv.index_select(1, rows))
                return
            for kv, out in zip(self.kv, self._spare_buffers(), strict=True):  # addresses alternate between two
                if kv.requires_grad:  # (decoding outside no_grad; autograd does not support out=)
                    out.copy_(kv.index_select(1, rows))
                else:
                    torch.index_select(kv, 1, rows, out=out)
            if swap:
                self.swap()
            return
        # static: every position (no shape from the length); exact: the filled ones, from the first one still read
        end = self.capacity if self.static else self.length
        target = self._layout(rows.numel(), self.capacity if self.static else self.length - drop + 1)
        for kv, out in zip(self.kv, target, strict=True):
            if kv.requires_grad:  # (decoding outside no_grad; autograd does not support out=)
                out[..., : end - drop, :].copy_(kv[..., drop:end, :].index_select(1, rows))
            else:
                torch.index_select(kv[..., drop:end, :], 1, rows, out=out[..., : end - drop, :])
        self.kv = target
        if drop:
            self.length -= drop
            self.pos -= drop

    def merge(self, other: Segment) -> None:
        """Take `other`'s rows after this one's, right-aligned (see the module docstring). This one has taken a step
        (its buffers exist), `other` too or none at all, and both have as many beams a sentence."""
        length = max(self.length, other.length)
        shifts = (length - self.length, length - other.length)
        offsets = [o + shifts[0] for o in self.offsets or [0] * self.sentences]
        offsets += [o + shifts[1] for o in other.offsets or [0] * other.sentences]
        rows = (self.rows, other.rows)
        if not self.static and not shifts[0] and self._full[0].size(1) >= sum(rows):
            target = [full.narrow(1, 0, sum(rows)) for full in self._full]  # into the spare rows: this segment's
            parts = [(other, shifts[1], rows[0])]  # stay where they are
        else:
            self.spare_rows = max(self.spare_rows, other.rows)  # joins this size merge in place from now on
            capacity = max(self.capacity, other.capacity if other.kv is not None else 0)
            target = self._layout(sum(rows), capacity if self.static else length + 1)
            parts = [(self, shifts[0], 0), (other, shifts[1], rows[0])]
        for layer, out in enumerate(target):
            for seg, shift, first in parts:
                part = out.narrow(1, first, seg.rows)
                if shift and not self.static:
                    part[..., :shift, :].zero_()  # columns masked, and never NaN: 0 x garbage would be
                if seg.length:
                    part[..., shift:length, :] = seg.kv[layer][..., : seg.length, :]
        sources = max(self.cross.size(4), other.cross.size(4))
        if self.src_pad is None and other.src_pad is None and self.cross.size(4) == other.cross.size(4):
            pad = None
        else:
            pad = torch.cat([_source_pad(self, sources), _source_pad(other, sources)])
        self._join_cross(other.cross, sources)
        self._set_pad(pad)
        self.kv = target
        self.length = length
        self.pos.fill_(length)
        self.offsets = offsets if any(offsets) else None
        self._row_start = None

    def _keep_cross(self, sentences: Tensor, kept: list[int] | None) -> None:
        """Keep the encoder-decoder keys and values of `sentences` (their host list `kept`): in place when only
        sentences from past the kept count fill holes (`order`), else by a gather; by a gather too when the buffer
        holds more than 4x what the kept sentences read (a burst of joins does not pin its memory for as long as a
        server's segment lives)."""
        n = len(kept) if kept is not None else -1
        if (n < 0 or any(k != i and k < n for i, k in enumerate(kept))
                or 4 * n * self.cross.size(4) < self._room.size(2) * self._room.size(4)):
            self.cross = self._room = self.cross.index_select(2, sentences)
            return
        for i, k in enumerate(kept):
            if k != i:  # one copy a hole: 3x faster than index_copy_ for the one or two of a server's step
                self.cross[:, :, i].copy_(self.cross[:, :, k])
        self.cross = self.cross.narrow(2, 0, n)

    def _join_cross(self, other: Tensor, sources: int) -> None:
        """Append `other`'s encoder-decoder keys and values [L, 2, n, H, s, K] after this segment's sentences, both
        read over `sources` source positions (the columns past a sentence's own are masked by the padding mask):
        into the buffer's room where there is enough, else into a new buffer with room to spare."""
        n, m = self.sentences, other.size(2)
        room = self._room
        if room.size(2) < n + m or room.size(4) < sources:
            shape = list(room.shape)
            shape[2], shape[4] = n + m + (n + m) // 2, -(-sources // CROSS_SOURCES) * CROSS_SOURCES
            room = self.cross.new_zeros(shape)  # zeros: columns never written are masked, and must not be NaN
            room[:, :, :n, :, : self.cross.size(4)] = self.cross
        room[:, :, n : n + m, :, : other.size(4)] = other
        self._room, self.cross = room, room[:, :, : n + m, :, :sources]

    def repeat_beams(self, k: int) -> None:
        if k == 1:
            return
        if self.kv is not None:
            self.reorder(torch.arange(self.rows, device=self.cross.device).repeat_interleave(k), None)
        self.beams *= k


class DecoderCache:
    """Incremental-decoding state of the whole decoder stack (see the module docstring). Implements `Cache`."""

    def __init__(self, segments: list[Segment]):
        self.segments = segments

    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    def make_room(self, max_positions: int) -> None:
        for s in self.segments:
            if s.length >= max_positions:
                raise ValueError(f"sequence of {s.length + 1} tokens exceeds max_positions {max_positions}")
            s.make_room()

    def advance(self, host: bool = True, device: bool = True) -> None:
        for s in self.segments:
            s.advance(host, device)

    def reorder(self, rows: Tensor, keep: list[int] | None = None, swap: bool = True) -> None:
        if len(self.segments) == 1:
            seg = self.segments[0]
            sentences = None
            if keep is not None and len(keep) < seg.sentences:
                sentences = torch.tensor(keep, device=rows.device)
            seg.reorder(rows, sentences, keep, swap)
            return
        kept, row_start, first_sentence, first_row = [], 0, 0, 0
        for seg in self.segments:
            sentences, old_rows = seg.sentences, seg.rows
            if keep is None:
                mine, count = None, sentences
            else:
                mine = [i - first_sentence for i in keep if first_sentence <= i < first_sentence + sentences]
                count = len(mine)
            n_rows = count * seg.beams
            if count:
                local = rows[row_start : row_start + n_rows] - first_row
                chosen = None if mine is None or count == sentences else torch.tensor(mine, device=rows.device)
                seg.reorder(local, chosen, mine, swap)
                kept.append(seg)
            row_start += n_rows
            first_sentence += sentences
            first_row += old_rows
        self.segments = kept

    def swap(self) -> None:
        """After `reorder(rows, swap=False)` (beams moved, no sentence left): each segment's gathered buffers
        become its cache."""
        for s in self.segments:
            s.swap()

    def repeat_beams(self, k: int, newest: bool = False) -> None:
        for seg in self.segments[-1:] if newest else self.segments:
            seg.repeat_beams(k)
        if newest:  # the batch that joined: part of the segment before it, where the rule allows
            self.merge()

    def join(self, other: DecoderCache) -> DecoderCache:
        self.segments += other.segments
        return self

    def order(self, keep: list[int]) -> list[int]:
        out, first = [], 0
        for seg in self.segments:
            n = seg.sentences
            out += [first + i for i in _fill_holes([i - first for i in keep if first <= i < first + n])]
            first += n
        return out

    def merges_on_join(self, beams: int) -> bool:
        """Whether the segment that joined last (no step taken yet) merges into the one before it once it has
        `beams` rows a sentence: then it takes its first step there (`repeat_beams(beams, newest=True)` first)."""
        if len(self.segments) < 2:
            return False
        last, before = self.segments[-1], self.segments[-2]
        return last.kv is None and _mergeable(before, last.length, beams)

    def merge(self) -> None:
        """Merge the newest segment into the one before it while that one has taken a step and the rule of the
        module docstring allows it."""
        while len(self.segments) > 1:
            last, before = self.segments[-1], self.segments[-2]
            if last.kv is None and last.length:
                return
            if not _mergeable(before, last.length, last.beams):
                return
            before.merge(last)
            self.segments.pop()


def _mergeable(before: Segment, length: int, beams: int) -> bool:
    """Whether rows that decoded `length` positions, `beams` a sentence, merge into `before` (see the module
    docstring)."""
    return before.kv is not None and before.beams == beams and abs(before.length - length) <= MERGE_GAP


def _fill_holes(kept: list[int]) -> list[int]:
    """Sentences `kept` (ascending) in the order that moves the fewest: those past the first len(kept) positions
    fill the holes before it, in order; the others stay where they are."""
    n = len(kept)
    tail = iter(k for k in kept if k >= n)
    stay = {k for k in kept if k < n}
    return [i if i in stay else next(tail) for i in range(n)]


def _source_pad(seg: Segment, sources: int) -> Tensor:
    """seg's source padding mask [N, sources]: True at padding, and at the columns past its own sources."""
    n, s = seg.sentences, seg.cross.size(4)
    pad = seg.src_pad if seg.src_pad is not None else torch.zeros(n, s, dtype=torch.bool, device=seg.cross.device)
    return pad if s == sources else torch.cat([pad, pad.new_ones(n, sources - s)], dim=1)


def _bucket(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // BUCKETS[-1]) * BUCKETS[-1]
