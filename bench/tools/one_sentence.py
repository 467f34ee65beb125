"""Where the time of one sentence a call goes (`Translator.translate([line])`, beam 4, CPU), in four probes:

  parts   timers around the decoding loop's parts (the model's step, the beam's select and advance, the
          shortlist's projection, the cache's bookkeeping, admitting a sentence: encoder and shortlist)
  floor   the eager floor: a hand-written minimal decoder step on the checkpoint's own packed layers
          (contiguous per-row caches, no slot table, no mask, no embedding or output projection), and its
          products alone
  slope   CTranslate2's time a step: `translate_batch` with min = max decoding length 1, 5, 15, 25 (needs
          `pip install ctranslate2` and the export `bench/translate.py` makes, --ct2-dir)
  topk    beam search's candidates (decoding/beam.py) by vocabulary blocks against one top-k a sentence

    python bench/tools/one_sentence.py --checkpoint runs/multi30k/run/averaged.pt
        [--probes parts,floor,slope,topk] [--lines 80] [--threads 2] [--ct2-dir runs/bench_translate/ct2_small]

Timing a step of a few rows measures microseconds: run it on a quiet machine (another busy process makes every
operation that enters an OpenMP region many times slower). Figures: docs/results-history.md, "One sentence a
call: the step's host work".
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from decode_step import cpu_name  # noqa: E402  (bench/tools: this script's folder)

from nmt_cli.decoding import beam, scheduler  # noqa: E402
from nmt_cli.decoding import step as decoding_step  # noqa: E402
from nmt_cli.decoding.cache import DecoderCache  # noqa: E402
from nmt_cli.decoding.candidates import Candidates  # noqa: E402
from nmt_cli.inference.translate import Translator, set_threads  # noqa: E402

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k" / "test.en"


def timed(f, n: int, warm: int = 50) -> float:
    """Microseconds a call of f(), the mean of n calls after `warm`."""
    for _ in range(warm):
        f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e6


def parts(tr: Translator, lines: list[str]) -> None:
    """Each part's time a sentence, with timers around the methods (in this process only)."""
    spent, calls = collections.Counter(), collections.Counter()

    def wrap(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        def timer(*args, **kwargs):
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start
                calls[label] += 1

        setattr(owner, name, timer)

    timers = ((scheduler.DecodeLoop, "step", "a step, all of it"),
              (decoding_step, "static_step", "  the model's step"),
              (beam.BeamSearch, "select", "  beam: select"), (beam.BeamSearch, "advance", "  beam: advance"),
              (Candidates, "output", "  the shortlist's projection"),
              (DecoderCache, "make_room", "  cache: room"), (DecoderCache, "reorder", "  cache: reorder"),
              (scheduler.DecodeLoop, "check", "  host check"),
              (scheduler.DecodeLoop, "admit", "admit (encoder, shortlist)"))
    for owner, name, label in timers:
        wrap(owner, name, label)
    for line in lines[:10]:
        tr.translate([line])
    spent.clear()
    calls.clear()
    start = time.perf_counter()
    for line in lines[10:]:
        tr.translate([line])
    n = len(lines) - 10
    steps = calls["a step, all of it"] / n
    total = (time.perf_counter() - start) / n * 1000
    print(f"parts: {total:.2f} ms a sentence (with the timers), {steps:.1f} steps")
    for label in (label for _, _, label in timers if calls[label]):
        each = spent[label] / calls[label] * 1e6
        print(f"  {label:32s} {spent[label] / n * 1000:7.2f} ms a sentence  {each:8.1f} us a call")


def floor(tr: Translator) -> None:
    """A minimal eager step (module docstring) on the model's own layers, 4 rows at position 12, a source of 14."""
    model = tr.model
    c = model.config
    rows, d, heads, t, s = 4, c.d_model, c.n_heads, 12, 14
    k = d // heads
    layers = list(model.decoder_layers)
    caches = [torch.randn(2, rows * heads, 64, k) for _ in layers]
    cross = [torch.randn(2, heads, s, k) for _ in layers]  # one sentence's: every beam reads the same
    x0, zero = torch.randn(rows, d), torch.zeros(1, 1, 1)

    def norm(x, n):
        return torch.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps)

    def minimal():
        x = x0
        for i, layer in enumerate(layers):
            sa, ca = layer.self_attn, layer.cross_attn
            q, key, value = sa.qkv_proj.forward(x).view(rows, 3, heads, k).unbind(1)
            cache = caches[i]
            cache[:, :, t].copy_(torch.stack((key, value)).view(2, rows * heads, k))
            w = torch.baddbmm(zero, q.reshape(rows * heads, 1, k), cache[0, :, : t + 1].transpose(1, 2), beta=0.0,
                              alpha=k ** -0.5).softmax(-1)
            x = norm(x + sa.out_proj.forward(torch.bmm(w, cache[1, :, : t + 1]).view(rows, d)), layer.sub1.norm)
            q = ca.q_proj.forward(x).view(rows, heads, k).transpose(0, 1)
            w = torch.baddbmm(zero, q, cross[i][0].transpose(1, 2), beta=0.0, alpha=k ** -0.5).softmax(-1)
            a = torch.bmm(w, cross[i][1]).transpose(0, 1).reshape(rows, d)
            x = norm(x + ca.out_proj.forward(a), layer.sub2.norm)
            x = norm(x + layer.ffn.fc2.forward(layer.ffn.fc1.forward(x)), layer.sub3.norm)
        return x

    products = [p for layer in layers for p in (layer.self_attn.qkv_proj, layer.self_attn.out_proj,
                                                 layer.cross_attn.q_proj, layer.cross_attn.out_proj,
                                                 layer.ffn.fc1, layer.ffn.fc2)]
    inputs = {d: x0, c.d_ff: torch.randn(rows, c.d_ff)}

    def alone():
        for p in products:
            p.forward(inputs[p.in_features])

    with torch.inference_mode():
        step, prods = timed(minimal, 2000), timed(alone, 2000)
    print(f"floor: a minimal {len(layers)}-layer step at {rows} rows {step:.0f} us; its {len(products)} products "
          f"alone {prods:.0f} us ({type(products[0]).__name__})")


def slope(ct2_dir: Path, lines: list[str], threads: int) -> None:
    """CTranslate2's ms a sentence at 1, 5, 15 and 25 decoding steps (beam 4): the slope is its time a step."""
    import ctranslate2
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(ct2_dir / "sentencepiece.model"))
    tr = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=threads, inter_threads=1)
    pieces = [sp.encode(line, out_type=str) for line in lines[:40]]
    ms = {}
    for length in (1, 5, 15, 25):
        def run(n=length):
            for p in pieces:
                tr.translate_batch([p], beam_size=4, min_decoding_length=n, max_decoding_length=n)
        run()
        start = time.perf_counter()
        run()
        ms[length] = (time.perf_counter() - start) / len(pieces) * 1000
    per_step = (ms[25] - ms[5]) / 20
    print("slope: CTranslate2 " + ", ".join(f"{n} steps {v:.2f} ms" for n, v in ms.items())
          + f"; {per_step:.3f} ms a step, {ms[1] - per_step:.2f} ms fixed")


def topk() -> None:
    """Candidates by blocks (FLAT_MAX 0) against one top-k a sentence, random log-probabilities, beam 4."""
    class State:  # what `candidates` reads of a SearchState
        def __init__(self, n: int):
            self.n, self.per = n, 4
            self.scores = torch.randn(n, 4)
            self._first = torch.arange(n).unsqueeze(1) * 4

        def first_rows(self):
            return self._first

    saved = beam.FLAT_MAX
    try:
        with torch.inference_mode():
            for n, width in ((1, 384), (1, 8000), (16, 1024), (64, 1536), (64, 8000)):
                state, lprobs = State(n), torch.randn(n * 4, width).log_softmax(-1)
                beam.FLAT_MAX = 0
                blocks = timed(lambda s=state, x=lprobs: beam.candidates(s, x), 1000)
                beam.FLAT_MAX = 1 << 62
                flat = timed(lambda s=state, x=lprobs: beam.candidates(s, x), 1000)
                print(f"topk: {n} x 4 x {width}: blocks {blocks:.1f} us, one top-k {flat:.1f} us")
    finally:
        beam.FLAT_MAX = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--probes", default="parts,floor,slope,topk")
    ap.add_argument("--input", type=Path, default=MULTI30K)
    ap.add_argument("--lines", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--ct2-dir", type=Path, default=ROOT / "runs" / "bench_translate" / "ct2_small",
                    help="slope: a CTranslate2 export of the same checkpoint (bench/translate.py makes this one)")
    a = ap.parse_args()
    probes = a.probes.split(",")
    set_threads(a.threads)
    lines = a.input.read_text(encoding="utf-8").splitlines()[: a.lines]
    print(f"{a.threads} threads, beam 4, {a.precision}; {cpu_name()}")
    if probes == ["slope"]:
        slope(a.ct2_dir, lines, a.threads)
        return
    tr = Translator.load(a.checkpoint, device="cpu", beam=4, precision=a.precision)
    if "floor" in probes:
        tr.translate(lines[:1])
        floor(tr)
    if "topk" in probes:
        topk()
    if "slope" in probes:  # a process of its own: torch's waiting OpenMP threads slow CTranslate2's several times
        subprocess.run([sys.executable, __file__, "--checkpoint", a.checkpoint, "--probes", "slope", "--input",
                        str(a.input), "--lines", str(a.lines), "--threads", str(a.threads), "--ct2-dir",
                        str(a.ct2_dir)], check=True)
    if "parts" in probes:  # last: it wraps the loop's methods in this process
        parts(tr, lines)
    print(f"(median line length {statistics.median(len(x.split()) for x in lines)} words)")


if __name__ == "__main__":
    main()
