"""What comparing a checkpoint's CRC-32s costs beside loading it: checkpoints.format.load with and without it.

    python bench/tools/checkpoint_crc.py --work /tmp/nmt-crc --presets base big --rounds 7

Makes (once, in --work) a randomly initialised model of each preset with a 37,000-piece vocabulary (the paper's
shared one; a small trained BPE stands in for the tokenizer) and saves it as nmt does (`format.save`: base ~250 MB,
big ~850 MB), plus base with a training state (Adam's two moments: ~750 MB). Then, for each file, after one untimed
load of each kind (the file is then in the page cache: the figures are a warm load, where the check's share is
largest; a cold one reads the disk once either way), `rounds` pairs alternated A B A B ...: A = `_torch_load` with
the CRC-32 check (what `load` does), B = the same without it; and the check alone (`integrity.check_archive`).
Prints the median seconds of each and the median of the pairwise ratios A/B. One torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from nmt_cli.checkpoints import format as ckpt_io  # noqa: E402
from nmt_cli.checkpoints.integrity import check_archive  # noqa: E402
from nmt_cli.config import preset  # noqa: E402


def make(work: Path, name: str, train_state: bool) -> Path:
    path = work / (f"{name}-train.pt" if train_state else f"{name}.pt")
    if path.exists():
        return path
    from nmt_cli.data.tokenizer import train_bpe
    from nmt_cli.model import Transformer

    words = [f"w{i} x{i % 97} y{i % 31}" for i in range(3000)]
    tokenizer = train_bpe(words, vocab_size=200)
    config = preset(name.split("-")[0], vocab_size=37000)
    model = Transformer(config)
    state = None
    if train_state:
        opt = torch.optim.Adam(model.parameters())
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        state = {"optimizer": opt.state_dict(), "step": 1}
    ckpt_io.save(ckpt_io.Checkpoint(config, model.state_dict(), tokenizer, {"src": "en", "tgt": "de"}, state), path)
    return path


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/nmt-crc")
    ap.add_argument("--presets", nargs="+", default=["base", "big"], help="base, big, base-train")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for name in args.presets:
        path = make(work, name.removesuffix("-train"), name.endswith("-train"))
        with_check = partial(ckpt_io._torch_load, path, "cpu", verify=True)
        without = partial(ckpt_io._torch_load, path, "cpu", verify=False)
        check = partial(check_archive, path, "use another checkpoint")
        with_check(), without()  # untimed: page cache, allocator
        a, b, c = [], [], []
        for _ in range(args.rounds):
            a.append(timed(with_check))
            b.append(timed(without))
            c.append(timed(check))
        ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(f"{name:10s} {path.stat().st_size / 1e6:6.0f} MB  load with check {statistics.median(a):.3f} s  "
              f"without {statistics.median(b):.3f} s  (min {min(a):.3f} / {min(b):.3f})  check alone "
              f"{statistics.median(c):.3f} s  ratio {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
