"""`train(cfg)`, the entry point of `nmt train`: check everything first (`plan_run`: data directory, devices,
precision, batch sizes, resume compatibility) so that bad input fails with one line before any file is written;
then run one process, or start N-1 more (`--gpus N` over NCCL, `--cpu-procs N` over gloo; distributed/spawn.py:
started first, so that their imports overlap rank 0's, and sent the plan) and run rank 0 here, or join the
processes torchrun started. Each process is set up (distributed/process_group.py) and runs `Trainer.fit()`
(loop.py). The process plumbing itself is in distributed/; this module only puts it in order around the trainer."""

from __future__ import annotations

import sys
import threading

from nmt_cli.errors import NmtError, TrainingError
from nmt_cli.runtime import cpus
from nmt_cli.training.config import TrainConfig
from nmt_cli.training.distributed.process_group import setup_process, shutdown_process
from nmt_cli.training.distributed.spawn import AGREED_ERROR, Ranks
from nmt_cli.training.distributed.world import plan_launch, torchrun_env
from nmt_cli.training.files import AVERAGED, LAST
from nmt_cli.training.loop import Progress, Trainer, TrainResult
from nmt_cli.training.plan import RunPlan, agree_on_resume, plan_run, write_run_config


def run_process(plan: RunPlan, rank: int, local_rank: int, init_method: str | None,
                progress: Progress | None = None, on_stall=None) -> TrainResult:
    """Set up this process (device, threads, process group), train, tear down. A collective that fails because
    another rank is gone becomes one line naming it (distributed/watchdog.py)."""
    rt = setup_process(plan.launch, rank, local_rank, plan.threads, init_method, plan.cfg.dist_timeout * 60,
                       on_stall)
    finished = False
    try:
        plan = agree_on_resume(plan, rt)
        if plan.finished:  # (under torchrun: rank 0 found the run done, and every rank ends)
            finished = True
            return finished_result(plan)
        result = Trainer(plan, rt, progress).fit()
        finished = True
        return result
    except RuntimeError as exc:  # gloo/NCCL: "Connection reset by peer", a timeout...
        if rt.watchdog is None or isinstance(exc, NmtError):
            raise
        gone = rt.watchdog.stopped()
        who = ", ".join(f"rank {r}" for r in gone) if gone else "another rank"
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise PeerLostError(f"rank {rank}: {who} of {rt.world_size} ended or stopped answering during a collective "
                            f"({first}); the checkpoints are intact: run the same command to resume, or let torchrun "
                            "--max-restarts restart it") from exc
    finally:
        shutdown_process(rt, finished)


def finished_result(plan: RunPlan) -> TrainResult:
    """The result of a run that had already reached its stop: nothing trained, nothing written."""
    done, out = plan.finished, plan.out_dir
    averaged = out / AVERAGED
    return TrainResult(out_dir=str(out), step=done["step"], epoch=done["epoch"], elapsed=done["elapsed"],
                       stopped_by="already", last=str(out / LAST),
                       averaged=str(averaged) if averaged.exists() else None, already=done["reason"])


class PeerLostError(TrainingError):
    """Another rank of the run is gone (each rank says so: the one that would have reported may be the dead one)."""


def child_main(conn, rank: int, init_method: str) -> None:
    """Entry point of ranks 1..N-1 that nmt spawns (spawn.Ranks). They start before rank 0 has planned the run,
    import what training needs meanwhile, and get the plan (batches included) from rank 0 through `conn`: None
    when rank 0 refused the run (it reports why)."""
    try:
        import torch._dynamo  # noqa: F401 (torch.optim imports it, seconds: spent while rank 0 plans)

        plan = conn.recv()
        conn.close()
        if plan is None:
            return
        run_process(plan, rank, rank, init_method)
    except EOFError:  # rank 0 is gone before sending the plan (it reports why)
        sys.exit(1)
    except PeerLostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except TrainingError:
        sys.exit(AGREED_ERROR)  # rank 0 reports the same error (every rank agrees on the loss)
    except Exception as exc:  # noqa: BLE001 - report in one line, the parent says which rank failed
        print(f"error: rank {rank}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


CHILD_MAIN = f"{__name__}:child_main"  # what spawned ranks run (spawn.Ranks)


def train(cfg: TrainConfig, progress: Progress | None = None, ranks: Ranks | None = None) -> TrainResult:
    """Train as `cfg` says; returns where the checkpoints are and how the run ended. `ranks`: the other processes,
    when the caller started them already (`nmt train` does, first thing: distributed/spawn.py); else started here if needed."""
    env = torchrun_env()
    try:
        if env is None and (cfg.cpu_procs > 1 or (cfg.gpus or 0) > 1):  # several processes: start them first
            launch = plan_launch(cfg.validate().gpus, cfg.cpu_procs, cfg.precision)
            if ranks is not None and ranks.world_size != launch.world_size:
                ranks.cancel()
                ranks = None
            if launch.distributed and ranks is None:
                if cfg.threads is None and launch.device_type == "cpu":
                    cpus.start().others_busy()  # the free cores, counted before the ranks' imports load them
                ranks = Ranks(launch.world_size, CHILD_MAIN)
        plan = plan_run(cfg)
        if plan.finished and env is None:  # nothing to train, nothing written (`finished_result`)
            if ranks is not None:
                ranks.cancel()
            return finished_result(plan)
        if (env is None or env[0] == 0) and not plan.finished:
            write_run_config(plan)
    except BaseException:
        if ranks is not None:
            ranks.cancel()
        raise
    if env is not None:
        rank, _, local_rank = env
        return run_process(plan, rank, local_rank, "env://" if plan.launch.distributed else None,
                           progress if rank == 0 else None)
    if ranks is None:
        return run_process(plan, 0, 0, None, progress)
    ranks.send(plan)
    import torch._dynamo  # noqa: F401 (torch.optim imports it, seconds: spent while the ranks start, as theirs)

    procs = ranks.procs
    done = threading.Event()
    ranks.watch(done)
    def kill_children() -> None:  # rank 0's watchdog ends the run: a stopped child would stay forever
        for p in procs:
            if p.is_alive():
                p.kill()

    try:
        result = run_process(plan, 0, 0, ranks.init_method, progress, on_stall=kill_children)
    except BaseException:
        done.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        raise
    done.set()
    for p in procs:
        p.join(timeout=300)
    failed = [f"rank {i + 1} (exit code {p.exitcode})" for i, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        raise TrainingError(f"training processes failed: {', '.join(failed)}; see their messages above")
    return result
