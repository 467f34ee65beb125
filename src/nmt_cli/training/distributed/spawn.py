"""Ranks 1..N-1 of a run that nmt starts itself (`--cpu-procs N`, `--gpus N`), spawned as early as possible and
sent the run's plan once it is made.

A rank spends seconds importing before it can train (torch; torch._dynamo, which torch.optim imports): started
first thing by `nmt train`, before rank 0 imports torch, those seconds overlap rank 0's own imports and planning
instead of following them. So this module imports nothing heavy. `early_world_size` says when the number of
processes is known without torch (CPU processes); `launch.train` checks it against the run's and starts the
ranks itself otherwise (GPUs: once it has counted them, still before planning).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import socket
import sys
import threading


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def early_world_size(gpus: int | None, cpu_procs: int) -> int | None:
    """The processes nmt will start for these options when that is known without torch: --cpu-procs N > 1
    without GPUs, within what world.py's plan_launch accepts. None otherwise: one process, torchrun's,
    or --gpus N (how many GPUs there are takes torch to say; `launch.train` starts those ranks after checking)."""
    if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) or gpus:
        return None
    return cpu_procs if 1 < cpu_procs <= (os.cpu_count() or 1) * 4 else None


AGREED_ERROR = 3  # a spawned rank's exit code for an error that rank 0 raises and reports too


class Ranks:
    """Spawned ranks 1..world_size-1, each waiting for the run's plan on a pipe. Each runs `entry` ("module:function",
    imported in the rank: training/launch.py's child_main), called as entry(conn, rank, init_method)."""

    def __init__(self, world_size: int, entry: str):
        ctx = mp.get_context("spawn")
        self.world_size, self.entry = world_size, entry
        self.init_method = f"tcp://127.0.0.1:{free_port()}"
        self.conns, self.procs = [], []
        for rank in range(1, world_size):
            ours, theirs = ctx.Pipe()
            # (not daemonic: a rank may start processes of its own, e.g. torch.compile's workers; one whose rank 0
            # dies before sending the plan reads the end of the pipe and exits)
            self.procs.append(ctx.Process(target=_main, args=(entry, theirs, rank, self.init_method)))
            self.procs[-1].start()
            theirs.close()
            self.conns.append(ours)

    def send(self, plan) -> threading.Thread:
        """The plan to every rank (None: stop, rank 0 refused the run), from a thread: a rank reads it when its
        imports are done, and rank 0 goes on meanwhile."""

        def send_all() -> None:
            for conn in self.conns:
                try:
                    conn.send(plan)
                except OSError:  # that rank is gone: launch's watcher or join says so
                    pass
                conn.close()

        thread = threading.Thread(target=send_all, daemon=True)
        thread.start()
        return thread

    def cancel(self) -> None:
        """Stop the ranks before they train (rank 0 refused the run, and says why): they exit quietly."""
        self.send(None).join(timeout=60)
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


    def watch(self, done: threading.Event) -> threading.Thread:
        """Until `done`: if a spawned rank dies while rank 0 still runs, rank 0 would block in a collective, so the
        run ends (the others are terminated, this process exits 1)."""
        thread = threading.Thread(target=_watch, args=(self.procs, done), daemon=True)
        thread.start()
        return thread


def _watch(procs: list, done: threading.Event) -> None:
    while not done.wait(1.0):
        for p in procs:
            if p.exitcode not in (None, 0, AGREED_ERROR):
                print(f"error: training process {procs.index(p) + 1} exited with code {p.exitcode}; stopping",
                      file=sys.stderr)
                for q in procs:
                    if q.is_alive():
                        q.terminate()
                os._exit(1)


def _main(entry: str, conn, rank: int, init_method: str) -> None:
    module, _, function = entry.partition(":")
    getattr(importlib.import_module(module), function)(conn, rank, init_method)  # (torch: imported here, in the rank)
