"""Probe: would int8 linear layers make `nmt translate` faster on this CPU, and at what BLEU cost?

    python bench/int8_probe.py runs/multi30k/run/averaged.pt runs/multi30k/data/raw/test.en \
        runs/multi30k/data/raw/test.de [--rounds 2] [--threads 2]

Translates the file with the checkpoint in fp32, then again with every linear layer (and the tied output
projection) replaced by torch's dynamic int8 quantization (int8 weights per tensor, activations quantized per
call; fbgemm kernels, VNNI where the CPU has it), alternating the two, and prints sentences/s, sacreBLEU and how
many lines are identical. This is a measurement, not a feature: `torch.ao.quantization.quantize_dynamic` is
deprecated (it warns that it will be removed), so nmt does not ship it. Results are in docs/results-history.md#same-run-comparisons-on-machine-c-third-session.
"""

from __future__ import annotations

import argparse
import time
import types
import warnings

import sacrebleu
import torch

from nmt_cli import model as model_module
from nmt_cli.inference import translate as T


def quantize(translator: T.Translator) -> None:
    """Swap the model's nn.Linear layers for dynamic int8 ones, and route the tied output projection through one."""
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    model = translator.model
    untied = getattr(model, "out_proj", None)  # kept as it is: decode() reads its .weight
    weight = untied.weight if untied is not None else model.embed.weight
    torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    if untied is not None:
        model.out_proj = untied
    dense = torch.nn.Linear(weight.size(1), weight.size(0), bias=False)
    with torch.no_grad():
        dense.weight.copy_(weight)
    output = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(dense), {torch.nn.Linear}, dtype=torch.qint8)
    real = torch.nn.functional
    proxy = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    proxy.linear = lambda x, w, b=None: output(x) if w is weight else real.linear(x, w, b)
    model_module.F = proxy  # model.decode ends with F.linear(x, weight): the one call not in an nn.Linear


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("source")
    p.add_argument("reference")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    lines = open(a.source, encoding="utf-8").read().splitlines()
    refs = open(a.reference, encoding="utf-8").read().splitlines()
    checkpoints = T.load_checkpoints([a.checkpoint])
    engines = {"fp32": T.Translator(checkpoints, "cpu", "fp32"), "int8": T.Translator(checkpoints, "cpu", "fp32")}
    quantize(engines["int8"])
    best: dict[str, float] = {}
    outputs: dict[str, list[str]] = {}
    for r in range(a.rounds):
        for name, translator in engines.items():
            start = time.perf_counter()
            outputs[name] = [hyps[0][1] for hyps in translator.translate(lines)]
            rate = len(lines) / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), rate)
            bleu = sacrebleu.corpus_bleu(outputs[name], [refs]).score
            print(f"round {r + 1} {name}: {rate:.1f} sent/s, sacreBLEU {bleu:.2f}", flush=True)
    same = sum(x == y for x, y in zip(outputs["fp32"], outputs["int8"], strict=True))
    print(f"best: fp32 {best['fp32']:.1f}, int8 {best['int8']:.1f} sent/s (x{best['int8'] / best['fp32']:.2f}); "
          f"{same}/{len(lines)} lines identical")


if __name__ == "__main__":
    main()
