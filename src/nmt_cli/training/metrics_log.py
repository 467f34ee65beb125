"""Training metrics: rank 0's JSON-lines log (and TensorBoard when installed), and the sums between log lines."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

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
