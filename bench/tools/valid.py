"""Benchmark `nmt train`'s validation: seconds of one validation (loss, and loss + BLEU) of a small Multi30k model
through the real Trainer.validate(), in 1 or more CPU processes; with --before, against an older commit's, runs
alternating.

    python bench/tools/valid.py                          # train the model once (--minutes), then time this tree
    python bench/tools/valid.py --before 6744d64         # this tree against that commit's src/, alternating
    python bench/tools/valid.py --checkpoint RUN/checkpoint_last.pt --precisions fp32 --procs 2 --threads 1

The model: d_model 256, d_ff 1024, 4 heads, 3+3 layers, 8k joint BPE on Multi30k en-de (../shared/data/multi30k,
prepared as bench/train.py prepares it), trained --minutes minutes in bf16 with --max-tokens 4096 (warmup 400, peak
lr 1e-3); the valid split is Multi30k's 1014 sentences, BLEU with beam 4 (--valid-beam's default). A validation is
timed `--reps` times in fresh processes per tree and precision (the first includes one-time work: reading the data,
the first products of each shape); with --procs N, N processes over gloo validate together and rank 0's times are
shown. Wall seconds and the process's CPU seconds (all threads) are both shown, since on a shared machine
neighbours slow the wall clock. The older tree is extracted with `git archive` into a temporary folder and imported
from there (PYTHONPATH), this bench's own code running against it: its Trainer API is the same.
Artifacts go to runs/bench_valid/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "runs" / "bench_valid"
MODEL = {"d_model": 256, "d_ff": 1024, "n_heads": 4, "encoder_layers": 3, "decoder_layers": 3}


def trained_model(data: Path, minutes: float, threads: int | None) -> Path:
    """runs/bench_valid/model/checkpoint_last.pt, trained for `minutes` unless it is there."""
    from nmt_cli.training.config import TrainConfig
    from nmt_cli.training.launch import train

    run = WORK / "model"
    if not (run / "checkpoint_last.pt").exists():
        cfg = TrainConfig(str(data), str(run), preset="tiny", model={**MODEL, "dropout": 0.1}, precision="bf16",
                          max_tokens=4096, update_freq=1, warmup=400, lr=1e-3, max_time=minutes, average=False,
                          save_every_minutes=minutes / 2, threads=threads)
        result = train(cfg)
        print(f"trained {result.step} updates in {result.elapsed / 60:.1f} min: {result.valid}", flush=True)
    return run / "checkpoint_last.pt"


def time_validations(data: Path, checkpoint: Path, precision: str, reps: int, threads: int | None, rank: int = 0,
                     procs: int = 1, init: str | None = None) -> dict:
    """Seconds (wall, CPU) of `reps` validations without and with BLEU, in this process: rank `rank` of `procs`
    CPU processes (gloo, joined at `init`)."""
    import torch

    from nmt_cli.training.config import TrainConfig
    from nmt_cli.training.distributed.process_group import setup_process, shutdown_process
    from nmt_cli.training.loop import Trainer
    from nmt_cli.training.plan import plan_run

    out: dict = {"threads": None}
    rt = None
    for bleu in (False, True):
        cfg = TrainConfig(str(data), str(WORK / "scratch"), init_from=str(checkpoint), precision=precision,
                          max_tokens=4096, update_freq=1, valid_bleu=bleu, threads=threads, resume=False,
                          cpu_procs=procs, gpus=0)
        plan = plan_run(cfg)
        rt = rt or setup_process(plan.launch, rank, rank, plan.threads, init)
        trainer = Trainer(plan, rt)
        out["threads"] = torch.get_num_threads()
        runs = []
        for _ in range(reps):
            w0, c0 = time.perf_counter(), time.process_time()
            valid = trainer.validate()
            runs.append({"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0, **valid})
        out["bleu" if bleu else "loss"] = runs
    shutdown_process(rt)
    return out


def run_tree(src: Path, args, data: Path, checkpoint: Path, precision: str) -> dict | str:
    """time_validations in `args.procs` fresh processes importing nmt_cli from `src` -> rank 0's figures, or the
    error's last line if one failed."""
    from nmt_cli.training.distributed.spawn import free_port

    init = f"tcp://127.0.0.1:{free_port()}" if args.procs > 1 else None
    env = {**os.environ, "PYTHONPATH": str(src)}
    procs = []
    for rank in range(args.procs):
        code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import valid; "
                f"print(json.dumps(valid.time_validations(valid.Path({str(data)!r}), valid.Path({str(checkpoint)!r}), "
                f"{precision!r}, {args.reps}, {args.threads!r}, {rank}, {args.procs}, {init!r})))")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        done = [p.communicate(timeout=1800) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return "timed out after 30 minutes"
    for p, (_, err) in zip(procs, done, strict=True):
        if p.returncode:
            return err.strip().splitlines()[-1]
    return json.loads(done[0][0].strip().splitlines()[-1])


def extract(commit: str, into: Path) -> Path:
    """`commit`'s src/ in `into` (git archive)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def summary(name: str, precision: str, r: dict | str, procs: int) -> str:
    if isinstance(r, str):
        return f"{name:>10} {precision}: failed: {r}"

    def secs(runs: list, key: str) -> str:
        return "/".join(f"{x[key]:.1f}" for x in runs)

    loss, bleu = r["loss"], r["bleu"]
    return (f"{name:>10} {precision}: {procs} process(es) x {r['threads']} threads; loss only {secs(loss, 'wall')} s wall "
            f"({secs(loss, 'cpu')} CPU s); loss + BLEU {secs(bleu, 'wall')} s wall ({secs(bleu, 'cpu')} CPU s); "
            f"valid_bleu {bleu[-1]['valid_bleu']:.2f}, valid_nll {bleu[-1]['valid_nll']:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a commit (or branch) to compare with: its src/, runs alternating")
    ap.add_argument("--checkpoint", help="the model to validate (default: train one, see --minutes)")
    ap.add_argument("--minutes", type=float, default=12.0, help="training time of the model when none is given")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--reps", type=int, default=2, help="validations timed per process")
    ap.add_argument("--rounds", type=int, default=2, help="processes per tree and precision (alternating trees)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: nmt train's choice)")
    ap.add_argument("--procs", type=int, default=1, help="CPU processes validating together (gloo; rank 0 timed)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for bench/train.py
    from train import multi30k_data_dir

    WORK.mkdir(parents=True, exist_ok=True)
    data = multi30k_data_dir(WORK / "multi30k")
    if data is None:
        raise SystemExit("../shared/data/multi30k is missing")
    checkpoint = Path(args.checkpoint) if args.checkpoint else trained_model(data, args.minutes, args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("after", ROOT / "src")]
        if args.before:
            trees.insert(0, (f"before {args.before}", extract(args.before, Path(tmp))))
        for precision in args.precisions.split(","):
            for _ in range(args.rounds):
                for name, src in trees:
                    print(summary(name, precision, run_tree(src, args, data, checkpoint, precision), args.procs), flush=True)


if __name__ == "__main__":
    main()
