"""`nmt serve`: a real server process on 127.0.0.1, spoken to through real clients (httpx and the published
LibreTranslate client, libretranslatepy): LibreTranslate's API as its clients send it, nmt's options, the errors,
the limits, batching across concurrent requests, and the graceful stop."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
httpx = pytest.importorskip("httpx", reason="the test-serve extra is not installed")
libretranslatepy = pytest.importorskip("libretranslatepy", reason="the test-serve extra is not installed")

from conftest import toy_pairs  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402
from nmt_cli import checkpoint  # noqa: E402
from nmt_cli.translate import Translator  # noqa: E402

LINES = [en for en, _ in toy_pairs(40, seed=11)]


class Server:
    """`nmt serve ARGS --port 0` in a subprocess; `url` once it listens; stderr collected in `log`."""

    def __init__(self, *args: str):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "nmt_cli.cli", "serve", "--port", "0", "--threads", "1",
                                      *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
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

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "tiny.pt", toy_tokenizer_bytes, seed=3,
                           max_positions=128)


@pytest.fixture(scope="module")
def slow_ckpt(tmp_path_factory, toy_tokenizer_bytes):
    """Random weights decode to the maximum length: with 512 positions, a request takes seconds."""
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "slow.pt", toy_tokenizer_bytes, seed=4,
                           d_model=128, d_ff=256, max_positions=512)


SERVER_MODES = {"in-process": ("--no-engine-process",), "engine-process": ("--engine-process",),
                "two-engine-processes": ("--engine-process", "--threads", "2")}


@pytest.fixture(scope="module", params=list(SERVER_MODES))
def server(ckpt, request):
    """The API's tests run against each: the engine in the server's process, in one of its own, and (2 threads)
    in two, the requests shared between them."""
    s = Server("-m", str(ckpt), "--batch-limit", "8", "--char-limit", "300", *SERVER_MODES[request.param])
    s.mode = request.param
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def reference(ckpt):
    """What the Python API translates, one thread, with the options a request gives."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cache = {}

    def translate(lines, **options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = Translator.load(ckpt, device="cpu", **options)
        return cache[key].translate(lines)

    yield translate
    torch.set_num_threads(threads)


def post(server, body=None, **kwargs):
    return httpx.post(server.url + "/translate", json=body, timeout=60, **kwargs) if body is not None else \
        httpx.post(server.url + "/translate", timeout=60, **kwargs)


def error_of(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)
    assert body["error"] and "\n" not in body["error"]
    return body["error"]


# ---------------------------------------------------------------------------------------------------- the API


def test_json_string_and_list_translate_as_the_python_api(server, reference):
    best = [h[0].text for h in reference(LINES[:6])]
    r = post(server, {"q": LINES[0], "source": "en", "target": "de"})
    assert r.status_code == 200 and r.json() == {"translatedText": best[0]}
    r = post(server, {"q": LINES[:6], "source": "en", "target": "de"})
    assert r.json() == {"translatedText": best}
    # a q of several lines: each line translated, the line breaks kept
    r = post(server, {"q": f"{LINES[0]}\n{LINES[1]}\r\n\n{LINES[2]}", "source": "en", "target": "de"})
    assert r.json()["translatedText"] == f"{best[0]}\n{best[1]}\r\n\n{best[2]}"


def test_the_libretranslate_client_and_form_data(server, reference):
    best = [h[0].text for h in reference(LINES[:3])]
    client = libretranslatepy.LibreTranslateAPI(server.url)
    assert client.translate(LINES[0], "en", "de") == best[0]  # a urlencoded form, as the client sends it
    assert client.languages() == [{"code": "de", "name": "German", "targets": []},
                                  {"code": "en", "name": "English", "targets": ["de"]}]
    r = post(server, data={"q": LINES[1], "source": "en", "target": "de", "alternatives": "1"})
    assert r.json()["translatedText"] == best[1] and len(r.json()["alternatives"]) == 1
    r = httpx.post(server.url + "/translate", content="q=" + "&q=".join(LINES[:2]) + "&source=en&target=de",
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.json() == {"translatedText": best[:2]}  # q repeated: a list
    r = post(server, files={"q": (None, LINES[2]), "source": (None, "en"), "target": (None, "de")})  # multipart
    assert r.json() == {"translatedText": best[2]}


def test_alternatives_scores_auto_and_decoding_options(server, reference):
    nbest = reference(LINES[:2], nbest=3)
    r = post(server, {"q": LINES[0], "source": "auto", "target": "de", "alternatives": 2, "scores": True}).json()
    assert r["translatedText"] == nbest[0][0].text
    assert r["alternatives"] == [h.text for h in nbest[0][1:]]
    assert r["scores"] == pytest.approx([h.score for h in nbest[0]], abs=1e-3)
    assert r["detectedLanguage"] == {"confidence": 100.0, "language": "en"}
    r = post(server, {"q": LINES[:2], "source": "en", "target": "de", "alternatives": "2"}).json()
    assert r["alternatives"] == [[h.text for h in hs[1:]] for hs in nbest]
    greedy = reference(LINES[:3], beam=1, lenpen=1.0, max_len_b=5)
    r = post(server, {"q": LINES[:3], "source": "en", "target": "de", "beam": 1, "lenpen": 1.0, "max_len_b": 5})
    assert r.json()["translatedText"] == [h[0].text for h in greedy]
    sample = {"q": LINES[:2], "source": "en", "target": "de", "sampling": True, "seed": 7, "alternatives": 2}
    first, second = post(server, sample).json(), post(server, sample).json()
    assert first == second  # a seed makes a request reproducible whatever else the server does
    other = post(server, {**sample, "seed": 8}).json()
    assert other != first


def test_languages_health_info(server, ckpt):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/languages").json()[1] == {"code": "en", "name": "English", "targets": ["de"]}
    info = httpx.get(server.url + "/info").json()
    assert info["limits"]["batch_limit"] == 8 and info["limits"]["char_limit"] == 300
    assert info["models"][0]["source"] == "en" and info["models"][0]["precision"] == "fp32"
    assert info["models"][0]["defaults"]["beam"] == 4 and info["api_key_required"] is False
    model = checkpoint.load(ckpt).build_model(torch.device("cpu"))  # the count before oneDNN packing or int8
    assert info["models"][0]["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["models"][0].get("engine_processes", 1) == (2 if server.mode == "two-engine-processes" else 1)
    settings = httpx.get(server.url + "/frontend/settings").json()
    assert settings["charLimit"] == 300 and settings["keyRequired"] is False


BAD = [
    ({"source": "en", "target": "de"}, "missing q"),
    ({"q": "a cat", "target": "de"}, "missing source"),
    ({"q": "a cat", "source": "en"}, "missing target"),
    ({"q": "a cat", "source": "fr", "target": "de"}, "fr is not supported as a source"),
    ({"q": "a cat", "source": "en", "target": "fr"}, "fr is not supported as a target"),
    ({"q": "a cat", "source": "en", "target": "de", "format": "html"}, "html is not supported"),
    ({"q": "a cat", "source": "en", "target": "de", "format": "xml"}, "format 'xml' is not supported"),
    ({"q": [], "source": "en", "target": "de"}, "empty list"),
    ({"q": 5, "source": "en", "target": "de"}, "q must be a string or a list"),
    ({"q": ["a", 1], "source": "en", "target": "de"}, "q must be a string or a list"),
    ({"q": "a cat", "source": "en", "target": "de", "alternatives": "many"}, "alternatives must be an integer"),
    ({"q": "a cat", "source": "en", "target": "de", "alternatives": -1}, "alternatives must be between"),
    ({"q": "a cat", "source": "en", "target": "de", "alternatives": 1e300}, "alternatives must be an integer"),
    ({"q": "a cat", "source": "en", "target": "de", "beam": 0}, "beam size must be at least 1"),
    ({"q": "a cat", "source": "en", "target": "de", "beam": 17}, "above this server's limit"),
    ({"q": "a cat", "source": "en", "target": "de", "beam": 2, "alternatives": 2}, "nbest must be between 1 and"),
    ({"q": "a cat", "source": "en", "target": "de", "topk": 5}, "only apply with sampling"),
    ({"q": "a cat", "source": "en", "target": "de", "sampling": "perhaps"}, "sampling must be true or false"),
    ({"q": "a cat", "source": ["en"], "target": "de"}, "source must be a language code"),
]


@pytest.mark.parametrize("body,message", BAD, ids=[m for _, m in BAD])
def test_bad_requests_get_400_and_one_line(server, body, message):
    assert message in error_of(post(server, body), 400)


@pytest.mark.parametrize("content,ctype,status,message", [
    (b"[1, 2]", "application/json", 400, "must be a JSON object"),
    (b'{"q": "a cat", ', "application/json", 400, "invalid JSON"),
    (b'{"q": "a \xff cat", "source": "en", "target": "de"}', "application/json", 400, "not valid UTF-8"),
    (b'{"q": "a \\ud800 cat", "source": "en", "target": "de"}', "application/json", 400, "invalid Unicode"),
    (b"[" * 30000 + b"]" * 30000, "application/json", 400, "invalid JSON"),
    (b"q=a%FFcat&source=en&target=de", "application/x-www-form-urlencoded", 400, "not valid UTF-8"),
    (b"q=a cat", "text/plain", 415, "content type text/plain"),
    (b"", "application/json", 400, "invalid JSON"),
])
def test_malformed_bodies(server, content, ctype, status, message):
    r = httpx.post(server.url + "/translate", content=content, headers={"Content-Type": ctype}, timeout=60)
    assert message in error_of(r, status)


def test_limits_give_413(server):
    assert "9 lines" in error_of(post(server, {"q": ["a cat"] * 9, "source": "en", "target": "de"}), 413)
    assert "301 characters" in error_of(post(server, {"q": "a" * 301, "source": "en", "target": "de"}), 413)
    big = json.dumps({"q": "a", "pad": "x" * 200_000, "source": "en", "target": "de"})
    assert "bytes" in error_of(httpx.post(server.url + "/translate", content=big, timeout=60,
                                          headers={"Content-Type": "application/json"}), 413)
    assert "no endpoint" in error_of(httpx.get(server.url + "/nothing"), 404)
    assert "not allowed" in error_of(httpx.get(server.url + "/translate"), 405)
    assert httpx.get(server.url + "/health").status_code == 200  # none of it hurt the server


def test_concurrent_requests_share_batches_and_get_their_own_answers(server, reference):
    best = [h[0].text for h in reference(LINES)]
    before = httpx.get(server.url + "/info").json()["models"][0]

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(i):
                r = await client.post(server.url + "/translate", json={"q": LINES[i], "source": "en", "target": "de"})
                return r.json()["translatedText"]
            return await asyncio.gather(*(one(i) for i in range(len(LINES))))

    assert asyncio.run(main()) == best
    after = httpx.get(server.url + "/info").json()["models"][0]
    sentences = after["translated"] - before["translated"]
    batches = after["batches"] - before["batches"]
    assert sentences == len(LINES) and batches < sentences  # sentences of different requests shared batches


def test_a_short_request_returns_before_a_long_one_it_joined(server, reference):
    long_line, short_line = " ".join(LINES[:6]), "a cat"
    long_out, short_out = (h[0].text for h in reference([long_line, short_line]))
    assert len(long_out) > 2 * len(short_out)  # (the precondition: more steps to decode)
    done = {}

    def send(name, line):
        r = post(server, {"q": line, "source": "en", "target": "de"})
        done[name] = (time.monotonic(), r.json()["translatedText"])

    t = threading.Thread(target=send, args=("long", long_line))
    t.start()
    time.sleep(0.02)
    send("short", short_line)
    t.join()
    assert done["long"][1] == long_out and done["short"][1] == short_out
    assert done["short"][0] < done["long"][0]


def test_a_failed_encoding_fails_its_request_and_the_engine_goes_on(ckpt, monkeypatch, reference):
    """The engine encodes waiting sentences on a thread of its own: an error there fails the request whose
    sentences it held, with a one-line message, and the next request is translated as usual."""
    from nmt_cli.serve import engine as served

    real, calls = served.encode_batch, []

    def flaky(model, src, pad, static=False):
        calls.append(src.size(0))
        if len(calls) == 1:
            raise RuntimeError("encoder broke\nsecond line")
        return real(model, src, pad, static)

    monkeypatch.setattr(served, "encode_batch", flaky)
    engine = served.Engine(Translator.load(ckpt, device="cpu"), max_queue=16)

    def run(lines):
        done, box = threading.Event(), []
        engine.submit(lines, engine.config(), lambda job: (box.append(job), done.set()))
        assert done.wait(60)
        return box[0]

    try:
        failed = run(["a cat sat"])
        assert failed.error == "RuntimeError: encoder broke"
        ok = run(LINES[:3])
        assert ok.error is None
        texts = engine.translator.tokenizer.decode([hyps[0].tokens for hyps in ok.results])
        assert texts == [h[0].text for h in reference(LINES[:3])]
    finally:
        engine.close()
    assert engine.stats()["queued"] == 0 and len(calls) >= 2


# ---------------------------------------------------------------------------------------------------- API keys


def test_api_keys(ckpt, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# the keys\nsecret-1\n\nsecret-2\n")
    s = Server("-m", str(ckpt), "--api-keys", str(keys))
    try:
        body = {"q": "a cat", "source": "en", "target": "de"}
        assert "API key" in error_of(post(s, body), 403)
        assert "API key" in error_of(post(s, {**body, "api_key": "wrong"}), 403)
        assert post(s, {**body, "api_key": "secret-2"}).status_code == 200
        client = libretranslatepy.LibreTranslateAPI(s.url, api_key="secret-1")
        assert isinstance(client.translate("a cat", "en", "de"), str)
        assert httpx.get(s.url + "/info").json()["api_key_required"] is True
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------------------------------------------- busy


def test_a_full_queue_gives_503_with_retry_after_and_the_time_limit_503(slow_ckpt):
    s = Server("-m", str(slow_ckpt), "--queue-size", "4", "--batch-limit", "4", "--timeout", "30",
               "--max-len-b", "400")
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(*(client.post(s.url + "/translate", json={
                    "q": LINES[i], "source": "en", "target": "de"}) for i in range(12)))

        answers = asyncio.run(burst())
        busy = [r for r in answers if r.status_code == 503]
        assert busy and all("queue full" in error_of(r, 503) for r in busy)
        assert all(int(r.headers["Retry-After"]) >= 1 for r in busy)
        assert all(r.status_code == 200 and r.json()["translatedText"] for r in answers if r not in busy)
        assert len(busy) < len(answers)
    finally:
        assert s.stop() == 0
    s = Server("-m", str(slow_ckpt), "--timeout", "0.3", "--max-len-b", "400")
    try:
        r = post(s, {"q": LINES[:4], "source": "en", "target": "de", "beam": 8})
        assert "longer than this server's limit of 0.3 s" in error_of(r, 503) and r.headers["Retry-After"]
        r = post(s, {"q": "a cat", "source": "en", "target": "de", "beam": 1, "max_len_b": 2})
        assert r.status_code == 200  # the server goes on
        for seed in range(5):  # seeded requests: a search group each
            assert post(s, {"q": "a cat", "source": "en", "target": "de", "sampling": True, "seed": seed,
                            "max_len_b": 2}).status_code == 200
        deadline = time.monotonic() + 30
        while True:  # nothing is left behind: no sentence queued, the abandoned ones counted, and of the seven
            # search groups only the one the idle worker waits on (the last seed's)
            m = httpx.get(s.url + "/info").json()["models"][0]
            if m["queued"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (m["queued"], m["search_groups"], m["dropped"], m["translated"]) == (0, 1, 4, 6)
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------------------------------------------- stopping


def test_sigterm_finishes_the_request_in_flight_then_exits_0(slow_ckpt, toy_tokenizer_bytes):
    s = Server("-m", str(slow_ckpt), "--max-len-b", "300")
    result = {}

    def send():
        r = post(s, {"q": LINES[:2], "source": "en", "target": "de"})
        result["status"], result["body"], result["at"] = r.status_code, r.json(), time.monotonic()

    t = threading.Thread(target=send)
    t.start()
    deadline = time.monotonic() + 30
    while httpx.get(s.url + "/info").json()["models"][0]["queued"] == 0:  # the request is in the engine
        assert time.monotonic() < deadline and t.is_alive()
        time.sleep(0.01)
    stopped = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    with pytest.raises(httpx.TransportError):  # no new connections once stopping
        httpx.get(s.url + "/health", timeout=5)
    t.join(120)
    assert s.proc.wait(60) == 0, "".join(s.log)
    # the request was in the engine when SIGTERM came, and was answered in full after it
    assert result["status"] == 200 and len(result["body"]["translatedText"]) == 2 and result["at"] > stopped


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux)."""
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def engine_pid(s: Server) -> int:
    """The engine process of an `--engine-process` server (the one child that is not multiprocessing's resource
    tracker)."""
    for pid in children(s.proc.pid):
        if "spawn_main" in open(f"/proc/{pid}/cmdline").read():
            return pid
    raise AssertionError(f"no engine process among {children(s.proc.pid)}")


def wait_queued(s: Server, busy: bool, deadline_s: float = 30) -> dict:
    """/info's model once sentences are queued (busy) or none is."""
    deadline = time.monotonic() + deadline_s
    while True:
        m = httpx.get(s.url + "/info").json()["models"][0]
        if (m["queued"] > 0) == busy:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.01)


@pytest.mark.parametrize("threads", ["1", "2"], ids=["one-engine-process", "two-engine-processes"])
def test_engine_process_time_limit_queue_and_stop(slow_ckpt, threads):
    """With --engine-process (one, or two sharing the requests): a request past the time limit gets 503 and leaves
    nothing queued, a full queue (over all engines) 503 with Retry-After, and SIGTERM finishes the request in flight,
    stops the engine processes and exits 0."""
    s = Server("-m", str(slow_ckpt), "--engine-process", "--timeout", "0.3", "--max-len-b", "400",
               "--queue-size", "4", "--batch-limit", "4", "--threads", threads)
    try:
        engine = engine_pid(s)
        r = post(s, {"q": LINES[:4], "source": "en", "target": "de", "beam": 8})
        assert "longer than this server's limit of 0.3 s" in error_of(r, 503)
        m = wait_queued(s, busy=False)  # the given-up sentences left the queue (and the engine's search)
        assert m["queued"] == 0 and m["dropped"] == 4
        r = post(s, {"q": "a cat", "source": "en", "target": "de", "beam": 1, "max_len_b": 2})
        assert r.status_code == 200 and r.json()["translatedText"]
        for q in ["\n", [" ", "a cat\n\n"], "a cat"]:  # lines with nothing to decode finish at once in the engine process
            assert post(s, {"q": q, "source": "en", "target": "de", "beam": 1, "max_len_b": 2}).status_code == 200
        assert httpx.get(s.url + "/info").json()["models"][0]["engine_process_requests"] == 0  # none kept there

        result = {}

        def send(key, body):
            r = httpx.post(s.url + "/translate", json=body, timeout=120)
            result[key] = (r.status_code, r.json(), r.headers.get("Retry-After"))

        long = threading.Thread(target=send, args=("long", {"q": LINES[:4], "source": "en", "target": "de",
                                                           "beam": 1}))
        long.start()
        wait_queued(s, busy=True)
        send("full", {"q": "a cat", "source": "en", "target": "de"})  # 4 sentences queued: no room for a 5th
        assert result["full"][0] == 503 and "queue full" in result["full"][1]["error"] and result["full"][2]
        s.proc.send_signal(signal.SIGTERM)
        long.join(120)
        assert s.proc.wait(60) == 0, "".join(s.log)
    finally:
        s.stop()
    assert result["long"][0] == 200 and len(result["long"][1]["translatedText"]) == 4  # finished after SIGTERM
    assert not os.path.exists(f"/proc/{engine}") or "zombie" in open(f"/proc/{engine}/status").read().lower()


def test_engine_process_that_dies_fails_its_requests_and_the_server_says_so(slow_ckpt):
    """If the engine process dies (killed: out of memory), the requests it held get 500, later ones 503, and
    the server still answers /health and stops with exit 0."""
    s = Server("-m", str(slow_ckpt), "--engine-process", "--max-len-b", "400")
    try:
        result = {}

        def send():
            r = post(s, {"q": LINES[:2], "source": "en", "target": "de"})
            result["r"] = r

        t = threading.Thread(target=send)
        t.start()
        wait_queued(s, busy=True)
        os.kill(engine_pid(s), signal.SIGKILL)
        t.join(60)
        assert "the decoding engine process died" in error_of(result["r"], 500)
        assert "the decoding engine process died" in error_of(post(s, {"q": "a cat", "source": "en",
                                                                        "target": "de"}), 503)
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/info").status_code == 200
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_an_engine_process_that_cannot_load_says_why_in_one_line(ckpt):
    from nmt_cli.serve.remote import EngineProcessError, RemoteEngine
    from nmt_cli.translate import TranslateConfig

    spec = dict(model=str(ckpt) + ".missing", device="cpu", precision="fp32", config=TranslateConfig(), threads=1)
    with pytest.raises(EngineProcessError) as err:
        RemoteEngine(Translator.load(ckpt, device="cpu"), spec)
    assert "could not load" in str(err.value) and "no such checkpoint" in str(err.value)
    assert "\n" not in str(err.value)


def test_without_the_extra_serve_says_what_to_install(ckpt):
    code = ("import sys; sys.modules['uvicorn'] = None; from nmt_cli.cli import main; "
            f"main(['serve', '-m', {str(ckpt)!r}])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install 'nmt-cli[serve]'" in lines[0]


def test_a_checkpoint_without_languages_needs_langs(tmp_path, toy_tokenizer_bytes):
    from nmt_cli import checkpoint

    path = make_checkpoint(tmp_path / "nolangs.pt", toy_tokenizer_bytes)
    ck = checkpoint.load(path)
    ck.langs = {}
    checkpoint.save(ck, path)
    r = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "serve", "-m", str(path), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--langs SRC-TGT" in r.stderr
    s = Server("-m", str(path), "--langs", "fr-es")
    try:
        assert httpx.get(s.url + "/languages").json()[0]["code"] == "es"
        assert post(s, {"q": "a cat", "source": "fr", "target": "es"}).status_code == 200
    finally:
        assert s.stop() == 0


def test_the_core_never_imports_the_web_stack():
    from pathlib import Path

    import nmt_cli

    pkg = Path(nmt_cli.__file__).parent
    web = {"starlette", "uvicorn", "fastapi", "httpx", "multipart", "python_multipart"}
    offenders = []
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        if rel.parts[:2] in (("serve", "app.py"), ("serve", "server.py")):
            continue
        import ast

        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if any(n.split(".")[0] in web for n in names):
                offenders.append(str(rel))
    assert offenders == []
    code = ("import sys; import nmt_cli.cli, nmt_cli.translate, nmt_cli.serve.engine, nmt_cli.serve.service; "
            "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stderr
