"""Default thread counts from the cores that are free when a command starts.

PyTorch's CPU kernels split work over one thread per core and wait for the slowest: with another busy process on a
2-core machine, two threads run slower than one
(docs/results-history.md#threads-on-a-busy-machine-the-results-page-until-2026-11-26).
So when `--threads` is not given, nmt counts the cores it may run on (the process's affinity mask) less the load
other processes put on them, sampled over a short window from /proc/stat (time spent by every CPU, our own process's
time subtracted), and splits what is free among the command's processes on this machine.

`Sampler` starts the window in the background at once, so that loading a model or data overlaps it; `threads()`
waits for what is left of it. Where /proc/stat is missing (not Linux) the count is the affinity mask's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 0.2  # long enough to see a busy neighbour (scheduler ticks are 1-10 ms), short against any command
BUSY_FROM = 0.5  # a core busier than this with other work counts as taken
RECHECK_S = 15.0  # a long training run counts the free cores again this often (Watch); a look costs one read


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # e.g. "2 cores, 1 busy: 1 thread"


def _cpu_times(text: str, cpus: set[int]) -> tuple[float, float]:
    """(busy, total) clock ticks over the CPUs `cpus` from /proc/stat's text. busy counts user, nice, system, irq,
    softirq and steal (a virtual CPU whose time the host gives to others is not free either); idle and iowait are
    free."""
    busy = total = 0.0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        v = [float(x) for x in rest.split()[:8]]
        v += [0.0] * (8 - len(v))
        user, nice, system, idle, iowait, irq, softirq, steal = v
        busy += user + nice + system + irq + softirq + steal
        total += user + nice + system + idle + iowait + irq + softirq + steal
    return busy, total


def _own_ticks() -> float:
    """This process's CPU time (all its threads), in clock ticks."""
    t = os.times()
    return (t.user + t.system) * os.sysconf("SC_CLK_TCK")


def choose(cores: int, others_busy: float, procs: int = 1) -> ThreadChoice:
    """Threads per process: the cores not taken by other work (a core is taken from BUSY_FROM of one core's load
    up), shared by `procs` processes, at least 1."""
    busy = min(cores - 1, int(others_busy + (1 - BUSY_FROM))) if cores > 1 else 0
    free = cores - busy
    threads = max(1, free // max(1, procs))
    per = f" for each of {procs} processes" if procs > 1 else ""
    plural = "s" if threads > 1 else ""
    return ThreadChoice(threads, f"{cores} cores, {busy} busy: {threads} thread{plural}{per}")


def core_count() -> int:
    """The CPUs this process may run on (its affinity mask; all cores where there is none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


Snapshot = tuple[float, float, float]  # (busy, total) ticks of the CPUs watched, and this process's own ticks
Snapshotter = Callable[[set[int]], "Snapshot | None"]


def _snapshot(cpus: set[int]) -> Snapshot | None:
    """(busy, total) ticks of the CPUs `cpus` and this process's own ticks, now; None without /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            busy, total = _cpu_times(f.read(), cpus)
    except OSError:
        return None
    return busy, total, _own_ticks()


def _others_busy(first, second, cores: int) -> float:
    """Cores' worth of other processes' work between two snapshots."""
    if first is None or second is None:
        return 0.0
    busy, total, own = (b - a for a, b in zip(first, second, strict=True))
    if total <= 0:
        return 0.0
    # busy and total are summed over the CPUs: busy / total * cores = cores' worth of work done
    return max(0.0, (busy - own) / total * cores)


def _own_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(core_count()))


class Sampler:
    """Measures the other processes' load on this process's CPUs over WINDOW_S, from the moment it is made.
    `snapshot` and `sleep` are /proc/stat's reading and the window's wait (tests give counters of their own)."""

    def __init__(self, window_s: float = WINDOW_S, snapshot: Snapshotter = _snapshot,
                 sleep: Callable[[float], None] = time.sleep, cpus: set[int] | None = None):
        self.cpus = _own_cpus() if cpus is None else set(cpus)
        self.window_s = window_s
        self._snap, self._sleep = snapshot, sleep
        self._result: float | None = None
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        first = self._snap(self.cpus)
        if first is None:
            self._result = 0.0
            return
        self._sleep(self.window_s)
        self._result = _others_busy(first, self._snap(self.cpus), len(self.cpus))

    def others_busy(self) -> float:
        """Cores' worth of other processes' work during the window (waits for the window to end)."""
        self._thread.join()
        return self._result or 0.0

    def threads(self, procs: int = 1) -> ThreadChoice:
        return choose(len(self.cpus), self.others_busy(), procs)


_started: Sampler | None = None


def start() -> Sampler:
    """Start (once per process) the sample the default thread count comes from; commands call it first thing."""
    global _started
    if _started is None:
        _started = Sampler()
    return _started


def default_threads(procs: int = 1) -> ThreadChoice:
    """Threads for each of `procs` processes of this command on this machine, from the free cores."""
    return start().threads(procs)


class Watch:
    """For a long single-process run: the free cores counted again from the load since the last look, at most every
    `every_s` seconds. The load of a shared machine changes during an hours-long run; a thread count chosen at the
    start and never revisited runs slow when a neighbour comes or goes
    (docs/results-history.md#threads-on-a-busy-machine-the-results-page-until-2026-11-26). A look is one read of /proc/stat, no waiting: the window is the time since the last look."""

    def __init__(self, every_s: float | None = None, snapshot: Snapshotter = _snapshot,
                 clock: Callable[[], float] = time.monotonic, cpus: set[int] | None = None):
        self.cpus = _own_cpus() if cpus is None else set(cpus)
        self.every_s = RECHECK_S if every_s is None else every_s
        self._snap, self._clock = snapshot, clock
        self._last, self._at = snapshot(self.cpus), clock()

    def poll(self, current: int) -> ThreadChoice | None:
        """A new choice when it differs from `current` threads (and a look is due), else None."""
        now = self._clock()
        if now - self._at < self.every_s or self._last is None:
            return None
        snap = self._snap(self.cpus)
        others = _others_busy(self._last, snap, len(self.cpus))
        self._last, self._at = snap, now
        choice = choose(len(self.cpus), others)
        return choice if choice.threads != current else None
