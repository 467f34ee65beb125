"""Devices and process groups of a training run (the precision table and checks: nmt_cli/runtime/precision.py).

- `plan_launch()` decides, before anything is written, where training runs: one process on CPU or one GPU,
  N processes over NCCL (`--gpus N`), N CPU processes over gloo (`--cpu-procs N`, what CI tests), or the
  processes `torchrun` started (RANK / WORLD_SIZE / LOCAL_RANK in the environment).
- `resolve_precision()` (precision.py) turns auto/fp32/bf16/fp16 into what the device supports.
- `Runtime` is one process's view: device, rank, autocast context, all-reduce helpers.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt_cli.errors import ConfigError, DeviceError
from nmt_cli.runtime.precision import (
    dtypes,
    resolve_precision,
)

DTYPES = dtypes()  # autocast dtypes by precision name

FP16_INIT_SCALE = 2.0**7  # the dynamic loss scale fp16 training starts from (as fairseq)


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


@dataclass
class Runtime:
    """One training process: its rank, device, precision and collective helpers."""

    launch: Launch
    rank: int = 0
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    watchdog: object = None  # training/watchdog.py's Watchdog in a multi-process run

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


class Votes:
    """Flags that every rank must act on together (stop, save), agreed a step late: the flags a rank raises at one
    update are summed over the ranks (the default process group: NCCL on GPUs, gloo on CPU) while the next update
    computes, and every rank reads the sums after that update. On a GPU the sum comes back in page-locked memory
    behind an event, so reading it waits only for the exchange, never for the update queued after it, and the host
    keeps feeding the device. One process agrees with itself at once."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self._pending = None  # (work, result tensor on the host, event or None)

    def exchange(self, *flags: bool) -> tuple[bool, ...]:
        """Raise `flags` for this update; -> the flags agreed at the previous one (any rank's raised flag counts):
        all False at the first update. Every rank calls it once per update, in the same order."""
        if not self.rt.distributed:
            return tuple(bool(f) for f in flags)
        agreed = self._read() or (False,) * len(flags)
        cuda = self.rt.device.type == "cuda"
        votes = torch.tensor([float(f) for f in flags], pin_memory=cuda).to(self.rt.device, non_blocking=True)
        work = dist.all_reduce(votes, op=dist.ReduceOp.SUM, async_op=True)
        event = None
        if cuda:
            work.wait()  # (the current stream waits for NCCL's; the host does not)
            votes = votes.to("cpu", non_blocking=True)  # (into page-locked memory)
            event = torch.cuda.Event()
            event.record()
        self._pending = (work, votes, event)
        return agreed

    def drain(self) -> None:
        """Wait for the last exchange (before the ranks leave the loop)."""
        self._read()

    def _read(self) -> tuple[bool, ...] | None:
        if self._pending is None:
            return None
        work, votes, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        else:
            work.wait()
        return tuple(v > 0 for v in votes.tolist())


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


def agent_store(timeout: datetime.timedelta):
    """Under torchrun with its agent's shared store (`TORCHELASTIC_USE_AGENT_STORE`, the rendezvous handler's
    `use_agent_store`: "store ... can be shared with user applications", MASTER_ADDR/MASTER_PORT by convention): a
    client of it; else None (env:// as usual: rank 0 hosts a fresh store)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         wait_for_workers=False, timeout=timeout)


def agree_round(store, rank: int, world_size: int, poll_s: float = 0.05) -> int:
    """A number of this round of workers, the same on every rank and new in every torchrun restart round.

    torchrun (c10d rendezvous) keeps one shared store server for every restart round, and torch's env:// joins the
    new round's workers to it without a prefix, so they read the dead round's keys: gloo dialled the old workers'
    addresses ("connectFullMesh ... Connection refused") or the ranks waited for each other forever
    (pytorch/pytorch#167288 is the same symptom with NCCL). Each round's keys therefore go under a prefix of its own.
    TORCHELASTIC_RESTART_COUNT cannot be that prefix on several nodes: only the agent whose worker failed counts a
    restart (two nodes restarted with counts 1 and 0 and never met). So rank 0 draws the next number of a counter
    in the store, and every other rank asks for it under a key nobody used before (a fresh nonce), which rank 0
    answers for every nonce it sees until every rank has acknowledged the number; a dead round's hello is answered
    too, harmlessly. Public store calls only (add, set, get, check)."""
    import uuid

    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"nmt/hello/{rank}", nonce)
        number = int(store.get(f"nmt/reply/{nonce}"))  # (get waits for the key)
        store.set(f"nmt/round_{number}/ack/{rank}", "1")
        return number
    number = store.add("nmt/rounds", 1)
    acks = [f"nmt/round_{number}/ack/{r}" for r in range(1, world_size)]
    answered: set[bytes] = set()
    while not store.check(acks):
        for r in range(1, world_size):
            if store.check([f"nmt/hello/{r}"]):
                nonce = store.get(f"nmt/hello/{r}")
                if nonce not in answered:
                    store.set(f"nmt/reply/{nonce.decode()}", str(number))
                    answered.add(nonce)
        time.sleep(poll_s)
    return number


def setup_process(launch: Launch, rank: int, local_rank: int, threads: int | None,
                  init_method: str | None = None, dist_timeout_s: float = 300.0, on_stall=None) -> Runtime:
    """Pin this process's device and threads and join the process group (world_size > 1), with a watchdog that
    ends the run when another rank stops answering for `dist_timeout_s` (watchdog.py)."""
    if launch.device_type == "cuda":
        from nmt_cli.model import avoid_cudnn_attention

        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        avoid_cudnn_attention()
    else:
        device = torch.device("cpu")
    if threads is not None:  # plan.py chose it (cpus.py); None: torch's default (GPUs)
        torch.set_num_threads(threads)
    run_round = 0  # torchrun's restart round, as the ranks agreed on it (`agree_round`)
    if launch.distributed:
        if not dist.is_initialized():
            timeout = datetime.timedelta(minutes=30)
            shared = agent_store(timeout) if init_method in (None, "env://") else None
            if shared is not None:
                run_round = agree_round(shared, rank, launch.world_size)
                dist.init_process_group(launch.backend, store=dist.PrefixStore(f"nmt/round_{run_round}/pg", shared),
                                        rank=rank, world_size=launch.world_size, timeout=timeout)
            else:
                dist.init_process_group(launch.backend, init_method=init_method or "env://", rank=rank,
                                        world_size=launch.world_size, timeout=timeout)
    # The default group is the only one: host values (loss sums, stop and save flags) go through it (`Votes`,
    # `all_reduce_sum`), NCCL on GPUs as gloo on CPU, so no gloo group beside NCCL (whose network interface clusters
    # would have to name). The watchdog is no group either: a TCPStore client of its own, so that it still answers
    # while a collective hangs (watchdog.py).
    watchdog = None
    if launch.distributed:
        from nmt_cli.training import watchdog as dog

        store = dog.connect(dog.store_address(init_method), dist_timeout_s, run_round)
        watchdog = dog.Watchdog(rank, launch.world_size, dist_timeout_s, store, on_stall)
    return Runtime(launch, rank, local_rank, device, watchdog)


def shutdown_process(runtime: Runtime, finished: bool = True) -> None:
    if runtime.watchdog is not None:
        runtime.watchdog.done() if finished else runtime.watchdog.close()
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()
