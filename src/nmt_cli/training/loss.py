"""Label-smoothed cross-entropy that ignores padding (Szegedy et al., 2016; eps 0.1 in the paper)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float = 0.1, pad_id: int = 0
) -> tuple[Tensor, Tensor, int]:
    """Sum over non-pad tokens of the smoothed loss, the plain NLL sum, and the token count.

    The target distribution puts 1 - eps on the gold token and spreads eps uniformly over the vocabulary:
    loss = (1 - eps) * -log p(gold) + eps / V * sum_v -log p(v).
    logits [B, T, V] (any float dtype; computed in float32), target [B, T].
    """
    lprobs = F.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)  # [N, V]
    flat_target = target.reshape(-1)
    keep = flat_target.ne(pad_id)
    nll = -lprobs.gather(-1, flat_target.unsqueeze(-1)).squeeze(-1).masked_fill(~keep, 0.0).sum()
    if epsilon:
        smooth = -lprobs.sum(-1).masked_fill(~keep, 0.0).sum()
        loss = (1.0 - epsilon) * nll + epsilon / lprobs.size(-1) * smooth
    else:
        loss = nll
    return loss, nll.detach(), int(keep.sum())
