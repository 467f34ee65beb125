"""`Runtime`: one training process's view of the run: its rank, device and precision (autocast, the fp16 loss
scaler) and the collectives the trainer calls (sums, broadcasts, gathers over the default process group)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt_cli.runtime.precision import dtypes
from nmt_cli.training.distributed.world import Launch

DTYPES = dtypes()  # autocast dtypes by precision name

FP16_INIT_SCALE = 2.0**7  # the dynamic loss scale fp16 training starts from (as fairseq)


@dataclass
class Runtime:
    """One training process: its rank, device, precision and collective helpers."""

    launch: Launch
    rank: int = 0
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    watchdog: object = None  # watchdog.py's Watchdog in a multi-process run

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.launch.distributed

    @property
    def precision(self) -> str:
        return self.launch.precision

    def autocast(self):
        """Mixed-precision context for the forward pass (a no-op in fp32).

        On CPU in bf16 it also selects the composite ("math") attention kernel: the fused CPU flash-attention
        kernel is slower than the composite one in bf16 for training-sized batches (bench/train.py measures both).
        """
        if self.precision == "fp32":
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(device_type=self.device.type, dtype=DTYPES[self.precision]))
        if self.device.type == "cpu":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return stack

    def make_scaler(self):
        """A dynamic loss scaler for fp16 (None otherwise): overflowed steps are skipped and the scale lowered.

        It starts at 2^7 as fairseq's does (--fp16-init-scale 128), not torch's 2^16: the loss is a sum over up to
        ~25k tokens, and from 2^16 a run loses its first updates to overflows while the scale falls (the tiny model
        of the tests lost 4 of its first 6)."""
        if self.precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type, init_scale=FP16_INIT_SCALE)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_float(self, value: float | None) -> float | None:
        """Rank 0's value on every rank (NaN stands for None)."""
        if not self.distributed:
            return value
        t = torch.tensor([float("nan") if value is None else value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0)
        out = float(t.item())
        return None if out != out else out

    def broadcast_object(self, obj):
        """Rank 0's `obj` (a small picklable value) on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj) -> list:
        """Every rank's `obj` (a small picklable value), in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()
