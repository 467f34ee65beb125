"""Tiny checkpoints for translation tests: a toy BPE model and a random (or briefly trained) tiny Transformer."""

from __future__ import annotations

from pathlib import Path

import torch

from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.config import ModelConfig
from nmt_cli.data.tokenizer import Tokenizer
from nmt_cli.model import Transformer


def tiny_config(vocab_size: int, **overrides) -> ModelConfig:
    base = dict(vocab_size=vocab_size, d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2,
                dropout=0.0, max_positions=64)
    base.update(overrides)
    return ModelConfig(**base).validate()


def tiny_model_and_batch(share: bool) -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    """A tiny Transformer in eval mode (50-token vocabulary) and a batch of sources [3, 7] and targets [3, 5], seeded:
    what the inference-only transformations (int8.py, packed.py) are checked against."""
    torch.manual_seed(1)
    model = Transformer(tiny_config(50, share_embeddings=share)).eval()
    return model, torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 5))


def make_checkpoint(path: Path, tokenizer_bytes: bytes, seed: int = 0, **overrides) -> Path:
    """Save a random tiny Transformer with `tokenizer_bytes` as an nmt checkpoint at `path`."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(Tokenizer(tokenizer_bytes).vocab_size, **overrides)).eval()
    ckpt = checkpoint.Checkpoint(model.config, model.state_dict(), tokenizer_bytes, {"src": "en", "tgt": "de"})
    checkpoint.save(ckpt, path)
    return path
