"""Run-directory checkpoints: names, keep-last-K, RNG state capture, and checkpoint averaging.

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
import re
from pathlib import Path

import numpy as np
import torch

from nmt_cli.checkpoint import Checkpoint, load
from nmt_cli.errors import CheckpointError

LAST, BEST, AVERAGED = "checkpoint_last.pt", "checkpoint_best.pt", "averaged.pt"
_PERIODIC = re.compile(r"^checkpoint_(\d+)\.pt$")


def periodic_name(step: int) -> str:
    return f"checkpoint_{step}.pt"


def periodic_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """checkpoint_<step>.pt files of `run_dir`, oldest (lowest step) first."""
    found = []
    for p in Path(run_dir).iterdir():
        m = _PERIODIC.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


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


# ---- averaging ------------------------------------------------------------------------------------------------

def average_checkpoints(paths: list[str | os.PathLike]) -> Checkpoint:
    """The element-wise mean of the weights of `paths` (same model config and tokenizer), as a new checkpoint.

    Floating tensors are accumulated in float64 and cast back to their dtype; other tensors are taken from the
    last file. The result has no training state and records its sources in meta["averaged_from"].
    """
    if not paths:
        raise CheckpointError("no checkpoints to average; pass files or --last N with a run directory")
    first = load(paths[0])
    sums = {k: v.to(torch.float64) if v.is_floating_point() else v.clone() for k, v in first.model_state.items()}
    last = first
    for path in paths[1:]:
        ckpt = load(path)
        if ckpt.model_config != first.model_config:
            raise CheckpointError(f"{path} has a different model config from {paths[0]}; average checkpoints of one run")
        if ckpt.tokenizer_key() != first.tokenizer_key():
            raise CheckpointError(f"{path} has a different tokenizer from {paths[0]}; average checkpoints of one run")
        if set(ckpt.model_state) != set(sums):
            raise CheckpointError(f"{path} has different weights from {paths[0]}; average checkpoints of one run")
        for k, v in ckpt.model_state.items():
            if v.is_floating_point():
                sums[k] += v.to(torch.float64)
            else:
                sums[k] = v.clone()
        last = ckpt
    n = len(paths)
    state = {k: (v / n).to(first.model_state[k].dtype) if v.is_floating_point() else v for k, v in sums.items()}
    meta = {k: v for k, v in last.meta.items() if k in ("step", "epoch", "preset")}
    meta["averaged_from"] = [str(p) for p in paths]
    return Checkpoint(first.model_config, state, first.tokenizer, dict(first.langs), None, meta,
                      first.target_tokenizer, first.vocab)


def last_checkpoints(run_dir: str | os.PathLike, n: int) -> list[Path]:
    """The newest `n` checkpoint_<step>.pt of `run_dir` (fewer if fewer exist); CheckpointError if none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir} is not a directory; --last N takes the run directory of nmt train")
    paths = periodic_checkpoints(run_dir)
    if not paths:
        raise CheckpointError(f"{run_dir} has no checkpoint_<step>.pt files to average; pass checkpoint files instead")
    return paths[-n:]
