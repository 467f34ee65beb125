"""The decoder cache: the interface the search uses (`Cache`), and its implementation (`DecoderCache`), a list of
`Segment`s in row order, each with its own positions and source. Attention over the cache is here too
(`self_attend`, `cross_attend`): the buffers' layout is written down in this module alone, and the step (step.py)
hands in projections and takes attention outputs back.

A segment keeps
  - each decoder layer's self-attention keys and values in a buffer of its own, `kv[layer]` [2, N, H, C, B, K]:
    sentence-major, one slot per beam (B), each row writing its new position into its own slot. One buffer a layer,
    so that growing or moving them holds one layer twice at a time, not the whole cache (the peak of decoding's
    memory; docs/results-history.md#one-buffer-a-layer);
  - the encoder-decoder keys and values `cross` [L, 2, N, H, S, K], once per sentence, and the source padding mask
    laid out once as [N x H, 1, S];
and composes three pieces, one idea each, each absent where it has nothing to do:
  - its `layout` (layout.py), chosen once: `Exact` (CPU eager: the filled positions, read by a slice) or `Static`
    (torch.compile, CUDA graphs: every position, masked, written by index, every address kept);
  - `slots` (slots.py): beam search's slot table, which slot holds each row's ancestor at each position (None for
    one row a sentence);
  - `offsets` (offsets.py): where each sentence's positions start in a merged segment (None when all start at 0).

Joins merge (continuous batching): a joining batch becomes part of the newest segment when their lengths differ by
at most MERGE_GAP positions, else a segment of its own; a step runs attention once per layer per segment, and a
server's small joins would otherwise pile up segments (docs/results.md#cpu-decoding-mechanisms). Sources are
padded to the longest. Sentences that leave do not move the others: those past the kept count fill the holes
(`order`), and joins write into room left in the same buffers (half as many sentences again to spare; sources
rounded up to CROSS_SOURCES), so a server's step copies only the few sentences that come and go.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from nmt_cli.decoding.attention import attend
from nmt_cli.decoding.batch import index_on
from nmt_cli.decoding.graphs import layout_key
from nmt_cli.decoding.layout import Exact, Static
from nmt_cli.decoding.offsets import Offsets
from nmt_cli.decoding.slots import Slots

# A join merges within MERGE_GAP positions of the newest segment (its rows attend over older rows' columns, masked,
# while those run); merging everything was slower: docs/results-history.md#the-decoder-cache-slot-tables-merging-copies.
MERGE_GAP = 4
CROSS_SOURCES = 16  # a merged segment's room for sources: their count rounded up to a multiple of this


class Cache(Protocol):
    """What a search asks of a decoder cache (DecoderCache; ensemble.EnsembleCache composes several)."""

    def rows(self) -> int:
        """Decoder rows (sentences x beams, over all segments)."""

    def reorder(self, rows: Tensor, keep: list[int] | None = None) -> None:
        """The new rows are old rows `rows` [R']. `keep`: None (beams move within their sentences), or the sentences
        kept (over all segments, in the order of `order`), `rows` sentence-major over them."""

    def repeat_beams(self, k: int) -> None:
        """Before the first step of a cache's sentences: k rows a sentence (beams or samples) instead of one."""

    def expect(self, positions: int) -> None:
        """Before the first step of a cache's sentences: the most positions any of them may decode (their longest
        maximum output length; a hint for the buffers' capacity, layout.py's `capacity`)."""

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
    """One batch's rows in the cache (see the module docstring). cross [L, 2, N, H, S, K], src_pad [N, S] or None;
    `static`: the Static layout, else the Exact one."""

    def __init__(self, cross: Tensor, src_pad: Tensor | None, static: bool):
        self.cross = cross
        self._room = cross  # the buffer `cross` is the leading [:, :, :N, :, :S] part of (room to join into)
        self.layout = Static() if static else Exact()
        self.beams = 1
        self.length = 0  # positions decoded (host)
        self.expected = 0  # the most positions its sentences may decode (`expect`; 0: not said)
        self.pos = torch.zeros(1, dtype=torch.long, device=cross.device)  # the same, on the device
        self.kv: list[Tensor] | None = None  # per layer [2, N, H, C, B, K], positions [0, length) filled
        self._kv_room: list[Tensor] | None = None  # per layer, the buffer its `kv` is the leading [:, :N] part of
        self.slots: Slots | None = None  # beams > 1 (made with the first buffers)
        self.offsets: Offsets | None = None  # merged rows that start at different columns
        self._views: tuple = (None, [])  # (the cross it was made of, its per-layer views): `_cross_views`
        self._set_pad(src_pad)

    def _set_pad(self, src_pad: Tensor | None) -> None:
        self.src_pad = src_pad
        heads = self.cross.size(3)
        self.pad = None if src_pad is None else src_pad.repeat_interleave(heads, 0).unsqueeze(1)  # [N*H, 1, S]

    @property
    def static(self) -> bool:
        return self.layout.static

    @property
    def sentences(self) -> int:
        return self.cross.size(2)

    @property
    def rows(self) -> int:
        return self.sentences * self.beams

    @property
    def window(self) -> int:
        """Positions a step's self-attention reads (layout.py)."""
        return self.layout.window(self.length, self.capacity)

    @property
    def capacity(self) -> int:
        return self.kv[0].size(3)

    def tensors(self) -> list[Tensor | None]:
        """Every tensor a step reads or writes (the pieces' too; None where a piece is absent)."""
        return [*(self.kv or [None]), self.cross, self.pad, self.pos, *self.layout.tensors(),
                *(self.slots.tensors() if self.slots is not None else (None, None)),
                *(self.offsets.tensors() if self.offsets is not None else (None,))]

    def key(self) -> tuple:
        """The addresses, shapes and strides of the buffers a step reads and writes (Cache.key)."""
        return layout_key(*self.tensors())

    def positions(self) -> Tensor:
        """The position each row decodes at this step: [1] (the same for all) or [R] (merged rows)."""
        return self.pos if self.offsets is None else self.offsets.positions(self.pos, self.beams)

    def self_mask(self) -> Tensor | None:
        """True at the keys a step's self-attention must not attend to (once a step; beam search: first records each
        row's own slot at the position in the slot table).
          - One row a sentence: broadcastable to [N x H, 1, window]: static layout, the columns past the position
            ([1, 1, C]); merged rows, the columns before each row's start ([N x H, 1, window]); None when neither.
          - Beams: [N, 1, B, window x B] over a sentence's [window, B] keys (Slots.mask)."""
        window = self.window
        late = self.layout.late(self.pos)  # [window] or None
        early = None
        if self.offsets is not None:
            early = self.offsets.early(self.layout.columns(window, self.pos.device), self.beams)  # [R, window]
        if self.slots is not None:
            self.slots.record(self.layout, self.length, self.pos)
            return self.slots.mask(window, late, early)
        mask = None if late is None else late.view(1, 1, -1)
        if early is None:
            return mask
        early = early.unsqueeze(1).expand(-1, self.cross.size(3), -1).reshape(-1, 1, window)
        return early if mask is None else early | mask

    def self_attend(self, layer: int, qkv: Tensor, out: Tensor, mask: Tensor | None) -> None:
        """Self-attention of this segment's rows at one new position: qkv [R, 3D] (queries, keys, values of the
        heads, concatenated) -> out [R, D]. The new keys and values are written at the position (each row into its
        slot), and every row attends over its sentence's window, all slots, masked by `mask` (`self_mask`)."""
        h, d_k = self.cross.size(3), self.cross.size(5)
        d, n, beams = qkv.size(1) // 3, self.sentences, self.beams
        kv = self.kv[layer]  # [2, N, H, C, B, K]
        new = qkv[:, d:].view(n, beams, 2, h, d_k).permute(2, 0, 3, 1, 4)  # [2, N, H, B, K]
        self.layout.write(kv, 3, new if new.dtype == kv.dtype else new.to(kv.dtype), self.length, self.pos)
        w = self.window  # attention over [N x H] batches of a sentence's [w x B] keys (views of the cache)
        k, v = kv.narrow(3, 0, w).view(2, n * h, w * beams, d_k).unbind(0)
        if beams == 1:  # [N, H, 1, K] is already the rows' layout
            attend(qkv[:, :d].reshape(n * h, 1, d_k), k, v, mask, out.view(n * h, 1, d_k))
            return
        q = qkv[:, :d].reshape(n, beams, h, d_k).transpose(1, 2).reshape(n * h, beams, d_k)
        out.view(n, beams, h, d_k).copy_(attend(q, k, v, mask).view(n, h, beams, d_k).transpose(1, 2))

    def cross_attend(self, layer: int, q: Tensor, out: Tensor) -> None:
        """Encoder-decoder attention of this segment's rows, q [R, D] -> out [R, D], against its per-sentence keys
        and values (a sentence's beams folded into the query dimension)."""
        h, d_k = self.cross.size(3), self.cross.size(5)
        n = self.sentences
        beams, b = q.size(0) // n, n * h
        q = q.view(n, beams, h, d_k).transpose(1, 2).reshape(b, beams, d_k)
        k, v = self._cross_views()[layer]
        if beams == 1:  # [N, H, 1, K] is already the rows' layout
            attend(q, k, v, self.pad, out.view(b, 1, d_k))
        else:
            out.view(n, beams, h, d_k).copy_(attend(q, k, v, self.pad).view(n, h, beams, d_k).transpose(1, 2))

    def _cross_views(self) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the encoder-decoder keys and values as [N x H, S, K] batches: made once for each `cross` (every
        change of it makes a new tensor), not at every step."""
        if self._views[0] is not self.cross:
            _, _, n, h, s, d_k = self.cross.shape
            per_layer = [tuple(x.reshape(n * h, s, d_k) for x in layer.unbind(0)) for layer in self.cross.unbind(0)]
            self._views = (self.cross, per_layer)
        return self._views[1]

    def make_room(self) -> None:
        """Before a step: buffers with room for position `length` (host; grows at bucket boundaries), the rows' own
        slots and merged rows' starts on the device (made here, so that the step itself creates no tensor from host
        values)."""
        if self.offsets is not None:
            self.offsets.rows(self.beams, self.cross.device)
        self._cross_views()
        need = self.length + 1
        if self.kv is None or self.capacity < need:
            self._grow(self._capacity(need))
        if self.slots is not None:
            self.slots.make_room(self.sentences)

    def _capacity(self, need: int) -> int:
        """The capacity of new buffers that must hold `need` positions (layout.py's `capacity`: room for `expected`
        positions at once where they are mapped)."""
        return self.layout.capacity(self.cross, self._shape(1), need, self.expected)

    def _shape(self, capacity: int) -> tuple[int, ...]:
        """A layer's keys-and-values buffer of `capacity` positions, with its room for joining sentences."""
        _, _, n, heads, _, d_k = self.cross.shape
        sentences = n if self._kv_room is None else self._kv_room[0].size(1)
        return (2, sentences, heads, capacity, self.beams, d_k)

    def _grow(self, capacity: int, drop: int = 0) -> None:
        """New buffers of `capacity` positions, the filled ones copied (those from column `drop` on, to column 0), a
        layer at a time: each old buffer goes before the next new one is made."""
        n, shape = self.sentences, self._shape(capacity)
        old, old_room, kept = self.kv, self._kv_room, self.length - drop
        self.kv, self._kv_room = [], []
        for layer in range(self.cross.size(0)):
            room = self._new(shape)
            if old is not None:
                if kept:
                    room[:, :n, :, :kept] = old[layer][:, :, :, drop : self.length]
                old[layer] = old_room[layer] = None
            self.kv.append(room.narrow(1, 0, n))  # (a view made after the copy: autograd, in tests, needs that)
            self._kv_room.append(room)
        if self.beams > 1:
            if self.slots is None:
                self.slots = Slots(self.beams, self.layout.in_place)
            self.slots.resized(self.rows, capacity, drop, self.length, self.cross.device)
        self.layout.resized(capacity, self.cross.device)

    def _new(self, shape: tuple[int, ...]) -> Tensor:
        """A keys-and-values buffer, as the layout makes them (layout.py: zeroed or not, mapped or not)."""
        return self.layout.new_buffer(self.cross, shape)

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
        move in the slot table. Merged rows: the columns no kept row reads any more are dropped."""
        drop = 0
        if sentences is not None:
            self.cross, self._room = _keep(self.cross, self._room, sentences, kept)
            for layer in range(len(self.kv or ())):  # (a layer at a time: see _grow)
                self.kv[layer], self._kv_room[layer] = _keep(self.kv[layer], self._kv_room[layer], sentences, kept,
                                                             self.length, dim=1, new=self._new)
            self._set_pad(None if self.src_pad is None else self.src_pad.index_select(0, sentences))
            if self.offsets is not None:
                self.offsets, drop = self.offsets.keep(kept if kept is not None else sentences.tolist())
        if self.slots is not None:
            self.slots.reorder(rows, sentences is not None, None if self.static else self.length)
        if drop and self.kv is not None:
            self.expected -= drop
            self._grow(max(self.capacity, self._capacity(self.length - drop + 1)), drop)
            self.length -= drop
            self.pos -= drop

    def merge(self, other: Segment) -> None:
        """Take `other`'s rows after this one's, right-aligned (offsets.py). This one has taken a step, `other` too
        or none; both have as many beams a sentence."""
        length = max(self.length, other.length)
        shifts = (length - self.length, length - other.length)
        n, m = self.sentences, other.sentences
        self.expected = max(self.expected + shifts[0], other.expected + shifts[1])
        capacity = max(self.capacity, other.capacity if other.kv is not None else 0, self._capacity(length + 1))
        if not shifts[0] and self._kv_room[0].size(1) >= n + m and self.capacity == capacity:
            parts = [(other, shifts[1], n)]  # into the room: this segment's keys and values stay where they are
        else:
            parts = [(self, shifts[0], 0), (other, shifts[1], n)]
        kv_layers, rooms = [], []
        for layer, room in enumerate(self._kv_room):  # a layer at a time (see _grow)
            if len(parts) == 2:
                shape = list(room.shape)
                shape[1], shape[3] = n + m + (n + m) // 2, capacity
                room = self._new(tuple(shape))
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
            self.slots = Slots.merged([(self.slots, self.rows, shifts[0], self.length),
                                       (other.slots, other.rows, shifts[1], other.length)],
                                      capacity, length, self.beams, self.layout.in_place, self.cross.device)
        self.offsets = Offsets.merged([(self.offsets, n, shifts[0]), (other.offsets, m, shifts[1])])
        sources = max(self.cross.size(4), other.cross.size(4))
        if self.src_pad is None and other.src_pad is None and self.cross.size(4) == other.cross.size(4):
            pad = None
        else:
            pad = torch.cat([_source_pad(self, sources), _source_pad(other, sources)])
        self._join_cross(other.cross, sources)
        self._set_pad(pad)
        self.kv, self._kv_room = kv_layers, rooms
        self.layout.resized(capacity, self.cross.device)
        self.length = length
        self.pos.fill_(length)

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

    def positions(self) -> Tensor:
        """The position each row decodes at this step: [1] (one segment, all rows alike) or [R]."""
        if len(self.segments) == 1:
            return self.segments[0].positions()
        return torch.cat([s.positions().expand(s.rows) for s in self.segments])

    def self_masks(self) -> list[Tensor | None]:
        """Each segment's self-attention mask for this step (Segment.self_mask: once a step, before the layers)."""
        return [s.self_mask() for s in self.segments]

    def self_attend(self, layer: int, qkv: Tensor, masks: list[Tensor | None]) -> Tensor:
        """Self-attention of one new position per row at decoder layer `layer`: qkv [R', 3D] (R' >= R: rows past the
        segments' are padding) -> the heads' outputs [R', D] (0 past the segments' rows), the new keys and values
        written into the cache. `masks`: `self_masks()` of this step."""
        out = qkv.new_empty((qkv.size(0), qkv.size(1) // 3))
        if len(self.segments) == 1 and self.segments[0].rows == out.size(0):  # (one segment, no padding rows)
            self.segments[0].self_attend(layer, qkv, out, masks[0])
            return out
        first = 0
        for seg, mask in zip(self.segments, masks, strict=True):
            seg.self_attend(layer, qkv.narrow(0, first, seg.rows), out.narrow(0, first, seg.rows), mask)
            first += seg.rows
        return _zero_past(out, first)

    def cross_attend(self, layer: int, q: Tensor) -> Tensor:
        """Encoder-decoder attention at decoder layer `layer`: q [R', D] -> [R', D] (as `self_attend`)."""
        out = torch.empty_like(q)
        if len(self.segments) == 1 and self.segments[0].rows == out.size(0):
            self.segments[0].cross_attend(layer, q, out)
            return out
        first = 0
        for seg in self.segments:
            seg.cross_attend(layer, q.narrow(0, first, seg.rows), out.narrow(0, first, seg.rows))
            first += seg.rows
        return _zero_past(out, first)

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

    def expect(self, positions: int) -> None:
        for seg in self.segments:
            seg.expected = max(seg.expected, seg.length + positions)

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


def _zero_past(out: Tensor, rows: int) -> Tensor:
    """out, its rows from `rows` on (padding rows of the step) zeroed."""
    if rows < out.size(0):
        out[rows:].zero_()
    return out


def _fill_holes(kept: list[int]) -> list[int]:
    """Sentences `kept` (ascending) in the order that moves the fewest: those past the first len(kept) positions
    fill the holes before it, in order; the others stay where they are."""
    n = len(kept)
    tail = iter(k for k in kept if k >= n)
    stay = {k for k in kept if k < n}
    return [i if i in stay else next(tail) for i in range(n)]


def _keep(view: Tensor, room: Tensor, sentences: Tensor, kept: list[int] | None,
          filled: int | None = None, dim: int = 2, new=None) -> tuple[Tensor, Tensor]:
    """Keep the sentences `sentences` (their host list `kept`) of `view` (sentences along `dim`, positions along
    `dim` + 2), the leading part of `room` along `dim` -> (the kept view, its room): in place when only sentences
    from past the kept count fill holes (`order`; the first `filled` positions copied, all when None), else by a
    gather; by a gather too when the room holds more than 4x what the kept sentences read (a burst of joins does not
    pin its memory for as long as a server's segment lives). A gather of `filled` positions goes into a buffer from
    `new(shape)` of the same capacity, the filled positions only (a buffer sized for the longest sentence to come,
    layout.py's `capacity`, holds many more)."""
    n = len(kept) if kept is not None else -1
    if (n < 0 or any(k != i and k < n for i, k in enumerate(kept))
            or 4 * n * view.select(dim, 0).numel() < room.size(dim) * room.select(dim, 0).numel()):
        if filled is None or new is None:
            out = view.index_select(dim, sentences)
            return out, out
        out = new((*view.shape[:dim], sentences.size(0), *view.shape[dim + 1:]))
        part = view.narrow(dim + 2, 0, filled)
        if torch.is_grad_enabled() and part.requires_grad:  # (tests: out= does not record autograd)
            out.narrow(dim + 2, 0, filled).copy_(part.index_select(dim, sentences))
        else:
            torch.index_select(part, dim, sentences, out=out.narrow(dim + 2, 0, filled))
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
