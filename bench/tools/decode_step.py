"""The cost of one incremental decoding step on CPU (`Transformer.step` plus the beam reorder of the cache, what
beam search runs per step), for each cache layout, alternated in one process:
  exact     the default on CPU: attention over exactly the filled positions, the cache re-laid by each reorder
  packed    exact, the products through oneDNN with prepacked weights (what translation uses on CPUs not Intel's;
            --packed; fp32 only)
  static    the layout for compiled steps and CUDA graphs: capacity buckets, masked attention, in-place reorders
  compiled  static, through torch.compile(fullgraph=True) of the step (inductor; --compile, slow to start;
            --autotune: frozen weights and max-autotune, inductor's C++ GEMM micro-kernels for the products)

    python bench/tools/decode_step.py                                        # small random model (Multi30k's shape)
    python bench/tools/decode_step.py --checkpoint runs/m30k/run/checkpoint_last.pt --precision int8 --rows 1,20,200

A step of a small model is ~100 small tensor operations; at one row their Python and dispatch cost is nearly all of
it. Prints ms per step (best of --rounds, each the mean of --steps steps after --start positions) and the CPU.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from nmt_cli.checkpoints import format as checkpoint  # noqa: E402
from nmt_cli.config import ModelConfig  # noqa: E402
from nmt_cli.model import Transformer  # noqa: E402


def cpu_name() -> str:
    """The CPU's model name and its wide-SIMD flags (avx2, avx512f, avx512_bf16, amx*), from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in info.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    simd = sorted(f for f in fields.get("flags", "").split() if f.startswith(("avx2", "avx512f", "avx512_bf16", "amx")))
    return f"{fields.get('model name', 'unknown CPU')} ({' '.join(simd)})"


def per_step_ms(model: Transformer, rows: int, steps: int, layout: str, start: int) -> float:
    src = torch.randint(5, model.config.vocab_size, (rows, 14))
    with torch.inference_mode():
        cache = model.init_cache(model.encode(src), static=layout != "exact")
        tokens = torch.randint(5, model.config.vocab_size, (rows,))
        same = torch.arange(rows)
        for _ in range(start):
            model.step(tokens, cache)
            cache.reorder(same)
        begin = time.perf_counter()
        for _ in range(steps):
            model.step(tokens, cache)
            cache.reorder(same)
        return (time.perf_counter() - begin) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, help="a trained model (default: random weights, Multi30k's shape)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "int8"))
    p.add_argument("--rows", default="1,20,200", help="decoder rows per step (sentences x beams)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--start", type=int, default=10, help="positions decoded before timing")
    p.add_argument("--compile", action="store_true", help="also time the compiled static step (inductor)")
    p.add_argument("--autotune", action="store_true", help="compile with freezing and max-autotune (with --compile)")
    p.add_argument("--packed", action="store_true", help="also time the exact layout with oneDNN's packed products")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.checkpoint:
        model = checkpoint.load(args.checkpoint).build_model()
    else:
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=8000, d_model=256, d_ff=1024, n_heads=4, encoder_layers=3,
                                        decoder_layers=3))
    model.eval()
    if args.precision == "int8":
        from nmt_cli.inference.int8 import quantize_int8

        quantize_int8(model)
    print(f"one decoding step, {args.precision}, {args.threads} threads, {cpu_name()}; torch {torch.__version__}")
    layouts = ["exact", "static"] + (["packed"] if args.packed else []) + (["compiled"] if args.compile else [])
    models = {name: model for name in layouts}
    if args.packed:
        from nmt_cli.inference.packed import pack_linears

        models["packed"] = pack_linears(copy.deepcopy(model))
    options = {}
    if args.autotune:  # (freezing read from inductor's config: given in `options` it did not take effect)
        from torch._inductor import config as inductor_config

        inductor_config.freezing = True
        options = {"mode": "max-autotune-no-cudagraphs"}
    for rows in (int(r) for r in args.rows.split(",")):
        times: dict[str, list[float]] = {name: [] for name in layouts}
        for _ in range(args.rounds):
            for name in layouts:
                if name == "compiled":
                    model.compile_step(backend="inductor", **options)
                else:
                    model.compile_step(backend=None)
                layout = "exact" if name == "packed" else name
                times[name].append(per_step_ms(models[name], rows, args.steps, layout, args.start))
        model.compile_step(backend=None)
        print(f"  {rows:4d} rows: " + ", ".join(f"{name} {min(t):6.2f} ms" for name, t in times.items()))

if __name__ == "__main__":
    main()
