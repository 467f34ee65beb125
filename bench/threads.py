"""Training speed with 1 and 2 torch threads, on an idle machine and beside one busy process (issue 14: which
default keeps `make demo` from halving its speed on a shared 2-core machine).

    python bench/threads.py                 # the demo's model: tiny preset on the sample corpus, fp32
    python bench/threads.py --seconds 30 --rounds 2 --precision bf16

Each configuration runs the real `Trainer.update()` (bench/train.py's `measure`) for --seconds; configurations are
alternated over --rounds; the busy neighbour is one `python -c "while True: pass"` process. The load average is
printed before and after, since other processes on a shared machine change every figure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train import WORK, measure  # noqa: E402


def sample_data_dir(path: Path) -> Path:
    if not (path / "manifest.json").exists():
        nmt = Path(sys.executable).with_name("nmt")
        subprocess.run([str(nmt), "prepare", "sample", "-o", str(path)], check=True, capture_output=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    data = sample_data_dir(WORK / "sample")
    print(f"{os.cpu_count()} CPUs, load average before: {os.getloadavg()}", flush=True)
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for load in ("idle", "1 busy process"):
            busy = (subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "idle" else None)
            try:
                for threads in (int(t) for t in args.threads.split(",")):
                    torch.set_num_threads(threads)
                    r = measure(data, "tiny", {}, args.precision, 2048, args.seconds, "cpu", window=args.seconds / 4)
                    results.setdefault((load, threads), []).append(r["tgt_tok_s"])
                    print(f"  {load:<15} --threads {threads}: {r['tgt_tok_s']:7.0f} tgt tok/s "
                          f"({r['s_per_update'] * 1e3:.0f} ms/update)", flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    print(f"load average after: {os.getloadavg()}")
    print("\nbest of rounds, target tokens/s (tiny preset, sample corpus, "
          f"{args.precision}, 2048-token updates):")
    for (load, threads), values in results.items():
        print(f"  {load:<15} --threads {threads}: {max(values):7.0f}")


if __name__ == "__main__":
    main()
