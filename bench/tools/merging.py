"""The decoder cache's merging of joins (decoding/cache.py, MERGE_GAP) on and off, in `nmt serve`'s decoding engine
without HTTP (bench/serve.py's `engine_alone`: C virtual clients, one sentence a request) and offline: CPU
milliseconds a sentence, which move less than wall time on a shared machine.

    for r in 1 2 3; do for g in 4 -1; do python bench/tools/merging.py -m CKPT --merge-gap $g; done; done

`--merge-gap -1`: every join keeps a cache segment of its own (a step then runs attention once per layer per join).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="checkpoint")
    ap.add_argument("-i", "--input", default=str(ROOT.parent / "shared" / "data" / "multi30k" / "test.en"))
    ap.add_argument("--merge-gap", type=int, default=None, help="cache.MERGE_GAP (-1: never merge); default: the code's")
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import serve as bench_serve  # bench/serve.py

    from nmt_cli.decoding import cache
    from nmt_cli.inference.translate import Translator, set_threads
    from nmt_cli.serve.engine import Engine

    if a.merge_gap is not None:
        cache.MERGE_GAP = a.merge_gap
    lines = Path(a.input).read_text(encoding="utf-8").splitlines()
    set_threads(a.threads)
    out: dict = {"merge_gap": cache.MERGE_GAP}
    seconds, cpu, _ = bench_serve.offline(a.model, lines, a.threads, {"beam": 4})
    out["offline_cpu_ms"] = round(1000 * cpu / len(lines), 2)
    engine = Engine(Translator.load(a.model, device="cpu", beam=4), 4096, "merging")
    bench_serve.engine_alone(engine, lines[:100], min(a.clients))  # warm-up
    for c in a.clients:
        start = time.process_time()
        out[f"sent_per_s_{c}"] = round(bench_serve.engine_alone(engine, lines, c), 1)
        out[f"cpu_ms_{c}"] = round(1000 * (time.process_time() - start) / len(lines), 2)
    print(json.dumps(out), flush=True)
    engine.close() if hasattr(engine, "close") else None


if __name__ == "__main__":
    main()
