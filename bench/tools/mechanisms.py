"""`nmt translate` with one of the CPU decoding engine's mechanisms turned off, to time it against the default.

Run it twice through farm-bench, alternated, and read the ratio (docs/results.md#cpu-decoding-mechanisms):

    farm-bench -n 5 --vs 'python bench/tools/mechanisms.py --off none -m CKPT -i TEST.en' -- \
        python bench/tools/mechanisms.py --off blocked-topk -m CKPT -i TEST.en

Mechanisms (what `--off` turns off):
  blocked-topk  beam search's candidates through vocabulary blocks on CPU (decoding/beam.py): a plain top-k
  row-padding   decoding steps' rows padded towards a multiple of 32 where products go through oneDNN
                (inference/packed.py; fp32 on non-Intel CPUs, bf16): every step its own row count
  packed        float32 products through oneDNN with weights laid out once (non-Intel CPUs' default): MKL's
The slot tables of beam search (decoding/cache.py) have no switch: they are how the cache is laid out. Two decoding
streams are an option (`--workers 2`), not a default: `bench/translate.py --nmt fp32,fp32-w2` compares them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

MECHANISMS = ("none", "blocked-topk", "row-padding", "packed")


def turn_off(name: str) -> list[str]:
    """Disable mechanism `name` in this process; -> extra `nmt translate` options it needs."""
    if name == "blocked-topk":
        from nmt_cli.decoding import beam

        beam._block_size = lambda width, k: None
    elif name == "row-padding":
        from nmt_cli.inference import packed

        packed.ROW_MULTIPLE = 1
    elif name == "packed":
        import os

        os.environ["NMT_CPU_GEMM"] = "mkl"
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--off", choices=MECHANISMS, default="none", help="the mechanism to turn off")
    parser.add_argument("-m", "--model", required=True, help="checkpoint")
    parser.add_argument("-i", "--input", required=True, help="source text, one sentence a line")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--gemm", choices=("mkl", "onednn"), help="NMT_CPU_GEMM for both runs (e.g. onednn on Intel)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="more `nmt translate` options, after --")
    args = parser.parse_args(argv)
    rest = [a for a in args.rest if a != "--"]
    if args.gemm:
        import os

        os.environ["NMT_CPU_GEMM"] = args.gemm
    extra = turn_off(args.off)
    from nmt_cli.cli import main as nmt

    nmt(["translate", args.input, "-m", args.model, "--precision", args.precision, "--device", "cpu", "-o",
         "/dev/null", *extra, *rest])


if __name__ == "__main__":
    main()
