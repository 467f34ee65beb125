"""The CPU's rate for a decoding step's float32 work, outside any model: the products of the `base` shape through
oneDNN's packed weights (nmt's `PackedLinear`, what translation uses off Intel CPUs) and through MKL (`F.linear`),
and attention's batched products (nmt's `attend`) against their alternatives. What a pass can reach at best on this
CPU (docs/results-history.md compares a pass's products with these rates: machine E, 2026-11-28).

    python bench/tools/cpu_products.py                    # 2 threads
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python bench/tools/cpu_products.py

Each figure is the best of 3 timings of a loop after a warm-up (GFLOP/s for the products, microseconds for
attention).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from nmt_cli.decoding.attention import attend
from nmt_cli.inference.packed import PackedLinear, packed_available


def best_time(fn, seconds: float = 0.3) -> float:
    """Seconds per call of fn: the best of 3 loops of ~`seconds` each, after a warm-up."""
    for _ in range(3):
        fn()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds / 3:
        fn()
        n += 1
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def products(rows: list[int], d_model: int, d_ff: int) -> None:
    print(f"products, GFLOP/s (rows x in -> out): oneDNN packed{'' if packed_available() else ' (unavailable)'} / MKL")
    for m in rows:
        for k, n in ((d_model, 3 * d_model), (d_model, d_model), (d_model, d_ff), (d_ff, d_model)):
            onednn, mkl = product_rates(m, k, n)
            print(f"  {m:5d} x {k:4d} -> {n:4d}   {onednn:7.1f} / {mkl:7.1f}")


def product_rates(m: int, k: int, n: int) -> tuple[float, float]:
    """GFLOP/s of x [m, k] W^T [k, n] + b: oneDNN packed (nan where this torch has none), MKL."""
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    flop = 2 * m * k * n
    mkl = flop / best_time(lambda: F.linear(x, w, b)) / 1e9
    if not packed_available():
        return float("nan"), mkl
    packed = PackedLinear(w, b)
    return flop / best_time(lambda: packed(x)) / 1e9, mkl


def attention(batches: int, keys: list[int], queries: int = 4, d_k: int = 64) -> None:
    print(f"attention, us ({batches} batches of {queries} queries): attend / SDPA; the scores alone: q k^T (attend's)"
          " / k q^T")
    for s in keys:
        print(f"  {s:4d} keys   " + " / ".join(f"{t * 1e6:6.0f}" for t in attention_times(batches, s, queries, d_k)))


def attention_times(batches: int, s: int, queries: int, d_k: int) -> list[float]:
    """Seconds for one attention over `s` keys: nmt's `attend`, SDPA, and the scores' two products."""
    q, k, v = torch.randn(batches, queries, d_k), torch.randn(batches, s, d_k), torch.randn(batches, s, d_k)
    mask = torch.rand(batches, queries, s) < 0.5
    mask[..., 0] = False
    no_bias = torch.zeros(1, 1, 1)
    return [best_time(lambda: attend(q, k, v, mask)),
            best_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=~mask)),
            best_time(lambda: torch.baddbmm(no_bias, q, k.transpose(1, 2), beta=0.0, alpha=d_k**-0.5)),
            best_time(lambda: torch.bmm(k, q.transpose(1, 2)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[160, 640])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--d-ff", type=int, default=2048)
    ap.add_argument("--batches", type=int, default=640, help="attention: sentences x heads")
    ap.add_argument("--keys", type=int, nargs="+", default=[33, 68, 132])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    with torch.inference_mode():
        products(a.rows, a.d_model, a.d_ff)
        attention(a.batches, a.keys)


if __name__ == "__main__":
    main()
