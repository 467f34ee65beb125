"""A step's constraints on the next-token log-probabilities, as tensor operations only (no host sync, no shape that
depends on data): no PAD or BOS ever, no EOS before the minimum length, no n-gram twice in a hypothesis (fairseq's
rule), a forced target prefix, and EOS at the maximum length. Each costs nothing when unused.

lprobs [R, V] is changed in place. `own_t` is each row's step counted from its sentence's start: an int when every
row started together, else a tensor [R] (sentences that joined a running batch start later).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.decoding.config import SearchConfig
from nmt_cli.errors import ConfigError

_NEG_INF = float("-inf")


def constrain(lprobs: Tensor, cfg: SearchConfig, own_t: int | Tensor, force_eos: Tensor | None,
              history: Tensor | None = None, forced: Tensor | None = None, columns=None) -> None:
    """All of a step's constraints: no PAD/BOS, no EOS before `cfg.min_len` tokens, no repeated n-gram in `history`
    [R, t] (generated tokens; PAD and BOS in it never match), the forced prefix token `forced` [R] (PAD where
    free), EOS only where `force_eos` [R] (bool; the maximum length). `columns`: lprobs holds a shortlist's
    columns (decoding/candidates.py), and columns(pieces [R, ...]) gives each row's columns of pieces (PAD's where
    it has none; the specials keep theirs)."""
    if forced is not None and columns is not None:
        forced = columns(forced)  # (a prefix's pieces are always among the candidates)
    if forced is not None:
        # the prefix token's log-probability before any ban (a model giving it probability 0 still produces it)
        keep = lprobs.gather(1, forced.unsqueeze(1)).nan_to_num(neginf=-1e4)  # [R, 1]
    if cfg.min_len:
        if isinstance(own_t, int):
            if own_t < cfg.min_len:
                lprobs[:, EOS_ID] = _NEG_INF
        else:
            lprobs[:, EOS_ID].masked_fill_(own_t < cfg.min_len, _NEG_INF)
    if cfg.no_repeat_ngram and history is not None:
        ban_repeats(lprobs, history, cfg.no_repeat_ngram, columns)
    if forced is not None:
        free = (forced == PAD_ID).unsqueeze(1)  # [R, 1]
        lprobs.masked_fill_(~free, _NEG_INF)
        # free rows write -inf at PAD (as below), forced ones their token's value
        lprobs.scatter_(1, forced.unsqueeze(1), keep.masked_fill_(free, _NEG_INF))
    mask_special(lprobs, force_eos)


def mask_special(lprobs: Tensor, force_eos: Tensor | None) -> None:
    """Never generate PAD or BOS; rows where `force_eos` [R] is True (maximum length) may only produce EOS."""
    lprobs[:, PAD_ID] = _NEG_INF
    lprobs[:, BOS_ID] = _NEG_INF
    if force_eos is not None:
        eos = lprobs[:, EOS_ID].nan_to_num(neginf=-1e4)  # a model giving EOS probability 0 still ends here
        lprobs.masked_fill_(force_eos.unsqueeze(1), _NEG_INF)
        lprobs[:, EOS_ID] = torch.where(force_eos, eos, lprobs[:, EOS_ID])


def ban_repeats(lprobs: Tensor, history: Tensor, n: int, columns=None) -> None:
    """No n-gram twice: ban each token that would complete an n-gram already in `history` [R, t]. One vectorised
    pass over the history's n-grams; the bans are a scatter-min of -inf (+inf where nothing is banned). `columns`:
    lprobs over a shortlist's columns (`constrain`); a piece outside them is banned at PAD's column, banned anyway."""
    t = history.size(1)
    if n == 1:
        if t:
            lprobs.scatter_(1, history if columns is None else columns(history), _NEG_INF)
        return
    if t < n:  # no complete n-gram yet
        return
    grams = history.unfold(1, n, 1)  # [R, t - n + 1, n]
    tail = history[:, t - n + 1 :]  # [R, n - 1]: the n-gram being completed now
    hit = (grams[:, :, :-1] == tail.unsqueeze(1)).all(-1)  # [R, G]
    ban = torch.full(hit.shape, float("inf"), dtype=lprobs.dtype, device=lprobs.device).masked_fill_(hit, _NEG_INF)
    last = grams[:, :, -1]
    lprobs.scatter_reduce_(1, last if columns is None else columns(last), ban, reduce="amin")


def prefix_tensor(prefix: list[list[int]] | None, batch: int, device) -> Tensor | None:
    """Prefixes (token ids per sentence, [] for none) as [B, P] padded with PAD; None when there is none."""
    if not prefix or not any(prefix):
        return None
    if len(prefix) != batch:
        raise ConfigError(f"{len(prefix)} prefixes for {batch} sentences; give one prefix per input line")
    width = max(len(p) for p in prefix)
    out = torch.full((batch, width), PAD_ID, dtype=torch.long)
    for i, p in enumerate(prefix):
        out[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out.to(device)
