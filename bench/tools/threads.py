"""Thread counts on an idle and a busy machine: `nmt train` and `nmt translate` as a user runs them, with the default
threads (the free cores, nmt_cli/runtime/cpus.py) against fixed counts (--threads 1, --threads N = one per core, the
default before the free cores were counted), beside 0, 1 and 2 busy processes.

    python bench/tools/threads.py                       # tiny preset on the sample corpus, 2 rounds
    python bench/tools/threads.py --rounds 3 --steps 200 --lines 400
    python bench/tools/threads.py --arrives 20 --steps 600   # training only: a neighbour arrives 20 s into each run

With `--arrives S` every training run starts on an idle machine and a busy neighbour starts S seconds in, so the
default's start-up choice (all cores) goes stale: it shows what counting the free cores again during the run
(cpus.Watch, every cpus.RECHECK_S seconds) recovers against keeping the start-up choice (= `--threads N`).

Each measurement is one `nmt` process (start-up and the thread choice included); configurations are alternated
within each round and the load changes between rounds' blocks; a busy neighbour is `python -c "while True: pass"`.
Figures: training updates/s from the run's metrics.jsonl (the `end` event: updates / elapsed), translation
lines/s from the wall time of the whole command. The best of the rounds is shown with the thread count the default
chose, and each configuration's ratio to the best fixed count under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "runs" / "bench_threads"
NMT = [sys.executable, "-m", "nmt_cli.cli"]


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(NMT + args, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"failed: nmt {' '.join(args)}\n{r.stderr}")
    return r


def train(data: Path, threads: str | None, steps: int, arrives: float | None = None) -> tuple[float, str]:
    """updates/s of one run and how its threads were chosen (with `arrives`: a busy neighbour starts that many
    seconds into the run, and the reason lists the changes the run made)."""
    out = WORK / "run"
    shutil.rmtree(out, ignore_errors=True)
    extra = [] if threads is None else ["--threads", threads]
    args = ["train", str(data), "-o", str(out), "--preset", "tiny", "--max-steps", str(steps), "--no-resume",
            "--save-every", str(steps), "--valid-every", str(steps), "--precision", "fp32", *extra]
    if arrives is None:
        run(args)
    else:
        proc = subprocess.Popen(NMT + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(timeout=arrives)
        except subprocess.TimeoutExpired:
            pass
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            _, err = proc.communicate()
        finally:
            neighbour.kill()
            neighbour.wait()
        if proc.returncode:
            sys.exit(f"failed: nmt {' '.join(args)}\n{err}")
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    start = [e for e in events if e["kind"] == "start"][-1]
    end = [e for e in events if e["kind"] == "end"][-1]
    changes = [f"update {e['step']}: {e['threads']}" for e in events if e["kind"] == "threads"]
    return end["step"] / end["elapsed"], "; ".join([start.get("threads_reason", ""), *changes])


def translate(model: Path, lines: Path, threads: str | None) -> tuple[float, str]:
    extra = [] if threads is None else ["--threads", threads]
    t0 = time.perf_counter()
    r = run(["translate", "-m", str(model), "-i", str(lines), *extra])
    seconds = time.perf_counter() - t0
    chose = re.search(r"threads: ([^\n(]*)", r.stderr)
    n = len(lines.read_text().splitlines())
    return n / seconds, chose.group(1).strip() if chose else "all cores (no note: none busy)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150, help="Training updates per measurement.")
    ap.add_argument("--lines", type=int, default=300, help="Lines translated per measurement.")
    ap.add_argument("--loads", default="0,1,2", help="Busy neighbour processes.")
    ap.add_argument("--arrives", type=float, default=None, metavar="S",
                    help="Training only, idle at the start: a busy neighbour arrives S seconds into each run.")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in Path("/proc/cpuinfo").read_text()]
    print(f"{cores} cores ({' '.join(flags)}); load average before: {os.getloadavg()}", flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / "sample"
    if not (data / "manifest.json").exists():
        run(["prepare", "sample", "-o", str(data)])
    model = WORK / "model.pt"
    if not model.exists():
        train(data, None, args.steps)
        shutil.copy(WORK / "run" / "checkpoint_last.pt", model)
    lines = WORK / "lines.en"
    lines.write_text("".join((data / "raw" / "test.en").read_text().splitlines(True)[: args.lines]))
    configs = [None, "1", str(cores)]
    if args.arrives is not None:
        arrived(data, configs, args)
        return
    results: dict[tuple, list] = {}
    for _ in range(args.rounds):
        for load in (int(x) for x in args.loads.split(",")):
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
            try:
                time.sleep(0.5)
                for threads in configs:
                    for task in ("train", "translate"):
                        value, chose = (train(data, threads, args.steps) if task == "train"
                                        else translate(model, lines, threads))
                        results.setdefault((task, load, threads), []).append((value, chose))
                        name = "default" if threads is None else f"--threads {threads}"
                        print(f"  {load} busy  {task:<9} {name:<12} {value:8.2f}  {chose}", flush=True)
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
    print(f"load average after: {os.getloadavg()}")
    print("\nbest of rounds (train: updates/s, tiny preset, fp32; translate: lines/s, beam 4, the start-up "
          "included); ratio to the best fixed count under the same load:")
    for task in ("train", "translate"):
        for load in (int(x) for x in args.loads.split(",")):
            best = {t: max(v for v, _ in results[(task, load, t)]) for t in configs}
            fixed = max(best[t] for t in configs if t is not None)
            for t in configs:
                name = "default" if t is None else f"--threads {t}"
                chose = results[(task, load, t)][0][1] if t is None else ""
                print(f"  {task:<9} {load} busy  {name:<12} {best[t]:8.2f}  {best[t] / fixed:5.2f}x  {chose}")


def arrived(data: Path, configs: list, args) -> None:
    """Every configuration alternated, each run idle at its start with a neighbour arriving `args.arrives` s in."""
    results: dict = {}
    for _ in range(args.rounds):
        for threads in configs:
            time.sleep(1.0)  # the last run's neighbour is gone before the next run counts the free cores
            value, chose = train(data, threads, args.steps, args.arrives)
            results.setdefault(threads, []).append(value)
            name = "default" if threads is None else f"--threads {threads}"
            print(f"  arrives {args.arrives:g}s  train  {name:<12} {value:8.2f}  {chose}", flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(f"\nbest of rounds (train: updates/s, tiny preset, fp32, {args.steps} updates; a busy neighbour arrives "
          f"{args.arrives:g} s in); ratio to the best fixed count:")
    fixed = max(max(results[t]) for t in configs if t is not None)
    for t in configs:
        name = "default" if t is None else f"--threads {t}"
        print(f"  train  {name:<12} {max(results[t]):8.2f}  {max(results[t]) / fixed:5.2f}x")


if __name__ == "__main__":
    main()
