"""int8 products at a decoding step's shapes: nmt's Int8Linear (FBGEMM, 7-bit activations) against the same int8
weights packed for oneDNN (torch's `onednn` quantized engine, 8-bit activations; AMX int8 tiles where the CPU has
them), and float32 (`F.linear`), alternated in one process. Prints microseconds a call (median of --rounds, each the
mean of --calls calls on a fresh input) and each int8 path's error against float32.

    python bench/tools/int8_engines.py                         # d_model 256, 8k vocabulary (the Multi30k model)
    python bench/tools/int8_engines.py --d-model 512 --outs 1536,2048,32000 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_step import cpu_name  # noqa: E402

from nmt_cli.inference.int8 import Int8Linear  # noqa: E402


def timed(fn, x_of, calls: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        xs = [x_of() for _ in range(calls)]
        fn(xs[0])
        start = time.perf_counter()
        for x in xs:
            fn(x)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--outs", default="768,1024,8000", help="output widths (qkv, feed-forward, vocabulary)")
    ap.add_argument("--rows", default="16,64,256,844")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if "onednn" not in torch.backends.quantized.supported_engines:
        raise SystemExit("this torch build has no oneDNN quantized engine")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"{cpu_name()}, torch {torch.__version__}, {a.threads} thread(s); us a call (median of {a.rounds})")
    print(f"{'out':>6} {'rows':>5} {'fbgemm':>8} {'onednn':>8} {'fp32':>8}  error fbgemm / onednn")
    for out in map(int, a.outs.split(",")):
        weight = torch.randn(out, a.d_model) * a.d_model ** -0.5
        fb, on = Int8Linear(weight), Int8Linear(weight, engine="onednn")
        for rows in map(int, a.rows.split(",")):
            def x_of(rows=rows):
                return torch.randn(rows, a.d_model)

            t_fb = timed(fb.forward, x_of, a.calls, a.rounds)
            t_on = timed(on.forward, x_of, a.calls, a.rounds)
            t_fp = timed(lambda x: torch.nn.functional.linear(x, weight), x_of, a.calls, a.rounds)  # noqa: B023
            x = x_of()
            ref = torch.nn.functional.linear(x, weight)
            err = [((y - ref).abs().mean() / ref.abs().mean()).item() for y in (fb(x), on(x))]
            print(f"{out:>6} {rows:>5} {t_fb:>8.0f} {t_on:>8.0f} {t_fp:>8.0f}  {err[0]:.4f} / {err[1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
