"""Ranks that stop answering end the run, in one line naming them, instead of a silent hang or a gloo traceback.

Every process of a multi-process run beats: a daemon thread adds 1 to its counter `nmt/<restart>/beat/<rank>` in
the process group's store every few seconds (the store is torchrun's agent, or rank 0 when nmt spawns the
processes). The same thread reads the other ranks' counters. A rank whose counter has not moved for `timeout_s`
(`nmt train --dist-timeout`, in minutes) is dead or stopped (SIGSTOP, a hung node): this process prints one line
naming it and exits with status 1, so that torchrun restarts the run (`--max-restarts`) or the user sees why it
ended. A rank busy computing still beats (torch releases the GIL), so a long validation or save is never taken for
a hang. Ranks that finished say so (`done`) and are not waited for.

When a collective fails at once (a peer's connection reset: its process died), `stopped()` names the ranks whose
counters no longer move.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

_DISK = "the run's checkpoints are intact"


def _store():
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):  # a private API: without it, no watchdog
        return None


class Watchdog:
    def __init__(self, rank: int, world_size: int, timeout_s: float, on_stall: Callable[[], None] | None = None):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.interval_s = max(0.2, min(2.0, timeout_s / 6))
        self.store = _store()
        self.on_stall = on_stall
        self.prefix = f"nmt/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._stop = threading.Event()
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved: our monotonic clock)
        self._thread: threading.Thread | None = None
        if self.store is not None and world_size > 1:
            self._beat()
            self._thread = threading.Thread(target=self._run, name="nmt-watchdog", daemon=True)
            self._thread.start()

    def _key(self, kind: str, rank: int) -> str:
        return f"{self.prefix}/{kind}/{rank}"

    def _beat(self) -> None:
        self.store.add(self._key("beat", self.rank), 1)

    def _read(self) -> dict[int, int | None]:
        """Each other rank's counter, None for a rank that finished."""
        out: dict[int, int | None] = {}
        for r in range(self.world_size):
            if r == self.rank:
                continue
            done = self.store.check([self._key("done", r)])
            out[r] = None if done else int(self.store.add(self._key("beat", r), 0))
        return out

    def _update(self, now: float) -> list[int]:
        """Record the counters that moved; -> the ranks silent for longer than the timeout."""
        silent = []
        for r, count in self._read().items():
            if count is None:
                self._seen.pop(r, None)
                continue
            last = self._seen.get(r)
            if last is None or count != last[0]:
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
                silent = self._update(now)
                store_failed_since = None
            except Exception:  # noqa: BLE001 - the store is gone (its host died) or unreachable
                store_failed_since = store_failed_since or now
                if now - store_failed_since > self.timeout_s:
                    self._end("the run's rendezvous store (rank 0, or torchrun's agent) has not answered for "
                              f"{self.timeout_s:.0f} s")
                continue
            if silent:
                names = ", ".join(f"rank {r}" for r in silent)
                self._end(f"{names} of {self.world_size} has not answered for {self.timeout_s:.0f} s (stopped, "
                          "hung or dead)")

    def _end(self, why: str) -> None:
        print(f"error: rank {self.rank}: {why}; ending the run ({_DISK}: run the same command to resume, or let "
              "torchrun --max-restarts restart it; --dist-timeout sets the wait)", file=sys.stderr, flush=True)
        if self.on_stall is not None:
            self.on_stall()
        os._exit(1)

    def stopped(self, wait_s: float | None = None) -> list[int]:
        """The other ranks whose counters do not move over `wait_s` (two beats by default): the dead or stopped."""
        if self.store is None or self.world_size < 2:
            return []
        try:
            before = self._read()
            time.sleep(2.5 * self.interval_s if wait_s is None else wait_s)
            after = self._read()
        except Exception:  # noqa: BLE001
            return [0] if self.rank != 0 else []  # the store's host (rank 0 when nmt spawned the processes)
        return [r for r, c in after.items() if c is not None and c == before.get(r)]

    def done(self) -> None:
        """This rank finished: the others stop waiting for its beats."""
        self._stop.set()
        if self.store is not None and self.world_size > 1:
            try:
                self.store.set(self._key("done", self.rank), "1")
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        self._stop.set()
