"""Checkpoint averaging and the names of a run directory's periodic checkpoints: shared by `nmt train
--average-last`, `nmt average` and `nmt translate --average-last` (inference never imports training/).

A run directory's periodic checkpoints are named checkpoint_<step>.pt; averaging takes the element-wise mean of the
weights of several checkpoints of one run (same model config and tokenizer).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from nmt_cli.checkpoints.format import Checkpoint, load
from nmt_cli.data.shortlist import same as same_shortlist
from nmt_cli.errors import CheckpointError

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


def average_checkpoints(paths: list[str | os.PathLike]) -> Checkpoint:
    """The element-wise mean of the weights of `paths` (same model config and tokenizer), as a new checkpoint.

    Floating tensors are accumulated in float64 and cast back to their dtype; other tensors are taken from the
    last file. The result has no training state and records its sources in meta["averaged_from"].
    """
    if not paths:
        raise CheckpointError("no checkpoints to average; pass files or --last N with a run directory")
    first = load(paths[0])
    sums = {k: v.to(torch.float64) if v.is_floating_point() else v.clone() for k, v in first.model_state.items()}
    last, shortlist = first, first.shortlist
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
        if not same_shortlist(shortlist, ckpt.shortlist):
            shortlist = None  # the inputs' shortlists differ: the average has none (nmt shortlist adds one)
        last = ckpt
    n = len(paths)
    state = {k: (v / n).to(first.model_state[k].dtype) if v.is_floating_point() else v for k, v in sums.items()}
    meta = {k: v for k, v in last.meta.items() if k in ("step", "epoch", "preset")}
    meta["averaged_from"] = [str(p) for p in paths]
    return Checkpoint(first.model_config, state, first.tokenizer, dict(first.langs), None, meta,
                      first.target_tokenizer, first.vocab, shortlist)



def last_checkpoints(run_dir: str | os.PathLike, n: int, note=None) -> list[Path]:
    """The newest `n` checkpoint_<step>.pt of `run_dir`; CheckpointError if none.

    The one rule of `nmt train`, `nmt average --last N` and `nmt translate --average-last N` when fewer than `n`
    exist: the ones there are averaged, and `note(message)` hears it in one line (`fewer_message`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir} is not a directory; --last N takes the run directory of nmt train")
    paths = periodic_checkpoints(run_dir)
    if not paths:
        raise CheckpointError(f"{run_dir} has no checkpoint_<step>.pt files to average; pass checkpoint files instead")
    if len(paths) < n and note is not None:
        note(fewer_message(run_dir, len(paths), n))
    return paths[-n:]


def fewer_message(run_dir: str | os.PathLike, found: int, wanted: int) -> str:
    return (f"{run_dir} holds {found} checkpoint_<step>.pt of the {wanted} asked for: averaged those {found} (save "
            "more often, --save-every N, to average more)")
