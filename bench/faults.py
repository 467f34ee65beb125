"""Every command that writes files, under faults: killed (SIGKILL) at random moments, and run onto a full disk.

  python bench/faults.py [--trials 20] [--writers average export-ct2 ...] [--seed 1] [--work DIR] [--json FILE]

Inputs are made once in --work (the bundled sample corpus prepared, a 40-update tiny run, a Hugging Face export
to import), then for each writer:

1. kill -9: the command is started with a previous output in place (every other trial; the other trials start
   with none), killed at a moment drawn uniformly from [0, its undisturbed wall time], and its output is
   classified: the previous one, whole; the new one, whole (same files and sizes as an undisturbed run, and it
   loads); none; or PARTIAL (anything else: what this script exists to catch). Then the same command is run again
   and must finish with a whole output (prepare and train resume). Temporary files left beside the output are
   counted after the kill and after the rerun.
2. disk full (where this process may mount a tmpfs; skipped with the reason where it may not): the output goes to
   a small filesystem filled up so that only half of the output fits; the command must exit 1 with one line on
   stderr naming the output and "No space left on device", leave the previous output whole and no temporary file.

`nmt translate -o` is one of the writers. The server's file translation (serve-file) is `nmt serve` killed while
clients translate .txt files through /translate_file and /download_file: every download that completed must be the
whole translation, and a server started again must answer; on a full disk (its temporary folder on the small
filesystem) a /translate_file must be answered by a one-line JSON error, not a 500 and not a partial file.

Prints one line per writer and fault (trials, outcomes, what was lost) and, with --json, writes them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}
NMT = [sys.executable, "-m", "nmt_cli.cli"]


# ------------------------------------------------------------------------------------------------ the writers


@dataclass
class Writer:
    name: str
    args: list[str]  # nmt's arguments; OUT stands for the output's path
    output: str  # the output's name (a file or a folder)
    kind: str  # "checkpoint", "files" (a folder or a text file: whole when its files and sizes are the undisturbed
    # run's), "prepared" or "run"
    previous: bool = True  # whether a previous output may be in place (a push staging folder must be new)

    def argv(self, out: Path) -> list[str]:
        return [*NMT, *(str(out) if a == "OUT" else a for a in self.args)]


def writers(work: Path) -> dict[str, Writer]:
    run, ckpt = work / "run", str(work / "run" / "checkpoint_40.pt")
    tiny = ["--preset", "tiny", "--d-model", "64", "--threads", "1", "--save-every", "10", "--max-steps", "40"]
    ws = [
        Writer("prepare", ["prepare", "sample", "-o", "OUT"], "data", "prepared", previous=False),
        Writer("train", ["train", str(work / "data"), "-o", "OUT", *tiny], "run", "run", previous=False),
        Writer("average", ["average", "--last", "3", str(run), "-o", "OUT"], "avg.pt", "checkpoint"),
        Writer("export-ct2", ["export", "ctranslate2", ckpt, "-o", "OUT", "--force"], "ct2", "files"),
        Writer("export-hf", ["export", "huggingface", ckpt, "-o", "OUT", "--force"], "hf", "files"),
        Writer("import", ["import", str(work / "marian"), "-o", "OUT"], "imported.pt", "checkpoint"),
        Writer("translate", ["translate", "-m", ckpt, "-i", str(work / "data" / "raw" / "test.en"), "-o", "OUT",
                             "--beam", "2", "--threads", "1"], "test.de", "files"),
        Writer("push-staging", ["push", ckpt, "me/model", "--huggingface", "--ctranslate2", "--dry-run", "OUT"],
               "staged", "files", previous=False),
    ]
    return {w.name: w for w in ws}


def make_inputs(work: Path) -> None:
    """The sample corpus prepared, a tiny run of 40 updates, and a MarianMT folder to import (made once)."""
    work.mkdir(parents=True, exist_ok=True)
    steps = [(work / "data" / "manifest.json", ["prepare", "sample", "-o", str(work / "data")]),
             (work / "run" / "checkpoint_40.pt", writers(work)["train"].argv(work / "run")[3:]),
             (work / "marian" / "config.json", ["export", "huggingface", str(work / "run" / "checkpoint_40.pt"),
                                                "-o", str(work / "marian")])]
    for done, args in steps:
        if not done.exists():
            subprocess.run([*NMT, *args], env=ENV, check=True, capture_output=True)


# ------------------------------------------------------------------------------------ what an output is after


def snapshot(path: Path) -> dict[str, int]:
    """{relative name: size} of a file or a folder's files (temporary ones left out); {} where nothing is."""
    if path.is_file():
        return {"": path.stat().st_size}
    if not path.is_dir():
        return {}
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))
            if p.is_file() and ".tmp" not in p.name}


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in ([path] if path.is_file() else sorted(q for q in path.rglob("*") if q.is_file() and ".tmp" not in q.name)):
        h.update(str(p.relative_to(path) if path.is_dir() else "").encode() + p.read_bytes())
    return h.hexdigest()


def leftovers(parent: Path) -> int:
    """Temporary files and folders a writer left (atomic_write's NAME.XXXX.tmp, atomic_folder's .NAME.XXXX.tmp)."""
    return sum(1 for p in parent.rglob("*") if p.name.endswith(".tmp") or ".tmp-" in p.name or p.name.endswith(".old"))


def loads(w: Writer, out: Path) -> bool:
    """Whether the output is whole by its own reader."""
    code = {
        "checkpoint": "from nmt_cli.checkpoints.format import load; load(OUT)",
        "files": "",
        "prepared": "from nmt_cli.data.store import load_manifest; load_manifest(OUT)",
        "run": "from nmt_cli.checkpoints.format import load; import pathlib; "
               "[load(p) for p in pathlib.Path(OUT).glob('*.pt')]",
    }[w.kind]
    if not code:
        return True
    done = subprocess.run([sys.executable, "-c", code.replace("OUT", repr(str(out)))], env=ENV,
                          capture_output=True, text=True)
    return done.returncode == 0


def classify(w: Writer, out: Path, previous: str | None, reference: dict[str, int]) -> str:
    snap = snapshot(out)
    if not snap:
        return "none"
    if previous is not None and digest(out) == previous:
        return "previous"
    if w.kind == "prepared" and not (out / "manifest.json").exists():
        return "unfinished (no manifest: never read)"
    if w.kind == "run":  # a run directory grows: every checkpoint in it must load
        return "whole (every checkpoint loads)" if loads(w, out) else "PARTIAL"
    if set(snap) == set(reference) and all(snap[k] == reference[k] or k.endswith((".md", ".json")) for k in snap) \
            and loads(w, out):
        return "new"
    return "PARTIAL"


# ------------------------------------------------------------------------------------------------ kill -9


@dataclass
class Tally:
    writer: str
    fault: str
    trials: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    reruns_failed: int = 0
    left_after_kill: int = 0
    left_after_rerun: int = 0
    downloads: int = 0  # serve-file: whole downloads before the kills
    notes: list[str] = field(default_factory=list)

    def add(self, outcome: str) -> None:
        self.trials += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    @property
    def lost(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k.startswith(("PARTIAL", "FAILED"))) + self.reruns_failed


def run_to_end(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=timeout)


def kill_trials(w: Writer, work: Path, trials: int, rng: random.Random) -> Tally:
    tally = Tally(w.name, "kill -9")
    base = work / "kill" / w.name
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    ref = base / ("ref-" + w.output)
    t0 = time.perf_counter()
    done = run_to_end(w.argv(ref))
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{w.name}: the undisturbed run failed: {done.stderr.strip()[-500:]}")
    reference = snapshot(ref)
    for trial in range(trials):
        out = base / w.output
        shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        previous = None
        if w.previous and trial % 2 == 0:
            shutil.copytree(ref, out) if ref.is_dir() else shutil.copy(ref, out)
            previous = digest(out)
        before = leftovers(base)
        proc = subprocess.Popen(w.argv(out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(rng.uniform(0, wall))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        tally.add(classify(w, out, previous, reference))
        tally.left_after_kill += leftovers(base) - before
        if w.name == "push-staging" and snapshot(out) == reference:  # a whole staging folder is refused as a
            tally.left_after_rerun += leftovers(base) - before  # target (by design): nothing to finish
            continue
        again = run_to_end(w.argv(out))
        if again.returncode != 0 or classify(w, out, None, reference) not in ("new", "whole (every checkpoint loads)"):
            tally.reruns_failed += 1
            tally.notes.append(f"rerun after trial {trial}: {again.stderr.strip()[-300:]}")
        tally.left_after_rerun += leftovers(base) - before
    return tally


# ------------------------------------------------------------------------------------------------ disk full


def mount_small(where: Path, size: str = "16m") -> str | None:
    """Mount a tmpfs on `where` -> None, or the reason it cannot be."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def fill(where: Path, leave: int) -> None:
    """Take all of `where`'s free space but `leave` bytes."""
    free = shutil.disk_usage(where).free
    with open(where / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, free - leave))


def disk_full_trial(w: Writer, work: Path) -> Tally:
    tally = Tally(w.name, "disk full")
    small = work / "small"
    reason = mount_small(small)
    if reason:
        tally.notes.append(f"skipped: cannot mount a tmpfs here ({reason})")
        return tally
    try:
        ref = work / "kill" / w.name / ("ref-" + w.output)
        if not ref.exists():
            run_to_end(w.argv(ref))
        out = small / w.output
        previous = None
        if w.previous:
            shutil.copytree(ref, out) if ref.is_dir() else shutil.copy(ref, out)
            previous = digest(out)
        size = sum(snapshot(ref).values())
        fill(small, size // 2)
        done = run_to_end(w.argv(out))
        lines = done.stderr.strip().splitlines()
        one_line = (done.returncode == 1 and len(lines) >= 1 and "No space left on device" in lines[-1]
                    and str(out) in lines[-1] and "Traceback" not in done.stderr)
        kept = (digest(out) == previous) if previous is not None else True
        left = leftovers(small)
        outcome = "one line, previous kept, nothing left" if one_line and kept and not left else "FAILED"
        tally.add(outcome)
        if outcome == "FAILED":
            tally.notes.append(f"rc={done.returncode} kept={kept} left={left}: {done.stderr.strip()[-400:]}")
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
    return tally


# ------------------------------------------------------------------------------------------------ the server


class Serve:
    """`nmt serve` in its own process group, its temporary folder `tmp`; `url` once it listens."""

    def __init__(self, work: Path, tmp: Path):
        import re
        import threading

        tmp.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [*NMT, "serve", "-m", str(work / "run" / "checkpoint_40.pt"), "--langs", "en-de", "--port", "0",
             "--threads", "1", "--file-char-limit", "100000"], env={**ENV, "TMPDIR": str(tmp)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.url, ready, self.log = None, threading.Event(), []

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if m := re.search(r"listening on (http://\S+)", line):
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(180) or self.url is None:
            self.kill()
            raise SystemExit("nmt serve did not start:\n" + "".join(self.log[-20:]))

    def kill(self, sig=signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        self.proc.wait()


def translate_files(url: str, text: str, stop, results: list) -> None:
    """Translate `text` as a .txt file through /translate_file and /download_file until `stop` is set or the
    server goes: each download that completes is recorded with its number of lines."""
    import httpx

    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            try:
                r = client.post(url + "/translate_file", data={"source": "en", "target": "de"},
                                files={"file": ("in.txt", text.encode(), "text/plain")})
                if r.status_code != 200:
                    results.append(("refused", r.status_code))
                    continue
                got = client.get(r.json()["translatedFileUrl"])
                results.append(("downloaded", got.content.count(b"\n") if got.status_code == 200 else -1))
            except httpx.HTTPError:
                return


def serve_trials(work: Path, trials: int, rng: random.Random) -> Tally:
    """kill -9 of nmt serve while 4 clients translate files; then a server started again must translate one."""
    import threading

    tally = Tally("serve-file", "kill -9")
    lines = [ln for ln in (work / "data" / "raw" / "test.en").read_text().splitlines() if ln][:40]
    text = "\n".join(lines) + "\n"
    base = work / "kill" / "serve-file"
    shutil.rmtree(base, ignore_errors=True)
    for trial in range(trials):
        tmp = base / f"tmp{trial}"
        server = Serve(work, tmp)
        stop, results = threading.Event(), []
        clients = [threading.Thread(target=translate_files, args=(server.url, text, stop, results)) for _ in range(4)]
        for c in clients:
            c.start()
        time.sleep(rng.uniform(0.5, 8))
        server.kill()
        stop.set()
        for c in clients:
            c.join(150)
        whole = sum(1 for kind, n in results if kind == "downloaded" and n == len(lines))
        broken = sum(1 for kind, n in results if kind == "downloaded" and n != len(lines))
        tally.add("PARTIAL download" if broken else "downloads all whole" if whole else "killed before any download")
        tally.downloads += whole
        tally.left_after_kill += sum(1 for _ in tmp.glob("nmt-serve-files-*"))
        again = Serve(work, tmp)
        results = []
        stop = threading.Event()
        stop.set()  # one round only
        try:
            import httpx

            r = httpx.post(again.url + "/translate_file", data={"source": "en", "target": "de"},
                           files={"file": ("in.txt", text.encode(), "text/plain")}, timeout=120)
            ok = r.status_code == 200 and httpx.get(r.json()["translatedFileUrl"], timeout=60).content.count(
                b"\n") == len(lines)
        finally:
            again.kill(signal.SIGTERM)
        tally.reruns_failed += not ok
        tally.left_after_rerun += sum(1 for _ in tmp.glob("nmt-serve-files-*"))
    return tally


def serve_disk_full(work: Path) -> Tally:
    """/translate_file with the server's temporary folder on a full filesystem: a one-line JSON error (507)."""
    import httpx

    tally = Tally("serve-file", "disk full")
    small = work / "small"
    reason = mount_small(small, "2m")
    if reason:
        tally.notes.append(f"skipped: cannot mount a tmpfs here ({reason})")
        return tally
    try:
        server = Serve(work, small)
        fill(small, 2048)
        text = "the cat sees the dog\n" * 2000
        r = httpx.post(server.url + "/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("in.txt", text.encode(), "text/plain")}, timeout=300)
        server.kill(signal.SIGTERM)
        stored = [p for d in small.glob("nmt-serve-files-*") for p in d.iterdir()]
        good = r.status_code == 507 and "No space left" in r.json().get("error", "") and not stored
        tally.add("507, one line, nothing stored" if good else "FAILED")
        if not good:
            tally.notes.append(f"{r.status_code} {r.text[:300]} stored={stored}")
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
    return tally


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="kill -9 trials per writer")
    ap.add_argument("--writers", nargs="+", default=None,
                    help="only these writers (default: all): prepare train average export-ct2 export-hf import "
                         "translate push-staging serve-file")
    ap.add_argument("--seed", type=int, default=1, help="seed of the moments of the kills")
    ap.add_argument("--work", default="/tmp/nmt-faults", help="working directory (inputs are reused)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    work = Path(args.work)
    make_inputs(work)
    ws = writers(work)
    rng = random.Random(args.seed)
    rows = []
    for name in args.writers or [*ws, "serve-file"]:
        if name == "serve-file":
            tallies = (serve_trials(work, args.trials, rng), serve_disk_full(work))
        else:
            tallies = (kill_trials(ws[name], work, args.trials, rng), disk_full_trial(ws[name], work))
        for tally in tallies:
            rows.append(tally)
            outcomes = ", ".join(f"{k} {n}" for k, n in sorted(tally.outcomes.items()))
            outcomes += f"; {tally.downloads} whole downloads" if tally.downloads else ""
            print(f"{tally.writer:13s} {tally.fault:9s} trials {tally.trials:3d}  lost {tally.lost}  "
                  f"reruns failed {tally.reruns_failed}  temp left after kill {tally.left_after_kill}, "
                  f"after rerun {tally.left_after_rerun}  [{outcomes}]", flush=True)
            for note in tally.notes[:3]:
                print("    " + note, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([t.__dict__ | {"lost": t.lost} for t in rows], indent=1))


if __name__ == "__main__":
    main()
