"""Which processes a run has, decided before anything is written (`plan_launch`): one process on CPU or one GPU,
N processes over NCCL (`--gpus N`), N CPU processes over gloo (`--cpu-procs N`, what CI tests), or the processes
`torchrun` started (RANK / WORLD_SIZE / LOCAL_RANK in the environment: `torchrun_env`); and each one's precision
(nmt_cli/runtime/precision.py's `resolve_precision`: auto/fp32/bf16/fp16 as the device supports them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from nmt_cli.errors import ConfigError, DeviceError
from nmt_cli.runtime.precision import resolve_precision


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when started by torchrun (or any launcher setting those variables)."""
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if not all(k in os.environ for k in keys):
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


@dataclass
class Launch:
    """Where the run happens: device type, number of processes, backend, and who starts the processes."""

    device_type: str  # "cpu" | "cuda"
    world_size: int
    backend: str | None  # "nccl" | "gloo" | None for one process
    external: bool  # True: torchrun started the processes; False: nmt spawns them (world_size > 1)
    precision: str  # resolved: fp32 | bf16 | fp16

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def plan_launch(gpus: int | None, cpu_procs: int, precision: str) -> Launch:
    """Check the request against the machine; raise DeviceError/ConfigError with one clear line."""
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = torchrun_env()
    if env is not None:
        _, world, local_rank = env
        device_type = "cuda" if (gpus != 0 and n_cuda > 0) else "cpu"
        backend = "nccl" if device_type == "cuda" else "gloo"
        return Launch(device_type, world, backend if world > 1 else None, True,
                      resolve_precision(precision, device_type, [local_rank]))
    if gpus is None:
        gpus = 1 if (n_cuda > 0 and cpu_procs == 1) else 0
    if gpus > n_cuda:
        where = f"only {n_cuda}" if n_cuda else "no CUDA GPU"
        raise DeviceError(f"--gpus {gpus} asked for {gpus} GPU(s) but this machine has {where}; "
                          "lower --gpus (or use --gpus 0 for CPU)")
    if gpus > 0:
        return Launch("cuda", gpus, "nccl" if gpus > 1 else None, False,
                      resolve_precision(precision, "cuda", list(range(gpus))))
    if cpu_procs > (os.cpu_count() or 1) * 4:
        raise ConfigError(f"--cpu-procs {cpu_procs} is far more than this machine's {os.cpu_count()} cores")
    return Launch("cpu", cpu_procs, "gloo" if cpu_procs > 1 else None, False, resolve_precision(precision, "cpu"))
