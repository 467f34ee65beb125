"""Label-smoothed cross-entropy that ignores padding (Szegedy et al., 2016; eps 0.1 in the paper).

The loss and its gradient are computed together, chunk by chunk of rows, in float32: the gradient with respect to
the logits, softmax - q, is stored in the logits' dtype during the forward pass and merely scaled in the backward
pass. No float32 copy or log-softmax of the whole [N, V] logits is ever materialised, which matters on CPU where
those passes over a 37k-token vocabulary cost as much as a few matrix products.
"""

from __future__ import annotations

import torch
from torch import Tensor

_CHUNK_ELEMENTS = 1 << 22  # CPU: ~4M elements a chunk (16 MiB of float32): few ops, bounded memory
_CUDA_CHUNK_ELEMENTS = 1 << 27  # GPU: few, large chunks (kernel launches), 512 MiB of float32 at most


def _chunk_loss(x: Tensor, target: Tensor, keep: Tensor, epsilon: float, grad_out: Tensor | None):
    """Loss and nll sums of one chunk; writes d loss / d x into `grad_out` when given.  x [n, V] any float dtype.

    One exp pass: with m = max x, e = exp(x - m), s = sum e:  log p = (x - m) - log s,  softmax = e / s.
    The gradient softmax - q, q = (1 - eps) onehot(gold) + eps / V, is formed in float32 and rounded once into
    `grad_out` (the logits' dtype) by a single fused pass.
    """
    v = x.size(-1)
    m = x.amax(dim=-1, keepdim=True)  # [n, 1] exact in any dtype
    xf = torch.sub(x, m.to(torch.float32))  # [n, V] float32 x - m, one pass (a new tensor, reused in place below)
    gold = xf.gather(-1, target.unsqueeze(-1))  # [n, 1] x_gold - m
    centered_sum = xf.sum(-1) if epsilon else None  # [n] sum_v (x_v - m)
    e = xf.exp_()
    s = e.sum(-1, keepdim=True)  # [n, 1]
    log_s = s.log().squeeze(-1)  # [n] = lse - m
    keep_f = keep.to(torch.float32)
    nll = log_s - gold.squeeze(-1)  # -log p(gold)
    nll_sum = (nll * keep_f).sum()
    if epsilon:
        smooth = v * log_s - centered_sum  # -sum_v log p(v)
        loss_sum = ((1.0 - epsilon) * nll + epsilon / v * smooth).mul(keep_f).sum()
    else:
        loss_sum = nll_sum
    if grad_out is not None:
        # e[gold] -= (1 - eps) s, so that e / s - eps / V = softmax - q everywhere, in one fused pass
        e.scatter_add_(-1, target.unsqueeze(-1), s * -(1.0 - epsilon))
        torch.addcmul(e.new_tensor(-epsilon / v), e, s.reciprocal(), out=grad_out)
        if grad_out.is_cuda:
            grad_out.mul_(keep.unsqueeze(-1).to(grad_out.dtype))  # no host sync
        elif not bool(keep.all()):
            grad_out.masked_fill_(~keep.unsqueeze(-1), 0.0)
    return loss_sum, nll_sum


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):  # logits [N, V], target [N]
        n, v = logits.shape
        keep = target.ne(pad_id)
        safe_target = target.masked_fill(~keep, 0)
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        loss = logits.new_zeros((), dtype=torch.float32)
        nll = logits.new_zeros((), dtype=torch.float32)
        rows = max(1, (_CUDA_CHUNK_ELEMENTS if logits.is_cuda else _CHUNK_ELEMENTS) // max(v, 1))
        for s in range(0, n, rows):
            e = min(n, s + rows)
            chunk_loss, chunk_nll = _chunk_loss(logits[s:e], safe_target[s:e], keep[s:e], epsilon,
                                                grad[s:e] if grad is not None else None)
            loss += chunk_loss
            nll += chunk_nll
        if grad is not None:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        (grad,) = ctx.saved_tensors
        if not grad_loss.is_cuda and float(grad_loss) == 1.0:
            return grad, None, None, None  # the usual case on CPU: skip a pass over [N, V]
        return grad.mul(grad_loss.to(grad.dtype)), None, None, None


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float = 0.1, pad_id: int = 0
) -> tuple[Tensor, Tensor, int]:
    """Sum over non-pad tokens of the smoothed loss, the plain NLL sum, and the token count.

    The target distribution puts 1 - eps on the gold token and spreads eps uniformly over the vocabulary:
    loss = (1 - eps) * -log p(gold) + eps / V * sum_v -log p(v).
    logits [B, T, V] (any float dtype; computed in float32), target [B, T].
    """
    flat = logits.reshape(-1, logits.size(-1))  # [N, V]
    flat_target = target.reshape(-1)  # [N]
    loss, nll = _SmoothedCrossEntropy.apply(flat, flat_target, float(epsilon), int(pad_id))
    return loss, nll.detach(), int(flat_target.ne(pad_id).sum())
