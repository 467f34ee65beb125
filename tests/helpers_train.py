"""Training-test helpers: a loss poisoned at one training micro-batch."""

from __future__ import annotations

import torch

from nmt_cli.training import loop as loop_mod


def poison_loss(monkeypatch, at: int, factor: float) -> dict:
    """Multiply the loss of the `at`-th training micro-batch (validation not counted) by `factor` (inf: an fp16
    overflow, nan: a diverged model). -> the call counter {"n": micro-batches so far}."""
    real = loop_mod.label_smoothed_cross_entropy
    calls = {"n": 0}

    def poisoned(logits, target, epsilon, pad_id):
        calls["n"] += torch.is_grad_enabled()
        loss, nll, n = real(logits, target, epsilon, pad_id)
        return (loss * factor, nll, n) if calls["n"] == at else (loss, nll, n)

    monkeypatch.setattr(loop_mod, "label_smoothed_cross_entropy", poisoned)
    return calls
