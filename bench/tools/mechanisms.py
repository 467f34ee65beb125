"""`nmt translate` with one of the CPU decoding engine's mechanisms turned off, to time it against the default.

Run it twice through farm-bench, alternated, and read the ratio (docs/results.md#cpu-decoding-mechanisms):

    farm-bench -n 5 --vs 'python bench/tools/mechanisms.py --off none -m CKPT -i TEST.en' -- \
        python bench/tools/mechanisms.py --off blocked-topk -m CKPT -i TEST.en

Mechanisms (what `--off` turns off):
  blocked-topk  beam search's candidates through vocabulary blocks on CPU (decoding/beam.py): a plain top-k
  row-padding   decoding steps' rows padded towards a multiple of 32 where products go through oneDNN
                (inference/packed.py; fp32 on non-Intel CPUs, bf16): every step its own row count
  packed        float32 products through oneDNN with weights laid out once (non-Intel CPUs' default): MKL's
  slot-tables   beam search's slot tables (decoding/cache.py): instead, each row keeps its own keys and values and a
                beam reorder gathers them into a second buffer (the filled positions, one index_select a layer, as
                CTranslate2 and fairseq reorder their caches), and each row attends over its own keys only; joins
                are not merged (offline translation's batches rarely are: their lengths differ by more than the gap)
Two decoding streams are an option (`--workers 2`), not a default: `bench/translate.py --nmt fp32,fp32-w2` compares
them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

MECHANISMS = ("none", "blocked-topk", "row-padding", "packed", "slot-tables")


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
    elif name == "slot-tables":
        gather_beams()
    return []


def gather_beams() -> None:
    """The cache without slot tables (`--off slot-tables`): each of a segment's rows has its own keys and values,
    [L, 2, R, H, C, 1, K] (the exact CPU layout only), and a beam reorder gathers the filled positions of the rows
    the beams continue into a second buffer of the same size (no allocation a step), which then becomes the cache."""
    import torch

    from nmt_cli.decoding import attention, cache, layout

    def make_room(self) -> None:
        if self.static:
            raise SystemExit("--off slot-tables: the exact (CPU) layout only")
        if self.kv is None or self.capacity < self.length + 1:
            layers, _, _, heads, _, d_k = self.cross.shape
            new = self.cross.new_empty((layers, 2, self.rows, heads, layout.bucket(self.length + 1), 1, d_k))
            if self.kv is not None and self.length:
                new[..., : self.length, :, :] = self.kv[..., : self.length, :, :]
            self.kv = self._kv_room = new
            self.spare = torch.empty_like(new)

    def reorder(self, rows, sentences, kept=None) -> None:
        if sentences is not None:
            self.cross, self._room = cache._keep(self.cross, self._room, sentences, kept)
            self._set_pad(None if self.src_pad is None else self.src_pad.index_select(0, sentences))
        if self.kv is not None:
            out = self.spare.narrow(2, 0, rows.size(0))  # (_kv_room: the whole buffer `kv` is part of)
            torch.index_select(self.kv.narrow(4, 0, self.length), 2, rows, out=out.narrow(4, 0, self.length))
            self.spare, self._kv_room, self.kv = self._kv_room, self.spare, out

    def self_attend(self, layer, qkv, out, mask) -> None:
        h, d_k = self.cross.size(3), self.cross.size(5)
        d, r, w = qkv.size(1) // 3, self.rows, self.window
        kv = self.kv[layer]  # [2, R, H, C, 1, K]
        kv.select(3, self.length).copy_(qkv[:, d:].view(r, 1, 2, h, d_k).permute(2, 0, 3, 1, 4))
        k, v = kv[0, :, :, :w].reshape(r * h, w, d_k), kv[1, :, :, :w].reshape(r * h, w, d_k)
        attention.attend(qkv[:, :d].reshape(r * h, 1, d_k), k, v, None, out.view(r * h, 1, d_k))

    cache.Segment.make_room = make_room
    cache.Segment.reorder = reorder
    cache.Segment.self_mask = lambda self: None
    cache.Segment.self_attend = self_attend
    cache.DecoderCache.merge = lambda self: None


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
