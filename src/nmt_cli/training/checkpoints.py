"""Run-directory checkpoints: names, keep-last-K, RNG state capture (averaging: nmt_cli/averaging.py).

A run directory holds
  checkpoint_last.pt        weights + the full training state (resume from here)
  checkpoint_best.pt        weights of the best validation score so far
  checkpoint_<step>.pt      weights saved every N updates / M minutes; the last K are kept (for averaging)
  averaged.pt               with --average-last N, the mean of the last N checkpoint_<step>.pt
Every file is a normal self-contained checkpoint (nmt_cli.checkpoint) written atomically.
Training state holds only tensors and plain data, so torch.load(weights_only=True) reads it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from nmt_cli.averaging import average_checkpoints, last_checkpoints, periodic_checkpoints, periodic_name  # noqa: F401

LAST, BEST, AVERAGED = "checkpoint_last.pt", "checkpoint_best.pt", "averaged.pt"


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
