"""The paper's learning-rate schedule: linear warmup, then decay with the inverse square root of the step."""

from __future__ import annotations


def inverse_sqrt_lr(step: int, d_model: int, warmup: int, peak: float | None = None) -> float:
    """lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)   (Vaswani et al., 2017, eq. 3).

    `step` counts updates from 1. With `peak`, the same shape is rescaled so that the maximum (reached at
    step == warmup) equals `peak`: lr = peak * min(step / warmup, sqrt(warmup / step)).
    """
    step = max(step, 1)
    shape = min(step**-0.5, step * warmup**-1.5)  # peaks at warmup^-0.5
    scale = d_model**-0.5 if peak is None else peak * warmup**0.5
    return scale * shape


def peak_lr(d_model: int, warmup: int, peak: float | None = None) -> float:
    """The highest learning rate the schedule reaches (at step == warmup)."""
    return inverse_sqrt_lr(warmup, d_model, warmup, peak)
