"""A training run's checkpoints: what rank 0 writes to the run directory and when, keep-last-K, averaging at the
end, and the training state that makes a resumed run continue bitwise (`train_state`, `restore`, RNG states).

A run directory holds
  checkpoint_last.pt        weights + the full training state (resume from here)
  checkpoint_best.pt        weights of the best validation score so far
  checkpoint_<step>.pt      weights saved every N updates (or M minutes); the last K are kept (for averaging)
  averaged.pt               the mean of the last N checkpoint_<step>.pt (nmt_cli/checkpoints/averaging.py), at the end
Every file is a normal self-contained checkpoint (nmt_cli.checkpoints.format) written atomically.
When: every --save-every updates and, with --save-every-minutes, by rank 0's clock, agreed by every rank
(`Periodic`, which also times the validations).
What a finished run is (nothing to train) is decided before training, from checkpoint_last.pt's state (plan.py).
Training state holds only tensors and plain data, so torch.load(weights_only=True) reads it.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from nmt_cli.checkpoints.averaging import (
    average_checkpoints,
    last_checkpoints,
    periodic_checkpoints,
    periodic_name,
)
from nmt_cli.checkpoints.format import Checkpoint, save
from nmt_cli.errors import CheckpointError

if TYPE_CHECKING:
    from nmt_cli.training.loop import Trainer

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


class Periodic:
    """When the run saves (or validates): every `every` updates, and with `minutes` also once that much wall-clock
    time has passed since the last one. That clock is rank 0's: its "time" is a flag the ranks agree on a step late
    (runtime.Votes), so that every rank acts at the same update; the flag is raised once until acted on (a second
    one, raised while the first was in flight, would save twice in a row)."""

    def __init__(self, every: int, minutes: float | None, start: float,
                 clock: Callable[[], float] = time.monotonic):
        self.every, self.minutes, self.clock = every, minutes, clock
        self.last = start  # clock() of the last save (or of the start)
        self.done_at = -1  # the update last acted on in this process
        self.raised = False  # the time flag is on its way to the other ranks

    def time_is_up(self, now: float) -> bool:
        """Whether to raise the time flag at `now` (rank 0's clock)."""
        if self.minutes is None or self.raised:
            return False
        self.raised = now - self.last >= self.minutes * 60
        return self.raised

    def due(self, step: int, time_agreed: bool) -> bool:
        """Whether to act after update `step`; `time_agreed`: the ranks agreed that the time is up."""
        return time_agreed or step % self.every == 0

    def done(self, step: int) -> None:
        self.done_at, self.last, self.raised = step, self.clock(), False


# ---- the training state in checkpoint_last.pt ---------------------------------------------------------------

def restore(trainer: Trainer, ckpt: Checkpoint) -> tuple[int, int]:
    """The training state of `ckpt` in `trainer` (weights, optimizer, loss scale, counters, the best validation,
    this rank's RNG streams); -> the data position (epoch, pos) its reader goes on from."""
    ts = ckpt.train_state
    try:
        trainer.module.load_state_dict(ckpt.model_state)
        trainer.optimizer.load_state_dict(ts["optimizer"])
        if trainer.scaler is not None and ts.get("scaler"):
            trainer.scaler.load_state_dict(ts["scaler"])
        trainer.step, epoch, pos = int(ts["step"]), int(ts["epoch"]), int(ts["pos"])
        trainer.elapsed, trainer.overflows = float(ts["elapsed"]), int(ts.get("overflows", 0))
        trainer.validations, trainer.valid_seconds = int(ts.get("validations", 0)), float(ts.get("valid_seconds", 0.0))
        trainer.saves, trainer.save_seconds = int(ts.get("saves", 0)), float(ts.get("save_seconds", 0.0))
        trainer.best.value, trainer.best.step, trainer.best.bad = ts.get("best"), ts.get("best_step"), \
            int(ts.get("bad_valids", 0))
        saved_world = int(ts.get("world_size", 1))
        rngs = ts.get("rng") or []
        trainer.probed = ts.get("probed_max_tokens") if trainer.cfg.max_tokens == "auto" else None
    except (KeyError, ValueError, RuntimeError, TypeError) as exc:
        raise CheckpointError(f"{trainer.plan.resume_from}: training state does not fit this run "
                              f"({str(exc).splitlines()[0][:150]}); pick another -o") from exc
    if not ts.get("pos_global"):  # an older nmt counted each rank's own batches: about the same place
        pos *= saved_world
    if saved_world != trainer.rt.world_size:  # the data position holds for any world size; RNG streams do not
        torch.manual_seed(trainer.cfg.seed + 1000 * trainer.rt.rank + trainer.step)
    elif trainer.rt.rank < len(rngs):
        set_rng_state(rngs[trainer.rt.rank], trainer.rt.device)
    return epoch, pos


def train_state(trainer: Trainer, rngs: list) -> dict:
    """What checkpoint_last.pt holds beside the weights, to resume `trainer` where it is: `rngs` are every rank's
    RNG states (`rng_state`, gathered)."""
    return {
        "step": trainer.step, "epoch": trainer.reader.epoch, "pos": trainer.reader.pos, "pos_global": True,
        "elapsed": trainer.elapsed, "best": trainer.best.value, "best_step": trainer.best.step,
        "bad_valids": trainer.best.bad, "overflows": trainer.overflows, "world_size": trainer.rt.world_size,
        "validations": trainer.validations, "valid_seconds": trainer.valid_seconds, "saves": trainer.saves,
        "save_seconds": trainer.save_seconds,
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "rng": rngs, "config": plain(trainer.cfg.to_dict()), "probed_max_tokens": trainer.probed,
    }


def plain(obj):
    """JSON-like plain data (tuples become lists) for the training state."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


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
