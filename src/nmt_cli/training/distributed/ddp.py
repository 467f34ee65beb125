"""`data_parallel`: DistributedDataParallel around the (compiled) model, as the trainer needs it."""

from __future__ import annotations

import torch

from nmt_cli.training.distributed.process import Runtime


def data_parallel(module: torch.nn.Module, rt: Runtime) -> torch.nn.Module:
    """DDP around the model, compiled or not. With --compile the order is DDP(torch.compile(model)), the one PyTorch's
    "Where to apply torch.compile?" recommends ("torch.compile specifically doesn't handle distributed wrapper modules
    like DDP or FSDP very well, so consider applying torch.compile to the inner module passed to the wrapper"). The
    backward still overlaps the all-reduce: DDP runs its module inside `_inside_ddp_forward`, and dynamo, compiling
    under an active DDP module, splits the graph at DDP's bucket boundaries (DDPOptimizer, torch/_dynamo/
    convert_frame.py), so each bucket's compiled backward hands its gradients to the reducer as it finishes
    (tests/test_train.py checks that DDPOptimizer compiles the model's graphs in this order). The only buffer is the
    constant position table: it is not broadcast before every forward."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else {"broadcast_buffers": False})  # (torch >= 2.13 renamed the option)
    return DDP(module, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None,
               gradient_as_bucket_view=True, **no_sync)
