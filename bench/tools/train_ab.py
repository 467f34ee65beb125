"""Before/after training speed of `nmt train` itself: this checkout against an older commit, alternated in one run.

    python bench/tools/train_ab.py --old 4165a04                       # small Multi30k model, fp32, 3 rounds
    python bench/tools/train_ab.py --old 4165a04 --steps 60 --rounds 5 --threads 1
    python bench/tools/train_ab.py --old 4165a04 --fairseq-python /work/fairseq-venv/bin/python --update-freq 1

Each round runs the real CLI (`python -m nmt_cli.cli train`) once with the old source tree (`git archive OLD src`,
put first on PYTHONPATH) and once with this checkout's, on the same prepared data (runs/m30k/data, or --data),
same seed and flags, so both read the same batches. The figures are steady-state: the time of the updates in
the log windows after the first (start-up, data loading, the first --log-every updates, validations and saves
are left out), as ms per update and target tokens/s. Machines are shared: the load average is printed
before and after each run, and only figures from one run of this script are comparable.
--fairseq-python PY adds fairseq 0.12.2 (installed in PY's environment) as a third contender, the same model and
recipe on the same data (bench/tools/fairseq_train.py); each round starts with the next contender in turn. nmt's
default --update-freq is auto (micro-batches up to the preset's ~25000 tokens per update); --update-freq N gives
both trees, and fairseq, N micro-batches of --max-tokens per update (1 when fairseq takes part and none is given).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--d-model", "256", "--d-ff", "1024", "--heads", "4", "--layers", "3", "--dropout", "0.1"]


def old_tree(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def run_once(src: Path, data: Path, work: Path, args) -> dict:
    out = work / "run"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "nmt_cli.cli", "train", str(data), "-o", str(out), "--preset", "base", *SMALL,
           "--max-tokens", str(args.max_tokens), "--max-steps", str(args.steps), "--log-every", str(args.log_every),
           "--precision", args.precision, "--threads", str(args.threads), "--no-resume", "--seed", "1"]
    if args.update_freq:
        cmd += ["--update-freq", str(args.update_freq)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    load = os.getloadavg()[0]
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logs = [r for r in records if r["kind"] == "train"]
    return steady_state([(r["tgt_tokens_per_update"], r["tgt_tokens_per_s"]) for r in logs], args.log_every, load)


def steady_state(windows: list[tuple[float, float]], log_every: int, load: float) -> dict:
    """A run's figures from its log windows of `log_every` updates each, (target tokens per update, target tokens/s),
    the first left out (start-up): ms per update and target tokens/s over the updates alone (a validation or save
    between windows is not counted), and the load average before (`load`) and now."""
    updates = log_every * (len(windows) - 1)
    tokens = sum(per_update * log_every for per_update, _ in windows[1:])
    seconds = sum(per_update * log_every / per_s for per_update, per_s in windows[1:])
    return {"ms_per_update": 1e3 * seconds / updates, "tgt_tok_s": tokens / seconds, "load": (load, os.getloadavg()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the commit to compare with (e.g. 4165a04)")
    ap.add_argument("--data", type=Path, default=ROOT / "runs" / "m30k" / "data",
                    help="prepared data (bash bench/multi30k.sh prepares runs/m30k/data with RUN_DIR=runs/m30k)")
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--log-every", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--update-freq", type=int, help="micro-batches per update for every contender (default: nmt's auto)")
    ap.add_argument("--fairseq-python", help="also time fairseq-train, with this python (fairseq 0.12.2 installed)")
    args = ap.parse_args()
    if args.fairseq_python and not args.update_freq:
        args.update_freq = 1  # fairseq has no auto: all contenders get the same tokens per update
    if not (args.data / "manifest.json").exists():
        sys.exit(f"error: no prepared data in {args.data}; run RUN_DIR=runs/m30k bash bench/multi30k.sh or pass --data")
    with tempfile.TemporaryDirectory() as tmp:
        runs = {f"old {args.old}": partial(run_once, old_tree(args.old, Path(tmp))),
                "this checkout": partial(run_once, ROOT / "src")}
        if args.fairseq_python:
            from fairseq_train import run_once as fairseq_run_once

            runs["fairseq 0.12.2"] = partial(fairseq_run_once, args.fairseq_python)
        results: dict[str, list[dict]] = {name: [] for name in runs}
        names = list(runs)
        for i in range(args.rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:  # each round starts with the next one
                r = runs[name](args.data, Path(tmp), args)
                results[name].append(r)
                print(f"round {i + 1} {name:<16} {r['ms_per_update']:7.0f} ms/update {r['tgt_tok_s']:7.0f} tgt tok/s "
                      f"(load {r['load'][0]:.2f} -> {r['load'][1]:.2f})", flush=True)
    print(f"\nbest of {args.rounds} rounds ({args.steps - args.log_every} updates each, {args.precision}, "
          f"{args.threads} threads, --max-tokens {args.max_tokens}, --update-freq {args.update_freq or 'auto'}):")
    for name, rs in results.items():
        best = min(rs, key=lambda r: r["ms_per_update"])
        print(f"  {name:<16} {best['ms_per_update']:7.0f} ms/update {best['tgt_tok_s']:7.0f} tgt tok/s")


if __name__ == "__main__":
    main()
