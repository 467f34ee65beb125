"""Default threads from the free cores (cpus.py): the arithmetic, /proc/stat's reading, and a busy neighbour seen
through counters the test advances (a machine of its own: no claim on how busy the real one is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt_cli.runtime import cpus

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 300 0 0 0 0 0 0
cpu1 200 0 50 300 0 0 0 0 0 0
cpu2 0 0 0 1000 0 0 0 50 0 0
intr 1 2 3
"""


def test_proc_stat_is_read_per_cpu_of_the_mask_with_steal_as_busy():
    assert cpus._cpu_times(STAT, {0, 1}) == (400.0, 1000.0)
    assert cpus._cpu_times(STAT, {2}) == (50.0, 1050.0)  # steal: the host gave the time to another guest
    assert cpus._cpu_times(STAT, set()) == (0.0, 0.0)


@pytest.mark.parametrize("cores,busy,procs,threads,reason", [
    (2, 0.0, 1, 2, "2 cores, 0 busy: 2 threads"),
    (2, 0.3, 1, 2, "2 cores, 0 busy: 2 threads"),  # background noise is not a busy core
    (2, 0.6, 1, 1, "2 cores, 1 busy: 1 thread"),
    (2, 3.0, 1, 1, "2 cores, 1 busy: 1 thread"),  # never fewer than one thread
    (1, 1.0, 1, 1, "1 cores, 0 busy: 1 thread"),
    (8, 2.0, 2, 3, "8 cores, 2 busy: 3 threads for each of 2 processes"),
    (2, 1.0, 2, 1, "2 cores, 1 busy: 1 thread for each of 2 processes"),
])
def test_threads_are_the_free_cores_shared_by_the_processes(cores, busy, procs, threads, reason):
    choice = cpus.choose(cores, busy, procs)
    assert (choice.threads, choice.reason) == (threads, reason)


class Machine:
    """A machine's /proc/stat and this process's CPU time as counters that the test advances: what a window of
    `seconds` adds with `neighbour` cores' worth of other processes' work and `own` of ours (100 ticks a second)."""

    def __init__(self, cores: int = 2):
        self.cores, self.busy, self.total, self.own, self.now = cores, 0.0, 0.0, 0.0, 0.0
        self.neighbour, self.ours = 0.0, 0.0

    def snapshot(self, cpus_: set[int]):
        assert cpus_ == set(range(self.cores))
        return self.busy, self.total, self.own

    def sleep(self, seconds: float) -> None:
        ticks = 100 * seconds
        self.busy += ticks * (self.neighbour + self.ours)
        self.own += ticks * self.ours
        self.total += ticks * self.cores
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_a_busy_neighbour_is_seen_and_our_own_work_is_not():
    machine = Machine(cores=2)
    cores = set(range(2))
    machine.neighbour = 1.0  # another process spins on one core
    sampler = cpus.Sampler(0.5, snapshot=machine.snapshot, sleep=machine.sleep, cpus=cores)
    assert sampler.others_busy() == pytest.approx(1.0)
    assert (sampler.threads().threads, sampler.threads().reason) == (1, "2 cores, 1 busy: 1 thread")
    machine.neighbour, machine.ours = 0.0, 1.0  # this process is busy during the window: not another's load
    sampler = cpus.Sampler(0.5, snapshot=machine.snapshot, sleep=machine.sleep, cpus=cores)
    assert sampler.others_busy() == pytest.approx(0.0)
    assert sampler.threads().threads == 2
    machine.neighbour = 0.2  # background noise beside our own work
    assert cpus.Sampler(0.5, snapshot=machine.snapshot, sleep=machine.sleep, cpus=cores).threads().threads == 2


def test_without_proc_stat_the_count_is_the_affinity_masks():
    sampler = cpus.Sampler(0.5, snapshot=lambda _: None, sleep=lambda s: pytest.fail("no window to wait for"),
                           cpus={0, 1, 2})
    assert sampler.threads().reason == "3 cores, 0 busy: 3 threads"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux only")
def test_the_real_proc_stat_is_read():
    """The real reading, with no claim on the machine's load (other processes come and go): sane counters."""
    first = cpus._snapshot(cpus._own_cpus())
    second = cpus._snapshot(cpus._own_cpus())
    assert first is not None and second is not None
    assert all(b >= a for a, b in zip(first, second, strict=True))
    assert 0 <= first[0] <= first[1]
    assert cpus.Sampler(0.0).others_busy() >= 0.0


def test_a_long_run_counts_again_when_a_neighbour_arrives():
    """cpus.Watch: no look before it is due; once due, a busy neighbour that arrived takes a core from the count."""
    machine = Machine(cores=2)
    watch = cpus.Watch(every_s=15.0, snapshot=machine.snapshot, clock=machine.clock, cpus={0, 1})
    machine.sleep(10.0)
    assert watch.poll(current=2) is None  # not due yet
    machine.sleep(10.0)
    assert watch.poll(current=2) is None  # due, idle: 2 threads is still the choice
    machine.neighbour = 1.0
    machine.sleep(5.0)
    assert watch.poll(current=2) is None  # not due again yet (the last look was 5 s ago)
    machine.sleep(10.0)
    choice = watch.poll(current=2)
    assert choice is not None and (choice.threads, choice.reason) == (1, "2 cores, 1 busy: 1 thread"), choice
    assert watch.poll(current=1) is None  # just looked
    machine.neighbour = 0.0  # the neighbour leaves: the core comes back
    machine.sleep(15.0)
    assert watch.poll(current=1) == cpus.ThreadChoice(2, "2 cores, 0 busy: 2 threads")
