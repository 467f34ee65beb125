"""Benchmark `nmt prepare`: sentence pairs/s per stage and peak memory.

    python bench/prepare.py                     # multi30k, europarl 20k, europarl x10 and x20 (memory check)
    python bench/prepare.py --corpora multi30k --workers 2
    python bench/prepare.py --pairs 1000000,4500000   # WMT scale: the whole `nmt prepare wmt14-en-de`
    python bench/prepare.py --pairs 10000000          # peak memory at 10M pairs (WMT14 en-fr: 40.8M)

WMT scale (--pairs N[,N...]): the real WMT14 data cannot be downloaded here, so bench/wmt_synth.py synthesises
N pairs from the shared Europarl and TED corpora (numbers and names varied; lengths and vocabulary stay real)
and lays them out as the pinned wmt/wmt14 de-en files in a temporary huggingface_hub cache. Then, in a fresh
process with HF_HUB_OFFLINE=1, `nmt prepare wmt14-en-de` runs with its defaults (37k joint BPE learned on a
uniform sample of at most 2M sentences, all cores): cache check (sha256 of every file), count, BPE, encode +
binarize, manifest. Targets: the whole prepare of 4.5M pairs in under 5 minutes on the 2-core
machine, peak memory under 2 GiB and the same at 1M and 4.5M pairs. WMT14 en-fr (40.8M pairs) is projected from
the largest run: its BPE time (bounded sample, the same at any size) plus the per-pair time of everything else.

Corpora (from ../shared/data, read in place):
  multi30k       Multi30k en-de: 29,000 / 1,014 / 1,000 pairs, 8k joint BPE (as `nmt prepare custom` for the
                 Multi30k benchmark)
  europarl       the first 20,000 pairs of Europarl v7 (part of WMT14 en-de training data) + newstest2013/2014
  europarl_x10   the same 20k pairs repeated 10 and 20 times (200k / 400k pairs, written to a temporary folder):
  europarl_x20   peak memory must not grow with the corpus (streaming encode in 50k-pair chunks, bounded BPE
                 sample: --bpe-sample 40000 for all europarl runs so the BPE stage is the same size)

Stages: check (open and count every input), bpe (sample + learn the joint BPE), encode (read, clean, encode on
all cores, write .bin/.idx and raw text), per split. Each corpus runs in a fresh process so its peak RSS
(VmHWM) is its own. Target: encode + binarize >= 20,000 pairs/s on the 2-core machine.
Besides wall-clock pairs/s, the table shows pairs per CPU-second (process CPU time, all threads): on a machine
shared with other jobs the wall figure drops, while pairs/CPU-s x cores bounds what an idle machine reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from translate import peak_mb  # bench/translate.py, beside this script: this process's own peak

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
TARGET_PAIRS_S = 20_000
TARGET_WMT_S = 300  # the whole prepare of 4.5M pairs
TARGET_RSS_MIB = 2048
ENFR_PAIRS = 40_836_715


def corpus_args(name: str, tmp: Path) -> dict:
    if name == "multi30k":
        d = DATA / "multi30k"
        return dict(train=d / "train", valid=d / "valid", test=d / "test", vocab_size=8000)
    ep, nt = DATA / "europarl_v7_ende_20k", DATA / "wmt14_newstest_ende"
    if name == "europarl":
        return dict(train=ep / "train", valid=nt / "valid", test=nt / "test", vocab_size=8000, bpe_sample=40000)
    if name.startswith("europarl_x"):
        times = int(name.removeprefix("europarl_x"))
        big = tmp / name
        for lang in ("en", "de"):
            text = (ep / f"train.{lang}").read_bytes()
            with open(f"{big}.{lang}", "wb") as f:  # streamed: the bench itself must not inflate peak RSS
                for _ in range(times):
                    f.write(text)
            del text
        return dict(train=big, valid=nt / "valid", test=nt / "test", vocab_size=8000, bpe_sample=40000)
    raise SystemExit(f"unknown corpus {name}")


def run_one(name: str, workers: int, out: Path, cache: str | None = None) -> dict:
    """Prepare one corpus in this process; returns stage timings, counts and peak RSS."""
    from nmt_cli.data.prepare import PrepareOptions, prepare

    if name.startswith("wmt:"):  # the synthesised WMT14 en-de in a hub cache (HF_HUB_OFFLINE=1 set by the parent)
        result = prepare(PrepareOptions("wmt14-en-de", str(out), workers=workers, force=True, cache_dir=cache))
        return _summary(name, result)
    with tempfile.TemporaryDirectory() as tmp:
        args = {k: str(v) if isinstance(v, Path) else v for k, v in corpus_args(name, Path(tmp)).items()}
        opts = PrepareOptions("custom", str(out), src_lang="en", tgt_lang="de", workers=workers, force=True, **args)
        result = prepare(opts)
    return _summary(name, result)


def _summary(name: str, result) -> dict:
    splits = result.manifest["splits"]
    return {"corpus": name, "timings": result.timings, "cpu": result.cpu,
            "pairs": {s: v["read"] for s, v in splits.items()}, "kept": {s: v["kept"] for s, v in splits.items()},
            "tokens": {s: v["src_tokens"] + v["tgt_tokens"] for s, v in splits.items()},
            "peak_rss_mib": peak_mb()}


def report(r: dict) -> None:
    t, c, pairs = r["timings"], r["cpu"], r["pairs"]
    total_pairs = sum(pairs.values())
    print(f"\n{r['corpus']}: {pairs['train']:,} train pairs (kept {r['kept']['train']:,}), "
          f"peak RSS {r['peak_rss_mib']:.0f} MiB")
    print(f"  {'stage':<14}{'wall s':>8}{'pairs/s':>11}{'CPU s':>8}{'pairs/CPU-s':>13}")
    rows = [(s, [s], total_pairs) for s in ("download", "check") if s in t and t[s] >= 0.005]  # download: or cache check
    rows += [("bpe", ["bpe"], pairs["train"])]
    rows += [(f"encode {s}", [f"encode {s}"], n) for s, n in pairs.items()]
    rows += [("encode (all)", [f"encode {s}" for s in pairs], total_pairs), ("total", ["total"], total_pairs)]
    for stage, keys, n in rows:
        wall, cpu = sum(t[k] for k in keys), sum(c[k] for k in keys)
        print(f"  {stage:<14}{wall:>8.2f}{n / max(wall, 1e-9):>11,.0f}{cpu:>8.2f}{n / max(cpu, 1e-9):>13,.0f}")
    encode_s = sum(t[f"encode {s}"] for s in pairs)
    rate = total_pairs / max(encode_s, 1e-9)
    verdict = "meets" if rate >= TARGET_PAIRS_S else "misses"
    load = os.getloadavg()[0]
    print(f"  encode+binarize: {rate:,.0f} pairs/s wall ({verdict} the {TARGET_PAIRS_S:,} pairs/s target; "
          f"4.5M pairs: {4.5e6 / rate / 60:.1f} min; load average {load:.1f} on {os.cpu_count()} cores)")


def machine() -> str:
    """The CPU model and the flags that matter for these figures (lscpu), cores and memory."""
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    except OSError:
        pass
    flags = info.get("Flags", "").split()
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags] or ["none listed"]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{info.get('Model name', platform.processor()).strip()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
            f"flags: {' '.join(shown)}; python {platform.python_version()}")


def load() -> str:
    with open("/proc/loadavg") as f:
        one, five, fifteen, running, _ = f.read().split()
    return f"load average {one} {five} {fifteen} (running/total tasks {running})"


def run_child(name: str, args, env=None, cache: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--workers", str(args.workers), "--out", args.out]
    if cache:
        cmd += ["--cache", cache]
    before = load()
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(load_before=before, load_after=load(), process_wall_s=wall)
    return result


def wmt_scale(sizes: list[int], args) -> None:
    from wmt_synth import write_cache

    results = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(args.work) / f"synth-{n}" / "hub" if args.work else Path(tmp) / "hub"
            done = cache.parent / "synth.json"
            if done.exists():
                info = json.loads(done.read_text())
                print(f"\nreusing {n:,} synthesised pairs in {cache}")
            else:
                t = time.perf_counter()
                info = write_cache(cache, n, DATA)
                done.write_text(json.dumps(info))
                print(f"\nsynthesised {n:,} pairs in {time.perf_counter() - t:.0f} s (not part of the timing)")
            print(f"  {info['parquet_bytes'] / 1e6:.0f} MB parquet, {info['en_words_per_pair']:.1f} English words per "
                  f"pair, from {info['distinct_base_pairs']:,} real pairs")
            env = {**os.environ, "HF_HUB_OFFLINE": "1"}
            r = run_child(f"wmt:{n}", args, env, cache=str(cache))
        results.append(r)
        report(r)
        t, total = r["timings"], r["timings"]["total"]
        train_tok = r["tokens"]["train"]
        print(f"  {load_before_after(r)}")
        to_45 = t["bpe"] + (total - t["bpe"]) / n * 4.5e6
        verdict = (f"{'meets' if total < TARGET_WMT_S else 'misses'} the {TARGET_WMT_S / 60:.0f}-minute target"
                   if n >= 4.5e6 else f"at 4.5M pairs: {to_45 / 60:.1f} min projected")
        print(f"  whole prepare: {total / 60:.2f} min for {n:,} pairs ({verdict}); "
              f"{train_tok / max(r['kept']['train'], 1):.1f} BPE tokens per kept training pair (both sides); "
              f"peak RSS {r['peak_rss_mib']:.0f} MiB ({'under' if r['peak_rss_mib'] < TARGET_RSS_MIB else 'over'} "
              f"{TARGET_RSS_MIB} MiB)")
    big = max(results, key=lambda r: r["pairs"]["train"])
    t, n = big["timings"], big["pairs"]["train"]
    per_pair = (t["total"] - t["bpe"]) / n
    projected = t["bpe"] + per_pair * ENFR_PAIRS
    print(f"\nWMT14 en-fr ({ENFR_PAIRS:,} pairs), projected from the {n:,}-pair run: BPE {t['bpe']:.0f} s (bounded "
          f"sample) + {per_pair * 1e6:.1f} s per million pairs for the rest = {projected / 60:.1f} min")
    if len(results) > 1:
        rss = ", ".join(f"{r['pairs']['train']:,} pairs: {r['peak_rss_mib']:.0f} MiB" for r in results)
        print(f"peak RSS by size: {rss}")


def load_before_after(r: dict) -> str:
    return f"before: {r['load_before']}; after: {r['load_after']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default="multi30k,europarl,europarl_x10,europarl_x20")
    ap.add_argument("--pairs", help="WMT scale: comma-separated sizes, e.g. 1000000,4500000 (replaces --corpora)")
    ap.add_argument("--workers", type=int, default=0, help="encoding threads (0: all cores)")
    ap.add_argument("--work", default=None, help="keep the synthesised hub caches in WORK/synth-N and reuse them "
                                                 "(default: a temporary folder, removed; 4.5M pairs take 0.7 GB)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_prepare"))
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.workers, Path(args.out) / args.one.replace(":", "_"), args.cache)))
        return
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is absent; this benchmark reads ../shared/data")
    print(f"nmt prepare benchmark: {machine()}; workers={args.workers or os.cpu_count()}")
    if args.pairs:
        wmt_scale([int(float(x)) for x in args.pairs.split(",")], args)
        return
    results = []
    for name in args.corpora.split(","):
        results.append(run_child(name, args))
        report(results[-1])
        print(f"  {load_before_after(results[-1])}")
    rss = {r["corpus"]: r["peak_rss_mib"] for r in results}
    if "europarl_x10" in rss and "europarl_x20" in rss:
        print(f"\npeak memory, 200k vs 400k pairs: {rss['europarl_x10']:.0f} MiB vs {rss['europarl_x20']:.0f} MiB "
              f"(x{rss['europarl_x20'] / rss['europarl_x10']:.2f} for twice the pairs)")


if __name__ == "__main__":
    main()
