"""`nmt serve`: a real server process on 127.0.0.1, spoken to through real clients (httpx and the published
LibreTranslate client, libretranslatepy): LibreTranslate's API as its clients send it, nmt's options, the errors,
the limits, batching across concurrent requests, and the graceful stop."""

from __future__ import annotations

import asyncio
import json
import os
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
from helpers_serve import Server, engine_pid, engine_pids, error_of, held, reference_translator, wait_for  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402
from nmt_cli.checkpoints import format as checkpoint  # noqa: E402
from nmt_cli.inference.translate import Translator  # noqa: E402

LINES = [en for en, _ in toy_pairs(40, seed=11)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "tiny.pt", toy_tokenizer_bytes, seed=3,
                           max_positions=128)


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
    with reference_translator(ckpt) as translate:
        yield translate


def post(server, body=None, **kwargs):
    return httpx.post(server.url + "/translate", json=body, timeout=60, **kwargs) if body is not None else \
        httpx.post(server.url + "/translate", timeout=60, **kwargs)


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


def test_nothing_to_translate_comes_back_as_given(server, reference):
    """As LibreTranslate: an emoji, a number, a URL alone come back unchanged, alone, in a list, as a line of q, as a
    form; the lines with letters beside them are translated as before; alternatives and scores as a line's."""
    best = [h[0].text for h in reference(LINES[:2])]
    for q in ("🙂", "42", "https://example.org/a-cat", "  ...  "):
        assert post(server, {"q": q, "source": "en", "target": "de"}).json() == {"translatedText": q}
        assert post(server, data={"q": q, "source": "en", "target": "de"}).json() == {"translatedText": q}
    r = post(server, {"q": ["🙂", LINES[0], "1984"], "source": "en", "target": "de", "alternatives": 1, "scores": True})
    assert r.json()["translatedText"] == ["🙂", best[0], "1984"]
    assert r.json()["alternatives"][0] == ["🙂"] and r.json()["scores"][2] == [0.0, 0.0]
    r = post(server, {"q": f"{LINES[0]}\n👍\n{LINES[1]}", "source": "auto", "target": "de"})
    assert r.json()["translatedText"] == f"{best[0]}\n👍\n{best[1]}"
    r = post(server, {"q": "<p>12  34 <b>https://example.org</b></p>", "source": "en", "target": "de",
                      "format": "html"})
    assert r.json() == {"translatedText": "<p>12  34 <b>https://example.org</b></p>"}
    r = post(server, {"q": "🙂", "source": "auto", "target": "de"}).json()
    assert r == {"translatedText": "🙂", "detectedLanguage": {"confidence": 0.0, "language": "en"}}


def test_sentences_are_translated_one_by_one(server, reference):
    """As LibreTranslate: a text is split into sentences (sentencex), each translated, joined back with the text's
    own spacing and line breaks; JSON, forms, lists and html alike. (A request of two sentences lost the second.)"""
    a, b, c = (f"{line}." for line in LINES[:3])
    best = dict(zip([a, b, c], [h[0].text for h in reference([a, b, c])], strict=True))
    r = post(server, {"q": f"{a} {b}", "source": "en", "target": "de"})
    assert r.json() == {"translatedText": f"{best[a]} {best[b]}"}
    assert post(server, data={"q": f"  {a}  {b}\n\n{c} 🙂", "source": "en", "target": "de"}).json() == {
        "translatedText": f"  {best[a]}  {best[b]}\n\n{best[c]} 🙂"}  # (a form's line breaks, as sent)
    r = post(server, {"q": [f"{a} {b}", c], "source": "en", "target": "de", "scores": True})
    one = reference([a, b])
    assert r.json()["translatedText"] == [f"{best[a]} {best[b]}", best[c]]
    assert r.json()["scores"][0] == pytest.approx([one[0][0].score + one[1][0].score], abs=1e-3)
    r = post(server, {"q": f"<p>{a} {b}</p>", "source": "en", "target": "de", "format": "html"})
    assert r.json() == {"translatedText": f"<p>{best[a]} {best[b]}</p>"}


def test_the_libretranslate_client_and_form_data(server, reference):
    best = [h[0].text for h in reference(LINES[:3])]
    client = libretranslatepy.LibreTranslateAPI(server.url)
    assert client.translate(LINES[0], "en", "de") == best[0]  # a urlencoded form, as the client sends it
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de", "en"]},  # (a GET)
                                  {"code": "de", "name": "German", "targets": ["de"]}]
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
    assert r["detectedLanguage"]["language"] == "en"  # (among en and de: de is its own target)
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


def test_each_language_is_its_own_target(server):
    """/languages lists each language as its own target, as LibreTranslate (its identity translation): the text
    comes back as given, a form or JSON, a list, html, alternatives; options are still checked."""
    text = "Ein Hund.\n  a cat 🙂"
    for source, target in (("de", "de"), ("en", "en")):
        r = post(server, {"q": text, "source": source, "target": target, "alternatives": 1})
        assert r.json() == {"translatedText": text, "alternatives": [text]}
        assert post(server, data={"q": text, "source": source, "target": target}).json() == {"translatedText": text}
    r = post(server, {"q": ["<p>a <b>cat</b></p>", "x"], "source": "de", "target": "de", "format": "html"})
    assert r.json() == {"translatedText": ["<p>a <b>cat</b></p>", "x"]}
    assert "beam 99 is above" in error_of(post(server, {"q": "a", "source": "de", "target": "de", "beam": 99}), 400)


def test_languages_health_info(server, ckpt):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/languages").json() == [{"code": "en", "name": "English", "targets": ["de", "en"]},
                                                           {"code": "de", "name": "German", "targets": ["de"]}]
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
    ({"q": "a cat", "source": "fr", "target": "de"}, "fr is not supported"),
    ({"q": "a cat", "source": "en", "target": "fr"}, "fr is not supported"),
    ({"q": "a cat", "source": "de", "target": "en"}, "English (en) is not available as a target language from"),
    ({"q": "a cat", "source": "en", "target": "de", "format": "xml"}, "xml format is not supported"),
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
    assert "9 sentences" in error_of(post(server, {"q": ["a cat"] * 9, "source": "en", "target": "de"}), 413)
    assert "10 sentences" in error_of(post(server, {"q": "A cat sleeps. A dog runs. " * 5, "source": "en", "target": "de"}), 413)
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

    answers = []
    client = threading.Thread(target=lambda: answers.append(asyncio.run(main())))
    with held(server):  # every request waits in the queue, whatever the machine's speed: they are batched together
        client.start()
        wait_for(server, lambda m: m["queued"] == len(LINES), "every request queued")
    client.join(120)
    assert answers == [best]
    after = httpx.get(server.url + "/info").json()["models"][0]
    sentences = after["translated"] - before["translated"]
    batches = after["batches"] - before["batches"]
    assert sentences == len(LINES) and batches < sentences  # sentences of different requests shared batches


def test_a_short_request_returns_before_a_long_one_it_joined(server, reference):
    """Both requests wait while the server is held; then they share one search, and the short one is answered as
    soon as its sentence ends, before the long one."""
    long_line, short_line = " ".join(LINES[:6]), "a cat"
    long_out, short_out = (h[0].text for h in reference([long_line, short_line]))
    assert len(long_out) > 2 * len(short_out)  # (the precondition: more steps to decode)
    done = []

    def send(name, line):
        r = post(server, {"q": line, "source": "en", "target": "de"})
        done.append((name, r.json()["translatedText"]))

    threads = [threading.Thread(target=send, args=(name, line)) for name, line in
               (("long", long_line), ("short", short_line))]
    with held(server):
        for k, t in enumerate(threads, 1):
            t.start()
            wait_for(server, lambda m, k=k: m["queued"] == k, f"{k} sentences queued")
    for t in threads:
        t.join(120)
    if server.mode == "two-engine-processes":  # each request goes whole to the emptier engine: no shared search
        assert sorted(done) == [("long", long_out), ("short", short_out)]
    else:
        assert done == [("short", short_out), ("long", long_out)]


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


@pytest.mark.parametrize("mode", list(SERVER_MODES))
def test_a_full_queue_gives_503_and_sigterm_finishes_what_was_accepted(ckpt, reference, mode):
    """Held, the server takes requests until its queue (4 sentences, over all engines) is full, then 503 with
    Retry-After; SIGTERM closes the listening socket at once, the accepted requests are answered in full when the
    decoding goes on, the engine processes stop and the server exits 0."""
    best = [h[0].text for h in reference(LINES[:12])]
    s = Server("-m", str(ckpt), "--queue-size", "4", "--batch-limit", "4", *SERVER_MODES[mode])
    engines = engine_pids(s)  # (none in-process)
    answers = []

    async def burst():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(s.url + "/translate", json={
                "q": LINES[i], "source": "en", "target": "de"}) for i in range(12)))

    client = threading.Thread(target=lambda: answers.extend(asyncio.run(burst())))
    try:
        with held(s):
            client.start()
            wait_for(s, lambda m: m["queued"] == 4, "a full queue")
            full = error_of(post(s, {"q": "a cat", "source": "en", "target": "de"}), 503)
            assert "queue full" in full
            s.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 60
            while True:  # no new connections once stopping
                try:
                    httpx.get(s.url + "/health", timeout=5)
                except httpx.TransportError:
                    break
                assert time.monotonic() < deadline, "the server still takes connections after SIGTERM"
                time.sleep(0.05)
        client.join(120)
        assert s.proc.wait(60) == 0, "".join(s.log)
    finally:
        s.stop()
    busy = [r for r in answers if r.status_code == 503]
    assert len(answers) == 12 and len(busy) == 8
    assert all("queue full" in error_of(r, 503) and int(r.headers["Retry-After"]) >= 1 for r in busy)
    assert [r.json()["translatedText"] for r in answers if r not in busy] == \
        [best[i] for i, r in enumerate(answers) if r not in busy]  # the accepted ones, answered after SIGTERM
    assert not any(os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read().lower()
                   for pid in engines)


@pytest.mark.parametrize("mode", list(SERVER_MODES))
def test_a_request_past_the_time_limit_gets_503_and_leaves_nothing_behind(ckpt, mode):
    """A held request runs past the limit: 503 with Retry-After; its sentences leave the queue and the search
    (counted as dropped), and the server goes on: lines with nothing to decode, other search groups."""
    s = Server("-m", str(ckpt), "--timeout", "2", *SERVER_MODES[mode])
    try:
        with held(s):
            r = post(s, {"q": LINES[:4], "source": "en", "target": "de", "beam": 8})
            assert "longer than this server's limit of 2 s" in error_of(r, 503) and r.headers["Retry-After"]
        wait_for(s, lambda m: m["queued"] == 0 and m["dropped"] == 4, "the given-up sentences dropped")
        assert post(s, {"q": "a cat", "source": "en", "target": "de", "beam": 1, "max_len_b": 2}).status_code == 200
        for q in ["\n", [" ", "a cat\n\n"], "a cat"]:  # lines with nothing to decode finish at once
            assert post(s, {"q": q, "source": "en", "target": "de", "beam": 1, "max_len_b": 2}).status_code == 200
        for seed in range(5):  # seeded requests: a search group each
            assert post(s, {"q": "a cat", "source": "en", "target": "de", "sampling": True, "seed": seed,
                            "max_len_b": 2}).status_code == 200
        # nothing is left behind: no sentence queued or held by an engine process, the abandoned ones counted, and
        # no search group (a search ends when its group has nothing left)
        m = wait_for(s, lambda m: m["translated"] == 8 and m["search_groups"] == 0,
                     "the eight sentences with text translated and their searches ended")
        assert (m["queued"], m["search_groups"], m["dropped"]) == (0, 0, 4)
        assert m.get("engine_process_requests", 0) == 0
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_engine_process_that_dies_fails_its_requests_and_the_server_says_so(ckpt):
    """If the engine process dies (killed: out of memory), the requests it held get 500, later ones 503, and
    the server still answers /health and stops with exit 0."""
    s = Server("-m", str(ckpt), "--engine-process")
    try:
        result = {}

        def send():
            result["r"] = post(s, {"q": LINES[:2], "source": "en", "target": "de"})

        t = threading.Thread(target=send)
        with held(s):
            t.start()
            wait_for(s, lambda m: m["queued"] == 2, "the request queued")
            os.kill(engine_pid(s), signal.SIGKILL)
        t.join(60)
        message = error_of(result["r"], 500)
        assert message.startswith("internal error (request id ") and "the decoding engine process died" in message
        rid = result["r"].headers["X-Request-Id"]
        assert f"request id {rid}" in message and f"request id {rid}" in s.logged(f"request id {rid}")
        assert "the decoding engine process died" in error_of(post(s, {"q": "a cat", "source": "en",
                                                                        "target": "de"}), 503)
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/info").status_code == 200
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_an_engine_process_that_cannot_load_says_why_in_one_line(ckpt):
    from nmt_cli.inference.translate import TranslateConfig
    from nmt_cli.serve.remote import EngineProcessError, RemoteEngine

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
    from nmt_cli.checkpoints import format as checkpoint

    path = make_checkpoint(tmp_path / "nolangs.pt", toy_tokenizer_bytes)
    ck = checkpoint.load(path)
    ck.langs = {}
    checkpoint.save(ck, path)
    r = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "serve", "-m", str(path), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--langs SRC-TGT" in r.stderr
    s = Server("-m", str(path), "--langs", "fr-es")
    try:
        assert [lang["code"] for lang in httpx.get(s.url + "/languages").json()] == ["fr", "es"]  # (by name)
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
    code = ("import sys; import nmt_cli.cli, nmt_cli.inference.translate, nmt_cli.serve.engine, nmt_cli.serve.service; "
            "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stderr
