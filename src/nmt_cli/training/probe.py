"""--max-tokens auto for training: the largest micro-batch whose forward and backward (the real loss, precision and
optimizer state) fit this GPU, found by nmt_cli.runtime.memory's search. Here rather than in memory.py so that translation
never imports training code."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from nmt_cli.config import PAD_ID
from nmt_cli.runtime.memory import SAFETY, attempt, largest_fitting, random_tokens
from nmt_cli.training.loss import label_smoothed_cross_entropy


def train_fits(module: torch.nn.Module, optimizer: torch.optim.Optimizer, autocast: Callable, length: int,
               label_smoothing: float, extra_param_copies: int = 0) -> Callable[[int], bool]:
    """A `fits(tokens)` for training: one forward and backward of `module` (in training mode, under `autocast`, with
    the label-smoothed loss) on a synthetic batch of tokens // length rows of `length` source and target tokens.

    Adam's two moments are allocated for the duration of each try when `optimizer` has no state yet (a fresh run
    allocates them at its first update; a resumed one has them already), and `extra_param_copies` more
    parameter-sized buffers (DistributedDataParallel's gradient buckets). The random number generators are left as
    they were, and so are the gradients (none)."""
    params = [p for p in module.parameters() if p.requires_grad]
    device = params[0].device
    vocab = module.config.vocab_size
    copies = extra_param_copies + (0 if optimizer.state else 2)
    generator = torch.Generator().manual_seed(0)

    def run(tokens: int) -> None:
        rows = max(1, tokens // length)
        reserve = [torch.empty_like(p) for p in params for _ in range(copies)]
        src = random_tokens(rows, length, vocab, device, generator)
        tgt = random_tokens(rows, length, vocab, device, generator)
        pad = torch.zeros(rows, length, dtype=torch.bool, device=device)
        with autocast():
            logits = module(src, tgt, pad)  # [rows, length, V]
        loss, _, _ = label_smoothed_cross_entropy(logits, tgt, label_smoothing, PAD_ID)
        loss.backward()
        del reserve

    def fits(tokens: int) -> bool:
        was_training = module.training
        module.train()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            try:
                return attempt(lambda: run(tokens))
            finally:
                module.zero_grad(set_to_none=True)
                module.train(was_training)

    return fits


def largest_train_batch(module: torch.nn.Module, optimizer: torch.optim.Optimizer, autocast: Callable, longest: int,
                        cap: int, label_smoothing: float = 0.1, extra_param_copies: int = 0) -> int | None:
    """--max-tokens auto for training: SAFETY x the largest micro-batch (padded tokens, at most `cap`) whose forward
    and backward fit at the data's longest sentences (`longest` tokens with EOS), or None when not even one sentence
    fits."""
    length = min(longest, module.config.max_positions)
    fits = train_fits(module, optimizer, autocast, length, label_smoothing, extra_param_copies)
    found = largest_fitting(fits, start=4096, cap=math.ceil(cap / SAFETY), floor=length)
    return None if found is None else min(cap, max(length, int(found * SAFETY)))


def probe_ranks(module: torch.nn.Module, optimizer: torch.optim.Optimizer, rt, longest: int, cap: int,
                label_smoothing: float) -> int:
    """`largest_train_batch` on every rank's GPU (before DDP and torch.compile wrap the model), the smallest answer
    of all; running out of memory at one sentence of `longest` tokens ends the run in one line."""
    from nmt_cli.runtime.memory import OutOfMemory

    found = largest_train_batch(module, optimizer, rt.autocast, longest, cap, label_smoothing,
                                extra_param_copies=1 if rt.distributed else 0)
    answers = rt.gather_objects(found)
    if any(a is None for a in answers):
        raise OutOfMemory(f"--max-tokens auto: not even one sentence of {longest} tokens fits in GPU memory "
                          "for a training step; use a smaller model (--preset, --d-model) or --precision bf16")
    return min(answers)
