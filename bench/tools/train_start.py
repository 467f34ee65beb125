"""Training start-up at WMT scale: seconds from `nmt train` starting to its first update being done.

    python bench/prepare.py --pairs 4500000 --work runs/synth    # the data: runs/bench_prepare/wmt_4500000
    python bench/tools/train_start.py runs/bench_prepare/wmt_4500000
    python bench/tools/train_start.py DATA --src /path/to/other/checkout/src --src src --repeat 3   # A/B, alternated
    python bench/tools/train_start.py DATA --profile       # where one process's seconds go (cProfile, this checkout)

Each run is `python -m nmt_cli.cli train DATA2 -o RUN --preset tiny --max-steps 1 --log-every 1 [--cpu-procs N]`
in a fresh process with a fresh RUN; the time is from just before the process starts to the moment the first
"train" record (written when update 1 is done) appears in RUN/metrics.jsonl, polled every 20 ms. DATA2 is DATA's
training split alone (links to its files and a manifest without the other splits), so that the run ends after
update 1 with its checkpoint instead of validating: its CPU time (all processes, user + system, from
getrusage) is then the start-up's plus that save's. `--src` picks the source tree the command runs (PYTHONPATH),
so two versions can be compared on the same machine, alternated run by run, after one untimed run of each (which
compiles the tree's bytecode and reads the data into the page cache). The target: under 10 s with
1 process as with 2, on the 2-core machine. The load average before each run is printed: other work on the
machine slows the start-up, which is CPU-bound.

`--profile` runs one single-process start of this checkout in this process, under cProfile, and prints when the
imports, the Trainer and update 1 were done, then the cumulative seconds of nmt's functions (the run goes on to
its validation and checkpoint: their lines come after update 1's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_S = 10.0


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def train_split_only(data: Path, out: Path) -> Path:
    """A data directory holding `data`'s training split alone (links to its files)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"] = {"train": manifest["splits"]["train"]}
    (out / "manifest.json").write_text(json.dumps(manifest))
    for f in data.iterdir():
        if f.name.startswith("train.") or f.suffix == ".model" or f.name == "vocab.json":
            (out / f.name).symlink_to(f.resolve())
    return out


def first_update_seconds(data: Path, src: Path, procs: int, extra: list[str]) -> tuple[float, float]:
    """Seconds from the start of `nmt train` to its first train record, and the CPU seconds of the whole run."""
    with tempfile.TemporaryDirectory(dir=ROOT / "runs") as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "nmt_cli.cli", "train", str(data), "-o", str(run), "--preset", "tiny",
               "--max-steps", "1", "--log-every", "1", "--cpu-procs", str(procs), *extra]
        env = {**os.environ, "PYTHONPATH": str(src)}
        metrics = run / "metrics.jsonl"
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = None
        while seconds is None:
            if metrics.exists() and '"kind": "train"' in metrics.read_text():
                seconds = time.perf_counter() - t0
            elif proc.poll() is not None:
                raise SystemExit(f"nmt train exited with {proc.returncode} before its first update:\n"
                                 f"{proc.stderr.read()}")
            else:
                time.sleep(0.02)
        _, err = proc.communicate(timeout=600)
        if proc.returncode:
            raise SystemExit(f"nmt train failed ({proc.returncode}):\n{err}")
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return seconds, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def profile(data: Path) -> None:
    """One single-process start of this checkout under cProfile, stopped after update 1."""
    import cProfile
    import pstats

    sys.path.insert(0, str(ROOT / "src"))
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    import torch  # noqa: F401

    from nmt_cli.training import launch, loop
    from nmt_cli.training.config import TrainConfig

    imported = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(dir=ROOT / "runs") as tmp:
        cfg = TrainConfig(str(data), str(Path(tmp) / "run"), preset="tiny", max_steps=1, log_every=1)
        first = {}

        def progress(event: dict) -> None:
            if event["kind"] == "train" and "at" not in first:
                first["at"] = time.perf_counter() - t0

        real_fit = loop.Trainer._fit
        loop.Trainer._fit = lambda self: (first.setdefault("init", time.perf_counter() - t0), real_fit(self))[1]
        launch.train(cfg, progress=progress)
    prof.disable()
    print(f"imports (torch, nmt) {imported:.2f} s; Trainer built at {first['init']:.2f} s; update 1 done at "
          f"{first['at']:.2f} s (in-process, so the CLI's own start, ~0.3 s, is not included)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(r"nmt_cli|numpy|torch/serialization", 30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, help="a prepared data directory (bench/prepare.py --pairs 4500000)")
    ap.add_argument("--src", action="append", type=Path, help="source trees to compare (default: this checkout's)")
    ap.add_argument("--procs", default="1,2", help="--cpu-procs values")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("extra", nargs="*", help="more nmt train options (after --)")
    args = ap.parse_args()
    (ROOT / "runs").mkdir(exist_ok=True)
    if args.profile:
        profile(args.data)
        return
    srcs = [s.resolve() for s in (args.src or [ROOT / "src"])]
    procs = [int(p) for p in args.procs.split(",")]
    pairs = json.loads((args.data / "manifest.json").read_text())["splits"]["train"].get("kept")
    print(f"nmt train start-up: {args.data} ({pairs:,} training pairs), preset tiny; {os.cpu_count()} cores")
    times: dict = {}
    with tempfile.TemporaryDirectory(dir=ROOT / "runs") as tmp:
        data = train_split_only(args.data, Path(tmp) / "data")
        for src in srcs:  # untimed: compiles each tree's bytecode and reads the data into the page cache
            for n in procs:
                first_update_seconds(data, src, n, args.extra)
        for r in range(args.repeat):
            for src in srcs:
                for n in procs:
                    before = load()
                    s, cpu = first_update_seconds(data, src, n, args.extra)
                    times.setdefault((src, n), []).append(s)
                    print(f"  round {r + 1}: {src}  --cpu-procs {n}: {s:5.1f} s to update 1, {cpu:5.1f} CPU-s "
                          f"in all (load average before: {before})", flush=True)
    print("median:")
    for (src, n), ts in times.items():
        m = statistics.median(ts)
        print(f"  {src}  --cpu-procs {n}: {m:5.1f} s ({', '.join(f'{t:.1f}' for t in ts)}); "
              f"{'under' if m < TARGET_S else 'over'} the {TARGET_S:.0f}-second target")


if __name__ == "__main__":
    main()
