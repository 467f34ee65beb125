"""Benchmark `nmt translate`: speed (sentences/s, target tokens/s), peak memory, CTranslate2 on the same weights.

    python bench/translate.py                       # everything (the base section on all 3003 lines is slow)
    python bench/translate.py --small-checkpoint runs/multi30k/checkpoint_best.pt   # a trained small model
    python bench/translate.py --ct2-site /tmp/ct2site           # where ctranslate2 lives (pip install --target)
    python bench/translate.py --sections small --repeat 3
    python bench/translate.py --sections latency --small-checkpoint runs/multi30k/run/averaged.pt --repeat 3
    python bench/translate.py --sections small --alpha 0 --nmt fp32-top,int8-top   # CTranslate2 stops as --stop top
    python bench/translate.py --sections small --alpha 0 --max-len 256 ...      # and both stop at 256 tokens
    python bench/translate.py --sections small --small-checkpoint runs/multi30k/run/averaged.pt \
        --ct2-site /tmp/ct2site --hf-site /tmp/hfsite --fairseq-python /tmp/fsvenv/bin/python   # every anchor

Sections:
  small   d_model 256, 3+3 layers, 8k BPE vocabulary (Multi30k), on Multi30k test (1000 lines), beam 4:
          nmt fp32 / bf16 (and fp32 with --stop top, and with --lenpen-form fairseq: CTranslate2's length
          penalty is score / len^alpha) and CTranslate2 fp32 / int8 (exported with `nmt export ctranslate2`) on
          the same weights, alternated in one run; agreement of the two engines' outputs (same weights, same
          search settings) checks the beam search itself. With
          --hf-site / --fairseq-python also Hugging Face generate (bench/hf_marian.py) and fairseq's
          SequenceGenerator (bench/fairseq_gen.py) on the same weights (--anchor-sections picks the sections).
  base    the paper's base model (random weights, 32k BPE vocabulary) on newstest2014 en (3003 lines), beam 4;
          its vocabulary shortlist learned from 200,000 pairs of bench/wmt_synth.py's WMT-sized synthetic corpus.

Shortlists: a checkpoint with one is decoded over its candidates (nmt's default on a CPU); '-nosl' configurations
score the whole vocabulary, and CTranslate2's '-vmap' ones use the same candidates through the export's vmap.txt.
  big     the paper's big shape (1024/4096, 16 heads; random weights, 32k vocabulary), as base (GPU).
  stream  peak memory and time to the first output line of `nmt translate` on a generated N-line input.
  latency one sentence a call (where a person waits: the web page, an editor plug-in), the small model on the first
          --latency-lines Multi30k test lines, beam 4: nmt's `Translator.translate([line])` against CTranslate2's
          `translate_batch([pieces])` (text to text on both sides), each in its own process, alternated; the median,
          90th percentile and mean milliseconds a sentence, and the ratio of the medians.

Random weights never choose EOS on purpose, so with them every output runs to a FIXED length (said in the
printout): nmt gets max-len-a 0, max-len-b L+1 (L tokens + EOS), CTranslate2 max_decoding_length L.
Each measurement runs in its own process (clean peak memory); CTranslate2 needs `pip install ctranslate2` (a
separate venv is fine: pass its site-packages with --ct2-site). Artifacts go to runs/bench_translate/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
WORK = ROOT / "runs" / "bench_translate"
MULTI30K = DATA / "multi30k"
NEWSTEST = DATA / "wmt14_newstest_ende"

# Quoted figures, not measured here (a trained small Multi30k model, 2 threads, beam 4, on one of the machines it was measured
# on); --hf-site / --fairseq-python measure the anchors in the same run instead.
QUOTED = "fairseq-generate ~80 sent/s, CTranslate2 fp32 ~100-120, CTranslate2 int8 ~165 (trained small model)"


def read_lines(path: Path, n: int | None = None) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n else lines


def peak_mb() -> float:
    """This process's peak resident memory in MB: VmHWM on Linux. Not ru_maxrss there: a process started by
    fork (or vfork) and exec keeps its parent's peak in it, so a small job started by a large parent reads the
    parent's peak (CTranslate2's job read ~300-435 MB that way, against ~210 MB of its own)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):  # not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_mb() -> float:
    """This process's resident memory now in MB (VmRSS): taken right after the engine's import, so that a peak can
    be read beyond what importing the engine holds (`import torch` alone is ~218 MB, CTranslate2's whole peak on
    the small model about as much)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):  # not Linux
        return 0.0


# ------------------------------------------------------------------------------------------------ artifacts


def make_random_checkpoint(path: Path, corpus: list[Path], vocab_size: int, **config) -> Path:
    """A BPE model on `corpus` and a random Transformer, saved as an nmt checkpoint (cached; the BPE model too, in
    WORK/bpe_{vocab_size}.model, shared by the sections of one vocabulary size)."""
    if path.exists():
        return path
    import torch

    from nmt_cli.checkpoints import format as checkpoint
    from nmt_cli.config import ModelConfig
    from nmt_cli.data.tokenizer import Tokenizer, train_bpe
    from nmt_cli.model import Transformer

    bpe = WORK / f"bpe_{vocab_size}.model"
    if bpe.exists():
        tokenizer = bpe.read_bytes()
    else:
        sentences = [line for p in corpus for line in read_lines(p)]
        tokenizer = train_bpe(sentences, vocab_size, seed_sentences=200_000)
        bpe.write_bytes(tokenizer)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=Tokenizer(tokenizer).vocab_size, dropout=0.0, **config))
    meta = {"note": "random weights (bench/translate.py)"}
    checkpoint.save(checkpoint.Checkpoint(model.config, model.state_dict(), tokenizer, {"src": "en", "tgt": "de"},
                                          meta=meta), path)
    return path


def with_synthetic_shortlist(path: Path, pairs: int = 200_000) -> Path:
    """A copy of a random-weight checkpoint with a vocabulary shortlist learned from `pairs` pairs of the WMT-sized
    synthetic corpus (bench/wmt_synth.py: Europarl and TED pairs, numbers and names varied), as `nmt prepare` learns
    one from its train split (cached beside it). Speed only: random weights make any shortlist as good as another."""
    out = path.with_name(path.stem + ".shortlist.pt")
    if out.exists() and out.stat().st_mtime >= path.stat().st_mtime:
        return out
    import random

    import numpy as np

    from nmt_cli.checkpoints import format as checkpoint
    from nmt_cli.data import shortlist

    sys.path.insert(0, str(ROOT / "bench"))
    import wmt_synth

    ckpt = checkpoint.load(path)
    rng = random.Random(1)
    base = wmt_synth.pool(DATA)
    name_pool = wmt_synth.names(50_000, rng)
    text = [wmt_synth.vary(*base[i % len(base)], rng, name_pool) for i in range(pairs)]
    tok = ckpt.tokenizer_obj()
    src, tgt = tok.encode([p[0] for p in text]), tok.encode([p[1] for p in text], side="target")
    ids = [(np.asarray(s, dtype=np.int64), np.asarray(t, dtype=np.int64)) for s, t in zip(src, tgt, strict=True)]
    ckpt.shortlist = shortlist.learn(ids, ckpt.model_config.vocab_size).to_dict()
    ckpt.meta["note"] = f"random weights, a shortlist from {pairs} synthetic WMT-like pairs (bench/translate.py)"
    checkpoint.save(ckpt, out)
    return out


def small_random_checkpoint() -> Path:
    """The small sections' model when no trained one is given: Multi30k's shape (d_model 256, 3+3 layers, 8k BPE)."""
    return make_random_checkpoint(WORK / "small_random.pt", [MULTI30K / "train.en", MULTI30K / "train.de"], 8000,
                                  d_model=256, d_ff=1024, n_heads=4, encoder_layers=3, decoder_layers=3)


def convert_to_ct2(ckpt_path: Path, out_dir: Path) -> Path:
    """An nmt checkpoint as a CTranslate2 model: `nmt export ctranslate2` (nmt_cli.export.ctranslate2), float32.

    The conversion is cached in `out_dir` together with the checkpoint it came from (path, size, mtime): a cached
    model of another checkpoint is converted again, never reused (a stale random-weight model reused for a trained
    checkpoint never emits EOS and decodes to the maximum length on every line). The model adds the source EOS
    itself (`add_source_eos`): callers pass plain sentencepiece pieces.
    """
    stat = ckpt_path.resolve().stat()
    source = json.dumps({"checkpoint": str(ckpt_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    if (out_dir / "model.bin").exists() and (out_dir / "nmt_source.json").exists() \
            and (out_dir / "nmt_source.json").read_text() == source:
        return out_dir
    from nmt_cli.checkpoints import format as checkpoint
    from nmt_cli.export import ctranslate2 as ct2_export

    ct2_export.export(checkpoint.load(ckpt_path), out_dir, replace=True)
    (out_dir / "nmt_source.json").write_text(source)
    return out_dir


# ------------------------------------------------------------------------------------------------ jobs (subprocess)


def job_nmt(a: dict) -> dict:
    import torch

    imported = resident_mb()

    from nmt_cli.decoding import SearchConfig
    from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints

    torch.set_num_threads(a["threads"])
    lines = read_lines(Path(a["input"]), a.get("n"))
    # "fp32-top": --stop top; "fp32-fairseq": --lenpen-form fairseq; "int8-nojoin": batches one after the other;
    # "fp32-w1", "fp32-w2": --workers 1 or 2; "fp32-nosl": --no-shortlist; "fp32-sl16": --shortlist-size 16
    precision, *flags = a["precision"].split("-")
    workers = next((int(f[1:]) for f in flags if f[:1] == "w" and f[1:].isdigit()), None)
    size = next((int(f[2:]) for f in flags if f[:2] == "sl" and f[2:].isdigit()), None)
    search = SearchConfig(beam=a["beam"], alpha=a["alpha"], max_len_a=a["max_len_a"], max_len_b=a["max_len_b"],
                          stop="top" if "top" in flags else "beam", lp="fairseq" if "fairseq" in flags else "gnmt")
    config = TranslateConfig(search=search, max_tokens=a["max_tokens"], buffer_size=len(lines),
                             join_batches="nojoin" not in flags, workers=workers,
                             cuda_graphs="graph" in flags, shortlist="nosl" not in flags, shortlist_size=size)
    device = a.get("device", "cpu")
    tr = Translator(load_checkpoints([a["checkpoint"]]), device, precision, config)
    tr.translate(lines[:32] if device == "cpu" else lines[:600])  # warm-up (GPU: kernels for many shapes)
    tr.src_tokens = tr.tgt_tokens = 0
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if a.get("profile"):
        return profile_translate(tr, lines)
    out = tr.translate(lines)
    seconds = time.perf_counter() - start
    Path(a["output"]).write_text("".join(hyps[0][1] + "\n" for hyps in out), encoding="utf-8")
    result = {"seconds": seconds, "sentences": len(lines), "tgt_tokens": tr.tgt_tokens, "peak_mb": peak_mb(),
              "import_mb": imported}
    if device == "cuda":
        result["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        if tr.graphs is not None:  # warm-up included
            g = tr.graphs
            result["graphs"] = f"{g.recorded} recorded, {g.replayed} replayed, {g.eager} eager{g.broken or ''}"
    return result


def profile_translate(tr, lines: list[str]) -> dict:
    """Where decoding time goes on the GPU: kernel time against wall time, top ops by CPU and by GPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        tr.translate(lines)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"profile: {len(lines)} lines in {wall:.2f} s wall, GPU kernels {kernel_us / 1e6:.2f} s "
          f"({100 * kernel_us / 1e6 / wall:.0f}% busy)", file=sys.stderr)
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50), file=sys.stderr)
    print(events.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=50), file=sys.stderr)
    return {"seconds": wall, "sentences": len(lines), "tgt_tokens": tr.tgt_tokens, "peak_mb": peak_mb(),
            "gpu_busy": kernel_us / 1e6 / wall}


def job_ct2(a: dict) -> dict:
    if a.get("ct2_site"):
        sys.path.append(a["ct2_site"])
    import ctranslate2
    import sentencepiece

    imported = resident_mb()
    # neither torch nor the nmt checkpoint in this process (its peak memory is CTranslate2's alone): the parent
    # converted the model, and the export holds the tokenizer (nmt_cli.export.ctranslate2.SPM_FILE, or source.spm
    # and target.spm; that module imports torch, so the names are written out here)
    model_dir = Path(a["ct2_dir"])
    if (model_dir / "source.spm").exists():
        raise SystemExit("separate source and target vocabularies: not measured here")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.model"))
    lines = read_lines(Path(a["input"]), a.get("n"))
    device = a.get("device", "cpu")
    # "float32-streams": inter_threads 2, as nmt's 2 streams; "int8-vmap": use_vmap (the export's vmap.txt: the
    # checkpoint's shortlist)
    compute_type, *flags = a["compute_type"].split("-")
    inter = min(2, a["threads"]) if "streams" in flags and device == "cpu" else 1
    tr = ctranslate2.Translator(str(model_dir), device=device, compute_type=compute_type,
                                intra_threads=max(1, a["threads"] // inter) if device == "cpu" else 1,
                                inter_threads=inter)
    kwargs = dict(beam_size=a["beam"], length_penalty=a["alpha"], max_decoding_length=a["max_decoding_length"],
                  max_batch_size=a["max_tokens"], batch_type="tokens", use_vmap="vmap" in flags)
    if "vmap" in flags and not (model_dir / "vmap.txt").exists():
        raise SystemExit("no vmap.txt in the export: the checkpoint has no shortlist")
    warm = lines[:32] if device == "cpu" else lines[:600]
    tr.translate_batch([sp.encode(line, out_type=str) for line in warm], **kwargs)
    # text to text, as nmt's time is: sentencepiece's encoding and decoding inside the timer (~80 ms of one core
    # for newstest2014's 3003 lines: 5% of a GPU pass)
    start = time.perf_counter()
    src = [sp.encode(line, out_type=str) for line in lines]  # the model appends </s> (add_source_eos)
    hyps = [r.hypotheses[0] for r in tr.translate_batch(src, **kwargs)]
    text = [sp.decode_pieces(h) for h in hyps]
    seconds = time.perf_counter() - start
    Path(a["output"]).write_text("".join(t + "\n" for t in text), encoding="utf-8")
    return {"seconds": seconds, "sentences": len(lines), "tgt_tokens": sum(len(h) + 1 for h in hyps),
            "peak_mb": peak_mb(), "import_mb": imported}


def job_stream(a: dict) -> dict:
    """Pipe a generated N-line input through the `nmt translate` CLI; peak memory, time to the first line."""
    import random

    rng = random.Random(0)
    words = read_lines(MULTI30K / "test.en")
    cmd = [sys.executable, "-m", "nmt_cli.cli", "translate", "-m", a["checkpoint"], "--beam", "1",
           "--max-len-a", "0", "--max-len-b", str(a["max_len_b"]), "--threads", str(a["threads"])]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def feed():
        for _ in range(a["n"]):
            proc.stdin.write((rng.choice(words) + "\n").encode())
        proc.stdin.close()

    import threading

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    first = proc.stdout.readline()
    first_s = time.perf_counter() - start
    count = 1 if first else 0
    for _ in proc.stdout:
        count += 1
    proc.wait()
    writer.join()
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"seconds": time.perf_counter() - start, "sentences": count, "first_line_s": first_s,
            "peak_mb": child_peak, "rc": proc.returncode}


def _timed_calls(translate_one, lines: list[str], imported: float) -> dict:
    """Each line translated alone, after 10 warm-up calls: per-call seconds, the outputs, peak memory (and resident
    memory after the engine's import: `imported`)."""
    for line in lines[:10]:
        translate_one(line)
    times, out = [], []
    for line in lines:
        start = time.perf_counter()
        out.append(translate_one(line))
        times.append(time.perf_counter() - start)
    return {"times": times, "outputs": out, "peak_mb": peak_mb(), "import_mb": imported}


def job_nmt_latency(a: dict) -> dict:
    """`Translator.translate([line])`, one line a call (the library call a server or an editor makes)."""
    import torch

    imported = resident_mb()
    from nmt_cli.decoding import SearchConfig
    from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints

    torch.set_num_threads(a["threads"])
    search = SearchConfig(beam=a["beam"], alpha=a["alpha"], max_len_a=a["max_len_a"], max_len_b=a["max_len_b"])
    tr = Translator(load_checkpoints([a["checkpoint"]]), "cpu", a["precision"], TranslateConfig(search=search))
    return _timed_calls(lambda line: tr.translate([line])[0][0].text, read_lines(Path(a["input"]), a["n"]), imported)


def job_ct2_latency(a: dict) -> dict:
    """CTranslate2's `translate_batch([pieces])`, one line a call, sentencepiece inside the timer (as nmt's)."""
    if a.get("ct2_site"):
        sys.path.append(a["ct2_site"])
    import ctranslate2
    import sentencepiece

    imported = resident_mb()
    model_dir = Path(a["ct2_dir"])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.model"))
    tr = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=a["compute_type"],
                                intra_threads=a["threads"], inter_threads=1)
    kwargs = dict(beam_size=a["beam"], length_penalty=a["alpha"], max_decoding_length=a["max_decoding_length"])

    def one(line: str) -> str:
        hyp = tr.translate_batch([sp.encode(line, out_type=str)], **kwargs)[0].hypotheses[0]
        return sp.decode_pieces(hyp)

    return _timed_calls(one, read_lines(Path(a["input"]), a["n"]), imported)


def latency(ckpt: Path, trained: bool, args) -> None:
    """The `latency` section (module docstring): nmt and CTranslate2 alternated, --repeat rounds; each
    configuration's figures are over all its calls of all rounds."""
    common = dict(checkpoint=str(ckpt), input=str(MULTI30K / "test.en"), n=args.latency_lines, threads=args.threads,
                  beam=4, alpha=args.alpha)
    lengths = dict(max_len_a=1.0, max_len_b=50) if trained else dict(max_len_a=0.0, max_len_b=21)
    ct2_len = 256 if trained else 20
    what = "trained" if trained else "RANDOM weights, FIXED output length 20 tokens"
    print(f"latency: one sentence a call, {args.latency_lines} Multi30k test lines, beam 4, {args.threads} threads, "
          f"small model ({what}: {ckpt})")
    configs = [("nmt", p) for p in args.nmt_latency.split(",")]
    if not args.no_ct2:
        convert_to_ct2(Path(ckpt), WORK / "ct2_small")
        configs += [("ct2", c) for c in args.ct2.split(",")]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in configs}
    outputs, peaks, errors = {}, {}, {}
    for _ in range(args.repeat):
        for engine, prec in configs:
            if engine == "nmt":
                r = run_job("nmt_latency", precision=prec, **common, **lengths)
            else:
                r = run_job("ct2_latency", compute_type=prec, ct2_site=args.ct2_site, ct2_dir=str(WORK / "ct2_small"),
                            max_decoding_length=ct2_len, **common)
            if "error" in r:
                errors[engine, prec] = r["error"]
                continue
            times[engine, prec] += r["times"]
            outputs[engine, prec], peaks[engine, prec] = r["outputs"], (r["peak_mb"], r["peak_mb"] - r["import_mb"])
    medians = {}
    for (engine, prec), ts in times.items():
        label = f"{'nmt' if engine == 'nmt' else 'CTranslate2'} {prec}"
        if not ts:
            print(f"  {label:<22} error: {errors.get((engine, prec), 'no result')}")
            continue
        ts = sorted(ts)
        medians[engine, prec] = statistics.median(ts)
        print(f"  {label:<22} median {1000 * medians[engine, prec]:6.1f} ms  p90 {1000 * ts[int(0.9 * len(ts))]:6.1f} ms"
              f"  mean {1000 * statistics.mean(ts):6.1f} ms  peak {peaks[engine, prec][0]:5.0f} MB "
              f"({peaks[engine, prec][1]:4.0f} beyond import)  ({len(ts)} calls)")
    for ours, theirs in ((("nmt", "fp32"), ("ct2", "float32")), (("nmt", "int8"), ("ct2", "int8"))):
        if ours in medians and theirs in medians:
            same = sum(x == y for x, y in zip(outputs[ours], outputs[theirs], strict=True))
            print(f"  nmt {ours[1]} / CTranslate2 {theirs[1]}: {medians[ours] / medians[theirs]:.2f}x the time a "
                  f"sentence (medians); {same}/{len(outputs[ours])} outputs identical")
    print()


JOBS = {"nmt": job_nmt, "ct2": job_ct2, "stream": job_stream, "nmt_latency": job_nmt_latency,
        "ct2_latency": job_ct2_latency}
# Anchors that live in their own environments, run as scripts that print one JSON line (seconds, sentences, ...):
# Hugging Face generate on the weights converted to a MarianMTModel, fairseq's SequenceGenerator on the weights
# converted to a fairseq TransformerModel (see each script's docstring for its install line).
ANCHOR_SCRIPTS = {"hf": ROOT / "bench" / "hf_marian.py", "fairseq": ROOT / "bench" / "fairseq_gen.py"}


def run_anchor(kind: str, python: str, site: str | None, a: dict) -> dict:
    """Run bench/hf_marian.py or bench/fairseq_gen.py on the same input, lengths and threads as the nmt job."""
    cmd = [python, str(ANCHOR_SCRIPTS[kind]), a["checkpoint"], a["input"], a["output"], "--threads", str(a["threads"]),
           "--beam", str(a["beam"]), "--lenpen", str(a["alpha"])]
    if a.get("fixed_len"):
        cmd += ["--fixed-length", str(a["fixed_len"])]
    else:
        cmd += ["--max-len-a", str(a["max_len_a"]), "--max-len-b", str(a["max_len_b"])]
    if a.get("n"):
        cmd += ["-n", str(a["n"])]
    if site:
        cmd += ["--hf-site", site]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_job(kind: str, show_stderr: bool = False, **args) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--job", json.dumps({"kind": kind, **args})],
                          capture_output=True, text=True)
    if show_stderr:
        print(proc.stderr, flush=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ report


def row(label: str, r: dict) -> str:
    if "error" in r:
        return f"  {label:<34} error: {r['error']}"
    sps, tps = r["sentences"] / r["seconds"], r["tgt_tokens"] / r["seconds"]
    gpu = f"  GPU peak {r['gpu_peak_mb']:6.0f} MB" if "gpu_peak_mb" in r else ""
    gpu += f"  graph steps: {r['graphs']}" if "graphs" in r else ""
    median = f", median of {r['runs']} {r['median_s']:.2f} s" if r.get("runs", 1) > 2 else ""
    if "import_mb" in r:  # the peak beyond the engine's import (its resident memory right after importing it)
        gpu = f" ({r['peak_mb'] - r['import_mb']:5.0f} beyond import){gpu}"
    return (f"  {label:<34} {sps:8.1f} sent/s {tps:9.0f} tgt tok/s  peak {r['peak_mb']:7.0f} MB{gpu}  "
            f"({r['seconds']:.2f} s{median})")


def best(runs: list[dict]) -> dict:
    """The fastest run, with the median time of all (`median_s`, `runs`): on a shared machine they can differ
    by 20-40%, and a comparison should hold for both."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    return {**min(ok, key=lambda r: r["seconds"]), "median_s": statistics.median(r["seconds"] for r in ok),
            "runs": len(ok)}


def agreement(a: Path, b: Path) -> float:
    x, y = read_lines(a), read_lines(b)
    return sum(p == q for p, q in zip(x, y, strict=True)) / max(len(x), 1)


def bleu(hyp: Path, ref: Path) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(read_lines(hyp), [read_lines(ref)]).score


def compare(name: str, ckpt: Path, src: Path, ref: Path | None, args, trained: bool, fixed_len: int) -> None:
    """nmt fp32/bf16 and CTranslate2 fp32/int8 on the same weights, alternated, best of --repeat."""
    common = dict(checkpoint=str(ckpt), input=str(src), n=args.lines.get(name), threads=args.threads, beam=4,
                  alpha=args.alpha, max_tokens=args.max_tokens, device=args.device)
    if trained and args.max_len:
        lengths = dict(max_len_a=0.0, max_len_b=args.max_len + 1)
        ct2_len = args.max_len
        print(f"{name}: trained model {ckpt}; max output length {args.max_len} tokens (+EOS for nmt), both engines")
    elif trained:
        lengths = dict(max_len_a=1.0, max_len_b=50)
        ct2_len = 256
        print(f"{name}: trained model {ckpt}; max output length = source + 50 (nmt), 256 (CTranslate2)")
    else:
        lengths = dict(max_len_a=0.0, max_len_b=fixed_len + 1)
        ct2_len = fixed_len
        print(f"{name}: RANDOM weights, FIXED output length {fixed_len} tokens (+EOS for nmt)")
    configs = [("nmt", prec) for prec in args.nmt.split(",")]
    if not args.no_ct2:
        configs += [("ct2", c) for c in args.ct2.split(",")]
    if args.hf_site and name in args.anchor_sections:
        configs.append(("hf", "fp32"))
    if args.fairseq_python and name in args.anchor_sections:
        configs.append(("fairseq", "fp32"))
    results: dict[tuple[str, str], list[dict]] = {c: [] for c in configs}
    outputs = {c: WORK / f"{name}.{c[0]}.{c[1]}.out" for c in configs}
    if any(engine == "ct2" for engine, _ in configs):
        convert_to_ct2(Path(ckpt), WORK / f"ct2_{name}")  # here: CTranslate2's jobs load no torch
    for _ in range(args.repeat):
        for engine, prec in configs:
            if engine == "nmt":
                r = run_job("nmt", precision=prec, output=str(outputs[engine, prec]), **common, **lengths)
            elif engine in ANCHOR_SCRIPTS:
                python = args.fairseq_python if engine == "fairseq" else sys.executable
                r = run_anchor(engine, python, args.hf_site if engine == "hf" else None,
                               {**common, **lengths, "output": str(outputs[engine, prec]),
                                "fixed_len": None if trained else fixed_len})
            else:
                r = run_job("ct2", compute_type=prec, output=str(outputs[engine, prec]), ct2_site=args.ct2_site,
                            ct2_dir=str(WORK / f"ct2_{name}"), max_decoding_length=ct2_len, **common)
            results[engine, prec].append(r)
    speeds = {c: (best(runs)["sentences"] / best(runs)["seconds"], best(runs)["sentences"] / best(runs)["median_s"])
              for c, runs in results.items() if "error" not in best(runs)}
    for (engine, prec), runs in results.items():
        label = {"nmt": "nmt " + prec.replace("-top", " --stop top").replace("-fairseq", " --lenpen-form fairseq")
                 .replace("-nojoin", " (no joining)").replace("-w1", " --workers 1").replace("-w2", " --workers 2")
                 .replace("-graph", " --cuda-graphs").replace("-nosl", " --no-shortlist").replace("-sl", " --shortlist-size "),
                 "ct2": f"CTranslate2 {prec}".replace("-streams", " inter_threads 2").replace("-vmap", " use_vmap"),
                 "hf": "Hugging Face generate fp32",
                 "fairseq": "fairseq SequenceGenerator fp32"}[engine]
        print(row(label, best(runs)))
    if args.profile and args.device == "cuda":
        prec = args.nmt.split(",")[0]
        run_job("nmt", show_stderr=True, precision=prec, output=str(WORK / "profile.out"), profile=True,
                **common, **lengths)
    for (e1, p1), (b1, m1) in speeds.items():  # nmt against CTranslate2 of the same precision, sentences/s
        for (e2, p2), (b2, m2) in speeds.items():
            if e1 == "nmt" and e2 == "ct2" and p1.startswith("fp32") == p2.startswith("float32") \
                    and p1.startswith("int8") == p2.startswith("int8"):
                print(f"  speed nmt {p1} / CTranslate2 {p2}: {b1 / b2:.2f}x (best runs), {m1 / m2:.2f}x (medians)")
    have = {c for c, runs in results.items() if any("error" not in r for r in runs)}
    pairs = [(("nmt", "fp32"), ("ct2", "float32")), (("nmt", "fp32-top"), ("ct2", "float32")),
             (("nmt", "fp32-fairseq"), ("ct2", "float32")),
             (("nmt", "fp16"), ("ct2", "float16")), (("nmt", "fp16-top"), ("ct2", "float16")),
             (("nmt", "fp32"), ("nmt", "fp16")),
             (("nmt", "fp32"), ("nmt", "fp32-top")), (("nmt", "fp32"), ("nmt", "bf16")),
             (("nmt", "fp32"), ("nmt", "int8")), (("nmt", "int8"), ("ct2", "int8")),
             (("nmt", "int8-top"), ("ct2", "int8")), (("nmt", "fp32"), ("nmt", "fp32-nojoin")),
             (("nmt", "int8"), ("nmt", "int8-nojoin")), (("nmt", "fp32"), ("nmt", "fp32-w1")), (("nmt", "fp32"), ("nmt", "fp32-w2")),
             (("nmt", "fp32"), ("ct2", "float32-streams")), (("nmt", "int8"), ("ct2", "int8-streams")), (("nmt", "int8-top"), ("nmt", "int8-top-nojoin")),
             (("nmt", "fp32"), ("hf", "fp32")), (("nmt", "fp32"), ("fairseq", "fp32")),
             (("nmt", "fp16"), ("nmt", "fp16-graph")), (("nmt", "fp32"), ("nmt", "fp32-graph")),
             (("nmt", "fp16-graph"), ("ct2", "float16")), (("nmt", "fp32-graph"), ("ct2", "float32")),
             (("nmt", "fp32"), ("nmt", "fp32-nosl")), (("nmt", "int8"), ("nmt", "int8-nosl")),
             (("nmt", "fp32"), ("ct2", "float32-vmap")), (("nmt", "int8"), ("ct2", "int8-vmap"))]
    for p, q in pairs:
        if p in have and q in have:
            print(f"  identical lines {p[0]} {p[1]} vs {q[0]} {q[1]}: {100 * agreement(outputs[p], outputs[q]):.1f}%")
    if trained and ref is not None and not args.lines.get(name):
        for c in sorted(have):
            print(f"  BLEU {c[0]} {c[1]}: {bleu(outputs[c], ref):.2f}")
    print()


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--sections", default="small,base,stream")
    p.add_argument("--small-checkpoint", type=Path, help="A trained small Multi30k model (default: random weights).")
    p.add_argument("--base-checkpoint", type=Path, help="A trained base model (default: random weights).")
    p.add_argument("--ct2-site", default=os.environ.get("NMT_BENCH_CT2_SITE"),
                   help="site-packages holding ctranslate2 if it is not importable here.")
    p.add_argument("--no-ct2", action="store_true")
    p.add_argument("--hf-site", default=os.environ.get("NMT_BENCH_HF_SITE"),
                   help="Directory holding `transformers` (pip install --target DIR transformers): adds the Hugging "
                        "Face generate anchor (bench/hf_marian.py).")
    p.add_argument("--fairseq-python", default=os.environ.get("NMT_BENCH_FAIRSEQ_PYTHON"),
                   help="Python of an environment with fairseq: adds the fairseq anchor (bench/fairseq_gen.py).")
    p.add_argument("--anchor-sections", default="small",
                   help="Sections that also run the Hugging Face / fairseq anchors (they are slow on base).")
    p.add_argument("--nmt", default="fp32,fp32-top,fp32-fairseq,bf16",
                   help="nmt configurations: precisions, '-fairseq' adds --lenpen-form fairseq (CTranslate2's and "
                        "Hugging Face's length penalty form), '-top' adds --stop top (OpenNMT-py's stopping rule; "
                        "CTranslate2, fairseq and Hugging Face stop as nmt's default; CTranslate2 as --stop top "
                        "with --alpha 0), '-nojoin' runs the batches one after the other (no continuous batching), '-w1' decodes "
                        "as one stream and '-w2' as two (--workers 1 or 2; the default: 1), "
                        "'-graph' decodes with CUDA graphs "
                        "(--cuda-graphs; GPU), '-nosl' scores the whole vocabulary (--no-shortlist), '-sl16' takes 16 "
                        "pieces per source piece (--shortlist-size 16).")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--alpha", type=float, default=0.6,
                   help="Length penalty of every engine. 0 (none) lets CTranslate2 stop a sentence once its best "
                        "candidate ended, as nmt's --stop top does: the like-with-like comparison of that rule.")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: nmt on the GPU (--nmt fp32,bf16,fp16) against CTranslate2 on the GPU (--ct2 "
                        "float16,int8_float16).")
    p.add_argument("--ct2", default=None, help="CTranslate2 compute types [cpu: float32,int8; cuda: "
                                               "float32,float16,int8_float16]; '-streams' (cpu) runs 2 "
                                               "translators of threads/2 threads each (inter_threads 2); '-vmap' "
                                               "translates with use_vmap (the export's vmap.txt: the checkpoint's "
                                               "shortlist).")
    p.add_argument("--profile", action="store_true",
                   help="cuda: also profile nmt's first --nmt configuration (GPU busy share, top ops).")
    p.add_argument("--max-len", type=int, default=None,
                   help="Trained models: both engines stop a sentence at this many tokens (nmt --max-len-a 0 "
                        "--max-len-b N+1, CTranslate2 max_decoding_length N). Default: nmt source + 50, CTranslate2 "
                        "256, which lets CTranslate2 run a looping output 200 steps further than nmt.")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="Batch size of both engines in padded source tokens [nmt's default: cpu 2000, cuda 6000].")
    p.add_argument("--repeat", type=int, default=2, help="Runs per configuration (alternated); the best is shown.")
    p.add_argument("--base-lines", type=int, default=None, help="First N lines of newstest2014 (default: all 3003).")
    p.add_argument("--stream-lines", type=int, default=1_000_000)
    p.add_argument("--latency-lines", type=int, default=50, help="latency: Multi30k test lines, one a call.")
    p.add_argument("--nmt-latency", default="fp32,int8", help="latency: nmt's precisions.")
    args = p.parse_args()
    if args.job:
        spec = json.loads(args.job)
        print(json.dumps(JOBS[spec.pop("kind")](spec)))
        return
    if not DATA.exists():
        sys.exit(f"{DATA} is missing: the benchmark reads ../shared/data (see its README)")
    WORK.mkdir(parents=True, exist_ok=True)
    args.lines = {"base": args.base_lines, "big": args.base_lines}
    if args.max_tokens is None:
        args.max_tokens = 2000 if args.device == "cpu" else 6000
    if args.ct2 is None:
        args.ct2 = "float32,int8" if args.device == "cpu" else "float32,float16,int8_float16"
    sections = args.sections.split(",")
    where = f"{args.threads} threads" if args.device == "cpu" else f"on {_gpu_name()}"
    print(f"nmt translate benchmark: {where}, beam 4, alpha {args.alpha} (GNMT form), batches of {args.max_tokens} tokens; "
          f"{os.cpu_count()} CPUs")
    anchors = "measured below" if (args.hf_site or args.fairseq_python) else "not measured: see --hf-site/--fairseq-python"
    print(f"quoted figures (not measured here): {QUOTED}; Hugging Face / fairseq anchors: {anchors}\n")
    if "small" in sections:
        ckpt = args.small_checkpoint or small_random_checkpoint()
        compare("small", ckpt, MULTI30K / "test.en", MULTI30K / "test.de", args, args.small_checkpoint is not None, 20)
    if "base" in sections:
        corpus = [DATA / "europarl_v7_ende_20k" / f"train.{lang}" for lang in ("en", "de")]
        corpus = [c for c in corpus if c.exists()] or [NEWSTEST / "valid.en", NEWSTEST / "valid.de"]
        ckpt = args.base_checkpoint or with_synthetic_shortlist(make_random_checkpoint(WORK / "base_random.pt", corpus,
                                                                                       32000))
        compare("base", ckpt, NEWSTEST / "test.en", NEWSTEST / "test.de", args, args.base_checkpoint is not None, 32)
    if "big" in sections:  # the paper's big shape (1024/4096, 16 heads), random weights
        corpus = [DATA / "europarl_v7_ende_20k" / f"train.{lang}" for lang in ("en", "de")]
        corpus = [c for c in corpus if c.exists()] or [NEWSTEST / "valid.en", NEWSTEST / "valid.de"]
        ckpt = make_random_checkpoint(WORK / "big_random.pt", corpus, 32000, d_model=1024, d_ff=4096, n_heads=16)
        compare("big", ckpt, NEWSTEST / "test.en", NEWSTEST / "test.de", args, False, 32)
    if "latency" in sections:
        ckpt = args.small_checkpoint or small_random_checkpoint()
        latency(ckpt, args.small_checkpoint is not None, args)
    if "stream" in sections:
        tiny = make_random_checkpoint(WORK / "stream_tiny.pt", [MULTI30K / "train.en", MULTI30K / "train.de"], 8000,
                                      d_model=64, d_ff=128, n_heads=2, encoder_layers=1, decoder_layers=1)
        print("stream: `nmt translate` CLI (tiny random model, greedy, 2 output tokens) on generated input")
        for n in sorted({10_000, args.stream_lines}):
            r = run_job("stream", checkpoint=str(tiny), n=n, threads=args.threads, max_len_b=2)
            if "error" in r:
                print(f"  {n:>9} lines: error: {r['error']}")
                continue
            print(f"  {n:>9} lines: peak memory {r['peak_mb']:6.0f} MB, first output line after {r['first_line_s']:.2f} s, "
                  f"{r['sentences']} lines out in {r['seconds']:.0f} s (rc {r['rc']})")


if __name__ == "__main__":
    main()
