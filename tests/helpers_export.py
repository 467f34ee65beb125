"""A tiny Transformer trained for a few seconds on the toy pairs, so that it ends its sentences (EOS) as a real
model does: equivalence tests compare whole translations with it. Random weights stay for logits-level checks."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from conftest import toy_pairs
from helpers_translate import tiny_config
from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.data.tokenizer import Tokenizer
from nmt_cli.model import Transformer


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(seqs), max(map(len, seqs))), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


_TRAINED: dict[tuple, Path] = {}  # one training per settings and test session (the file stays until pytest ends)


def train_tiny(path: Path, tokenizer_bytes: bytes, steps: int = 150, seed: int = 0, **overrides) -> Path:
    """Teacher-forced cross-entropy with Adam on 600 toy pairs (batches of 32), saved as an nmt checkpoint; a
    model already trained with the same settings in this session is copied instead."""
    key = (tokenizer_bytes, steps, seed, tuple(sorted(overrides.items())))
    if key in _TRAINED and _TRAINED[key].exists():
        path.write_bytes(_TRAINED[key].read_bytes())
        return path
    _TRAINED[key] = _train(path, tokenizer_bytes, steps, seed, **overrides)
    return path


def _train(path: Path, tokenizer_bytes: bytes, steps: int, seed: int, **overrides) -> Path:
    tok = Tokenizer(tokenizer_bytes)
    pairs = toy_pairs(600, seed=7)
    src = [ids + [EOS_ID] for ids in tok.encode([p[0] for p in pairs])]
    tgt = [ids + [EOS_ID] for ids in tok.encode([p[1] for p in pairs])]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 32-wide model: one thread is fastest, and immune to a busy machine
    try:
        torch.manual_seed(seed)
        model = Transformer(tiny_config(tok.vocab_size, **overrides)).train()
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        rng = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            idx = torch.randint(0, len(pairs), (32,), generator=rng).tolist()
            s, t = _pad([src[i] for i in idx]), _pad([tgt[i] for i in idx])
            t_in = torch.cat([torch.full((len(idx), 1), BOS_ID), t[:, :-1]], dim=1)
            logits = model(s, t_in, s == PAD_ID)
            loss = F.cross_entropy(logits.transpose(1, 2), t, ignore_index=PAD_ID)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    checkpoint.save(checkpoint.Checkpoint(model.config, model.state_dict(), tokenizer_bytes,
                                          {"src": "en", "tgt": "de"}, meta={"step": steps}), path)
    return path
