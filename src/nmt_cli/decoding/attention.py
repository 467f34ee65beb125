"""Attention of a few new positions over stored keys and values, on batches flattened to 3-D (batch x heads): the
arithmetic decoding's cache (cache.py) and the alignments (inference/alignment.py) share. Layout-free: the cache
says which keys and values, and which mask, each batch reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Decoding's attention through F.scaled_dot_product_attention (one fused kernel on a GPU, the mask included)
# instead of five (product, scale, mask, softmax, product): a step of a 6-layer model launches 48 kernels fewer.
# Off until a GPU has measured it (bench/tools/graph_ab.py times both); on CPU it is slower (see `attend`).
SDPA_DECODING = False
_NO_BIAS = torch.zeros(1, 1, 1)  # baddbmm's `input` with beta=0: ignored, but it must broadcast (CPU, float32)


def attention_weights(q: Tensor, k: Tensor, pad: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(K)) with padding masked: q [B, Tq, K], k [B, S, K] (unit last stride), pad bool [B, Tq,
    S] or broadcastable, or [N, 1, Tq, S] over B = N x H batches (beam search's slots, slots.py), True = padding ->
    [B, Tq, S] in k's dtype. The scale is baddbmm's alpha on CPU float32 (faster than matmul then mul_ on a step's
    shapes); elsewhere q is scaled before the product, as fairseq, CTranslate2 and SDPA do, so that an fp16 product
    cannot overflow where the scaled one fits. What `attend` uses, and what alignment.py reads."""
    if q.dtype != k.dtype:
        q = q.to(k.dtype)
    if k.dtype == torch.float32 and k.device.type == "cpu":
        scores = torch.baddbmm(_NO_BIAS, q, k.transpose(1, 2), beta=0.0, alpha=q.size(-1) ** -0.5)  # [B, Tq, S]
    else:
        scores = torch.bmm(q * q.size(-1) ** -0.5, k.transpose(1, 2))
    if pad is not None:
        grouped = scores if pad.dim() == 3 else scores.view(pad.size(0), -1, *scores.shape[1:])
        grouped.masked_fill_(pad, float("-inf"))
    return scores.softmax(dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(K) + mask) v on batches flattened to 3-D (batch x heads), q [B, Tq, K], k/v [B, S, K]
    (strided cache slices used in place), pad as `attention_weights` -> [B, Tq, K] in q's dtype, computed in k's
    (float32 on CPU); written into `out` when given. Not SDPA on CPU: its kernels are built for long queries (for
    Tq ~ 1 the flash kernel's per-block overhead dominates, the math kernel copies q, k, v to float32 first)."""
    if SDPA_DECODING:
        groups = 1 if pad is None or pad.dim() == 3 else pad.size(0)  # [1 or N, B / N, ...] as SDPA's 4-D
        mask = None if pad is None else ~(pad.unsqueeze(0) if pad.dim() == 3 else pad)  # True = attend
        q, k, v = (x.unflatten(0, (groups, -1)) for x in (q, k, v))
        res = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask).flatten(0, 1)
        if out is not None:
            return out.copy_(res)
        return res if res.dtype == q.dtype else res.to(q.dtype)
    weights = attention_weights(q, k, pad)
    if out is not None and out.dtype == v.dtype and not torch.is_grad_enabled():
        return torch.bmm(weights, v, out=out)
    res = torch.bmm(weights, v)
    if out is not None:
        return out.copy_(res)
    return res if res.dtype == q.dtype else res.to(q.dtype)
