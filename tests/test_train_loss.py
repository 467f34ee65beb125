"""The fused, chunked label-smoothed loss equals the plain log-softmax formulation, in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.training import loss as loss_mod
from nmt_cli.training.loss import label_smoothed_cross_entropy


def reference(logits, target, epsilon, pad_id=0):
    lprobs = F.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)
    flat = target.reshape(-1)
    keep = flat.ne(pad_id)
    nll = -lprobs.gather(-1, flat.unsqueeze(-1)).squeeze(-1).masked_fill(~keep, 0.0).sum()
    smooth = -lprobs.sum(-1).masked_fill(~keep, 0.0).sum()
    return (1.0 - epsilon) * nll + epsilon / lprobs.size(-1) * smooth, nll


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("scale", [1.0, 2.5])  # 1.0: the backward's shortcut; 2.5: e.g. a loss scaler
def test_fused_loss_matches_reference(dtype, epsilon, scale, monkeypatch):
    monkeypatch.setattr(loss_mod, "_CHUNK_ELEMENTS", 3 * 50)  # several chunks, the last one partial
    torch.manual_seed(0)
    logits = (3 * torch.randn(4, 5, 50)).to(dtype)
    target = torch.randint(4, 50, (4, 5))
    target[1, 2:] = 0
    target[3, 4] = 0
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    loss, nll, n = label_smoothed_cross_entropy(a, target, epsilon, pad_id=0)
    ref_loss, ref_nll = reference(b, target, epsilon)
    assert n == int(target.ne(0).sum())
    tol = dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(loss, ref_loss, **tol)
    torch.testing.assert_close(nll, ref_nll.detach(), **tol)
    (scale * loss).backward()
    (scale * ref_loss).backward()
    assert a.grad.dtype == dtype
    grad_tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(a.grad, b.grad, **grad_tol)
    assert a.grad[1, 2:].abs().sum() == 0  # padding gets no gradient
    torch.testing.assert_close(a.detach(), logits)  # the logits themselves are not modified


def test_no_grad_path_and_fp32_input_untouched():
    logits = torch.randn(3, 7, 20)
    target = torch.randint(1, 20, (3, 7))
    with torch.no_grad():
        loss, nll, n = label_smoothed_cross_entropy(logits, target, 0.1)
    ref_loss, _ = reference(logits, target, 0.1)
    torch.testing.assert_close(loss, ref_loss)
    assert n == int(target.ne(0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_formulation_for_the_gpu_matches_reference(dtype):
    """`_fused_rows` (what CUDA compiles) gives the loss, nll and gradient of the reference; fp16 logits keep a
    float32 gradient (eps / V would be subnormal in fp16)."""
    torch.manual_seed(1)
    logits = (3 * torch.randn(40, 300)).to(dtype)
    target = torch.randint(4, 300, (40,))
    target[::5] = 0
    keep = target.ne(0)
    grad_dtype = torch.float32 if dtype == torch.float16 else dtype
    loss, nll, grad = loss_mod._fused_rows(logits, target.masked_fill(~keep, 0), keep, 0.1, grad_dtype)
    b = logits.float().clone().requires_grad_()
    ref_loss, ref_nll = reference(b, target, 0.1)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll, ref_nll.detach(), rtol=1e-5, atol=1e-4)
    assert grad.dtype == grad_dtype
    tol = dict(rtol=1e-5, atol=1e-6) if grad_dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grad.float(), b.grad, **tol)
    assert grad[::5].abs().sum() == 0


def test_fp16_logits_keep_a_float32_gradient_until_it_is_scaled():
    """fp16 training scales the loss by up to 2^15: the gradient eps / V (2.7e-6 for 37k tokens) must be scaled
    before it is rounded to fp16, where it would be subnormal (a few bits of precision)."""
    torch.manual_seed(2)
    v = 37000
    logits = torch.randn(6, v).to(torch.float16)
    target = torch.randint(4, v, (6,))
    a = logits.clone().requires_grad_()
    loss, _, _ = label_smoothed_cross_entropy(a, target, 0.1)
    scale = 2.0**15
    (scale * loss).backward()
    b = logits.float().clone().requires_grad_()
    ref_loss, _ = reference(b, target, 0.1)
    (scale * ref_loss).backward()
    assert a.grad.dtype == torch.float16 and torch.isfinite(a.grad).all()
    # every element within fp16's rounding of the exact scaled gradient (relative to eps / V where softmax - q
    # cancels to about 0); rounding the unscaled gradient to fp16 first flushed 384 of these 222,000 elements to 0
    # and left a median error of 9e-4
    floor = scale * 0.1 / v
    rel = (a.grad.float() - b.grad).abs() / b.grad.abs().clamp_min(floor)
    assert rel.max().item() < 2e-3 and rel.median().item() < 3e-4
    assert not ((a.grad == 0) & (b.grad.abs() > floor)).any()


def test_out_of_memory_in_the_fused_loss_is_raised_and_keeps_it(monkeypatch):
    """A CUDA out-of-memory error inside the compiled loss (a batch too large: the --max-tokens auto probe tries
    some) reaches the caller, and the fused loss stays in use: only a compiler failure switches to the eager loss
    (on an H200 the probe's first out-of-memory try turned it off for the whole run, 2026-11-26)."""
    calls = []

    def too_large(*args):
        calls.append(args)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 188.00 MiB.")

    monkeypatch.setattr(loss_mod, "_compiled", {"fn": too_large, "failed": False})
    x, target, keep = torch.randn(6, 10), torch.randint(1, 10, (6,)), torch.ones(6, dtype=torch.bool)
    with pytest.raises(torch.OutOfMemoryError):
        loss_mod._fused_loss(x, target, keep, 0.1, torch.float32)
    assert loss_mod._compiled == {"fn": too_large, "failed": False} and len(calls) == 1

    def broken(*args):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(loss_mod, "_compiled", {"fn": broken, "failed": False})
    with pytest.warns(UserWarning, match="could not be compiled"):
        loss, nll, grad = loss_mod._fused_loss(x, target, keep, 0.1, torch.float32)
    assert loss_mod._compiled["failed"] and grad.shape == x.shape  # the eager loss answered instead
    ref_loss, ref_nll = reference(x, target, 0.1)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
