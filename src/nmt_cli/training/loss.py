"""Label-smoothed cross-entropy that ignores padding (Szegedy et al., 2016; eps 0.1 in the paper).

The loss and its gradient are computed together in float32: the gradient with respect to the logits,
softmax - q, is stored during the forward pass and merely scaled in the backward pass. No float32 copy or
log-softmax of the whole [N, V] logits is ever kept.
- CPU: chunk by chunk of rows, a few passes each (those passes over a 37k vocabulary cost as much as a few
  matrix products there).
- CUDA: one `torch.compile`d function (a few fused kernels that read the logits and write the gradient, where the
  eager chunks make 8 memory-bound passes); eager chunks if compiling fails.
The gradient is stored in the logits' dtype, except for fp16 logits: there it stays float32 until the backward
pass has multiplied it by the loss scale (eps / V = 2.7e-6 is subnormal in fp16).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from nmt_cli.runtime.memory import is_out_of_memory

_CHUNK_ELEMENTS = 1 << 22  # CPU: ~4M elements a chunk (16 MiB of float32): few ops, bounded memory
_CUDA_CHUNK_ELEMENTS = 1 << 30  # GPU (fused): rows per call kept under 2^30 elements (32-bit indexing)


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
        torch.addcmul(e.new_full((), -epsilon / v), e, s.reciprocal(), out=grad_out)
        if grad_out.is_cuda:
            grad_out.mul_(keep.unsqueeze(-1).to(grad_out.dtype))  # no host sync
        elif not bool(keep.all()):
            grad_out.masked_fill_(~keep.unsqueeze(-1), 0.0)
    return loss_sum, nll_sum


def _fused_rows(x: Tensor, target: Tensor, keep: Tensor, epsilon: float, grad_dtype: torch.dtype):
    """The same loss, nll and gradient as `_chunk_loss`, written for `torch.compile` to fuse (no in-place ops).
    x [n, V] -> loss sum, nll sum, gradient [n, V] in `grad_dtype`."""
    v = x.size(-1)
    xf = x.float()
    z = xf - xf.amax(dim=-1, keepdim=True)
    lse = z.exp().sum(-1, keepdim=True).log()  # [n, 1] log-sum-exp - max
    gold = z.gather(-1, target.unsqueeze(-1))
    keep_f = keep.to(torch.float32)
    nll = (lse - gold).squeeze(-1)
    smooth = v * lse.squeeze(-1) - z.sum(-1)
    loss_sum = (((1.0 - epsilon) * nll + epsilon / v * smooth) * keep_f).sum()
    is_gold = torch.arange(v, device=x.device) == target.unsqueeze(-1)
    grad = ((z - lse).exp() - epsilon / v - (1.0 - epsilon) * is_gold.to(torch.float32)) * keep_f.unsqueeze(-1)
    return loss_sum, (nll * keep_f).sum(), grad.to(grad_dtype)


_compiled = {"fn": None, "failed": False}


def _fused_loss(x: Tensor, target: Tensor, keep: Tensor, epsilon: float, grad_dtype: torch.dtype):
    """`_fused_rows` compiled once (dynamic shapes); the eager chunks when compiling is not possible here."""
    if not _compiled["failed"]:
        try:
            if _compiled["fn"] is None:
                _compiled["fn"] = torch.compile(_fused_rows, dynamic=True)
            return _compiled["fn"](x, target, keep, epsilon, grad_dtype)
        except Exception as exc:  # noqa: BLE001 - no compiler toolchain, an unsupported GPU, ...
            if is_out_of_memory(exc):
                # a batch too large for the GPU, not a compiler that fails: the caller decides (the probe of
                # --max-tokens auto answers "does not fit"; training says which option to lower). Falling back
                # here would slow every later update and leave the probe measuring two different losses.
                raise
            _compiled["failed"] = True
            warnings.warn(f"the fused CUDA loss could not be compiled ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); using the slower eager loss",
                          stacklevel=2)
    grad = torch.empty_like(x, dtype=grad_dtype)
    loss, nll = _chunk_loss(x, target, keep, epsilon, grad)
    return loss, nll, grad


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):  # logits [N, V], target [N]
        n, v = logits.shape
        keep = target.ne(pad_id)
        safe_target = target.masked_fill(~keep, 0)
        grad_dtype = torch.float32 if logits.dtype == torch.float16 else logits.dtype
        ctx.logits_dtype = logits.dtype
        loss = logits.new_zeros((), dtype=torch.float32)
        nll = logits.new_zeros((), dtype=torch.float32)
        if logits.is_cuda and ctx.needs_input_grad[0]:
            rows = max(1, _CUDA_CHUNK_ELEMENTS // max(v, 1))
            grads = []
            for s in range(0, n, rows):
                e = min(n, s + rows)
                chunk_loss, chunk_nll, g = _fused_loss(logits[s:e], safe_target[s:e], keep[s:e], epsilon, grad_dtype)
                loss, nll = loss + chunk_loss, nll + chunk_nll
                grads.append(g)
            grad = grads[0] if len(grads) == 1 else torch.cat(grads)
        else:
            grad = torch.empty_like(logits, dtype=grad_dtype) if ctx.needs_input_grad[0] else None
            # (eager on the GPU, i.e. validation: 512 MiB float32 chunks)
            rows = max(1, ((1 << 27) if logits.is_cuda else _CHUNK_ELEMENTS) // max(v, 1))
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
        if not grad_loss.is_cuda and float(grad_loss) == 1.0 and grad.dtype == ctx.logits_dtype:
            return grad, None, None, None  # the usual case on CPU: skip a pass over [N, V]
        return grad.mul(grad_loss.to(grad.dtype)).to(ctx.logits_dtype), None, None, None


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float = 0.1, pad_id: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Sum over non-pad tokens of the smoothed loss, the plain NLL sum, and the token count (a 0-dim tensor on
    the logits' device: reading it is the caller's choice, no host-device synchronisation here).

    The target distribution puts 1 - eps on the gold token and spreads eps uniformly over the vocabulary:
    loss = (1 - eps) * -log p(gold) + eps / V * sum_v -log p(v).
    logits [B, T, V] (any float dtype; computed in float32), target [B, T].
    """
    flat = logits.reshape(-1, logits.size(-1))  # [N, V]
    flat_target = target.reshape(-1)  # [N]
    loss, nll = _SmoothedCrossEntropy.apply(flat, flat_target, float(epsilon), int(pad_id))
    return loss, nll.detach(), flat_target.ne(pad_id).sum()
