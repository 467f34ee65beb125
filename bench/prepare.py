"""Benchmark `nmt prepare`: sentence pairs/s per stage and peak memory.

    python bench/prepare.py                     # multi30k, europarl 20k, europarl x10 and x20 (memory check)
    python bench/prepare.py --corpora multi30k --workers 2

Corpora (from ../shared/data, read in place):
  multi30k       Multi30k en-de: 29,000 / 1,014 / 1,000 pairs, 8k joint BPE (as `nmt prepare custom` for the
                 Multi30k benchmark)
  europarl       the first 20,000 pairs of Europarl v7 (part of WMT14 en-de training data) + newstest2013/2014
  europarl_x10   the same 20k pairs repeated 10 and 20 times (200k / 400k pairs, written to a temporary folder):
  europarl_x20   peak memory must not grow with the corpus (streaming encode in 50k-pair chunks, bounded BPE
                 sample: --bpe-sample 40000 for all europarl runs so the BPE stage is the same size)

Stages: check (open and count every input), bpe (sample + learn the joint BPE), encode (read, clean, encode on
all cores, write .bin/.idx and raw text), per split. Each corpus runs in a fresh process so its peak RSS
(ru_maxrss) is its own. Target (the issue): encode + binarize >= 20,000 pairs/s on the 2-core machine.
Besides wall-clock pairs/s, the table shows pairs per CPU-second (process CPU time, all threads): on a machine
shared with other jobs the wall figure drops, while pairs/CPU-s x cores bounds what an idle machine reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
TARGET_PAIRS_S = 20_000


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


def run_one(name: str, workers: int, out: Path) -> dict:
    """Prepare one corpus in this process; returns stage timings, counts and peak RSS."""
    from nmt_cli.data.prepare import PrepareOptions, prepare

    with tempfile.TemporaryDirectory() as tmp:
        args = {k: str(v) if isinstance(v, Path) else v for k, v in corpus_args(name, Path(tmp)).items()}
        opts = PrepareOptions("custom", str(out), src_lang="en", tgt_lang="de", workers=workers, force=True, **args)
        result = prepare(opts)
    splits = result.manifest["splits"]
    return {"corpus": name, "timings": result.timings, "cpu": result.cpu, "pairs": {s: v["read"] for s, v in splits.items()},
            "kept": {s: v["kept"] for s, v in splits.items()},
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def report(r: dict) -> None:
    t, c, pairs = r["timings"], r["cpu"], r["pairs"]
    total_pairs = sum(pairs.values())
    print(f"\n{r['corpus']}: {pairs['train']:,} train pairs (kept {r['kept']['train']:,}), "
          f"peak RSS {r['peak_rss_mib']:.0f} MiB")
    print(f"  {'stage':<14}{'wall s':>8}{'pairs/s':>11}{'CPU s':>8}{'pairs/CPU-s':>13}")
    rows = [(s, [s], total_pairs) for s in ("check",)] + [("bpe", ["bpe"], pairs["train"])]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default="multi30k,europarl,europarl_x10,europarl_x20")
    ap.add_argument("--workers", type=int, default=0, help="encoding threads (0: all cores)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_prepare"))
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.workers, Path(args.out) / args.one)))
        return
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is absent; this benchmark reads ../shared/data")
    print(f"nmt prepare benchmark: {os.cpu_count()} cores, workers={args.workers or os.cpu_count()}")
    results = []
    for name in args.corpora.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--workers", str(args.workers),
                               "--out", args.out], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{name} failed:\n{proc.stderr}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        report(results[-1])
    rss = {r["corpus"]: r["peak_rss_mib"] for r in results}
    if "europarl_x10" in rss and "europarl_x20" in rss:
        print(f"\npeak memory, 200k vs 400k pairs: {rss['europarl_x10']:.0f} MiB vs {rss['europarl_x20']:.0f} MiB "
              f"(x{rss['europarl_x20'] / rss['europarl_x10']:.2f} for twice the pairs)")


if __name__ == "__main__":
    main()
