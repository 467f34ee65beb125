"""A batch of sources on the decoding device, and the host-side helpers that move indices there once: what the loop
(scheduler.py), the search state and the cache pass between them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from nmt_cli.config import PAD_ID


class Sources(NamedTuple):
    """A batch for decode_batches: source ids [B, S], right-padded, and their padding mask [B, S] (True at padding)
    on the decoding device; their lengths on the host (so that the search never reads them back); optionally the
    batch already encoded (its decoder cache: a server encodes arriving sentences while the search decodes) and the
    target ids each output must start with (one list per sentence)."""

    src: Tensor
    src_pad_mask: Tensor | None
    lengths: list[int]
    cache: object = None
    prefix: list[list[int]] | None = None


def source_batch(seqs: list[list[int]], device) -> Sources:
    """`seqs` (token ids with EOS, none empty) as a Sources batch on `device`, padded on the host and copied once
    (asynchronously from page-locked memory to a GPU). No padding mask where every sequence has the batch's length
    (one sentence, always): the encoder and every step's encoder-decoder attention then mask nothing."""
    lengths = [len(s) for s in seqs]
    width = max(lengths)
    src = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for row, s in enumerate(seqs):
        src[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    mask = None if min(lengths) == width else to_device(src == PAD_ID, device)
    return Sources(to_device(src, device), mask, lengths)


class Kept(list):
    """The sentences that stay when others leave (indices, a host list), with their device copy made once for the
    search, the state and the cache alike (`on`)."""

    _copy: Tensor | None = None

    def on(self, device) -> Tensor:
        if self._copy is None:
            self._copy = to_device(torch.tensor(self, dtype=torch.long), device)
        return self._copy


def index_on(keep: list[int], device) -> Tensor:
    """`keep` as a device index: a Kept list's one copy, else a new one."""
    return keep.on(device) if isinstance(keep, Kept) else to_device(torch.tensor(keep, dtype=torch.long), device)


def to_device(x: Tensor, device) -> Tensor:
    """A host tensor on `device`: on a GPU through page-locked memory, without waiting for the device."""
    if torch.device(device).type != "cuda":
        return x
    return x.pin_memory().to(device, non_blocking=True)
