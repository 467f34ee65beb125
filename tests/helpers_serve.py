"""A real `nmt serve` process for the tests, and a way to hold its decoding still.

A test that needs requests to wait (a full queue, a request past the time limit, a request in flight at SIGTERM,
requests that must share a batch) holds the server with `held(server)` instead of racing the machine's speed: the
engine processes are stopped (SIGSTOP) or, for a server that decodes in its own process, no sentence enters a search
while a gate file exists (the engine's encoding waits). Requests are still accepted, counted in /info's `queued`, and cancelled at the time limit;
none is decoded until the hold ends.

Run as a script (`python helpers_serve.py serve ...`), this file is `nmt` with that gate in the engine: the Server
below starts every server that way, so any of them can be held. With NMT_TEST_FAULT=languages in its environment,
GET /languages raises, as a bug in the web layer would (the test of internal errors).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GATE = "NMT_TEST_GATE"
FAULT = "NMT_TEST_FAULT"  # "languages": GET /languages raises, as a bug would


class Server:
    """`nmt serve ARGS --port 0` in a subprocess; `url` once it listens; stderr collected in `log`."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.dir = tempfile.mkdtemp(prefix="nmt-serve-test-")
        self.gate = Path(self.dir) / "hold"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", GATE: str(self.gate), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, __file__, "serve", "--port", "0", "--threads", "1", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        self.ready = threading.Event()
        self.url = None
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(120) or self.url is None:
            self.proc.kill()
            raise AssertionError("the server did not start:\n" + "".join(self.log))

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                self.ready.set()
        self.ready.set()

    def logged(self, text: str, timeout: float = 30) -> str:
        """The log so far once it holds `text`: the server writes its log from another thread than the one that
        answers, and the reader here collects it in a third, so a line may arrive after the response."""
        deadline = time.monotonic() + timeout
        while text not in (log := "".join(self.log)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return log

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux)."""
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def engine_pids(s: Server) -> list[int]:
    """The engine processes of a server (its children but multiprocessing's resource tracker); [] for a server that
    decodes in its own process."""
    return [pid for pid in children(s.proc.pid) if "spawn_main" in open(f"/proc/{pid}/cmdline").read()]


def engine_pid(s: Server) -> int:
    pids = engine_pids(s)
    assert len(pids) == 1, f"not one engine process among {children(s.proc.pid)}"
    return pids[0]


@contextlib.contextmanager
def held(s: Server):
    """Hold the server's decoding still for the block (see the module docstring); start it from an idle server."""
    pids = engine_pids(s)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    if not pids:
        s.gate.touch()
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        s.gate.unlink(missing_ok=True)


def info(s: Server) -> dict:
    """/info's first model."""
    import httpx

    return httpx.get(s.url + "/info", timeout=60).json()["models"][0]


def wait_for(s: Server, predicate, what: str, deadline_s: float = 60) -> dict:
    """/info's first model once `predicate(model)` holds (the deadline only ends a hang)."""
    deadline = time.monotonic() + deadline_s
    while True:
        m = info(s)
        if predicate(m):
            return m
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {m}"
        time.sleep(0.01)


def _gated_main() -> None:
    """`nmt` whose serve engine (in this process) encodes no batch, so no sentence enters a search, while the gate
    file exists."""
    from nmt_cli.cli import main
    from nmt_cli.serve import engine

    gate, encode = Path(os.environ[GATE]), engine.encode_batch

    def gated(*args, **kwargs):
        while gate.exists():
            time.sleep(0.005)
        return encode(*args, **kwargs)

    engine.encode_batch = gated
    if os.environ.get(FAULT) == "languages":  # a bug in the web layer, for the test of internal errors
        from nmt_cli.serve import service

        def broken(self):
            raise RuntimeError("a bug in the service")

        service.Service.languages = broken
    main(sys.argv[1:])


if __name__ == "__main__":
    _gated_main()


def error_of(r, status: int) -> str:
    """The error text of response `r`, which must have status `status` and be one JSON line {"error": text}."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
    assert "\n" not in body["error"] and "\n" not in r.text.strip()  # one JSON line
    return body["error"]


@contextlib.contextmanager
def reference_translator(ckpt):
    """What the Python API translates from `ckpt`, one thread, with the options a request gives:
    translate(lines, **options) -> per line its Translations (a Translator per set of options, made once)."""
    import torch

    from nmt_cli.inference.translate import Translator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cache = {}

    def translate(lines, **options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = Translator.load(ckpt, device="cpu", **options)
        return cache[key].translate(lines)

    try:
        yield translate
    finally:
        torch.set_num_threads(threads)
