"""The decoder cache: the interface the search uses (`Cache`), and its one implementation (`DecoderCache`).

A `DecoderCache` holds `Segment`s in row order, each with its own positions and source. A segment keeps
  - each decoder layer's self-attention keys and values in a buffer of its own, `kv[layer]` [2, N, H, C, B, K]:
    sentence-major, one slot per beam (B), each row writing its new position into its own slot. One buffer a layer,
    so that growing or moving them holds one layer twice at a time, not the whole cache (the peak of decoding's
    memory; docs/results-history.md#one-buffer-a-layer);
  - beam search's slot table `slots` [R, C]: for each row and position, the slot holding its ancestor's keys and
    values. A beam reorder moves only this table, never the keys and values: a row attends over all B slots of its
    sentence (the beams fold into the query dimension), the slots not its ancestor's masked (`self_mask`), which
    reads the same memory as attention over gathered keys, without the gather
    (docs/results-history.md#the-decoder-cache-slot-tables-merging-copies). One row a sentence: no table;
  - the encoder-decoder keys and values `cross` [L, 2, N, H, S, K], once per sentence, and the source padding mask
    laid out once as [N x H, 1, S].

One layout: the capacity C comes from buckets (16, 32, 64, ...; new buffers, the filled positions copied, when one
runs out), read in one of two ways. Exact (CPU eager, the default): attention reads the `length + 1` filled
positions, a slice; a step writes by a slice. Static (`static=True`: torch.compile, CUDA graphs): attention reads
all C positions, the unfilled ones masked; a step writes by index from the device tensor `pos`; a beam reorder
copies the slot table in place, so every buffer keeps its address and shapes change only with the bucket.
`make_room` and `advance` are the host's part around a step (decoding/step.py), which reads only tensors.

Joins merge (continuous batching): a joining batch becomes part of the newest segment when their lengths differ by
at most MERGE_GAP positions, else a segment of its own; a step runs attention once per layer per segment, and a
server's small joins would otherwise pile up segments (docs/results.md#cpu-decoding-mechanisms). Merged rows are
right-aligned: every row's newest position is the same column, and a later starter reads from `offsets[n]` on
(zeros before, masked); sources are padded to the longest. Columns no row reads any more are dropped when the
first starters leave. Sentences that leave do not move the others: those past the kept count fill the holes
(`order`), and joins write into room left in the same buffers (half as many sentences again to spare; sources
rounded up to CROSS_SOURCES), so a server's step copies only the few sentences that come and go.
"""

from __future__ import annotations

import math
import mmap
from typing import Protocol

import torch
from torch import Tensor

from nmt_cli.decoding.config import index_on, layout_key

BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# A join merges within MERGE_GAP positions of the newest segment (its rows attend over older rows' columns, masked,
# while those run); merging everything was slower: docs/results-history.md#the-decoder-cache-slot-tables-merging-copies.
MERGE_GAP = 4
CROSS_SOURCES = 16  # a merged segment's room for sources: their count rounded up to a multiple of this
MAPPED_BYTES = 16 << 20  # CPU keys-and-values buffers from this size on are `mapped`


class Cache(Protocol):
    """What a search asks of a decoder cache (DecoderCache; ensemble.EnsembleCache composes several)."""

    def rows(self) -> int:
        """Decoder rows (sentences x beams, over all segments)."""

    def reorder(self, rows: Tensor, keep: list[int] | None = None) -> None:
        """The new rows are old rows `rows` [R']. `keep`: None (beams move within their sentences), or the sentences
        kept (over all segments, in the order of `order`), `rows` sentence-major over them."""

    def repeat_beams(self, k: int) -> None:
        """Before the first step of a cache's sentences: k rows a sentence (beams or samples) instead of one."""

    def join(self, other: Cache) -> Cache:
        """This cache's rows, then `other`'s (not stepped yet), decoded as one batch from the next step on; returns
        the joined cache (this one)."""

    def order(self, keep: list[int]) -> list[int]:
        """The sentences `keep` (ascending) in the order that moves the least when the others leave."""

    def make_room(self, max_positions: int) -> None:
        """Room for one more position in every segment (a ValueError past `max_positions`), before a step."""

    def advance(self, host: bool = True, device: bool = True) -> None:
        """One more position decoded: the host's count and/or the device's (a graph replays only the device's)."""

    def key(self) -> tuple:
        """Ints that change whenever a buffer a step reads or writes changes address, shape or strides (graphs.py)."""


class Segment:
    """One batch's rows in the cache (see the module docstring). cross [L, 2, N, H, S, K], src_pad [N, S] or None."""

    def __init__(self, cross: Tensor, src_pad: Tensor | None, static: bool):
        self.cross = cross
        self._room = cross  # the buffer `cross` is the leading [:, :, :N, :, :S] part of (room to join into)
        self.static = static
        self.beams = 1
        self.length = 0  # positions decoded (host)
        self.pos = torch.zeros(1, dtype=torch.long, device=cross.device)  # the same, on the device
        self.kv: list[Tensor] | None = None  # per layer [2, N, H, C, B, K], positions [0, length) filled
        self._kv_room: list[Tensor] | None = None  # per layer, the buffer its `kv` is the leading [:, :N] part of
        self.slots: Tensor | None = None  # beams > 1: [R, C] the slot of each row's ancestor at each position
        self._own: Tensor | None = None  # beams > 1: [R] each row's own slot (the one it writes)
        self._arange: Tensor | None = None  # static layout: [C] position indices, for the mask
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

    def key(self) -> tuple:
        """The addresses, shapes and strides of the buffers a step reads and writes (Cache.key)."""
        return layout_key(*(self.kv or [None]), self.cross, self.pad, self.pos, self.slots, self._own, self._arange,
                          self._row_start)

    def write(self, layer: int, new: Tensor) -> None:
        """Write one layer's new keys and values new [2, N, H, B, K] (each row into its own slot) at the position: by
        index (the `pos` tensor) in the static layout; in the exact one by a slice at `length`, faster on CPU than
        index_copy_."""
        kv = self.kv[layer]  # [2, N, H, C, B, K]
        if self.static:
            kv.index_copy_(3, self.pos, new.unsqueeze(3))
        else:
            kv.select(3, self.length).copy_(new)

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
        """True at the keys a step's self-attention must not attend to (once a step; beam search: first records each
        row's own slot at the position in `slots`).
          - One row a sentence: broadcastable to [N x H, 1, window]: static layout, the columns past the position
            ([1, 1, C]); merged rows, the columns before each row's start ([N x H, 1, window]); None when neither.
          - Beams: [N, 1, B, window x B] over a sentence's [window, B] keys: the slots that do not hold the row's
            ancestor, and those columns."""
        start = self.row_start()
        window, heads = self.window, self.cross.size(3)
        cols = self._arange if self.static or start is None else torch.arange(window, device=start.device)
        late = (cols > self.pos) if self.static else None  # [window]
        early = None if start is None else cols < start.unsqueeze(1)  # [R, window]
        if self.beams == 1:
            mask = None if late is None else late.view(1, 1, -1)
            if early is None:
                return mask
            early = early.unsqueeze(1).expand(-1, heads, -1).reshape(-1, 1, window)
            return early if mask is None else early | mask
        if self.static:
            self.slots.index_copy_(1, self.pos, self._own.unsqueeze(1))
        else:
            self.slots.select(1, self.length).copy_(self._own)
        n, b = self.sentences, self.beams
        slot_ids = self._own[:b]  # 0 .. B-1 (a sentence's own slots)
        mask = self.slots[:, :window].view(n, b, window, 1) != slot_ids  # [N, B, window, B]
        if late is not None:
            mask |= late.view(1, 1, window, 1)
        if early is not None:
            mask |= early.view(n, b, window, 1)
        return mask.view(n, 1, b, window * b)

    def make_room(self) -> None:
        """Before a step: buffers with room for position `length` (host; grows at bucket boundaries), the rows' own
        slots and merged rows' starts on the device (made here, so that the step itself creates no tensor from host
        values)."""
        self.row_start()
        need = self.length + 1
        if self.kv is None or self.capacity < need:
            self._grow(_bucket(need))
        if self.beams > 1 and (self._own is None or self._own.size(0) != self.rows):
            self._own = torch.arange(self.beams, device=self.cross.device).repeat(self.sentences)

    def _grow(self, capacity: int, drop: int = 0) -> None:
        """New buffers of `capacity` positions, the filled ones copied (those from column `drop` on, to column 0), a
        layer at a time: each old buffer goes before the next new one is made."""
        layers, _, n, heads, _, d_k = self.cross.shape
        sentences = n if self._kv_room is None else self._kv_room[0].size(1)
        old, old_room, kept = self.kv, self._kv_room, self.length - drop
        self.kv, self._kv_room = [], []
        for layer in range(layers):
            room = self._new((2, sentences, heads, capacity, self.beams, d_k))
            if old is not None:
                if kept:
                    room[:, :n, :, :kept] = old[layer][:, :, :, drop : self.length]
                old[layer] = old_room[layer] = None
            self.kv.append(room.narrow(1, 0, n))  # (a view made after the copy: autograd, in tests, needs that)
            self._kv_room.append(room)
        if self.beams > 1:
            slots = torch.zeros((self.rows, capacity), dtype=torch.long, device=self.cross.device)
            if self.slots is not None and kept:
                slots[:, :kept] = self.slots[:, drop : self.length]
            self.slots = slots
        if self.static:
            self._arange = torch.arange(capacity, device=self.cross.device)

    def _new(self, shape: list[int] | tuple[int, ...]) -> Tensor:
        """A keys-and-values buffer: zeros in the static layout, which reads every position (masked ones must hold
        no NaN: 0 x NaN is NaN); uninitialised in the exact one, which reads only positions written (or zeroed:
        `merge`, `repeat_beams`), and where zeroing a buffer would cost decoding time for nothing. On CPU a large
        one has pages of its own (`mapped`)."""
        if self.static:
            return self.cross.new_zeros(shape)
        if self.cross.device.type == "cpu" and math.prod(shape) * self.cross.element_size() >= MAPPED_BYTES:
            return mapped(shape, self.cross.dtype)
        return self.cross.new_empty(shape)

    def advance(self, host: bool = True, device: bool = True) -> None:
        """After a step: one position more, on the host (`length`) and on the device (`pos`; a CUDA graph's step
        moves only this one, the host its own after the replay: graphs.py)."""
        if host:
            self.length += 1
        if device:
            self.pos += 1

    def reorder(self, rows: Tensor, sentences: Tensor | None, kept: list[int] | None = None) -> None:
        """Rows `rows` [R'] (local) become the rows; `sentences` (local, or None: unchanged) the sentences, `kept`
        the same on the host. The keys and values move only with sentences that leave (their holes filled); beams
        move in the slot table (in place in the static layout: a CUDA graph's reorder keeps every address). Merged
        rows: the columns no kept row reads any more are dropped."""
        drop = 0
        if sentences is not None:
            self.cross, self._room = _keep(self.cross, self._room, sentences, kept)
            for layer in range(len(self.kv or ())):  # (a layer at a time: see _grow)
                self.kv[layer], self._kv_room[layer] = _keep(self.kv[layer], self._kv_room[layer], sentences, kept,
                                                             self.length, dim=1)
            self._set_pad(None if self.src_pad is None else self.src_pad.index_select(0, sentences))
            if self.offsets is not None:
                offsets = [self.offsets[i] for i in (kept if kept is not None else sentences.tolist())]
                drop = min(offsets)
                self.offsets = [o - drop for o in offsets] if any(o > drop for o in offsets) else None
                self._row_start = None
        if self.slots is not None:
            if self.static and sentences is None:
                self.slots.copy_(self.slots.index_select(0, rows))
            else:
                self.slots = self.slots.index_select(0, rows)
        if drop and self.kv is not None:
            self._grow(self.capacity, drop)
            self.length -= drop
            self.pos -= drop

    def merge(self, other: Segment) -> None:
        """Take `other`'s rows after this one's, right-aligned (module docstring). This one has taken a step, `other`
        too or none; both have as many beams a sentence."""
        length = max(self.length, other.length)
        shifts = (length - self.length, length - other.length)
        offsets = [o + shifts[0] for o in self.offsets or [0] * self.sentences]
        offsets += [o + shifts[1] for o in other.offsets or [0] * other.sentences]
        n, m = self.sentences, other.sentences
        capacity = max(self.capacity, other.capacity if other.kv is not None else 0)
        if not shifts[0] and self._kv_room[0].size(1) >= n + m and self.capacity == capacity:
            parts = [(other, shifts[1], n)]  # into the room: this segment's keys and values stay where they are
        else:
            parts = [(self, shifts[0], 0), (other, shifts[1], n)]
        kv_layers, rooms = [], []
        for layer, room in enumerate(self._kv_room):  # a layer at a time (see _grow)
            if len(parts) == 2:
                shape = list(room.shape)
                shape[1], shape[3] = n + m + (n + m) // 2, capacity
                room = self._new(shape)
            for seg, shift, first in parts:
                part = room.narrow(1, first, seg.sentences)
                if shift:
                    part[:, :, :, :shift].zero_()  # columns masked, and never NaN: 0 x garbage would be
                if seg.length:
                    part[:, :, :, shift:length] = seg.kv[layer][:, :, :, : seg.length]
                    seg.kv[layer] = seg._kv_room[layer] = None  # (this layer copied: its old buffer goes)
            kv_layers.append(room.narrow(1, 0, n + m))  # (made after the copies, as in _grow)
            rooms.append(room)
        if self.beams > 1:
            slots = torch.zeros((self.rows + other.rows, capacity), dtype=torch.long, device=self.cross.device)
            for seg, shift, first in ((self, shifts[0], 0), (other, shifts[1], self.rows)):
                if seg.length:
                    slots[first : first + seg.rows, shift:length] = seg.slots[:, : seg.length]
            self.slots = slots
        sources = max(self.cross.size(4), other.cross.size(4))
        if self.src_pad is None and other.src_pad is None and self.cross.size(4) == other.cross.size(4):
            pad = None
        else:
            pad = torch.cat([_source_pad(self, sources), _source_pad(other, sources)])
        self._join_cross(other.cross, sources)
        self._set_pad(pad)
        self.kv, self._kv_room = kv_layers, rooms
        self.length = length
        self.pos.fill_(length)
        self.offsets = offsets if any(offsets) else None
        self._row_start = None

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
        """k rows a sentence, before the first step (each writes its own slot of k)."""
        if self.kv is not None:
            raise ValueError("repeat_beams: only before a segment's first step")
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

    def key(self) -> tuple:
        return tuple(s.key() for s in self.segments)

    def reorder(self, rows: Tensor, keep: list[int] | None = None) -> None:
        if len(self.segments) == 1:
            seg = self.segments[0]
            sentences = None
            if keep is not None and len(keep) < seg.sentences:
                sentences = index_on(keep, rows.device)
            seg.reorder(rows, sentences, keep)
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
                seg.reorder(local, chosen, mine)
                kept.append(seg)
            row_start += n_rows
            first_sentence += sentences
            first_row += old_rows
        self.segments = kept

    def repeat_beams(self, k: int) -> None:
        for seg in self.segments:
            seg.repeat_beams(k)

    def join(self, other: DecoderCache) -> DecoderCache:
        self.segments += other.segments
        self.merge()
        return self

    def order(self, keep: list[int]) -> list[int]:
        out, first = [], 0
        for seg in self.segments:
            n = seg.sentences
            out += [first + i for i in _fill_holes([i - first for i in keep if first <= i < first + n])]
            first += n
        return out

    def merge(self) -> None:
        """Merge the newest segment into the one before it while that one has taken a step and the rule of the
        module docstring allows it."""
        while len(self.segments) > 1:
            last, before = self.segments[-1], self.segments[-2]
            if (before.kv is None or before.beams != last.beams
                    or abs(before.length - last.length) > MERGE_GAP):
                return
            before.merge(last)
            self.segments.pop()


def _fill_holes(kept: list[int]) -> list[int]:
    """Sentences `kept` (ascending) in the order that moves the fewest: those past the first len(kept) positions
    fill the holes before it, in order; the others stay where they are."""
    n = len(kept)
    tail = iter(k for k in kept if k >= n)
    stay = {k for k in kept if k < n}
    return [i if i in stay else next(tail) for i in range(n)]


def _keep(view: Tensor, room: Tensor, sentences: Tensor, kept: list[int] | None,
          filled: int | None = None, dim: int = 2) -> tuple[Tensor, Tensor]:
    """Keep the sentences `sentences` (their host list `kept`) of `view` (sentences along `dim`, positions along
    `dim` + 2), the leading part of `room` along `dim` -> (the kept view, its room): in place when only sentences
    from past the kept count fill holes (`order`; the first `filled` positions copied, all when None), else by a
    gather; by a gather too when the room holds more than 4x what the kept sentences read (a burst of joins does not
    pin its memory for as long as a server's segment lives)."""
    n = len(kept) if kept is not None else -1
    if (n < 0 or any(k != i and k < n for i, k in enumerate(kept))
            or 4 * n * view.select(dim, 0).numel() < room.size(dim) * room.select(dim, 0).numel()):
        out = view.index_select(dim, sentences)
        return out, out
    part = view if filled is None else view.narrow(dim + 2, 0, filled)
    for i, k in enumerate(kept):
        if k != i:  # one copy a hole: faster than index_copy_ for the one or two of a server's step
            part.select(dim, i).copy_(part.select(dim, k))
    return view.narrow(dim, 0, n), room


def _source_pad(seg: Segment, sources: int) -> Tensor:
    """seg's source padding mask [N, sources]: True at padding, and at the columns past its own sources."""
    n, s = seg.sentences, seg.cross.size(4)
    pad = seg.src_pad if seg.src_pad is not None else torch.zeros(n, s, dtype=torch.bool, device=seg.cross.device)
    return pad if s == sources else torch.cat([pad, pad.new_ones(n, sources - s)], dim=1)


def mapped(shape: list[int] | tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An uninitialised CPU tensor in an anonymous memory mapping of its own: its pages take memory only once
    written (the positions past the filled ones take none), and all of it goes back to the system when the tensor
    goes. A buffer from the C heap may instead land in memory freed earlier and already resident (its unwritten
    part counted too), and on freeing stay with the process when smaller than glibc's mapping threshold (which
    rises to 32 MB as buffers are freed). docs/results-history.md#one-buffer-a-layer."""
    return torch.frombuffer(mmap.mmap(-1, math.prod(shape) * dtype.itemsize), dtype=dtype).view(shape)


def _bucket(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // BUCKETS[-1]) * BUCKETS[-1]
