"""Training-test helpers: a loss poisoned at one training micro-batch; one rank of a validation."""

from __future__ import annotations

import sys

import torch

from nmt_cli.training import loop as loop_mod


def poison_loss(monkeypatch, at: int, factor: float) -> dict:
    """Multiply the loss of the `at`-th training micro-batch (validation not counted) by `factor` (inf: an fp16
    overflow, nan: a diverged model). -> the call counter {"n": micro-batches so far}."""
    real = loop_mod.label_smoothed_cross_entropy
    calls = {"n": 0}

    def poisoned(logits, target, epsilon, pad_id):
        calls["n"] += torch.is_grad_enabled()
        loss, nll, n = real(logits, target, epsilon, pad_id)
        return (loss * factor, nll, n) if calls["n"] == at else (loss, nll, n)

    monkeypatch.setattr(loop_mod, "label_smoothed_cross_entropy", poisoned)
    return calls


def run_ranks(target, world_size: int, *args) -> list:
    """`world_size` spawned processes, each running target(rank, world_size, init_method, *args, results): what each
    put on `results` (a queue; the rank first), in rank order. Every process must end with exit status 0."""
    import multiprocessing as mp

    from nmt_cli.training.distributed.spawn import free_port

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=target, args=(r, world_size, init, *args, results)) for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        out = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * world_size
    return out


def validate_checkpoint(rank: int, world_size: int, init_method: str | None, checkpoint: str, data_dir: str,
                        beam: int, results, precision: str = "fp32") -> None:
    """One rank of a validation of `checkpoint` on `data_dir`'s valid split over gloo (`world_size` 1: no process
    group) at `precision`: puts (rank, the figures, this rank's hypotheses {sentence: token ids}) on `results` (a queue)."""
    from nmt_cli.checkpoints.format import load
    from nmt_cli.data.store import ParallelData, read_tokenizer
    from nmt_cli.training.distributed.process_group import setup_process, shutdown_process
    from nmt_cli.training.distributed.world import Launch
    from nmt_cli.training.validate import Validator

    launch = Launch("cpu", world_size, "gloo" if world_size > 1 else None, False, precision)
    rt = setup_process(launch, rank, rank, 1, init_method)
    try:
        ckpt = load(checkpoint)
        module = ckpt.build_model(rt.device)
        validator = Validator(ParallelData(data_dir, "valid"), read_tokenizer(data_dir), rt, 256, 0.1,
                              ckpt.model_config.max_positions, beam)
        results.put((rank, validator(module, step=0), validator.hypotheses(module)))
    finally:
        shutdown_process(rt)


def exchange_votes(rank: int, world_size: int, init_method: str, raised: dict, results) -> None:
    """One rank of a run of 6 updates' `Votes.exchange` over gloo, raising the flags `raised` gives for (rank,
    update): puts (rank, what each exchange returned) on `results` (a queue)."""
    from nmt_cli.training.distributed.process_group import setup_process, shutdown_process
    from nmt_cli.training.distributed.votes import Votes
    from nmt_cli.training.distributed.world import Launch

    rt = setup_process(Launch("cpu", world_size, "gloo", False, "fp32"), rank, rank, 1, init_method)
    try:
        votes = Votes(rt)
        seen = [votes.exchange(*raised.get((rank, update), (False, False))) for update in range(6)]
        votes.drain()
        results.put((rank, seen))
    finally:
        shutdown_process(rt)


def train_as_nccl(rank: int, world_size: int, init_method: str, plan, results) -> None:
    """One rank of `plan`'s run, its launch saying NCCL: the default group is made over gloo (a CPU has no NCCL) while
    every question nmt asks about the backend (`torch.distributed.get_backend`) answers "nccl", and every process
    group made besides the default one is recorded. Puts (rank, the backends asked for, the groups made, the step
    and stop the run ended at) on `results` (a queue)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from nmt_cli.training.launch import run_process

    asked, made = [], []
    real_init = dist.init_process_group

    def init_process_group(backend=None, *args, **kw):
        asked.append(backend)
        return real_init("gloo", *args, **kw)

    def recording(name, real):
        return lambda *args, **kw: (made.append(name), real(*args, **kw))[1]

    dist.init_process_group = init_process_group
    dist.get_backend = lambda group=None: "nccl"
    for module in (dist, c10d):
        for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"):
            if hasattr(module, name):
                setattr(module, name, recording(name, getattr(module, name)))
    result = run_process(plan, rank, rank, init_method)
    results.put((rank, asked, made, result.step, result.stopped_by, result.ranks_agree))


def cli_args(data_dir, run, *extra) -> list:
    """`nmt train` on a tiny model (one layer, d_model 32), fp32 unless `extra` says otherwise (the last value wins)."""
    return ["train", data_dir, "-o", run, "--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--layers", "1",
            "--max-tokens", "256", "--update-freq", "1", "--warmup", "10", "--precision", "fp32", *extra]


def torchrun(nproc: int) -> list[str]:
    """The command that starts `nproc` processes on this machine as torchrun does (a free port for its store)."""
    from nmt_cli.training.distributed.spawn import free_port

    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
