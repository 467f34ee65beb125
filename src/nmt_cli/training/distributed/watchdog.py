"""Ranks that stop answering end the run, in one line naming them, instead of a silent hang or a gloo traceback.

Every process of a multi-process run beats: a daemon thread adds 1 to its counter `beat/<rank>` every few seconds,
in the run's rendezvous store (torchrun's agent, or rank 0's store when nmt spawns the processes), through a
`TCPStore` client of its own (public API; its own connection, so a collective waiting on the process group's store
never holds it up). Reads are bounded per rank whatever the world size: rank 0 reads every counter in one
`multi_get` per beat, rank 1 reads rank 0's, and every rank reads one `verdict` key. A rank whose counter has not
moved for `timeout_s` (`nmt train --dist-timeout`, in minutes) is dead or stopped (SIGSTOP, a hung node): the rank
that sees it writes the verdict (one line naming it), kills it when it runs on the same machine (a stopped process
would otherwise keep torchrun waiting for its SIGTERM grace period), and exits with status 1; the other ranks read
the verdict and exit too, so torchrun ends or restarts the run (`--max-restarts`). A rank busy computing still
beats (torch releases the GIL), so a long validation or save is never taken for a hang. Ranks that finished say so
(`done`) and are not waited for.

When a collective fails at once (a peer's connection reset: its process died), `stopped()` names the ranks whose
counters no longer move.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

_DISK = "the run's checkpoints are intact"
_DONE = b"done"


def store_address(init_method: str | None) -> tuple[str, int] | None:
    """Where the run's rendezvous store listens: the tcp:// address nmt gave its spawned processes, or torchrun's
    (and env://'s) MASTER_ADDR:MASTER_PORT."""
    if init_method and init_method.startswith("tcp://"):
        url = urlsplit(init_method)
        return url.hostname, url.port
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return None


def connect(address: tuple[str, int] | None, timeout_s: float, run_round: int = 0):
    """A client of the run's store with this run's (and torchrun restart round's: process_group.agree_round) key prefix;
    None without one."""
    if address is None:
        return None
    import torch.distributed as dist

    try:
        client = dist.TCPStore(address[0], address[1], is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=max(30.0, timeout_s)))
    except (RuntimeError, ValueError):  # no store there: run without a watchdog rather than fail the run
        return None
    return dist.PrefixStore(f"nmt/round_{run_round}/watchdog", client)


class Watchdog:
    def __init__(self, rank: int, world_size: int, timeout_s: float, store,
                 on_stall: Callable[[], None] | None = None):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.interval_s = max(0.2, min(2.0, timeout_s / 6))
        self.store = store
        self.on_stall = on_stall
        self._stop = threading.Event()
        self._seen: dict[int, tuple[bytes, float]] = {}  # rank -> (counter, when it last moved: our monotonic clock)
        self._watched = list(range(world_size)) if rank == 0 else [0] if rank == 1 else []
        self._ready = False  # every watched rank has beaten once (multi_get needs its keys)
        self._thread: threading.Thread | None = None
        if self.store is not None and world_size > 1:
            self.store.set(f"where/{rank}", f"{socket.gethostname()} {os.getpid()}")
            self._beat()
            self._thread = threading.Thread(target=self._run, name="nmt-watchdog", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        self.store.add(f"beat/{self.rank}", 1)

    def _counters(self, ranks: list[int]) -> dict[int, bytes]:
        """The counters of `ranks` (b"done" for a rank that finished) in one store request."""
        return dict(zip(ranks, self.store.multi_get([f"beat/{r}" for r in ranks]), strict=True))

    def _update(self, now: float) -> list[int]:
        """Record the watched counters that moved; -> the ranks silent for longer than the timeout."""
        others = [r for r in self._watched if r != self.rank]
        if not others:
            return []
        if not self._ready:  # a rank not started yet has no counter: wait for all, one request a beat
            self._ready = self.store.check([f"beat/{r}" for r in others])
            if not self._ready:
                return []
        silent = []
        for r, count in self._counters(others).items():
            last = self._seen.get(r)
            if count == _DONE:
                self._seen.pop(r, None)
            elif last is None or count != last[0]:
                self._seen[r] = (count, now)
            elif now - last[1] > self.timeout_s:
                silent.append(r)
        return silent

    def _run(self) -> None:
        store_failed_since = None
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            try:
                self._beat()
                if self.store.check(["verdict"]):
                    self._end(self.store.get("verdict").decode(), publish=False)
                silent = self._update(now)
                store_failed_since = None
            except Exception:  # noqa: BLE001 - the store is gone (its host died) or unreachable
                store_failed_since = store_failed_since or now
                if now - store_failed_since > self.timeout_s:
                    self._end("the run's rendezvous store (rank 0, or torchrun's agent) has not answered for "
                              f"{self.timeout_s:.0f} s", publish=False)
                continue
            if silent:
                self._kill_local(silent)
                names = ", ".join(f"rank {r}" for r in silent)
                self._end(f"{names} of {self.world_size} has not answered for {self.timeout_s:.0f} s (stopped, "
                          "hung or dead)")

    def _kill_local(self, ranks: list[int]) -> None:
        """SIGKILL the silent ranks that run on this machine (a stopped one holds its SIGTERM until it runs)."""
        host = socket.gethostname()
        for r in ranks:
            try:
                where, pid = self.store.get(f"where/{r}").decode().rsplit(" ", 1)
                if where == host:
                    os.kill(int(pid), signal.SIGKILL)
            except Exception:  # noqa: BLE001 - gone already, or another machine's
                pass

    def _end(self, why: str, publish: bool = True) -> None:
        if publish:
            try:
                self.store.set("verdict", why)
            except Exception:  # noqa: BLE001
                pass
        print(f"error: rank {self.rank}: {why}; ending the run ({_DISK}: run the same command to resume, or let "
              "torchrun --max-restarts restart it; --dist-timeout sets the wait)", file=sys.stderr, flush=True)
        if self.on_stall is not None:
            self.on_stall()
        os._exit(1)

    def stopped(self, wait_s: float | None = None) -> list[int]:
        """The other ranks whose counters do not move over `wait_s` (two beats by default): the dead or stopped."""
        if self.store is None or self.world_size < 2:
            return []
        others = [r for r in range(self.world_size) if r != self.rank]
        try:
            before = self._counters(others)
            time.sleep(2.5 * self.interval_s if wait_s is None else wait_s)
            after = self._counters(others)
        except Exception:  # noqa: BLE001
            return [0] if self.rank != 0 else []  # the store's host (rank 0 when nmt spawned the processes)
        return [r for r, c in after.items() if c != _DONE and c == before.get(r)]

    def done(self) -> None:
        """This rank finished: the others stop waiting for its beats."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)  # (its last beat lands before the counter becomes "done")
        if self.store is not None and self.world_size > 1:
            try:
                self.store.set(f"beat/{self.rank}", _DONE)
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        self._stop.set()
