"""Training speed of fairseq 0.12.2 on CPU, on nmt's prepared data and with train_ab.py's model, for comparison.

    python bench/tools/fairseq_train.py --python /work/fairseq-venv/bin/python --data runs/m30k/data
    python bench/tools/fairseq_train.py --python PY --data DIR --steps 60 --log-every 15 --threads 1

fairseq trains on the very sentences nmt trains on: the ids of DIR's train/valid .bin files (nmt's sentencepiece
pieces, after its length and ratio filters) are written out as text, one id per token, and binarized once with
`fairseq-preprocess --joined-dictionary` over a dictionary of all of the model's ids, so that both vocabularies
have the same size (cached in runs/fairseq/<manifest digest>, or --bin). The model and recipe are train_ab.py's:
a post-LN transformer, d_model 256, d_ff 1024, 4 heads, 3+3 layers, dropout 0.1, all embeddings shared, label
smoothing 0.1, Adam(0.9, 0.98, 1e-9), inverse-sqrt schedule with 4000 warm-up updates and nmt's peak lr, fp32,
--max-tokens per micro-batch and --update-freq micro-batches per update (1 here, train_ab.py gives nmt the same).
The figures are steady-state as in train_ab.py: fairseq's log windows (--log-format json, one every --log-every
updates) after the first, as ms per update and target tokens/s (fairseq's wps counts target tokens with EOS, as
nmt does). The fairseq environment is built by hand (Python 3.11 needs patches): bench/tools/fairseq_py311/README.md (the steps and the patches).
"""

from __future__ import annotations

import argparse
import array
import hashlib
import itertools
import json
import os
import subprocess
import tempfile
from pathlib import Path

from train_ab import steady_state

ROOT = Path(__file__).resolve().parents[2]
SRC, TGT = "en", "de"
MODEL = ["--arch", "transformer", "--share-all-embeddings", "--dropout", "0.1",
         "--encoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
         "--encoder-layers", "3", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024",
         "--decoder-attention-heads", "4", "--decoder-layers", "3"]
RECIPE = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
          "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--lr-scheduler", "inverse_sqrt",
          "--warmup-updates", "4000", "--lr", str(256 ** -0.5 * 4000 ** -0.5)]


def sentences(data: Path, split: str, lang: str, vocab_size: int):
    """nmt's stored sentences of a split and side (store.py's layout), each a list of ids."""
    ids = array.array("H" if vocab_size <= 65536 else "i", (data / f"{split}.{lang}.bin").read_bytes())
    offsets = array.array("q", (data / f"{split}.{lang}.idx").read_bytes())
    for a, b in itertools.pairwise(offsets):
        yield ids[a:b]


def prepare(python: str, data: Path, bin_dir: Path | None = None, workers: int = 1) -> Path:
    """The fairseq-binarized copy of DIR's train and valid splits (made once, then reused)."""
    manifest = (data / "manifest.json").read_bytes()
    bin_dir = bin_dir or ROOT / "runs" / "fairseq" / hashlib.sha256(manifest).hexdigest()[:12]
    if (bin_dir / f"train.{SRC}-{TGT}.{TGT}.bin").exists():
        return bin_dir
    vocab_size = json.loads(manifest)["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp)
        # nmt's ids 0-3 are pad/unk/bos/eos; fairseq puts its own four specials first, so the sizes match
        (text / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(4, vocab_size)))
        for split in ("train", "valid"):
            for lang in (SRC, TGT):
                with open(text / f"{split}.{lang}", "w") as f:
                    for s in sentences(data, split, lang, vocab_size):
                        f.write(" ".join("<unk>" if i == 1 else str(i) for i in s) + "\n")
        subprocess.run([python, "-m", "fairseq_cli.preprocess", "--source-lang", SRC, "--target-lang", TGT,
                        "--trainpref", text / "train", "--validpref", text / "valid", "--destdir", bin_dir,
                        "--srcdict", text / "dict.txt", "--joined-dictionary", "--workers", str(workers)],
                       check=True, capture_output=True)
    return bin_dir


def run_once(python: str, data: Path, work: Path, args) -> dict:
    """One fairseq-train run of args.steps updates; steady-state figures as train_ab.py's run_once gives them."""
    bin_dir = prepare(python, data, getattr(args, "bin", None), args.threads)
    cmd = [python, "-m", "fairseq_cli.train", bin_dir, *MODEL, *RECIPE, "--cpu", "--seed", "1",
           "--max-tokens", str(args.max_tokens), "--update-freq", str(args.update_freq or 1),
           "--max-update", str(args.steps), "--log-format", "json", "--log-interval", str(args.log_every),
           "--no-save", "--disable-validation", "--num-workers", "0", "--save-dir", work / "fairseq"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    load = os.getloadavg()[0]
    out = subprocess.run([str(c) for c in cmd], check=True, env=env, capture_output=True, text=True)
    # lines like "... | INFO | train_inner | {"epoch": 1, "wps": "2345.6", "wpb": "3120.4", ...}", one per window
    logs = [json.loads(line.split(" | ")[-1]) for line in (out.stdout + out.stderr).splitlines()
            if "| train_inner |" in line]
    if len(logs) < 2:
        raise RuntimeError(f"fairseq-train logged {len(logs)} windows; want --steps >= 2 x --log-every")
    return steady_state([(float(r["wpb"]), float(r["wps"])) for r in logs], args.log_every, load)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="the python of an environment with fairseq 0.12.2")
    ap.add_argument("--data", type=Path, default=ROOT / "runs" / "m30k" / "data", help="nmt prepared data")
    ap.add_argument("--bin", type=Path, help="where to keep fairseq's binarized copy (default runs/fairseq/DIGEST)")
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--log-every", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--update-freq", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = run_once(args.python, args.data, Path(tmp), args)
    print(f"fairseq {r['ms_per_update']:7.0f} ms/update {r['tgt_tok_s']:7.0f} tgt tok/s "
          f"({args.steps - args.log_every} updates, {args.threads} threads, --max-tokens {args.max_tokens}, "
          f"--update-freq {args.update_freq}; load {r['load'][0]:.2f} -> {r['load'][1]:.2f})")


if __name__ == "__main__":
    main()
