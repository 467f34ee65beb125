"""Training metrics: rank 0's JSON-lines log (and TensorBoard when installed), the run's header (`start_event`), and
the sums between log lines."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_cli.runtime.precision import slow_bf16_warning
from nmt_cli.training.distributed.process import DTYPES
from nmt_cli.training.files import METRICS_JSONL
from nmt_cli.training.schedule import inverse_sqrt_lr, peak_lr

if TYPE_CHECKING:
    from nmt_cli.training.distributed.process import Runtime
    from nmt_cli.training.plan import RunPlan
    from nmt_cli.training.state import TrainState


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


def start_event(plan: RunPlan, rt: Runtime, state: TrainState, params: int, reader, stale_tmp: tuple[int, int],
                probe_source: str) -> dict:
    """The run's header as rank 0 reports it (the first record of metrics.jsonl; `nmt train` prints it): the model
    (`params`), the machine, the batch (`reader`'s), the schedule and the stops, as the run is about to train from
    `state`."""
    b, cfg = plan.batching, plan.cfg
    return {
        "kind": "start", "preset": cfg.preset, "params": params,
        "device": rt.device.type, "world_size": rt.world_size, "precision": rt.precision,
        "max_tokens": b.max_tokens, "update_freq": b.update_freq,
        "max_tokens_auto": _auto_reason(state.probed_max_tokens, probe_source) if cfg.max_tokens == "auto" else None,
        "max_tokens_per_update": b.max_tokens_per_update, "update_tokens": b.update_tokens,
        # real (unpadded) tokens per update expected from the batches' average (metrics' "train" records: seen)
        "tgt_tokens_per_update": plan.mean_tgt_tokens * b.update_freq * b.world_size,
        "src_tokens_per_update": plan.mean_src_tokens * b.update_freq * b.world_size,
        "batches_per_epoch": len(reader.batches), "padding_efficiency": reader.padding_efficiency(),
        "peak_lr": peak_lr(plan.model_config.d_model, plan.warmup, cfg.lr), "warmup": plan.warmup,
        "max_steps": plan.max_steps, "max_time": cfg.max_time, "max_epochs": cfg.max_epochs,
        "save_every": plan.save_every, "save_minutes": plan.save_minutes, "average_last": plan.average_last,
        "average_note": plan.average_note, "valid_every": plan.valid_every, "valid_minutes": plan.valid_minutes,
        "has_valid": plan.has_valid,
        "lr_at_end": inverse_sqrt_lr(plan.max_steps, plan.model_config.d_model, plan.warmup, cfg.lr),
        "slow_precision": slow_bf16_warning(DTYPES.get(rt.precision), rt.device),
        "resumed_at": state.step if plan.resume_from else None,
        "stale_tmp_removed": stale_tmp[0], "stale_tmp_bytes": stale_tmp[1],
        "out_dir": str(plan.out_dir), "threads": plan.threads, "threads_reason": plan.threads_reason,
    }


def _auto_reason(probed: int | None, source: str) -> str:
    """How --max-tokens auto chose this run's micro-batch (the run's header prints it)."""
    if probed is None:
        return "the default micro-batch (the probe needs a CUDA GPU)"
    return f"micro-batches of at most {probed} tokens fit ({source})"
