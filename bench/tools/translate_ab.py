"""Before/after speed of `nmt translate` (the default path) against an older commit, alternated in one run.

    python bench/tools/translate_ab.py --old 4165a04 --model runs/m30k/run/checkpoint_last.pt \
        --input runs/m30k/data/raw/test.en [--rounds 3] [--threads 2] [--options "--precision int8 --stop top"]

Each round runs the real CLI with the old source tree (`git archive OLD src` first on PYTHONPATH) and with this
checkout's, default options (beam 4, GNMT length penalty, --stop beam) or those of --options, and prints the wall time with start-up
and sentences/s; the outputs of the two are compared line by line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_ab import ROOT, old_tree


def run_once(src: Path, args) -> tuple[float, bytes]:
    cmd = [sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(args.model), "--threads", str(args.threads),
           *args.options.split()]
    with open(args.input, "rb") as f:
        start = time.perf_counter()
        out = subprocess.run(cmd, stdin=f, capture_output=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(src)}).stdout
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--options", default="", help="Extra `nmt translate` options for both trees.")
    args = ap.parse_args()
    lines = len(args.input.read_bytes().splitlines())
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f"old {args.old}": old_tree(args.old, Path(tmp)), "this checkout": ROOT / "src"}
        best: dict[str, float] = {}
        outputs: dict[str, bytes] = {}
        for i in range(args.rounds):
            for name, src in (trees.items() if i % 2 == 0 else reversed(trees.items())):
                seconds, outputs[name] = run_once(src, args)
                best[name] = min(best.get(name, seconds), seconds)
                print(f"round {i + 1} {name:<16} {seconds:6.2f} s  {lines / seconds:6.1f} sent/s "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\nbest of {args.rounds} ({lines} lines, {args.threads} threads, wall time with start-up):")
    for name, seconds in best.items():
        print(f"  {name:<16} {seconds:6.2f} s  {lines / seconds:6.1f} sent/s")
    old, new = (outputs[n].splitlines() for n in trees)
    print(f"identical output lines: {sum(a == b for a, b in zip(old, new, strict=True))}/{len(new)}")


if __name__ == "__main__":
    main()
