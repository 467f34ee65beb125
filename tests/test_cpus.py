"""Default threads from the free cores (cpus.py): the arithmetic, /proc/stat's reading, and a real busy neighbour."""

from __future__ import annotations

import subprocess
import sys
import time
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


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux only")
def test_a_busy_neighbour_is_seen_and_our_own_work_is_not():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start
        assert cpus.Sampler(0.5).others_busy() > 0.6
    finally:
        spinner.kill()
        spinner.wait()
    time.sleep(0.2)
    idle = cpus.Sampler(0.5).others_busy()
    sampler = cpus.Sampler(0.5)
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:  # this process is busy during the window: not another process's load
        pass
    assert sampler.others_busy() < idle + 0.5


@pytest.mark.skipif(not Path("/proc/stat").exists() or cpus.core_count() < 2, reason="Linux, 2+ cores")
def test_a_long_run_counts_again_when_a_neighbour_arrives():
    """cpus.Watch: no look before it is due; once due, a busy neighbour that arrived takes a core from the count."""
    watch = cpus.Watch(every_s=0.4)
    assert watch.poll(current=99) is None  # not due yet
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.6)
        choice = watch.poll(current=99)  # due; 99 threads is never the choice
        assert choice is not None and choice.threads < len(watch.cpus), choice
        assert "busy" in choice.reason
        assert watch.poll(current=98) is None  # just looked: not due again yet
    finally:
        spinner.kill()
        spinner.wait()
