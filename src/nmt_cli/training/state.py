"""The trainer's state apart from its model and optimizer: `TrainState`, which the Trainer owns and the checkpoint
manager (checkpoint_manager.py) writes into checkpoint_last.pt and reads back as a plain dict, never seeing the Trainer.

It holds the counters a resumed run goes on from (the update, the data position, the training time, what
validating and saving cost), the best validation and patience (`Best`), the micro-batch a probe found, and the
world size the state was saved with; `rng_state`/`set_rng_state` carry each rank's random streams. Everything is
tensors and plain data, so torch.load(weights_only=True) reads it. The dict's keys are checkpoint_last.pt's
`train_state` keys (docs/checkpoint-format.md): the Trainer adds its optimizer's, loss scaler's, RNG states and
the options to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Best:
    """The best validation so far by `criterion` (valid_bleu: the higher the better; valid_nll: the lower) and how
    many validations since have not improved on it (--patience)."""

    criterion: str
    value: float | None = None
    step: int | None = None
    bad: int = 0

    def improved(self, valid: dict, step: int) -> bool:
        """Take validation `valid` of update `step` into account; -> whether it is the new best."""
        value = valid[self.criterion]
        if self.value is None or (value > self.value if self.criterion == "valid_bleu" else value < self.value):
            self.value, self.step, self.bad = value, step, 0
            return True
        self.bad += 1
        return False


@dataclass
class TrainState:
    """Where a run is: what checkpoint_last.pt's training state holds besides the optimizer, the loss scaler and
    the RNG streams."""

    best: Best = field(default_factory=lambda: Best("valid_nll"))
    step: int = 0  # updates applied (fp16 overflows skipped)
    epoch: int = 1  # the data position the reader goes on from (reader.py): epoch, and batches of its order done
    pos: int = 0
    elapsed: float = 0.0  # seconds of training, over all resumes
    overflows: int = 0  # fp16 updates skipped
    validations: int = 0  # what validating and saving cost, over all resumes (the end of the run reports it)
    valid_seconds: float = 0.0
    saves: int = 0
    save_seconds: float = 0.0
    probed_max_tokens: int | None = None  # --max-tokens auto: the micro-batch the probe found (probe.py)
    world_size: int = 1  # the processes the state was saved by

    def state_dict(self) -> dict:
        return {
            "step": self.step, "epoch": self.epoch, "pos": self.pos, "pos_global": True, "elapsed": self.elapsed,
            "best": self.best.value, "best_step": self.best.step, "bad_valids": self.best.bad,
            "overflows": self.overflows, "world_size": self.world_size, "validations": self.validations,
            "valid_seconds": self.valid_seconds, "saves": self.saves, "save_seconds": self.save_seconds,
            "probed_max_tokens": self.probed_max_tokens,
        }

    def load_state_dict(self, ts: dict) -> None:
        """The state saved as `ts` (`state_dict`; older nmt's keys too). KeyError, ValueError or TypeError when
        it is not a training state."""
        self.step, self.epoch, self.pos = int(ts["step"]), int(ts["epoch"]), int(ts["pos"])
        self.elapsed, self.overflows = float(ts["elapsed"]), int(ts.get("overflows", 0))
        self.validations, self.valid_seconds = int(ts.get("validations", 0)), float(ts.get("valid_seconds", 0.0))
        self.saves, self.save_seconds = int(ts.get("saves", 0)), float(ts.get("save_seconds", 0.0))
        self.best.value, self.best.step, self.best.bad = ts.get("best"), ts.get("best_step"), \
            int(ts.get("bad_valids", 0))
        self.world_size = int(ts.get("world_size", 1))
        self.probed_max_tokens = ts.get("probed_max_tokens")
        if not ts.get("pos_global"):  # an older nmt counted each rank's own batches: about the same place
            self.pos *= self.world_size


def plain(obj):
    """JSON-like plain data (tuples become lists) for the training state."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


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
