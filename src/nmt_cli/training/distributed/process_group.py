"""Setting a training process up and down: its device and threads, the process group (torch's env:// or nmt's own
tcp:// address; under torchrun, a round of its own in the agent's store: `agree_round`) and the watchdog
(watchdog.py); `shutdown_process` at the end."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

from nmt_cli.training.distributed.process import Runtime
from nmt_cli.training.distributed.world import Launch


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
        from nmt_cli.training.distributed import watchdog as dog

        store = dog.connect(dog.store_address(init_method), dist_timeout_s, run_round)
        watchdog = dog.Watchdog(rank, launch.world_size, dist_timeout_s, store, on_stall)
    return Runtime(launch, rank, local_rank, device, watchdog)


def shutdown_process(runtime: Runtime, finished: bool = True) -> None:
    if runtime.watchdog is not None:
        runtime.watchdog.done() if finished else runtime.watchdog.close()
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()
