"""Loopback load test of `nmt serve` beside `nmt translate` on the same file, in the same run.

  python bench/serve.py --checkpoint runs/multi30k/run/averaged.pt [--input ../shared/data/multi30k/test.en]
      [--clients 8 32 128] [--threads 1] [--beam 4] [--precision fp32] [--rounds 3]

1. offline: the file through the same code as `nmt translate` (Translator + translate_stream, model load excluded),
   with --threads threads;
2. a real `nmt serve` subprocess on 127.0.0.1 with the same model, options and threads;
3. for each client count C: C concurrent clients (asyncio, keep-alive connections), each sending the next line
   of the file, one sentence a request, until all are sent, and one more client sending a short sentence (--short)
   again and again meanwhile; sentences/s over the wall time, p50 and p99 request latency (and the short request's),
   failures,
   how many answers equal the offline translation, and the server's CPU time a sentence (beside offline's: on a
   shared machine, CPU time moves less than wall time).
4. for each C, the same decoding engine without HTTP (`nmt_cli.serve.engine.Engine` in this process, C virtual
   clients each submitting its next line from the previous one's callback): what the server's HTTP side and its
   sharing of Python's GIL cost, beside what the decoding itself reaches;
5. steps 1, 3 and 4 again, --rounds times in all (the server keeps running): each round's ratio is against its own
   offline run, and the median over the rounds is printed last (a shared machine's speed drifts between runs).
Bounded: a response that does not come within 120 s is a failure (its latency counted as 120 s), and the
server is stopped (SIGTERM) at the end, whatever happens.

  python bench/serve.py --checkpoint CKPT --soak [--minutes 10] [--clients 128] [--json FILE]

--soak: the server alone under C clients (default 128) sending the file's lines round and round for --minutes:
requests answered, failed (any status but 200, or no answer within 120 s) and lost (sent, never answered); the
resident memory of the server and its engine processes, sampled every 2 s, at the end of the warm-up (the first
tenth of the time, at least 10 s) and at the end; p99 latency in the first and the last window (a tenth of the
time, at most a minute) after the warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from nmt_cli.inference.translate import Translator, set_threads, translate_stream  # noqa: E402


def offline(checkpoint: str, lines: list[str], threads: int, options: dict) -> tuple[float, float, list[str]]:
    """Wall and CPU seconds to translate `lines` as `nmt translate` does (model load excluded), and the
    translations."""
    set_threads(threads)
    tr = Translator.load(checkpoint, device="cpu", **options)
    sink = io.BytesIO()
    start, cpu = time.perf_counter(), time.process_time()
    translate_stream(tr, io.BytesIO("".join(line + "\n" for line in lines).encode()), sink)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return seconds, cpu, sink.getvalue().decode().splitlines()


def engine_alone(engine, lines: list[str], clients: int) -> float:
    """Sentences/s of `engine` (a serve Engine in this process) with `clients` virtual clients: each submits its
    next line when its previous one is answered (from the engine's callback), one sentence a request, no HTTP."""
    cfg = engine.config()
    lock, done = threading.Lock(), threading.Event()
    state = {"next": min(clients, len(lines)), "finished": 0}

    def on_finish(job) -> None:
        with lock:
            state["finished"] += 1
            i, state["next"] = state["next"], state["next"] + 1
            if state["finished"] == len(lines):
                done.set()
        if i < len(lines):
            engine.submit([lines[i]], cfg, on_finish)

    start = time.perf_counter()
    for i in range(state["next"]):
        engine.submit([lines[i]], cfg, on_finish)
    if not done.wait(600):
        raise SystemExit("the engine did not finish within 600 s")
    return len(lines) / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and the processes it started, so far (/proc: Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(cpu_seconds(int(child)) for child in children)


def start_server(checkpoint: str, threads: int, options: dict, queue: int, flags: tuple[str, ...] = ()
                 ) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "nmt_cli.cli", "serve", "-m", checkpoint, "--port", "0", "--threads", str(threads),
            "--queue-size", str(queue), "--batch-limit", "64", *flags]
    for k, v in options.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    found: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stderr:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                found.append(m.group(1))
                ready.set()
            elif not line.startswith("note:"):
                print("  server:", line.rstrip(), file=sys.stderr)
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300) or not found:
        proc.kill()
        raise SystemExit("the server did not start")
    return proc, found[0]


async def load(url: str, lines: list[str], clients: int, short: str | None = None, source: str = "auto"
               ) -> tuple[float, list[float], list[str | None], int, list[float]]:
    """C clients over keep-alive connections, each sending the next unsent line until none is left; with `short`,
    one more client meanwhile sends that line again and again (its latencies apart: a short request beside the
    load; not counted in the answers). Each request is `{"q": line, "source": source, "target": TARGET}`; one not
    answered within 120 s is a failure, its latency counted as 120 s, and its client goes on on a new connection.

    The load generator is a minimal HTTP/1.1 client on asyncio streams, not httpx: on this 2-core machine httpx
    costs ~4 ms of CPU a request (170-230 GET /health a second with 32 clients against ~3000 with this client),
    which would measure the client, on the cores the server needs. The tests talk to the server with httpx."""
    from urllib.parse import urlsplit

    where = urlsplit(url)
    answers: list[str | None] = [None] * len(lines)
    latencies: list[float] = []
    short_latencies: list[float] = []
    failures = 0
    next_line = 0

    async def ask(reader, writer, text: str) -> tuple[int, dict, float]:
        body = json.dumps({"q": text, "source": source, "target": TARGET}).encode()
        t0 = time.perf_counter()
        writer.write(b"POST /translate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)
        status = int(head.split(b" ", 2)[1])
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n")
                      if h.lower().startswith(b"content-length:"))
        payload = json.loads(await reader.readexactly(length))
        if status != 200:
            print(f"  {status}: {payload}", file=sys.stderr)
        return status, payload, time.perf_counter() - t0

    async def worker():
        nonlocal next_line, failures
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        try:
            while next_line < len(lines):
                i = next_line
                next_line += 1
                try:
                    status, payload, seconds = await ask(reader, writer, lines[i])
                except asyncio.TimeoutError:  # no answer within 120 s: a failure, its latency counted as 120 s
                    latencies.append(120.0)
                    failures += 1
                    writer.close()  # the answer may still come: a new connection for the next request
                    reader, writer = await asyncio.open_connection(where.hostname, where.port)
                    continue
                latencies.append(seconds)
                if status == 200:
                    answers[i] = payload["translatedText"]
                else:
                    failures += 1
        finally:
            writer.close()

    async def prober():
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        try:
            while next_line < len(lines):
                status, _, seconds = await ask(reader, writer, short)
                if status == 200:
                    short_latencies.append(seconds)
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)), *([prober()] if short else []))
    return time.perf_counter() - start, latencies, answers, failures, short_latencies


TARGET = "de"


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and the processes it started (/proc: Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    own = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(rss_bytes(int(child)) for child in children)


async def soak(url: str, pid: int, lines: list[str], clients: int, seconds: float) -> dict:
    """`clients` keep-alive clients sending `lines` round and round for `seconds`; the figures of --soak."""
    from urllib.parse import urlsplit

    where = urlsplit(url)
    start = time.perf_counter()
    done: list[tuple[float, float]] = []  # (when answered, latency) of each 200
    counts = {"sent": 0, "failed": 0}
    memory: list[tuple[float, int]] = []
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            memory.append((time.perf_counter() - start, rss_bytes(pid)))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 2)

    async def worker(k: int):
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        i = k
        try:
            while time.perf_counter() - start < seconds:
                body = json.dumps({"q": lines[i % len(lines)], "source": "auto", "target": TARGET}).encode()
                i += clients
                counts["sent"] += 1
                t0 = time.perf_counter()
                writer.write(b"POST /translate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    counts["failed"] += 1
                    return
                status = int(head.split(b" ", 2)[1])
                length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n")
                              if h.lower().startswith(b"content-length:"))
                payload = await reader.readexactly(length)
                if status == 200:
                    done.append((time.perf_counter() - start, time.perf_counter() - t0))
                else:
                    counts["failed"] += 1
                    print(f"  {status}: {payload[:200]!r}", file=sys.stderr)
        finally:
            writer.close()

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(worker(k) for k in range(clients)))
    stop.set()
    await sampler
    memory.append((time.perf_counter() - start, rss_bytes(pid)))
    warmup = max(10.0, seconds / 10)
    window = min(60.0, seconds / 10)
    after = [m for t, m in memory if t >= warmup]
    first = [lat for t, lat in done if warmup <= t < warmup + window]
    last = [lat for t, lat in done if t >= seconds - window]

    def p99(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else float("nan")

    return {"clients": clients, "seconds": round(time.perf_counter() - start, 1), "answered": len(done),
            "failed": counts["failed"], "lost": counts["sent"] - len(done) - counts["failed"],
            "rss_after_warmup_mb": round(after[0] / 2**20, 1), "rss_end_mb": round(memory[-1][1] / 2**20, 1),
            "rss_max_mb": round(max(after) / 2**20, 1),
            "rss_growth_pct": round(100 * (memory[-1][1] - after[0]) / after[0], 2),
            "p99_first_ms": round(1000 * p99(first), 1), "p99_last_ms": round(1000 * p99(last), 1),
            "p99_last_over_first": round(p99(last) / p99(first), 3), "warmup_s": warmup, "window_s": window}


def main() -> None:
    global TARGET
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--input", default=str(ROOT.parent / "shared" / "data" / "multi30k" / "test.en"))
    ap.add_argument("--target", default="de")
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--precision", default="fp32", help="the server's and offline's (fp32, bf16, int8)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N lines")
    ap.add_argument("--no-engine-process", action="store_true",
                    help="serve with the engine in the server's process (nmt serve --no-engine-process)")
    ap.add_argument("--short", default="A dog runs.",
                    help="a short request one more client sends again and again during each load run: its p50 and "
                         "p99 latency beside the load's (short50, short99; '' for none)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="offline and server runs in turn this many times (the machine's speed drifts)")
    ap.add_argument("--soak", action="store_true", help="the server alone under --clients (default 128) for --minutes")
    ap.add_argument("--minutes", type=float, default=10, help="--soak: how long")
    ap.add_argument("--json", default=None, help="--soak: also write the figures to this file")
    a = ap.parse_args()
    TARGET = a.target
    lines = Path(a.input).read_text(encoding="utf-8").splitlines()[: a.limit]
    options = {"beam": a.beam, "precision": a.precision}
    if a.soak:
        clients = a.clients[0] if a.clients != [8, 32, 128] else 128
        proc, url = start_server(a.checkpoint, a.threads, options, queue=max(1024, 2 * clients),
                                 flags=("--no-engine-process",) if a.no_engine_process else ())
        try:
            figures = asyncio.run(soak(url, proc.pid, lines, clients, 60 * a.minutes))
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
        figures["server_exit"] = code
        print(json.dumps(figures))
        if a.json:
            Path(a.json).write_text(json.dumps(figures, indent=1) + "\n")
        return
    print(f"input: {a.input} ({len(lines)} lines), checkpoint {a.checkpoint}, beam {a.beam}, {a.threads} thread(s), "
          f"{a.rounds} round(s)")
    from nmt_cli.serve.engine import Engine

    queue = max(1024, max(a.clients) * 2)
    set_threads(a.threads)
    engine = Engine(Translator.load(a.checkpoint, device="cpu", **options), queue, "bench-engine")
    engine_alone(engine, lines[:100], min(a.clients))  # warm-up
    proc, url = start_server(a.checkpoint, a.threads, options, queue=queue,
                             flags=("--no-engine-process",) if a.no_engine_process else ())
    ratios: dict[int, list[float]] = {c: [] for c in a.clients}
    try:
        reference = None
        for r in range(1, a.rounds + 1):
            seconds, cpu, translations = offline(a.checkpoint, lines, a.threads, options)
            reference = reference or translations
            base = len(lines) / seconds
            print(f"round {r}: offline (nmt translate's code, load excluded): {seconds:.2f} s, {base:.1f} "
                  f"sentences/s, {1000 * cpu / len(lines):.2f} CPU ms a sentence")
            print(f"{'clients':>7} {'sent/s':>8} {'x offline':>9} {'p50 ms':>8} {'p99 ms':>8} {'short50':>8} "
                  f"{'short99':>8} {'failed':>6} "
                  f"{'= offline':>9} {'CPU ms/sent':>11}   offline, <= C sentences a batch: sent/s, CPU ms/sent; "
                  "engine alone, no HTTP: sent/s (x offline)")
            for c in a.clients:
                # C clients never have more than C sentences in flight: offline batches of at most C sentences
                # (the same continuous batching), measured right before, for comparison
                capped, capped_cpu, _ = offline(a.checkpoint, lines, a.threads, {**options, "max_sentences": c})
                before = cpu_seconds(proc.pid)
                wall, lat, answers, failures, short = asyncio.run(load(url, lines, c, a.short))
                used = cpu_seconds(proc.pid) - before
                alone = engine_alone(engine, lines, c)
                ok = sum(1 for x in answers if x is not None)
                same = sum(1 for x, y in zip(answers, reference, strict=True) if x == y)
                q = statistics.quantiles(lat, n=100)
                sq = statistics.quantiles(short, n=100) if len(short) > 1 else [float("nan")] * 99
                ratios[c].append(ok / wall / base)
                print(f"{c:>7} {ok / wall:>8.1f} {ok / wall / base:>9.2f} {q[49] * 1000:>8.0f} "
                      f"{q[98] * 1000:>8.0f} {sq[49] * 1000:>8.0f} {sq[98] * 1000:>8.0f} {len(lines) - ok:>6} "
                      f"{same:>5}/{len(lines)} "
                      f"{1000 * used / len(lines):>11.2f}   {len(lines) / capped:.1f}, "
                      f"{1000 * capped_cpu / len(lines):.2f}; {alone:.1f} ({alone / base:.2f})", flush=True)
        if a.rounds > 1:
            print("x offline over the rounds (each against its own round's offline run): "
                  + "; ".join(f"{c} clients median {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                              for c, v in ratios.items()))
    finally:
        engine.close()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        print(f"server stopped by SIGTERM: exit {code}")


if __name__ == "__main__":
    main()
