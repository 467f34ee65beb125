"""Greedy search and sampling as tensor operations over a SearchState: each of a sentence's `per` rows is its own
hypothesis, extended by `pick(lprobs [R, V]) -> tokens [R]` (argmax, or a draw from the temperature / top-k / top-p
distribution) until it produces EOS. A row that ended stays in place (what it does after is not recorded) until its
sentence is done and leaves at the scheduler's next host check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.config import EOS_ID
from nmt_cli.decoding.candidates import Candidates
from nmt_cli.decoding.config import SearchConfig
from nmt_cli.decoding.state import SearchState


class Sampling:
    """Greedy search (`pick` None: the most probable token) or sampling (`cfg.sampling`: `cfg.nbest` draws per
    sentence, in the order drawn)."""

    beam = False

    def __init__(self, cfg: SearchConfig, generator: torch.Generator | None = None):
        self.cfg = cfg
        self.per = cfg.nbest if cfg.sampling else 1
        self.generator = generator
        self.pick: Callable[[Tensor], Tensor] = self._draw if cfg.sampling else _argmax
        # draws go to rows in order: sentences that stay keep their order (a seed's samples stay what they were)
        self.keeps_order = cfg.sampling

    def _draw(self, lprobs: Tensor) -> Tensor:
        return torch.multinomial(filtered(lprobs, self.cfg).exp(), 1, generator=self.generator).squeeze(1)

    def select(self, state: SearchState, t: int | Tensor, lprobs: Tensor, shortlist: Candidates | None = None,
               ) -> Tensor:
        """lprobs [R, V] (constrained; or over a `shortlist`'s columns) -> the chosen tokens [R]; records the rows
        that end here."""
        choice = self.pick(lprobs)
        state.scores += lprobs.gather(1, choice.unsqueeze(1)).view_as(state.scores)
        if shortlist is not None:
            choice = shortlist.to_ids(choice.view(state.n, -1)).view(-1)
        ended = (choice == EOS_ID) & ~state.row_done  # [R]
        state.row_done |= ended
        written = ended.view_as(state.scores)  # [N, per]
        state.fin_tokens = torch.where(written.unsqueeze(2), state.tokens.view_as(state.fin_tokens),
                                       state.fin_tokens)
        state.fin_lp = torch.where(written, state.scores, state.fin_lp)
        state.fin_len = torch.where(written, state.own_len(t), state.fin_len)
        state.count = state.row_done.view_as(state.scores).sum(1)
        state.done = state.count >= self.per
        return choice

    def advance(self, state: SearchState, t: int | Tensor, choice: Tensor) -> None:
        """Write the chosen tokens (every row stays where it is: nothing for the cache to follow)."""
        state.set_column(t + 1, choice)


def _argmax(lprobs: Tensor) -> Tensor:
    return lprobs.argmax(dim=-1)


def filtered(lprobs: Tensor, cfg: SearchConfig) -> Tensor:
    """Sampling distribution of each row [R, V]: temperature, then top-k, then top-p (the most probable token is
    always kept); excluded tokens get -inf. Returns renormalised log-probabilities."""
    if cfg.temperature != 1.0:
        lprobs = F.log_softmax(lprobs / cfg.temperature, dim=-1)
    if cfg.topk and cfg.topk < lprobs.size(-1):
        kth = lprobs.topk(cfg.topk, dim=-1).values[:, -1:]
        lprobs = lprobs.masked_fill(lprobs < kth, float("-inf"))
    if cfg.topp < 1.0:
        sorted_lp, order = lprobs.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        before = probs.cumsum(-1) - probs  # mass of the more probable tokens
        drop = before >= cfg.topp
        drop[:, 0] = False
        lprobs = lprobs.scatter(1, order, sorted_lp.masked_fill(drop, float("-inf")))
    return F.log_softmax(lprobs, dim=-1)
