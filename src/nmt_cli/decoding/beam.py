"""Beam search (fairseq's scheme) as tensor operations over a SearchState: no host sync within a step.

Every step picks the 2K best (beam, token) candidates per sentence over K x V, records the EOS candidates among the
first K as finished hypotheses (into the state's buffers, at most K per sentence), and continues with the K best
others. A sentence is done when it holds K finished hypotheses or reaches its maximum length (where EOS is forced);
with `stop="top"` also once a step's best candidate was EOS and `nbest` hypotheses have finished (the rule of
OpenNMT-py, and of CTranslate2 without a length penalty), and so without a length penalty for the best hypothesis
alone, where it changes nothing but the steps taken (`SearchConfig.stops_at_top`). Done sentences stay in place
until the scheduler's next host check, where they leave; nothing they do after `done` is recorded.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt_cli.config import EOS_ID
from nmt_cli.decoding.candidates import Candidates
from nmt_cli.decoding.config import SearchConfig
from nmt_cli.decoding.state import SearchState

# Where `candidates` cuts the vocabulary into blocks. On a GPU the plain path's topk over every beam's whole
# vocabulary (a multi-block radix select) is a large share of a step's kernel time (docs/results.md, GPU); the
# blocks are yet to be measured there (bench/tools/graph_ab.py times both).
BLOCK_DEVICES = ("cpu",)
# Where `finalize` may read from the device within a step (free on a CPU, a wait for the device elsewhere): a step
# with no EOS candidate then skips the bookkeeping of finished hypotheses.
READ_DEVICES = ("cpu",)
# On CPU, up to this many log-probabilities a step ([N*K, V]: one sentence over a shortlist's columns, a few over the
# whole vocabulary) one top-k over each sentence's K x V sums is cheaper than the blocks (3.4x at 1 x 4 x 384, 1.2x at
# 16 x 4 x 1024, 0.63x at 64 x 4 x 1536: docs/results-history.md#one-sentence-a-call-the-steps-host-work-machine-e-2026-11-28-fourth).
FLAT_MAX = 1 << 16


class BeamSearch:
    """`select` chooses and records; `advance` moves the beams and returns the rows the cache must follow."""

    beam = True
    keeps_order = False  # the sentences that stay may take the order the cache moves least in (Cache.order)

    def __init__(self, cfg: SearchConfig):
        self.cfg = cfg
        self.per = cfg.beam

    def select(self, state: SearchState, t: int | Tensor, lprobs: Tensor, shortlist: Candidates | None = None,
               ) -> tuple[Tensor, Tensor, Tensor]:
        """lprobs [N*K, V] (constrained; or over a `shortlist`'s columns) -> the step's candidates (scores, beams,
        tokens, each [N, 2K]); records finished hypotheses and updates `state.done`."""
        scores, beams, tokens = candidates(state, lprobs)
        if shortlist is not None:
            tokens = shortlist.to_ids(tokens)
        finalize(state, t, scores, beams, tokens, self.cfg)
        return scores, beams, tokens

    def advance(self, state: SearchState, t: int | Tensor, chosen: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Continue each sentence with its K best non-EOS candidates; -> the rows of the old batch they extend
        [N*K] (the cache follows them)."""
        scores, beams, tokens = chosen
        k, width = state.per, scores.size(1)
        rank = torch.arange(width, device=scores.device)
        order = (rank + (tokens == EOS_ID).long() * width).argsort(dim=1)[:, :k]  # non-EOS first, by rank
        rows = (state.first_rows() + beams.gather(1, order)).view(-1)  # [N*K] rows of the old batch
        state.tokens = state.tokens.index_select(0, rows)
        state.set_column(t + 1, tokens.gather(1, order).view(-1))
        state.scores = scores.gather(1, order)
        return rows


def _block_size(width: int, k: int) -> int | None:
    """A divisor of `width` near 64 leaving at least k blocks, for `candidates`; None: use a plain topk."""
    for size in (64, 50, 60, 40, 74, 80, 100, 32, 125, 128):
        if width % size == 0 and width // size >= k:
            return size
    return None


def candidates(state: SearchState, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Best 2K (beam, token) extensions per sentence.  lprobs [N*K, V] -> scores, beams, tokens, each [N, 2K].

    On CPU (BLOCK_DEVICES), up to FLAT_MAX log-probabilities, one top-k over each sentence's K x V sums (beam score
    plus token). Beyond that the full [N*K, V] matrix is never added to or sorted: the vocabulary is cut into blocks
    of ~64 tokens, and the 2K best candidates lie in the 2K (beam, block) pairs whose block maximum plus the beam's
    score is highest, so one max over blocks, a topk over K x blocks and a topk over 2K blocks per sentence do the
    work. Otherwise each beam's 2K best tokens, plus the beam's score, are the only candidates."""
    k, k2 = state.per, 2 * state.per
    n, width = state.n, lprobs.size(1)
    if lprobs.device.type in BLOCK_DEVICES and lprobs.numel() <= FLAT_MAX:
        top_scores, top_idx = (lprobs + state.scores.view(-1, 1)).view(n, k * width).topk(k2, dim=1)
        return top_scores, torch.div(top_idx, width, rounding_mode="floor"), top_idx % width
    block = _block_size(width, k2) if lprobs.device.type in BLOCK_DEVICES and width >= 16 * k2 else None
    if block is None:
        row_scores, row_tokens = lprobs.topk(min(k2, width), dim=1)  # [N*K, 2K']
        total = row_scores.add_(state.scores.view(-1, 1)).view(n, -1)  # [N, K*2K']
        top_scores, top_idx = total.topk(min(k2, total.size(1)), dim=1)  # [N, 2K]
        per_row = row_scores.size(1)
        return (top_scores, torch.div(top_idx, per_row, rounding_mode="floor"),
                row_tokens.view(n, -1).gather(1, top_idx))
    blocks = width // block
    beam_scores = state.scores.view(-1, 1)  # [N*K, 1]
    maxima = lprobs.view(n * k, blocks, block).amax(dim=2).add_(beam_scores)  # [N*K, blocks]
    best = maxima.view(n, k * blocks).topk(k2, dim=1).indices  # [N, 2K] over (beam, block)
    first_row = state.first_rows()
    rows = torch.div(best, blocks, rounding_mode="floor") + first_row
    picked = rows * blocks + best % blocks  # [N, 2K] index into the [N*K*blocks, block] view
    values = lprobs.view(-1, block).index_select(0, picked.view(-1)).view(n, k2, block)
    values = values.add_(beam_scores.view(-1)[rows].unsqueeze(2)).view(n, -1)  # [N, 2K*block]
    top_scores, top_idx = values.topk(k2, dim=1)  # [N, 2K]
    which = torch.div(top_idx, block, rounding_mode="floor")  # the chosen pair of each candidate
    tokens = (best % blocks).gather(1, which) * block + top_idx % block
    return top_scores, rows.gather(1, which) - first_row, tokens


def finalize(state: SearchState, t: int | Tensor, scores: Tensor, beams: Tensor, tokens: Tensor,
             cfg: SearchConfig) -> None:
    """Record the EOS candidates ranked within the first K, in rank order, while a sentence holds fewer than K
    finished hypotheses; update `state.done`. Tensor operations only: the slot of each EOS candidate is its
    sentence's count plus its rank among them, and each slot takes the candidate aimed at it (if any). Where the
    host may read (READ_DEVICES), a step with no EOS candidate (most steps) only marks the sentences at their maximum
    length: `done` already holds the rest, which only EOS candidates change."""
    k = state.per
    eos = tokens[:, :k] == EOS_ID  # [N, K]
    if eos.device.type in READ_DEVICES and not eos.any():  # no hypothesis ends (most steps)
        state.done = state.done | (state.max_len <= t + 1)
        return
    eos &= torch.isfinite(scores[:, :k]) & ~state.done.unsqueeze(1)
    top = cfg.stops_at_top()
    if top:
        state.top_ended |= eos[:, 0]
    slot = state.count.unsqueeze(1) + eos.long().cumsum(1) - 1  # [N, K] the slot each EOS candidate would fill
    accept = eos & (slot < k)
    slots = torch.arange(k, device=scores.device)
    aimed = accept.unsqueeze(2) & (slot.unsqueeze(2) == slots)  # [N, rank, slot]
    written = aimed.any(1)  # [N, slot]
    rank = (aimed.long() * slots.view(1, k, 1)).sum(1)  # [N, slot] the rank written there (0 where none)
    rows = (state.first_rows() + beams.gather(1, rank)).view(-1)  # the row each written slot extends
    width = state.tokens.size(1)
    state.fin_tokens = torch.where(written.unsqueeze(2), state.tokens.index_select(0, rows).view(-1, k, width),
                                   state.fin_tokens)
    state.fin_lp = torch.where(written, scores.gather(1, rank), state.fin_lp)
    state.fin_len = torch.where(written, state.own_len(t), state.fin_len)
    state.count += accept.sum(1)
    done = state.done | (state.count >= k) | (state.max_len <= t + 1)
    if top:
        done |= state.top_ended & (state.count >= cfg.nbest)
    state.done = done
