"""A training run's checkpoint manager: what rank 0 writes to the run directory and when, keep-last-K, averaging
at the end, and reading checkpoint_last.pt back. It saves and restores state dicts (the model's weights, the
training state the Trainer gives it: state.py) and never sees the Trainer.

The run directory's files are named in files.py (checkpoint_last.pt with the full training state,
checkpoint_best.pt, checkpoint_<step>.pt, averaged.pt: nmt_cli/checkpoints/averaging.py's mean). Every file is a
normal self-contained checkpoint (nmt_cli.checkpoints.format) written atomically.
When: every --save-every updates and, with --save-every-minutes, by rank 0's clock, agreed by every rank
(`Periodic`, which also times the validations).
What a finished run is (nothing to train) is decided before training, from checkpoint_last.pt's state (plan.py).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from nmt_cli.checkpoints.averaging import (
    average_checkpoints,
    last_checkpoints,
    periodic_checkpoints,
    periodic_name,
)
from nmt_cli.checkpoints.format import Checkpoint, load, save
from nmt_cli.training.files import AVERAGED, BEST, LAST


class RunCheckpoints:
    """The checkpoints of the run in `out_dir`, written with the model's configuration and its tokenizer."""

    def __init__(self, out_dir: Path, model_config, tokenizer, langs, keep_last: int, shortlist: dict | None = None):
        self.out_dir, self.model_config, self.tokenizer, self.langs = Path(out_dir), model_config, tokenizer, langs
        self.keep_last = keep_last
        self.shortlist = shortlist  # the data's vocabulary shortlist (data/shortlist.py), in every checkpoint

    def save(self, model_state: dict, meta: dict, train_state: dict, periodic: bool) -> Path:
        """checkpoint_last.pt (weights and `train_state`) and, if `periodic`, checkpoint_<step>.pt (weights), keeping
        the newest `keep_last` of those. -> the path of checkpoint_last.pt"""
        weights = _on_cpu(model_state)
        save(self._checkpoint(weights, meta, train_state), self.out_dir / LAST)
        if periodic:
            save(self._checkpoint(weights, meta), self.out_dir / periodic_name(meta["step"]))
            prune_periodic(self.out_dir, self.keep_last)
        return self.out_dir / LAST

    def save_best(self, model_state: dict, meta: dict) -> None:
        save(self._checkpoint(_on_cpu(model_state), meta), self.out_dir / BEST)

    @staticmethod
    def restore(path: str | os.PathLike) -> tuple[dict, dict]:
        """checkpoint_last.pt's weights and training state: the state dicts the Trainer saved."""
        ckpt = load(path)
        return ckpt.model_state, ckpt.train_state

    def average(self, n: int, note: Callable[[str], None]) -> tuple[Path, int]:
        """averaged.pt: the mean of the last `n` checkpoint_<step>.pt (fewer: `note` says so, averaging.py).
        -> its path and how many it averaged"""
        paths = last_checkpoints(self.out_dir, n, note)
        save(average_checkpoints(paths), self.out_dir / AVERAGED)
        return self.out_dir / AVERAGED, len(paths)

    def _checkpoint(self, weights: dict, meta: dict, train_state: dict | None = None) -> Checkpoint:
        tok = self.tokenizer
        return Checkpoint(self.model_config, weights, tok.model_bytes, self.langs, train_state, meta, tok.target_bytes,
                          tok.vocab, self.shortlist)


class Periodic:
    """When the run saves (or validates): every `every` updates, and with `minutes` also once that much wall-clock
    time has passed since the last one. That clock is rank 0's: its "time" is a flag the ranks agree on a step late
    (distributed/votes.py), so that every rank acts at the same update; the flag is raised once until acted on (a second
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


def _on_cpu(model_state: dict) -> dict:
    return {k: v.detach().to("cpu") for k, v in model_state.items()}


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
