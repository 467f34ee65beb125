"""Benchmark `nmt train`: target tokens/s and model FLOP utilization (MFU) through the real training loop.

    python bench/train.py                          # all sections
    python bench/train.py --sections small --seconds 60
    python bench/train.py --sections base --precisions bf16

Sections:
  peak    the matrix-product peak of this machine, measured in this run (torch.mm, same threads, per dtype):
          the denominator of MFU
  base    the paper's base model (d 512, 6+6 layers, 37k vocabulary) on synthetic sentences (random ids, lengths
          like WMT en-de) in fp32 and bf16, one process, --max-tokens 8192 micro-batches
  small   d_model 256, d_ff 1024, 4 heads, 3+3 layers, 8k BPE vocabulary on Multi30k (../shared/data/multi30k),
          prepared with `nmt prepare custom`; fp32 and bf16. fairseq trains this at ~3300 target tokens/s on the
          2-core CPU in fp32 (a quoted figure, not re-measured here); the target is >= 1.5x that.
  (CUDA: the same sections run on one GPU when one is present, base and big in bf16; unverified here.)

MFU = model FLOPs / time / peak. Model FLOPs count every matrix product of forward + backward (3 x forward)
on the real (non-pad) tokens, attention score/value products per sentence included; padding is not counted.
Each update runs Trainer.update(): forward, label-smoothed loss, backward, Adam (the same code as nmt train).
Artifacts go to runs/bench_train/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
WORK = ROOT / "runs" / "bench_train"
MULTI30K = DATA / "multi30k"
FAIRSEQ_SMALL_TOK_S = 3300  # quoted: fairseq, small Multi30k config, 2-core CPU, fp32 (measured beside nmt: tools/train_ab.py)


# ---- peak ------------------------------------------------------------------------------------------------------

def matmul_peak(dtype: torch.dtype, device: str, seconds: float = 2.0) -> float:
    """Best FLOP/s of torch.mm over a few large shapes (the machine's practical matrix-product peak), on random
    data (zeros run faster than real data on some GPUs)."""
    best = 0.0
    shapes = ((2048, 2048, 2048), (4096, 1024, 4096), (4096, 4096, 1024))
    if device == "cuda":
        shapes = ((8192, 8192, 8192), (16384, 4096, 8192), (8192, 8192, 4096))
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        for _ in range(3):
            a @ b
        _sync(device)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            a @ b
            reps += 1
            if device == "cuda" and reps % 10 == 0:
                _sync(device)
        _sync(device)
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t0))
    return best


# Dense (no sparsity) bf16 tensor-core peaks from the vendor's datasheets, FLOP/s: the other MFU denominator.
DATASHEET_BF16 = {"H200": 989.4e12, "H100 80GB HBM3": 989.4e12, "H100 PCIe": 756.0e12, "A100": 312.0e12,
                  "L40S": 362.1e12, "A10": 125.0e12}


def datasheet_peak(device: str) -> tuple[str, float | None]:
    """(device name, datasheet dense bf16 peak or None when unknown) of GPU 0."""
    if device != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(0)
    for key, value in DATASHEET_BF16.items():
        if key in name:
            return name, value
    return name, None


# ---- FLOPs -----------------------------------------------------------------------------------------------------

def model_flops(cfg, src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Forward + backward FLOPs (3 x forward, 2 per multiply-add) of one batch, on real tokens.

    Per encoder layer and source token: qkv + out 4D^2, FFN 2DF, scores + values 2 S D.
    Per decoder layer and target token: self 4D^2 + causal attention ~T D, cross query + out 2D^2 (its keys and
    values 2D^2 per source token), cross attention 2 S D, FFN 2DF. Output projection D V per target token.
    """
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    s, t = src_lens.astype(np.float64), tgt_lens.astype(np.float64)
    enc = cfg.encoder_layers * np.sum(s * (4 * d * d + 2 * d * f) + 2 * s * s * d)
    dec = cfg.decoder_layers * np.sum(t * (4 * d * d + 2 * d * d + 2 * d * f) + t * t * d
                                      + s * 2 * d * d + 2 * t * s * d)
    out = np.sum(t) * d * v
    return 3 * 2 * float(enc + dec + out)


# ---- data directories ------------------------------------------------------------------------------------------

def synthetic_data_dir(path: Path, vocab_size: int, n: int = 20000, seed: int = 0) -> Path:
    """Random-id sentences with WMT-like lengths (mean ~27 tokens) in nmt prepare's format."""
    from nmt_cli.data.store import MANIFEST, SPM_MODEL, BinaryWriter
    from nmt_cli.data.tokenizer import Tokenizer, train_bpe

    if (path / MANIFEST).exists() and Tokenizer((path / SPM_MODEL).read_bytes()).vocab_size == vocab_size:
        return path
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # never decoded (the ids are random), but as large as the manifest says: placeholder pieces fill it
    spm = train_bpe([f"placeholder sentence number {i}" for i in range(200)], vocab_size=vocab_size,
                    symbols=[f"<x{i}>" for i in range(vocab_size - 40)])
    if (pieces := Tokenizer(spm).vocab_size) != vocab_size:
        raise SystemExit(f"the synthetic tokenizer has {pieces} pieces, not {vocab_size}")
    (path / SPM_MODEL).write_bytes(spm)
    splits = {}
    for split, count in (("train", n), ("valid", 200)):
        lens = np.clip(rng.gamma(4.0, 27 / 4.0, size=count).astype(int), 3, 120)
        for lang, scale in (("en", 1.0), ("de", 1.05)):
            sents = [rng.integers(4, vocab_size, size=max(2, int(x * scale))).tolist() for x in lens]
            with BinaryWriter(path / f"{split}.{lang}", vocab_size) as w:
                w.add_many(sents)
        splits[split] = {"read": count, "kept": count, "dropped": {}}
    manifest = {"format_version": 1, "corpus": "synthetic", "src_lang": "en", "tgt_lang": "de",
                "vocab_size": vocab_size, "splits": splits}
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def multi30k_data_dir(path: Path) -> Path | None:
    if (path / "manifest.json").exists():
        return path
    if not MULTI30K.is_dir():
        return None
    nmt = Path(sys.executable).with_name("nmt")
    cmd = [str(nmt), "prepare", "custom", "--src-lang", "en", "--tgt-lang", "de",
           "--train", str(MULTI30K / "train"), "--valid", str(MULTI30K / "valid"), "--test", str(MULTI30K / "test"),
           "--vocab-size", "8000", "-o", str(path)]
    subprocess.run(cmd, check=True)
    return path


# ---- one measurement --------------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(data_dir: Path, preset: str, model: dict, precision: str, max_tokens: int, seconds: float,
            device: str, warmup_updates: int = 2, compile: bool = False, window: float = 8.0,
            compile_shapes: str = "buckets") -> dict:
    """tokens/s and FLOP/s of Trainer.update() on this data, after `warmup_updates`: overall and in the best
    window of >= `window` seconds (a shared machine's neighbours slow some windows down)."""
    from nmt_cli.data.batching import padding_efficiency
    from nmt_cli.training.config import TrainConfig
    from nmt_cli.training.distributed.process import Runtime
    from nmt_cli.training.distributed.process_group import setup_process
    from nmt_cli.training.loop import Trainer
    from nmt_cli.training.plan import plan_run

    cfg = TrainConfig(str(data_dir), str(WORK / "scratch"), preset=preset, model=model, precision=precision,
                      max_tokens=max_tokens, update_freq=1, gpus=1 if device == "cuda" else 0, compile=compile,
                      resume=None, **({"compile_shapes": compile_shapes} if compile else {}))
    plan = plan_run(cfg)
    rt: Runtime = setup_process(plan.launch, 0, 0, None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(plan, rt)
    batches = _batches(trainer)
    shape_fn = [batches.batch_shape] if getattr(batches, "batch_shape", None) else []  # (an nmt before buckets)
    t_warm = time.perf_counter()
    shapes = warm_every_shape(trainer, device) if compile and shape_fn else 0  # (dynamic: warm-up updates)
    for _ in range(warmup_updates):
        trainer.update(next_update(trainer))
    _sync(device)
    warm_s = time.perf_counter() - t_warm
    windows = []  # (seconds, tgt tokens, src tokens, flops, updates) per window of >= `window` seconds
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds or len(windows) < 2:
        flops = tgt = src = updates = 0.0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < window:
            update = next_update(trainer)
            stats = trainer.update(update)
            for b in getattr(update, "micro_batches", update):
                tgt_lens = b.tgt_out.ne(0).sum(1).numpy()
                real = tgt_lens > 0  # (the empty rows that complete a compiled batch's shape do no useful work)
                flops += model_flops(plan.model_config, (~b.src_pad_mask).sum(1).numpy()[real], tgt_lens[real])
            tgt += stats.tgt_tokens
            src += stats.src_tokens
            updates += 1
        _sync(device)
        windows.append((time.perf_counter() - t0, tgt, src, flops, updates))
    total = [sum(w[i] for w in windows) for i in range(5)]
    best = max(windows, key=lambda w: w[3] / w[0])
    out = {"windows": len(windows), "seconds": total[0], "tgt_tok_s": total[1] / total[0],
           "src_tok_s": total[2] / total[0], "flop_s": total[3] / total[0],
           "best_tgt_tok_s": best[1] / best[0], "best_flop_s": best[3] / best[0],
           "params": trainer.module.num_parameters(), "s_per_update": total[0] / total[4],
           "tgt_per_update": total[1] / total[4], "warmup_s": warm_s, "shapes": shapes,
           "padding_efficiency": padding_efficiency(batches.batches, trainer.train_data.src_lengths,
                                                    trainer.train_data.tgt_lengths, *shape_fn)}
    if device == "cuda":
        out["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    del trainer
    if device == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    return out


def next_update(trainer):
    """The next update, as this nmt's Trainer.update takes it (an older nmt's: its micro-batches; PYTHONPATH=OLD/src
    for before/after runs)."""
    return trainer.reader.next_update() if hasattr(trainer, "reader") else trainer._next_micro_batches()


def _batches(trainer):
    """What holds the training batches and their shapes: the data reader (an older nmt: the Trainer itself)."""
    return getattr(trainer, "reader", trainer)


def warm_every_shape(trainer, device: str) -> int:
    """One update on a batch of each of the compiled run's shapes (their compilation, before any timing), each
    printed with its compile time. -> the number of shapes."""
    first, batches = {}, _batches(trainer)
    for idx in batches.batches:
        first.setdefault(batches.batch_shape(idx), idx)
    for i, (shape, idx) in enumerate(sorted(first.items(), key=lambda kv: kv[0][1])):
        t0 = time.perf_counter()
        trainer.update(batches.collate([idx]) if hasattr(trainer, "reader") else trainer._collate([idx]))
        _sync(device)
        print(f"  compiled shape {i + 1}/{len(first)}: {shape[0]} rows x {shape[1]} tokens in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return len(first)


def report(name: str, precision: str, r: dict, peak: float, extra: str = "") -> None:
    print(f"{name:<28} {precision:<5} {r['params'] / 1e6:6.1f}M  overall {r['tgt_tok_s']:7.0f} tgt tok/s "
          f"MFU {100 * r['flop_s'] / peak:5.1f}% | best {r['windows']}-window {r['best_tgt_tok_s']:7.0f} tgt tok/s "
          f"{r['best_flop_s'] / 1e9:7.1f} GFLOP/s MFU {100 * r['best_flop_s'] / peak:5.1f}% of {peak / 1e9:.0f} GFLOP/s "
          f"{extra}", flush=True)


# ---- GPU ---------------------------------------------------------------------------------------------------------

PAPER_STEPS = {"base": 100_000, "big": 300_000}
# Assumed NCCL all-reduce bus bandwidth inside one 8-GPU NVLink node (H100/H200 SXM): an assumption for the
# 8-GPU estimate when the all-reduce does not overlap the backward pass, not a measurement.
ASSUMED_BUSBW = 350e9


def gpu_main(args, data: Path) -> None:
    """base and big at the paper's batch on one GPU: tokens/s, MFU of the measured and the datasheet peak, the
    paper's schedule in hours on 1 and 8 GPUs; eager against torch.compile."""
    name, sheet = datasheet_peak("cuda")
    measured = matmul_peak(torch.bfloat16, "cuda")
    print(f"GPU {name}: matmul peak bf16 measured {measured / 1e12:.0f} TFLOP/s (8192-16384 sized products, random "
          f"data); datasheet dense bf16 {sheet / 1e12 if sheet else float('nan'):.0f} TFLOP/s", flush=True)
    results = {}
    for preset in args.presets.split(","):
        sizes = [int(x) for x in args.gpu_max_tokens.split(",")]
        for compiled in ([False, True] if args.compile_too else [args.compile]):
            for max_tokens in (sizes[:1] if compiled and args.compile_too else sizes):
                try:
                    r = measure(data, preset, {}, "bf16", max_tokens, args.seconds, "cuda", compile=compiled,
                                warmup_updates=10 if compiled else 3, window=args.window,
                                compile_shapes=args.compile_shapes)
                except Exception as exc:  # noqa: BLE001 - report and go on with the other configurations
                    print(f"{preset} {'compile' if compiled else 'eager'} {max_tokens}: failed: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", flush=True)
                    continue
                results[preset, compiled, max_tokens] = r
                mfu_sheet = f"{100 * r['flop_s'] / sheet:5.1f}%" if sheet else "  n/a"
                print(f"{preset:<4} bf16 {'compile' if compiled else 'eager  '} micro-batch {max_tokens:>6} tokens: "
                      f"{r['params'] / 1e6:5.1f}M params, {r['tgt_tok_s']:8.0f} tgt tok/s, "
                      f"{r['s_per_update'] * 1e3:7.1f} ms/update ({r['tgt_per_update']:.0f} tgt tok), "
                      f"{r['flop_s'] / 1e12:5.0f} TFLOP/s = MFU {100 * r['flop_s'] / measured:5.1f}% of measured, "
                      f"{mfu_sheet} of datasheet; peak mem {r.get('peak_gb', 0):5.1f} GiB; "
                      f"warm-up {r['warmup_s']:.0f} s ({r['shapes']} compiled shapes); padding efficiency "
                      f"{r['padding_efficiency']:.3f}", flush=True)
    print("\nthe paper's schedule (25k-token updates) from the measured update times:")
    for preset in args.presets.split(","):
        full = [(c, r) for (p, c, mt), r in results.items() if p == preset and mt >= 20000]
        eighth = [(c, r) for (p, c, mt), r in results.items() if p == preset and mt <= 4000]
        if full:
            c, r = min(full, key=lambda cr: cr[1]["s_per_update"] / cr[1]["tgt_per_update"])
            per_update = r["s_per_update"] * 25000 / r["tgt_per_update"]
            print(f"  {preset}: {PAPER_STEPS[preset]} updates on 1 GPU: {PAPER_STEPS[preset] * per_update / 3600:6.1f} h "
                  f"({per_update * 1e3:.0f} ms per 25k-token update, {'compiled' if c else 'eager'})")
        if eighth:
            c, r = min(eighth, key=lambda cr: cr[1]["s_per_update"] / cr[1]["tgt_per_update"])
            per_update = r["s_per_update"] * 3125 / r["tgt_per_update"]
            params = r["params"]
            allreduce = 2 * 7 / 8 * params * 4 / ASSUMED_BUSBW  # fp32 gradients, ring all-reduce
            print(f"  {preset}: {PAPER_STEPS[preset]} updates on 8 GPUs (3125 tokens each): "
                  f"{PAPER_STEPS[preset] * per_update / 3600:6.1f} h if the gradient all-reduce overlaps the backward, "
                  f"{PAPER_STEPS[preset] * (per_update + allreduce) / 3600:6.1f} h if it does not "
                  f"({allreduce * 1e3:.1f} ms at an ASSUMED {ASSUMED_BUSBW / 1e9:.0f} GB/s bus bandwidth; not measured)")
    if args.profile:
        try:
            profile_update(data, args.profile, int(args.gpu_max_tokens.split(",")[0]))
        except Exception as exc:  # noqa: BLE001
            print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)


def profile_update(data: Path, preset: str, max_tokens: int, updates: int = 4) -> None:
    """Where one update's time goes on the GPU: the top kernels, and the GPU's busy share of the wall time."""
    from torch.profiler import ProfilerActivity, profile

    from nmt_cli.training.config import TrainConfig
    from nmt_cli.training.distributed.process_group import setup_process
    from nmt_cli.training.loop import Trainer
    from nmt_cli.training.plan import plan_run

    cfg = TrainConfig(str(data), str(WORK / "scratch"), preset=preset, precision="bf16", max_tokens=max_tokens,
                      update_freq=1, gpus=1, resume=None)
    plan = plan_run(cfg)
    trainer = Trainer(plan, setup_process(plan.launch, 0, 0, None))
    for _ in range(3):
        trainer.update(next_update(trainer))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(updates):
            trainer.update(next_update(trainer))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"\nprofile {preset} bf16, {updates} updates of {max_tokens} tokens: wall {wall * 1e3 / updates:.1f} ms/update, "
          f"GPU kernels {kernel_us / 1e3 / updates:.1f} ms/update ({100 * kernel_us / 1e6 / wall:.0f}% busy)")
    print(events.table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="peak,base,small")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--seconds", type=float, default=40.0, help="measuring time per configuration")
    ap.add_argument("--window", type=float, default=8.0, help="seconds per measuring window")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--base-max-tokens", type=int, default=8192)
    ap.add_argument("--small-max-tokens", type=int, default=4096)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-too", action="store_true", help="GPU: measure eager and torch.compile")
    ap.add_argument("--compile-shapes", default="buckets", choices=("buckets", "dynamic"),
                    help="with --compile/--compile-too: nmt train --compile-shapes (buckets: 12 shapes compiled first; "
                         "dynamic: one compilation, in the warm-up updates)")
    ap.add_argument("--presets", default="base,big", help="GPU: presets to measure")
    ap.add_argument("--gpu-max-tokens", default="25000,3125",
                    help="GPU: micro-batch sizes (25000: the paper's update on one GPU; 3125: one of 8 GPUs)")
    ap.add_argument("--profile", default="", help="GPU: profile a few updates of this preset")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    sections, precisions = args.sections.split(","), args.precisions.split(",")
    WORK.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}", flush=True)
    if device == "cuda" and "base" in sections:
        # 200k sentences (~11M tokens): ~450 updates of 25k tokens an epoch, as many as real corpora give per
        # length bucket; the 20k of the CPU sections leave a compiled run's buckets a few part-filled batches each
        gpu_main(args, synthetic_data_dir(WORK / "synthetic37k_200k", 37000, n=200_000))
        sections = [s for s in sections if s not in ("peak", "base")]
        precisions = [p for p in precisions if p != "fp32"] or ["bf16"]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    peaks = {p: matmul_peak(dtypes[p], device) for p in precisions}
    for p, v in peaks.items():
        print(f"matmul peak {p}: {v / 1e9:.0f} GFLOP/s", flush=True)
    if "base" in sections:
        data = synthetic_data_dir(WORK / "synthetic37k", 37000)
        for p in precisions:
            r = measure(data, "base", {"dropout": 0.1}, p, args.base_max_tokens, args.seconds, device,
                        compile=args.compile, window=args.window, compile_shapes=args.compile_shapes)
            report("base (synthetic, 37k vocab)", p, r, peaks[p], "(target >= 40% bf16 on CPU)" if p == "bf16" else "")
    if "small" in sections:
        data = multi30k_data_dir(WORK / "multi30k_8k")
        if data is None:
            print(f"small: skipped ({MULTI30K} is absent)")
            return
        small = {"d_model": 256, "d_ff": 1024, "n_heads": 4, "encoder_layers": 3, "decoder_layers": 3}
        for p in precisions:
            r = measure(data, "base", small, p, args.small_max_tokens, args.seconds, device, compile=args.compile,
                        window=args.window, compile_shapes=args.compile_shapes)
            ratio = r["best_tgt_tok_s"] / FAIRSEQ_SMALL_TOK_S
            report("small (Multi30k, 8k vocab)", p, r, peaks[p], f"= {ratio:.2f}x fairseq fp32 (target >= 1.5x)")


if __name__ == "__main__":
    main()
