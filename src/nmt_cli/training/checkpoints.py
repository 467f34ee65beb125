"""A training run's checkpoints: what rank 0 writes to the run directory, keep-last-K, RNG state capture.

A run directory holds
  checkpoint_last.pt        weights + the full training state (resume from here)
  checkpoint_best.pt        weights of the best validation score so far
  checkpoint_<step>.pt      weights saved every N updates (or M minutes); the last K are kept (for averaging)
  averaged.pt               the mean of the last N checkpoint_<step>.pt (nmt_cli/checkpoints/averaging.py), at the end
Every file is a normal self-contained checkpoint (nmt_cli.checkpoints.format) written atomically.
Training state holds only tensors and plain data, so torch.load(weights_only=True) reads it.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from nmt_cli.checkpoints.averaging import (
    average_checkpoints,
    last_checkpoints,
    periodic_checkpoints,
    periodic_name,
)
from nmt_cli.checkpoints.format import Checkpoint, save

LAST, BEST, AVERAGED = "checkpoint_last.pt", "checkpoint_best.pt", "averaged.pt"


class RunCheckpoints:
    """The checkpoints of the run in `out_dir`, written with the model's configuration and its tokenizer."""

    def __init__(self, out_dir: Path, model_config, tokenizer, langs, keep_last: int):
        self.out_dir, self.model_config, self.tokenizer, self.langs = Path(out_dir), model_config, tokenizer, langs
        self.keep_last = keep_last

    def save(self, module: torch.nn.Module, meta: dict, train_state: dict, periodic: bool) -> Path:
        """checkpoint_last.pt (weights and `train_state`) and, if `periodic`, checkpoint_<step>.pt (weights), keeping
        the newest `keep_last` of those. -> the path of checkpoint_last.pt"""
        weights = _weights(module)
        save(self._checkpoint(weights, meta, train_state), self.out_dir / LAST)
        if periodic:
            save(self._checkpoint(weights, meta), self.out_dir / periodic_name(meta["step"]))
            prune_periodic(self.out_dir, self.keep_last)
        return self.out_dir / LAST

    def save_best(self, module: torch.nn.Module, meta: dict) -> None:
        save(self._checkpoint(_weights(module), meta), self.out_dir / BEST)

    def average(self, n: int, note: Callable[[str], None]) -> tuple[Path, int]:
        """averaged.pt: the mean of the last `n` checkpoint_<step>.pt (fewer: `note` says so, averaging.py).
        -> its path and how many it averaged"""
        paths = last_checkpoints(self.out_dir, n, note)
        save(average_checkpoints(paths), self.out_dir / AVERAGED)
        return self.out_dir / AVERAGED, len(paths)

    def _checkpoint(self, weights: dict, meta: dict, train_state: dict | None = None) -> Checkpoint:
        tok = self.tokenizer
        return Checkpoint(self.model_config, weights, tok.model_bytes, self.langs, train_state, meta, tok.target_bytes,
                          tok.vocab)


def _weights(module: torch.nn.Module) -> dict:
    return {k: v.detach().to("cpu") for k, v in module.state_dict().items()}


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-1 of all weights, bitwise (to check that data-parallel ranks stayed identical)."""
    h = hashlib.sha1()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def prune_periodic(run_dir: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoint_<step>.pt files; return the deleted paths."""
    paths = periodic_checkpoints(run_dir)
    doomed = paths[:-keep_last] if keep_last > 0 else paths
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


# ---- RNG states (weights_only-safe: tensors and plain data only) --------------------------------------------

def rng_state(device: torch.device | None = None) -> dict:
    """torch (CPU and this process's CUDA device), numpy and python RNG states as tensors/plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["state"].tolist()), p["gauss"]))
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
