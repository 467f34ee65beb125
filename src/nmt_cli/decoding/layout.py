"""How a cache segment stores and reads its positions: one of two layouts, chosen once when the segment is made.

Both hold capacity C in buckets (BUCKETS: 16, 32, 64, ...; new buffers, the filled positions copied, when one runs
out). They differ in what a step reads and how it writes:
  - `Exact` (CPU eager, the default): a step reads the `length + 1` filled positions (a slice) and writes position
    `length` by a slice. Buffers are left uninitialised (no position is read before it is written), and large CPU
    ones get pages of their own (`mapped`), made long enough at once for the longest sentence (`capacity`).
  - `Static` (`torch.compile`, CUDA graphs): a step reads all C positions, those past the device position `pos`
    masked, and writes by index from `pos`; a beam reorder moves the slot table in place (slots.py). So every buffer
    keeps its address and shapes change only with the bucket: what a recorded graph needs. Buffers are zeroed
    (masked positions must hold no NaN: 0 x NaN is NaN).
"""

from __future__ import annotations

import math
import mmap

import torch
from torch import Tensor

BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MAPPED_BYTES = 16 << 20  # exact layout: CPU keys-and-values buffers from this size on are `mapped`


class Exact:
    """The filled positions, read by a slice (module docstring)."""

    static = False
    in_place = False  # beam reorders make a new slot table

    def window(self, length: int, capacity: int) -> int:
        return length + 1

    def new_buffer(self, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        if _maps(like, math.prod(shape)):
            return mapped(shape, like.dtype)
        return like.new_empty(shape)

    def capacity(self, like: Tensor, shape: tuple[int, ...], need: int, expected: int) -> int:
        """The capacity of new buffers that must hold `need` positions and may come to hold `expected` (0: not
        known), `shape` a buffer of one position. Buffers grow by buckets; but a mapped one takes memory only where
        written, so where even the bucket for `need` is mapped, it is made long enough for `expected` at once (no
        growing: no copy, no page written twice). Not smaller ones: mapped too, to be longer, they would no longer
        reuse the heap's pages (Multi30k's two streams: 1.04-1.08x the time)."""
        if expected > need and _maps(like, math.prod(shape) * bucket(need)):
            return bucket(expected)
        return bucket(need)

    def write(self, buffer: Tensor, dim: int, new: Tensor, length: int, pos: Tensor) -> None:
        """Position `length` of `buffer` along `dim` := new (a slice: faster on CPU than index_copy_)."""
        buffer.select(dim, length).copy_(new)

    def resized(self, capacity: int, device) -> None:
        pass

    def late(self, pos: Tensor) -> None:
        return None  # nothing past the position is read

    def columns(self, window: int, device) -> Tensor:
        return torch.arange(window, device=device)

    def tensors(self) -> list[Tensor | None]:
        return []


class Static:
    """Every position of the capacity, read whole and masked (module docstring)."""

    static = True
    in_place = True  # beam reorders copy the slot table into itself

    def __init__(self):
        self.arange: Tensor | None = None  # [C] position indices, for the mask

    def window(self, length: int, capacity: int) -> int:
        return capacity

    def capacity(self, like: Tensor, shape: tuple[int, ...], need: int, expected: int) -> int:
        return bucket(need)  # (every position is read: a longer buffer is a longer step)

    def new_buffer(self, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        return like.new_zeros(shape)

    def write(self, buffer: Tensor, dim: int, new: Tensor, length: int, pos: Tensor) -> None:
        """Position `pos` (a [1] device tensor) of `buffer` along `dim` := new."""
        buffer.index_copy_(dim, pos, new.unsqueeze(dim))

    def resized(self, capacity: int, device) -> None:
        if self.arange is None or self.arange.size(0) != capacity:
            self.arange = torch.arange(capacity, device=device)

    def late(self, pos: Tensor) -> Tensor:
        return self.arange > pos  # [C] the columns not decoded yet

    def columns(self, window: int, device) -> Tensor:
        return self.arange

    def tensors(self) -> list[Tensor | None]:
        return [self.arange]


def bucket(n: int) -> int:
    """The capacity that holds n positions."""
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // BUCKETS[-1]) * BUCKETS[-1]


def _maps(like: Tensor, elements: int) -> bool:
    """Whether a buffer of `elements` like `like` is `mapped` (the exact layout's CPU buffers from MAPPED_BYTES on)."""
    return like.device.type == "cpu" and elements * like.element_size() >= MAPPED_BYTES


def mapped(shape: list[int] | tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An uninitialised CPU tensor in an anonymous memory mapping of its own: its pages take memory only once
    written (the positions past the filled ones take none), and all of it goes back to the system when the tensor
    goes. A buffer from the C heap may instead land in memory freed earlier and already resident (its unwritten
    part counted too), and on freeing stay with the process when smaller than glibc's mapping threshold (which
    rises to 32 MB as buffers are freed). docs/results-history.md#one-buffer-a-layer."""
    return torch.frombuffer(mmap.mmap(-1, math.prod(shape) * dtype.itemsize), dtype=dtype).view(shape)
