"""nmt's GPU decoding with and without CUDA graphs, alternated in one process (base shape, random weights, fp16,
beam 4, newstest2014 sources, every output 32 tokens): sentences/s and the graphs' counts. Graphs three times: as
they are; with the attention through SDPA (decoding.attention.SDPA_DECODING: one kernel instead of five); with the best
candidates found by blocks of the vocabulary, as on CPU (decoding.beam.BLOCK_DEVICES), instead of a topk over
each beam's whole vocabulary. (Until 2026-11-26 beam reorders gathered the cache, in place or into spare buffers;
they now move a slot table, decoding/cache.py: run this script on both commits to compare.)

    python bench/tools/graph_ab.py [--precision fp16] [--lines 3003] [--rounds 2]
    python bench/tools/graph_ab.py --device cpu --precision fp32 --lines 40 --rounds 1   # the script itself, on CPU
      (there the "graphs" are the recorded function run eagerly: decoding/graphs.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from nmt_cli.config import ModelConfig  # noqa: E402
from nmt_cli.decoding import SearchConfig, decode_batches  # noqa: E402
from nmt_cli.decoding import attention as decoding_attention  # noqa: E402
from nmt_cli.decoding import beam as decoding_beam  # noqa: E402
from nmt_cli.decoding.graphs import GPU_CHECK_EVERY, StepGraphs  # noqa: E402
from nmt_cli.model import Transformer, avoid_cudnn_attention  # noqa: E402

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "wmt14_newstest_ende"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--lines", type=int, default=3003)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=6000)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = p.parse_args()
    avoid_cudnn_attention()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.precision]
    torch.manual_seed(0)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = Transformer(ModelConfig(vocab_size=32000, dropout=0.0)).to(device).to(dtype).eval()
    # source lengths as newstest2014's in words x 1.3 (no tokenizer needed), longest first, batches of max-tokens
    lengths = [min(250, int(len(line.split()) * 1.3) + 1) for line in
               (DATA / "test.en").read_text(encoding="utf-8").splitlines()[: args.lines]]
    lengths.sort(reverse=True)
    g = torch.Generator().manual_seed(0)
    batches, i = [], 0
    while i < len(lengths):
        n = max(1, min(512, args.max_tokens // lengths[i]))
        width = lengths[i]
        src = torch.randint(4, 32000, (len(lengths[i : i + n]), width), generator=g)
        for row, length in enumerate(lengths[i : i + n]):
            src[row, length - 1] = 3
            src[row, length:] = 0
        batches.append((src.to(device), (src == 0).to(device)))
        i += n
    cfg = SearchConfig(beam=4, max_len_a=0.0, max_len_b=33)
    graphs, sdpa, blocks = StepGraphs(device), StepGraphs(device), StepGraphs(device)
    modes = {"graphs": dict(static=True, check_every=GPU_CHECK_EVERY, graphs=graphs),
             "graphs, sdpa": dict(static=True, check_every=GPU_CHECK_EVERY, graphs=sdpa),
             "graphs, blocks": dict(static=True, check_every=GPU_CHECK_EVERY, graphs=blocks),
             "static": dict(static=True, check_every=GPU_CHECK_EVERY),
             "exact (before)": dict()}
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {args.precision}, {len(lengths)} sentences, "
          f"{len(batches)} batches")
    decode_batches(model, batches[:2], cfg, **modes["graphs"])  # warm-up
    outputs = {}
    for r in range(args.rounds):
        for name, options in modes.items():
            decoding_attention.SDPA_DECODING = name == "graphs, sdpa"  # attention: one SDPA call or five operations
            # the best candidates: a topk over each beam's vocabulary, or blocks of it (as on CPU)
            decoding_beam.BLOCK_DEVICES = ("cpu", "cuda") if name == "graphs, blocks" else ("cpu",)
            sync()
            start = time.perf_counter()
            found = decode_batches(model, batches, cfg, **options)
            sync()
            outputs[name] = [h[0].tokens for batch in found for h in batch]
            s = time.perf_counter() - start
            print(f"  round {r}: {name:<15} {len(lengths) / s:8.1f} sent/s ({s:.2f} s)")
    decoding_attention.SDPA_DECODING = False
    decoding_beam.BLOCK_DEVICES = ("cpu",)
    for name, g in (("graphs", graphs), ("graphs, sdpa", sdpa), ("graphs, blocks", blocks)):
        print(f"  {name}: {g.recorded} recorded, {g.replayed} replayed, {g.eager} eager, broken: {g.broken}")
    for other in ("graphs, sdpa", "graphs, blocks", "static", "exact (before)"):
        same = sum(a == b for a, b in zip(outputs["graphs"], outputs[other], strict=True))
        print(f"  best hypotheses identical, graphs vs {other}: {same}/{len(lengths)}")

if __name__ == "__main__":
    main()
