"""Head to head on the same weights: `nmt serve` against LibreTranslate 1.9.6, one sentence a request.

  python bench/serve_vs_libretranslate.py --checkpoint runs/multi30k/run/averaged.pt --lt-venv /work/lt-venv
      [--input ../shared/data/multi30k/test.en] [--clients 1 8 32 128] [--threads 2] [--limit N]
      [--workdir /tmp/nmt-vs-libretranslate] [--json FILE] [--lt-omp-passive]

LibreTranslate runs from a virtual environment of its own (--lt-venv; it pins numpy < 2 and rich < 13, which
nmt's environment does not share), made once, from PyPI only:

  python3 -m venv /work/lt-venv
  /work/lt-venv/bin/pip install libretranslate==1.9.6 spacy==3.8.18 'numpy<2' 'rich<13'

What this script does, nothing of it downloaded:
1. `nmt export ctranslate2 CKPT` into the work folder, and that CTranslate2 model packaged as an Argos package
   (`en_de-nmt.argosmodel`: a zip of one folder holding `metadata.json`, `model/` = the CTranslate2 model,
   `sentencepiece.model`, and `spacy/`: a blank spaCy pipeline, to which argostranslate adds spaCy's
   rule-based sentencizer), installed with argostranslate's own `package.install_from_path` into an Argos data
   folder of the work folder (XDG_DATA_HOME, XDG_CONFIG_HOME, XDG_CACHE_HOME and HOME point there: nothing of
   the user's is read or written).
2. LibreTranslate started offline (`libretranslate --threads 2 --load-only en,de`; see OFFLINE below) on
   127.0.0.1, with CTranslate2 on --threads threads (ARGOS_INTER_THREADS=1, ARGOS_INTRA_THREADS=--threads),
   and `nmt serve --threads 2 --beam 4` (its defaults otherwise: fp32, two engine processes of one thread
   each).
3. For each client count C, each server in turn (LibreTranslate first; the other one idle): C concurrent
   clients over keep-alive connections (bench/serve.py's load generator), each sending the next line of
   --input as `{"q": line, "source": "en", "target": "de"}` until all are sent: sentences/s over the wall
   time, p50 and p99 request latency, failures, the server's CPU time a sentence, and how much CPU the rest of
   the machine took meanwhile (/proc/stat's busy time less the server's and this process's: other work on a
   shared machine).
4. The answers compared line by line (each server's answers at the smallest C), and every difference explained
   where it can be: the same checkpoint run offline by nmt with LibreTranslate's search (beam 4, length
   penalty 0.2 in CTranslate2's form, length^0.2: `--lenpen 0.2 --lenpen-form fairseq`), then LibreTranslate's
   own post-processing (`improve_translation_formatting`, imported in its venv, not copied) applied to that: a
   line whose LibreTranslate answer this reproduces differs by the length penalty, the post-processing, or
   both; one that is longer and starts with nmt's, by the length cap (CTranslate2's 256 tokens against nmt's
   source + 50).

OFFLINE: at start LibreTranslate 1.9.6 fetches argostranslate's package index (and then MiniSBD's sentence
models from GitHub) when fewer than two Argos packages are installed, and argostranslate's spaCy mode fetches
`xx_sent_ud_sm` when it is imported. The script stops each: ARGOS_PACKAGE_INDEX is a file:// folder whose
index.json is `[]`, and with `--load-only en,de` the start-up check finds no package to fetch and stops with
"Cannot update models (normal if you're offline): Unavailable language codes: de,en." before MiniSBD's
download (without --load-only it would retry MiniSBD's downloads for minutes); ARGOS_CHUNK_TYPE=SPACY splits
sentences with the package's spaCy pipeline (MiniSBD, 1.9.6's default, has no model without the download), and
the folder argostranslate checks for its cached xx_sent_ud_sm (`argos-translate/spacy/senter/model` under
XDG_CACHE_HOME) exists, empty, so that it skips the download; `--update-models` is not given.

SHARED MACHINES: CTranslate2's pip wheel runs its threads on GNU OpenMP, whose threads spin while they wait
for each other. When other work takes a core, LibreTranslate's two CTranslate2 threads spin against it: on
this project's 2-core machine, with other work taking about 1.3 cores, LibreTranslate as shipped fell from
97 to about 3 sentences/s with 1 client (232 CPU ms a sentence instead of 20), and to 22 with
OMP_WAIT_POLICY=PASSIVE under the same load (runs of 150-300 lines). nmt serve's engine processes run one
thread each, which never wait for another. The `others` column says how much of the machine other work took
during each run; `--lt-omp-passive` starts LibreTranslate with OMP_WAIT_POLICY=PASSIVE (not its default: say
so beside the figures), for a shared machine."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

_spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "bench" / "serve.py")
bench_serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_serve)  # its offline(), start_server(), load(), cpu_seconds()

PACKAGE = "translate-en_de-nmt"


def run(args: list[str], **kw) -> str:
    out = subprocess.run(args, check=True, capture_output=True, text=True, **kw)
    return out.stdout


def export_and_package(checkpoint: str, work: Path, lt_python: Path) -> tuple[Path, dict]:
    """`nmt export ctranslate2`, then the Argos package around it; returns the .argosmodel and the export's
    nmt_export.json."""
    ct2 = work / "ct2"
    run([sys.executable, "-m", "nmt_cli.cli", "export", "ctranslate2", checkpoint, "-o", str(ct2), "--force"])
    info = json.loads((ct2 / "nmt_export.json").read_text())
    src, tgt = info["langs"]["src"], info["langs"]["tgt"]
    from nmt_cli.serve.service import LANGUAGE_NAMES

    pkg = work / "package" / PACKAGE
    shutil.rmtree(pkg.parent, ignore_errors=True)
    (pkg / "model").mkdir(parents=True)
    for name in ("model.bin", "config.json", "shared_vocabulary.json"):
        shutil.copy(ct2 / name, pkg / "model" / name)
    shutil.copy(ct2 / "sentencepiece.model", pkg / "sentencepiece.model")
    # argostranslate's Package reads metadata.json (its fields: package/package.py's load_metadata_from_json)
    (pkg / "metadata.json").write_text(json.dumps({
        "package_version": "1.0", "argos_version": "1.0", "code": f"{src}_{tgt}-nmt", "type": "translate",
        "from_code": src, "from_name": LANGUAGE_NAMES.get(src, src), "to_code": tgt,
        "to_name": LANGUAGE_NAMES.get(tgt, tgt), "links": [],
    }, indent=1) + "\n")
    source = info["source"]
    (pkg / "README.md").write_text(f"{src}-{tgt}: {source.get('path')} (sha256 {source['sha256']}), "
                                   "exported by `nmt export ctranslate2`, packaged by "
                                   "bench/serve_vs_libretranslate.py\n")
    # a blank multilingual spaCy pipeline: argostranslate's SpacySentencizerSmall loads it and adds spaCy's
    # rule-based sentencizer (no trained model, nothing to download)
    run([str(lt_python), "-c", "import spacy, sys; spacy.blank('xx').to_disk(sys.argv[1])",
         str(pkg / "spacy")])
    archive = work / f"{src}_{tgt}-nmt.argosmodel"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(pkg.rglob("*")):
            z.write(path, path.relative_to(pkg.parent))
    return archive, info


def lt_environment(work: Path, threads: int, omp_passive: bool = False) -> dict[str, str]:
    """LibreTranslate's and argostranslate's environment: every folder inside `work`, the package index a
    local empty one, spaCy sentence splitting, CTranslate2 on `threads` threads (with `omp_passive`, OpenMP's
    threads sleep instead of spinning while they wait)."""
    home = work / "lt-home"
    index = home / "index"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARGOS_", "LT_", "XDG_"))}
    env.update({
        "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "ARGOS_PACKAGE_INDEX": index.as_uri() + "/", "ARGOS_CHUNK_TYPE": "SPACY", "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_INTER_THREADS": "1", "ARGOS_INTRA_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
        "PYTHONWARNINGS": "ignore",
    })
    if omp_passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def install_lt_package(work: Path, archive: Path, lt_python: Path, env: dict[str, str]) -> None:
    home = work / "lt-home"
    shutil.rmtree(home, ignore_errors=True)
    (home / "index").mkdir(parents=True)
    (home / "index" / "index.json").write_text("[]\n")
    (home / "cache" / "argos-translate" / "spacy" / "senter" / "model").mkdir(parents=True)
    run([str(lt_python), "-c", "import sys; from argostranslate import package; "
         "package.install_from_path(sys.argv[1])", str(archive)], env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_libretranslate(lt_venv: Path, env: dict[str, str], threads: int, langs: str, log: Path
                         ) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [str(lt_venv / "bin" / "libretranslate"), "--host", "127.0.0.1", "--port", str(port),
            "--threads", str(threads), "--load-only", langs]
    out = log.open("w")
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"LibreTranslate exited ({proc.returncode}); its output: {log}")
        try:
            with urllib.request.urlopen(url + "/languages", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"LibreTranslate did not answer within 300 s; its output: {log}")


def post(url: str, q: str, source: str, target: str) -> str:
    body = json.dumps({"q": q, "source": source, "target": target}).encode()
    req = urllib.request.Request(url + "/translate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["translatedText"]


def busy_seconds() -> float:
    """The machine's busy CPU seconds so far (all cores; /proc/stat: user+nice+system+irq+softirq+steal)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / os.sysconf("SC_CLK_TCK")


def measure(name: str, url: str, pid: int, lines: list[str], clients: int, source: str) -> dict:
    busy, server, own = busy_seconds(), bench_serve.cpu_seconds(pid), time.process_time()
    wall, lat, answers, failures, _ = asyncio.run(bench_serve.load(url, lines, clients, None, source=source))
    server = bench_serve.cpu_seconds(pid) - server
    own = time.process_time() - own
    others = busy_seconds() - busy - server - own
    ok = sum(1 for a in answers if a is not None)
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    return {"server": name, "clients": clients, "sentences": ok, "failed": len(lines) - ok,
            "seconds": round(wall, 2), "sentences_per_s": round(ok / wall, 2),
            "p50_ms": round(1000 * q[49], 1), "p99_ms": round(1000 * q[98], 1),
            "server_cpu_ms_per_sentence": round(1000 * server / max(ok, 1), 2),
            "client_cpu_s": round(own, 1), "others_cores": round(max(others, 0.0) / wall, 2),
            "answers": answers}


def explain(lines: list[str], lt: list[str | None], ours: list[str | None], checkpoint: str, threads: int,
            lt_python: Path, env: dict[str, str]) -> dict:
    """Each line where the two servers' answers differ, put down to its causes where they can be shown."""
    _, _, argos_search = bench_serve.offline(checkpoint, lines, threads,
                                             {"beam": 4, "lenpen": 0.2, "lenpen_form": "fairseq"})
    helper = ("import json, sys, spacy\n"
              "from libretranslate.language import improve_translation_formatting\n"
              "nlp = spacy.blank('xx'); nlp.add_pipe('sentencizer')\n"
              "d = json.load(sys.stdin)\n"
              "post = [improve_translation_formatting(s, t) for s, t in zip(d['src'], d['hyp'])]\n"
              "json.dump({'post': post,\n"
              "           'sentences': [len(list(nlp(s).sents)) for s in d['src']]}, sys.stdout)\n")
    out = json.loads(run([str(lt_python), "-c", helper], env=env,
                         input=json.dumps({"src": lines, "hyp": argos_search})))
    causes: dict[str, list[int]] = {"length penalty": [], "post-processing": [],
                                    "length penalty and post-processing": [], "length cap": [], "other": []}
    for i, (a, b) in enumerate(zip(lt, ours, strict=True)):
        if a is None or b is None or a == b:
            continue
        if out["post"][i] != a:
            # CTranslate2 stops at 256 tokens, nmt at the source's length + 50: a looping output runs longer
            longer = len(a) > len(argos_search[i]) and a.startswith(argos_search[i].rstrip(".!?,;"))
            causes["length cap" if longer else "other"].append(i)
        elif argos_search[i] == b:
            causes["post-processing"].append(i)
        elif out["post"][i] == argos_search[i]:
            causes["length penalty"].append(i)
        else:
            causes["length penalty and post-processing"].append(i)
    examples = {k: [{"line": i + 1, "src": lines[i], "libretranslate": lt[i], "nmt": ours[i],
                     "nmt_with_argos_search": argos_search[i], "then_lt_post_processing": out["post"][i],
                     "lt_spacy_sentences": out["sentences"][i]} for i in v] for k, v in causes.items()}
    post = causes["post-processing"]
    lowered = sum(1 for i in post if lt[i] == ours[i].lower())
    return {"differ": sum(len(v) for v in causes.values()), "causes": {k: len(v) for k, v in causes.items()},
            "post_processing_kinds": {"lowercased (a lower-case source)": lowered,
                                      "final punctuation made the source's": len(post) - lowered},
            "lt_split_lines": sum(1 for n in out["sentences"] if n > 1),
            "nmt_offline_argos_search_equal_lt": sum(1 for x, y in zip(argos_search, lt, strict=True)
                                                     if x == y),
            "lines": examples}


def machine() -> str:
    cpu = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in cpu.splitlines() if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(isa)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="an nmt checkpoint (its pair recorded: en-de)")
    ap.add_argument("--lt-venv", required=True, type=Path, help="LibreTranslate 1.9.6's virtual environment")
    ap.add_argument("--input", default=str(ROOT.parent / "shared" / "data" / "multi30k" / "test.en"))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--threads", type=int, default=2, help="each server's threads")
    ap.add_argument("--limit", type=int, default=None, help="only the first N lines")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/nmt-vs-libretranslate"))
    ap.add_argument("--json", default=None, help="also write the figures and the differences to this file")
    ap.add_argument("--lt-omp-passive", action="store_true",
                    help="LibreTranslate with OMP_WAIT_POLICY=PASSIVE (not its default): for a machine "
                         "shared with other work, where its CTranslate2 threads would spin against it")
    a = ap.parse_args()
    lines = Path(a.input).read_text(encoding="utf-8").splitlines()[: a.limit]
    lt_python = a.lt_venv / "bin" / "python"
    a.workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; load average before: {os.getloadavg()[0]:.2f}")
    lt_omp = "with OMP_WAIT_POLICY=PASSIVE" if a.lt_omp_passive else "as shipped (OpenMP's default)"
    print(f"input: {a.input} ({len(lines)} lines), checkpoint {a.checkpoint}, {a.threads} threads each "
          f"server; LibreTranslate {lt_omp}")
    archive, info = export_and_package(a.checkpoint, a.workdir, lt_python)
    src, tgt = info["langs"]["src"], info["langs"]["tgt"]
    bench_serve.TARGET = tgt
    env = lt_environment(a.workdir, a.threads, a.lt_omp_passive)
    install_lt_package(a.workdir, archive, lt_python, env)
    print(f"Argos package: {archive}")
    log = a.workdir / "libretranslate.log"
    lt_proc, lt_url = start_libretranslate(a.lt_venv, env, a.threads, f"{src},{tgt}", log)
    nmt_proc = None
    try:
        nmt_proc, nmt_url = bench_serve.start_server(a.checkpoint, a.threads, {"beam": 4},
                                                     queue=max(1024, 2 * max(a.clients)))
        for url in (lt_url, nmt_url):  # warm-up: the first request loads LibreTranslate's model and spaCy
            for line in lines[:20]:
                post(url, line, src, tgt)
        print(f"LibreTranslate {lt_url} (output: {log}), nmt serve {nmt_url}; "
              "warmed up with 20 requests each")
        print(f"{'clients':>7} {'server':>14} {'sent/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6} "
              f"{'CPU ms/sent':>11} {'others':>6}   (others: cores busy with other work meanwhile)")
        rows = []
        for c in a.clients:
            for name, url, pid in (("libretranslate", lt_url, lt_proc.pid),
                                   ("nmt serve", nmt_url, nmt_proc.pid)):
                r = measure(name, url, pid, lines, c, src)
                rows.append(r)
                print(f"{c:>7} {name:>14} {r['sentences_per_s']:>8.1f} {r['p50_ms']:>8.0f} "
                      f"{r['p99_ms']:>8.0f} {r['failed']:>6} {r['server_cpu_ms_per_sentence']:>11.1f} "
                      f"{r['others_cores']:>6.2f}",
                      flush=True)
            lt_row, nmt_row = rows[-2], rows[-1]
            ratio = nmt_row['sentences_per_s'] / lt_row['sentences_per_s']
            print(f"{'':>7} {'nmt / LT':>14} {ratio:>8.2f} {nmt_row['p50_ms'] / lt_row['p50_ms']:>8.2f} "
                  f"{nmt_row['p99_ms'] / lt_row['p99_ms']:>8.2f}",
                  flush=True)
    finally:
        for proc in (lt_proc, nmt_proc):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
        for proc in (lt_proc, nmt_proc):
            if proc is not None:
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    first = min(a.clients)
    lt_answers = next(r["answers"] for r in rows if r["server"] == "libretranslate" and r["clients"] == first)
    nmt_answers = next(r["answers"] for r in rows if r["server"] == "nmt serve" and r["clients"] == first)
    for r in rows:  # each server's answers at other client counts against its own at the smallest
        own = lt_answers if r["server"] == "libretranslate" else nmt_answers
        r["equal_own_first"] = sum(1 for x, y in zip(r["answers"], own, strict=True) if x == y)
    print("each server's answers equal to its own with 1 client: " + "; ".join(
        f"{r['server']} {r['clients']}: {r['equal_own_first']}/{len(lines)}"
        for r in rows if r["clients"] != first))
    why = explain(lines, lt_answers, nmt_answers, a.checkpoint, a.threads, lt_python, env)
    print(f"answers ({first} client): {len(lines) - why['differ']}/{len(lines)} equal; {why['differ']} "
          "differ: " + ", ".join(f"{k} {n}" for k, n in why["causes"].items())
          + f" (LibreTranslate's sentencizer split {why['lt_split_lines']} lines; nmt offline with Argos's "
            f"search equals LibreTranslate on {why['nmt_offline_argos_search_equal_lt']}); post-processing: "
          + ", ".join(f"{k} {n}" for k, n in why["post_processing_kinds"].items()))
    for cause, examples in why["lines"].items():
        for e in examples[:3]:
            print(f"  {cause}: line {e['line']}: {e['src']!r}\n    LT:  {e['libretranslate']!r}\n"
                  f"    nmt: {e['nmt']!r}" + (f"\n    nmt with Argos's search: {e['nmt_with_argos_search']!r}"
                                             if cause in ("other", "length cap") else ""))
    at = {(r["server"], r["clients"]): r for r in rows}
    if 32 in a.clients:
        x = at[("nmt serve", 32)]["sentences_per_s"] / at[("libretranslate", 32)]["sentences_per_s"]
        print(f"goal, >= 5x LibreTranslate's throughput at 32 clients: {x:.2f}x: "
              f"{'met' if x >= 5 else 'not met'}")
    for c in a.clients:
        n, lt = at[("nmt serve", c)], at[("libretranslate", c)]
        ok = n["p50_ms"] <= lt["p50_ms"] and n["p99_ms"] <= lt["p99_ms"]
        print(f"goal, p50 and p99 at most LibreTranslate's, {c} client(s): {'met' if ok else 'not met'} "
              f"(p50 {n['p50_ms']:.0f} vs {lt['p50_ms']:.0f} ms, "
              f"p99 {n['p99_ms']:.0f} vs {lt['p99_ms']:.0f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine(), "input": a.input, "lines": len(lines),
                                            "checkpoint": a.checkpoint, "threads": a.threads,
                                            "lt_omp_passive": a.lt_omp_passive,
                                            "rows": [{k: v for k, v in r.items() if k != "answers"}
                                                     for r in rows],
                                            "differences": why}, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
