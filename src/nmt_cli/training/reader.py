"""The training data as the loop reads it: the batches, the data position, and each update's micro-batches.

    position  (epoch, pos): the epoch and how many batches of its order (`epoch_order`, all ranks') were trained on
    update    the next processes x update-freq batches of that order, dealt to the ranks (`batching.deal`): the same
              sentences for any processes x update-freq of the same product, and a position that holds for any number
              of processes (a resume on another machine)
    tokens    the update's real source and target tokens over all ranks, counted from the sentence lengths every rank
              holds: no collective, no wait
    prefetch  the next update's micro-batches are collated in a background thread while this one computes

The position advances only as batches are taken, so a checkpoint records exactly what was trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from nmt_cli.data.batching import (
    bucket_shape,
    deal,
    epoch_order,
    flat_padding_efficiency,
    padding_efficiency,
    split,
)
from nmt_cli.data.store import Batch, ParallelData, collate


@dataclass
class Update:
    """One update: this rank's padded micro-batches and the real tokens of the whole update (every rank's)."""

    micro_batches: list[Batch]
    tgt_tokens: float  # as the loss counts them: ids + EOS
    src_tokens: float


class TrainReader:
    """The batches of `indices, sizes` (plan.batches) over `data`, read from a data position on, rank `rank` of
    `world_size`, `update_freq` micro-batches each. `max_positions` (compiled training with shape buckets): every
    batch is padded to one of a few shapes (`batch_shape`)."""

    def __init__(self, data: ParallelData, batches: tuple[np.ndarray, np.ndarray], update_freq: int, rank: int,
                 world_size: int, seed: int, max_epochs: int = 0, max_tokens: int = 0,
                 max_positions: int | None = None, pin_memory: bool = False, position: tuple[int, int] = (1, 0)):
        self.data, self.flat = data, batches
        self.batches = split(*batches)
        self.update_freq, self.rank, self.world_size = update_freq, rank, world_size
        self.seed, self.max_epochs, self.pin_memory = seed, max_epochs, pin_memory
        self.epoch, self.pos = position
        self.batch_shape: Callable[[np.ndarray], tuple[int, int]] | None = None
        if max_positions is not None:
            src, tgt = data.src_lengths, data.tgt_lengths
            self.batch_shape = lambda idx: bucket_shape(src[idx], tgt[idx], max_tokens, max_positions)
        self._epochs: dict[int, list] = {}
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-batches")
        self._prefetch = None  # ((epoch, pos) the batches start at, Future of their Update)

    def next_update(self) -> Update | None:
        """The next update (fewer micro-batches at the end of an epoch); None after --max-epochs. Taking it starts
        collating the one after it."""
        nxt = self._update_after(self.epoch, self.pos)
        if nxt is None:  # past --max-epochs: the run ends at the start of that epoch
            self.epoch, self.pos = self.epoch + 1, 0
            return None
        update, self.epoch, self.pos = nxt
        pending, self._prefetch = self._prefetch, None
        taken = pending[1].result() if pending is not None and pending[0] == (self.epoch, self.pos) else None
        if taken is None:
            taken = self.collate(update)
        following = self._update_after(self.epoch, self.pos)
        if following is not None:
            self._prefetch = ((following[1], following[2]), self._loader.submit(self.collate, following[0]))
        return taken

    def collate(self, update: list[np.ndarray]) -> Update:
        """`update` (every rank's batch indices, in order) as this rank's micro-batches, padded (in pinned memory
        when training on a GPU: asynchronous copies), with the update's token totals."""
        shape = self.batch_shape or (lambda idx: None)
        # an empty micro-batch (`deal`) is one row of padding; compiled, in the shape of a batch that exists
        micro = [collate([self.data[int(i)] for i in idx], shape=shape(idx if len(idx) else self.batches[0]))
                 for idx in deal(update, self.rank, self.world_size)]
        if self.pin_memory:
            micro = [b.pin_memory() for b in micro]
        every = np.concatenate(update) if update else np.zeros(0, dtype=np.int64)
        return Update(micro, float(self.data.tgt_lengths[every].sum()), float(self.data.src_lengths[every].sum()))

    def padding_efficiency(self) -> float:
        """Real tokens / padded tokens of all the batches (source and target)."""
        src, tgt = self.data.src_lengths, self.data.tgt_lengths
        if self.batch_shape is not None:
            return padding_efficiency(self.batches, src, tgt, self.batch_shape)
        return flat_padding_efficiency(*self.flat, src, tgt)  # (the flat form: no list to concatenate)

    def shapes(self) -> int:
        """How many batch shapes there are (compiled training: the code torch.compile makes)."""
        return len({self.batch_shape(idx) for idx in self.batches}) if self.batch_shape is not None else 0

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)

    def _epoch_order(self, epoch: int) -> list:
        """All the batches of `epoch`, every rank's, in training order (the current and the next epoch are kept)."""
        if epoch not in self._epochs:
            self._epochs = {e: v for e, v in self._epochs.items() if e >= epoch - 1}
            self._epochs[epoch] = epoch_order(self.batches, epoch, self.seed)
        return self._epochs[epoch]

    def _update_after(self, epoch: int, pos: int) -> tuple[list, int, int] | None:
        """The batches (every rank's) of the update at position (epoch, pos), and the position after it; None after
        --max-epochs."""
        if pos >= len(self._epoch_order(epoch)):
            epoch, pos = epoch + 1, 0
        if self.max_epochs and epoch > self.max_epochs:
            return None
        update = self._epoch_order(epoch)[pos : pos + self.update_freq * self.world_size]
        return update, epoch, pos + len(update)
