"""Training metrics: rank 0's JSON-lines log (and TensorBoard when installed), the run's header (`start_event`), and
the sums between log lines."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_cli.runtime.precision import slow_bf16_warning
from nmt_cli.training.runtime import DTYPES
from nmt_cli.training.schedule import inverse_sqrt_lr, peak_lr

if TYPE_CHECKING:
    from nmt_cli.training.loop import Trainer

METRICS_JSONL = "metrics.jsonl"


class MetricsLog:
    """Rank 0's JSONL log (and TensorBoard events when tensorboard is installed)."""

    def __init__(self, out_dir: Path, enabled: bool):
        self.enabled = enabled
        self.file = open(out_dir / METRICS_JSONL, "a") if enabled else None
        self.tb = None
        self.note: str | None = None  # why there are no TensorBoard events (the run's header says it)
        if enabled:
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                self.note = ("TensorBoard is not installed: the metrics go to metrics.jsonl and train.log only "
                             "(pip install tensorboard for RUN_DIR/tensorboard)")
            else:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self.tb = SummaryWriter(str(out_dir / "tensorboard"))
                except Exception as exc:  # a broken tensorboard install must not stop training
                    self.note = (f"TensorBoard could not start ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:100] if str(exc) else ''}): the metrics go to "
                                 "metrics.jsonl and train.log only")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            kind, step = record.get("kind"), record.get("step", 0)
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                    self.tb.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


@dataclass
class Window:
    """Sums over the updates since the last log line (the losses are added when they are read from the device)."""

    loss: float = 0.0
    nll: float = 0.0
    tgt_tokens: float = 0.0
    src_tokens: float = 0.0
    updates: int = 0
    seconds: float = 0.0

    def add(self, tgt_tokens: float, src_tokens: float, seconds: float) -> None:
        self.tgt_tokens += tgt_tokens
        self.src_tokens += src_tokens
        self.updates += 1
        self.seconds += seconds

    def add_losses(self, loss: float, nll: float) -> None:
        self.loss += loss
        self.nll += nll

    def speed(self) -> dict:
        """Speeds and the average real (unpadded) tokens of an update, over all processes and micro-batches."""
        return {"tgt_tokens_per_s": self.tgt_tokens / max(self.seconds, 1e-9),
                "src_tokens_per_s": self.src_tokens / max(self.seconds, 1e-9),
                "tgt_tokens_per_update": self.tgt_tokens / max(self.updates, 1),
                "src_tokens_per_update": self.src_tokens / max(self.updates, 1)}

    def summary(self) -> dict:
        tok = max(self.tgt_tokens, 1.0)
        return {"loss": self.loss / tok, "nll_loss": self.nll / tok, "ppl": math.exp(min(self.nll / tok, 50.0)),
                **self.speed()}


def start_event(trainer: Trainer) -> dict:
    """The run's header as rank 0 reports it (the first record of metrics.jsonl; `nmt train` prints it): the model,
    the machine, the batch, the schedule and the stops, as `trainer` is about to train."""
    plan, b = trainer.plan, trainer.plan.batching
    return {
        "kind": "start", "preset": trainer.cfg.preset, "params": trainer.module.num_parameters(),
        "device": trainer.rt.device.type, "world_size": trainer.rt.world_size, "precision": trainer.rt.precision,
        "max_tokens": b.max_tokens, "update_freq": b.update_freq,
        "max_tokens_auto": _auto_reason(trainer) if trainer.cfg.max_tokens == "auto" else None,
        "max_tokens_per_update": b.max_tokens_per_update, "update_tokens": b.update_tokens,
        # real (unpadded) tokens per update expected from the batches' average (metrics' "train" records: seen)
        "tgt_tokens_per_update": plan.mean_tgt_tokens * b.update_freq * b.world_size,
        "src_tokens_per_update": plan.mean_src_tokens * b.update_freq * b.world_size,
        "batches_per_epoch": len(trainer.reader.batches), "padding_efficiency": trainer.reader.padding_efficiency(),
        "peak_lr": peak_lr(plan.model_config.d_model, plan.warmup, trainer.cfg.lr), "warmup": plan.warmup,
        "max_steps": plan.max_steps, "max_time": trainer.cfg.max_time, "max_epochs": trainer.cfg.max_epochs,
        "save_every": plan.save_every, "save_minutes": plan.save_minutes, "average_last": plan.average_last,
        "average_note": plan.average_note, "valid_every": plan.valid_every, "valid_minutes": plan.valid_minutes,
        "has_valid": plan.has_valid,
        "lr_at_end": inverse_sqrt_lr(plan.max_steps, plan.model_config.d_model, plan.warmup, trainer.cfg.lr),
        "slow_precision": slow_bf16_warning(DTYPES.get(trainer.rt.precision), trainer.rt.device),
        "resumed_at": trainer.step if plan.resume_from else None,
        "stale_tmp_removed": trainer.stale_tmp[0], "stale_tmp_bytes": trainer.stale_tmp[1],
        "out_dir": str(trainer.out_dir), "threads": plan.threads, "threads_reason": plan.threads_reason,
    }


def _auto_reason(trainer: Trainer) -> str:
    """How --max-tokens auto chose this run's micro-batch (the run's header prints it)."""
    if trainer.probed is None:
        return "the default micro-batch (the probe needs a CUDA GPU)"
    return f"micro-batches of at most {trainer.probed} tokens fit ({trainer.probe_source})"
