"""Tiny checkpoints for translation tests: a toy BPE model and a random (or briefly trained) tiny Transformer."""

from __future__ import annotations

from pathlib import Path

import torch

from nmt_cli import checkpoint
from nmt_cli.config import ModelConfig
from nmt_cli.data.tokenizer import Tokenizer
from nmt_cli.model import Transformer


def tiny_config(vocab_size: int, **overrides) -> ModelConfig:
    base = dict(vocab_size=vocab_size, d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2,
                dropout=0.0, max_positions=64)
    base.update(overrides)
    return ModelConfig(**base).validate()


def make_checkpoint(path: Path, tokenizer_bytes: bytes, seed: int = 0, **overrides) -> Path:
    """Save a random tiny Transformer with `tokenizer_bytes` as an nmt checkpoint at `path`."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(Tokenizer(tokenizer_bytes).vocab_size, **overrides)).eval()
    ckpt = checkpoint.Checkpoint(model.config, model.state_dict(), tokenizer_bytes, {"src": "en", "tgt": "de"})
    checkpoint.save(ckpt, path)
    return path
