"""`nmt serve`'s LibreTranslate endpoints beyond /translate, against a real server process: /detect and source
auto, format html, /translate_file and /download_file, /suggest, /spec, /frontend/settings, LibreTranslate's
pinned error texts and statuses, the web page's files, and internal errors with a request id."""

from __future__ import annotations

import html
import io
import json
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
httpx = pytest.importorskip("httpx", reason="the test-serve extra is not installed")
libretranslatepy = pytest.importorskip("libretranslatepy", reason="the test-serve extra is not installed")
docx = pytest.importorskip("docx", reason="the serve extra is not installed (python-docx)")

from conftest import toy_pairs  # noqa: E402
from helpers_serve import FAULT, Server, error_of, reference_translator  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402
from nmt_cli.serve.service import SEARCH_FIELDS  # noqa: E402

LINES = [en for en, _ in toy_pairs(12, seed=5)]
ENGLISH = "The children are playing in the garden while their mother reads a book."
FRENCH = "Les enfants jouent dans le jardin pendant que leur mère lit un livre."


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("serve-api") / "tiny.pt", toy_tokenizer_bytes, seed=3,
                           max_positions=128)


@pytest.fixture(scope="module")
def suggestions(tmp_path_factory):
    return tmp_path_factory.mktemp("suggestions") / "corrections.jsonl"


@pytest.fixture(scope="module")
def server(ckpt, suggestions):
    """Two pairs from one checkpoint (en-de and fr-de: two source languages to detect among), suggestions kept."""
    s = Server("-m", str(ckpt), "--langs", "en-de", "-m", str(ckpt), "--langs", "fr-de", "--no-engine-process",
               "--batch-limit", "8", "--char-limit", "400", "--file-char-limit", "2000",
               "--suggestions", str(suggestions))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def reference(ckpt):
    with reference_translator(ckpt) as translate:
        yield lambda lines: [h[0].text for h in translate(lines)]


# ------------------------------------------------------------------------------- LibreTranslate's pinned answers


def test_libretranslate_pinned_error_texts_and_statuses(server):
    """What LibreTranslate's own tests pin (libretranslate/tests/test_api; test_serve_libretranslate.py runs them),
    its texts exactly."""
    r = httpx.post(server.url + "/translate", data={"q": "Hello", "source": "en", "target": "zz", "format": "text"})
    assert error_of(r, 400) == "zz is not supported"
    r = httpx.post(server.url + "/translate", data={"source": "en", "target": "de", "format": "text"})
    assert error_of(r, 400) == "Invalid request: missing q parameter"
    r = httpx.post(server.url + "/translate", json={"q": "Hello", "source": "de", "target": "fr"})
    assert error_of(r, 400) == "French (fr) is not available as a target language from German (de)"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    for method, path in (("GET", "/detect"), ("POST", "/health"), ("POST", "/spec"), ("POST", "/languages"), ("GET", "/translate"),
                         ("GET", "/translate_file"), ("GET", "/suggest"), ("POST", "/frontend/settings")):
        assert "not allowed" in error_of(httpx.request(method, server.url + path), 405)
    assert httpx.get(server.url + "/spec").status_code == 200
    assert httpx.get(server.url + "/frontend/settings").status_code == 200


def test_frontend_settings_has_every_key_libretranslates_page_reads(server):
    s = httpx.get(server.url + "/frontend/settings").json()
    types = {"charLimit": int, "frontendTimeout": int, "apiKeys": bool, "keyRequired": bool, "suggestions": bool,
             "filesTranslation": bool, "supportedFilesFormat": list, "language": dict}
    assert all(isinstance(s[k], t) for k, t in types.items()), s
    assert s["charLimit"] == 400 and s["suggestions"] is True and s["filesTranslation"] is True
    assert {".txt", ".html", ".docx"} <= set(s["supportedFilesFormat"])
    # two source languages: the page starts on auto, into a target both translate to
    assert s["language"] == {"source": {"code": "auto", "name": "Auto Detect"},
                             "target": {"code": "de", "name": "German"}}


# ------------------------------------------------------------------------------- /detect and source auto


def test_detect_among_the_source_languages(server):
    client = libretranslatepy.LibreTranslateAPI(server.url)
    detected = client.detect(FRENCH)  # a form, as LibreTranslate's client sends it
    assert detected[0]["language"] == "fr" and 50 < detected[0]["confidence"] <= 100
    assert {d["language"] for d in detected} <= {"en", "fr"}  # never a language no model translates from
    assert all(0 <= d["confidence"] <= 100 for d in detected)
    r = httpx.post(server.url + "/detect", json={"q": ENGLISH}).json()
    assert r[0]["language"] == "en" and r[0]["confidence"] >= r[-1]["confidence"]
    assert sum(d["confidence"] for d in r) == pytest.approx(100, abs=0.2)
    # no letter: nothing to detect from, as LibreTranslate answers it
    assert httpx.post(server.url + "/detect", json={"q": "1234 !!"}).json()[0]["confidence"] == 0


@pytest.mark.parametrize("body,status,message", [
    ({"q": ""}, 400, "Invalid request: missing q parameter"),
    ({}, 400, "Invalid request: missing q parameter"),
    ({"q": 5}, 400, "q must be a string or a list of strings"),
    ({"q": "a" * 401}, 413, "401 characters"),
    (b'{"q": "a \\ud800"}', 400, "invalid Unicode"),
    (b'{"q": "a', 400, "invalid JSON"),
])
def test_detect_bad_input(server, body, status, message):
    r = httpx.post(server.url + "/detect", content=body, headers={"Content-Type": "application/json"}) \
        if isinstance(body, bytes) else httpx.post(server.url + "/detect", json=body)
    assert message in error_of(r, status)


@pytest.mark.parametrize("endpoint,body", [
    ("/detect", {"q": "the cat"}),
    ("/translate", {"q": "the cat", "source": "en", "target": "de"}),
    ("/suggest", {"q": "the cat", "s": "die Katze", "source": "en", "target": "de"}),
])
@pytest.mark.parametrize("key", [True, 5, ["k"], {}])
def test_an_api_key_that_is_not_a_string_is_refused_even_where_none_is_required(server, endpoint, body, key):
    """Found by the fuzzing of /spec (tests/test_serve_fuzz.py): /spec says api_key is a string, and a server
    without --api-keys took any JSON value."""
    r = httpx.post(server.url + endpoint, json={**body, "api_key": key})
    assert error_of(r, 400) == "Invalid request: api_key must be a string"


def test_source_auto_detects_and_translates(server, reference):
    r = httpx.post(server.url + "/translate", json={"q": FRENCH, "source": "auto", "target": "de"}).json()
    assert r["detectedLanguage"]["language"] == "fr" and 50 < r["detectedLanguage"]["confidence"] <= 100
    assert r["translatedText"] == reference([FRENCH])[0]
    r = httpx.post(server.url + "/translate", json={"q": [ENGLISH, ENGLISH], "source": "auto", "target": "de"})
    assert [d["language"] for d in r.json()["detectedLanguage"]] == ["en", "en"]
    # into a language no model translates into: only the language itself is a candidate, and the text comes back
    r = httpx.post(server.url + "/translate", json={"q": "a cat", "source": "auto", "target": "en"})
    assert r.json() == {"translatedText": "a cat", "detectedLanguage": {"confidence": 100.0, "language": "en"}}


# ------------------------------------------------------------------------------- format html


def test_html_translates_text_nodes_and_keeps_markup(server, reference):
    a, b, c = LINES[:3]
    ta, tb, tc = (html.escape(t, quote=False) for t in reference([a, b, c]))
    q = (f'<!DOCTYPE html><p class="x" title="{a}">{a}  <b>{b}</b>&nbsp;<!-- {c} --><code>{c}</code>'
         f'<span translate="no">{c}</span></p>\n<ul><li>{c}</li></ul>')
    r = httpx.post(server.url + "/translate", json={"q": q, "source": "en", "target": "de", "format": "html"})
    assert r.json()["translatedText"] == (
        f'<!DOCTYPE html><p class="x" title="{a}">{ta}  <b>{tb}</b>&nbsp;<!-- {c} --><code>{c}</code>'
        f'<span translate="no">{c}</span></p>\n<ul><li>{tc}</li></ul>')
    # entities: decoded for the model, the ones written kept as written
    r = httpx.post(server.url + "/translate", data={"q": "<i>Tom &amp; Jerry</i>", "source": "en", "target": "de",
                                                    "format": "html"})
    assert r.json()["translatedText"] == f"<i>{html.escape(reference(['Tom & Jerry'])[0], quote=False)}</i>"
    # broken markup is read as a browser reads it; markup without text comes back as it was
    r = httpx.post(server.url + "/translate", json={"q": [f"</div><p>{a}<b>{b}</i>", "<br/><img src='x'>"],
                                                    "source": "en", "target": "de", "format": "html"})
    assert r.json()["translatedText"] == [f"</div><p>{ta}<b>{tb}</i>", "<br/><img src='x'>"]


# ------------------------------------------------------------------------------- files


def _docx_bytes(paragraphs: list[list[str]], cell: str) -> bytes:
    document = docx.Document()
    for runs in paragraphs:
        p = document.add_paragraph()
        for k, text in enumerate(runs):
            p.add_run(text).bold = k == 0
    document.add_table(rows=1, cols=1).cell(0, 0).text = cell
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def _translate_file(server, name, data, **fields):
    fields = {"source": "en", "target": "de", **fields}
    return httpx.post(server.url + "/translate_file", files={"file": (name, data)}, data=fields, timeout=120)


def test_translate_file_txt_html_docx(server, reference):
    a, b, c = LINES[3:6]
    ta, tb, tc = reference([a, b, c])
    r = _translate_file(server, "notes.txt", f"{a}\r\n\n  {b}\n---\n".encode())
    url = r.json()["translatedFileUrl"]
    got = httpx.get(url)
    assert got.status_code == 200 and got.content.decode() == f"{ta}\r\n\n  {tb}\n---\n"
    assert "notes.de.txt" in got.headers["content-disposition"]

    r = _translate_file(server, "page.HTML", f"<h1>{a}</h1><p>{b} <em>{c}</em></p>".encode())
    assert httpx.get(r.json()["translatedFileUrl"]).text == (
        f"<h1>{html.escape(ta, quote=False)}</h1><p>{html.escape(tb, quote=False)} "
        f"<em>{html.escape(tc, quote=False)}</em></p>")

    r = _translate_file(server, "report.docx", _docx_bytes([[a[:10], a[10:]], [b]], c))
    out = docx.Document(io.BytesIO(httpx.get(r.json()["translatedFileUrl"]).content))
    texts = [p.text for p in out.paragraphs if p.text]
    assert texts == [ta, tb] and out.tables[0].cell(0, 0).text == tc
    assert out.paragraphs[0].runs[0].bold  # the first run keeps its formatting


def test_file_names_are_never_paths(server, reference, tmp_path):
    r = _translate_file(server, "../../../../tmp/evil name;.txt", LINES[0].encode())
    url = r.json()["translatedFileUrl"]
    name = url.rsplit("/download_file/", 1)[1]
    assert "/" not in name and ".." not in name and " " not in name and ";" not in name
    assert httpx.get(url).text == reference([LINES[0]])[0]
    assert not list(Path("/tmp").glob("evil*"))
    for bad in ("..%2F..%2Fetc%2Fpasswd", "nothing.txt", name.replace(name[:4], "0000")):
        assert httpx.get(server.url + "/download_file/" + bad).status_code == 404


def test_a_files_paragraphs_are_translated_sentence_by_sentence(server, reference):
    a, b = (f"{line}." for line in LINES[6:8])
    ta, tb = reference([a, b])
    r = _translate_file(server, "two.txt", f"{a}  {b}\n🙂\n".encode())
    assert httpx.get(r.json()["translatedFileUrl"]).content.decode() == f"{ta}  {tb}\n🙂\n"


@pytest.mark.parametrize("name,data,fields,status,message", [
    ("empty.txt", b"", {}, 400, "empty file"),
    ("doc.pdf", b"%PDF-1.4", {}, 400, "Invalid request: file format not supported"),
    ("noext", b"a cat", {}, 400, "Invalid request: file format not supported"),
    ("big.txt", b"a cat sat.\n" * 300, {}, 413, "3000 characters of text"),
    ("broken.docx", b"PK\x03\x04 not a zip at all", {}, 400, "not a .docx file"),
    ("latin1.txt", "caf\xe9".encode("latin-1"), {}, 400, "not UTF-8 text"),
    ("a.txt", b"a cat", {"target": "zz"}, 400, "zz is not supported"),
    ("a.txt", b"a cat", {"source": ""}, 400, "missing source parameter"),
    ("long.txt", b"a " * 300, {}, 413, "a paragraph of the file has 599 characters"),
])
def test_translate_file_bad_input(server, name, data, fields, status, message):
    assert message in error_of(_translate_file(server, name, data, **fields), status)
    assert httpx.get(server.url + "/health").status_code == 200


def test_translate_file_malformed_requests(server):
    r = httpx.post(server.url + "/translate_file", json={"file": "a cat", "source": "en", "target": "de"})
    assert "multipart/form-data" in error_of(r, 415)
    r = httpx.post(server.url + "/translate_file", files={"other": ("a.txt", b"a cat")},
                   data={"source": "en", "target": "de"})
    assert "missing file parameter" in error_of(r, 400)
    huge = b"a" * (10 << 20) + b"b" * 70000
    assert "bytes" in error_of(_translate_file(server, "huge.txt", huge), 413)
    assert httpx.get(server.url + "/health").status_code == 200


def test_translated_files_are_removed_after_their_time(ckpt):
    s = Server("-m", str(ckpt), "--no-engine-process", "--file-ttl", "2")
    # the server's own folder (its name holds its process id): other servers may run beside it (pytest -n)
    own = f"nmt-serve-files-{s.proc.pid}-*"
    try:
        start = time.monotonic()
        url = _translate_file(s, "a.txt", b"a cat").json()["translatedFileUrl"]
        first = httpx.get(url)
        if time.monotonic() - start < 2:  # still within its time (on a slow machine it may not be)
            assert first.status_code == 200
        deadline = time.monotonic() + 60  # only ends a hang
        while httpx.get(url).status_code != 404:
            assert time.monotonic() < deadline, "the file was not removed"
            time.sleep(0.2)
        assert "no such file" in httpx.get(url).json()["error"]
        mine = list(Path(tempfile.gettempdir()).glob(own))
        assert len(mine) == 1 and not list(mine[0].iterdir())  # the server's folder is empty again
    finally:
        assert s.stop() == 0, "".join(s.log)
    assert not list(Path(tempfile.gettempdir()).glob(own))  # and gone once it stopped


def test_files_translation_can_be_disabled(ckpt):
    s = Server("-m", str(ckpt), "--no-engine-process", "--disable-files-translation")
    try:
        assert error_of(_translate_file(s, "a.txt", b"a cat"), 403) == "Files translation are disabled on this server."
        settings = httpx.get(s.url + "/frontend/settings").json()
        assert settings["filesTranslation"] is False and settings["supportedFilesFormat"] == []
        # and suggestions are off without --suggestions, as LibreTranslate answers
        r = httpx.post(s.url + "/suggest", data={"q": "a", "s": "b", "source": "en", "target": "de"})
        assert error_of(r, 403) == "Suggestions are disabled on this server."
        # one source language: no auto in the page's settings, /detect names it
        assert settings["language"]["source"]["code"] == "en"
        assert httpx.post(s.url + "/detect", json={"q": "a cat"}).json() == [{"confidence": 100.0, "language": "en"}]
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_req_limit_answers_429_per_client_as_libretranslate_and_the_page_can_be_off(ckpt, tmp_path):
    """--req-limit N: N requests a minute per client (its API key, else its address), each text of q one, then 429
    with LibreTranslate's text and Retry-After; /languages, /health and /frontend/settings are not counted.
    --disable-web-ui: / and its files are a 404, the API answers."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a\nkey-b\n")
    s = Server("-m", str(ckpt), "--langs", "en-de", "--no-engine-process", "--req-limit", "3", "--api-keys",
               str(keys), "--disable-web-ui")
    try:
        def translate(q, key):
            return httpx.post(s.url + "/translate", json={"q": q, "source": "en", "target": "de", "api_key": key},
                              timeout=60)

        assert translate(["a cat", "a dog"], "key-a").status_code == 200  # counts 2
        assert translate("a cat", "key-a").status_code == 200
        r = translate("a cat", "key-a")
        assert error_of(r, 429).startswith("Slowdown: 3 per 1 minute (this server's --req-limit")
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert error_of(httpx.post(s.url + "/detect", json={"q": "a cat", "api_key": "key-a"}), 429)
        assert translate("a cat", "key-b").status_code == 200  # another client: its own minute
        assert translate(["a", "b", "c", "d"], "key-b").status_code == 429  # over what is left, not counted
        assert translate(["a", "b"], "key-b").status_code == 200
        for path in ("/languages", "/health", "/frontend/settings"):
            assert httpx.get(s.url + path).status_code == 200
        # no key: the client's address, from X-Forwarded-For where a local proxy sends it (uvicorn trusts 127.0.0.1)
        body = {"q": "a cat", "source": "en", "target": "de"}
        for _ in range(3):  # refused for the missing key, and counted
            assert error_of(httpx.post(s.url + "/translate", json=body, headers={"X-Forwarded-For": "10.0.0.1"}), 403)
        assert error_of(httpx.post(s.url + "/translate", json=body, headers={"X-Forwarded-For": "10.0.0.1"}), 429)
        assert error_of(httpx.post(s.url + "/translate", json=body, headers={"X-Forwarded-For": "10.0.0.2"}), 403)
        assert "--disable-web-ui" in error_of(httpx.get(s.url + "/"), 404)
        assert error_of(httpx.get(s.url + "/static/app.js"), 404)
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_the_rate_limiter_is_a_moving_window_per_client():
    from nmt_cli.serve.ratelimit import RateLimiter

    now = [1000.0]
    limiter = RateLimiter(3, clock=lambda: now[0])
    assert limiter.take("a", 2) is None
    now[0] += 20
    assert limiter.take("a") is None
    assert limiter.take("a") == pytest.approx(40.0)  # the first 2 leave the window at 1060
    assert limiter.take("b", 3) is None and limiter.take("a", 4) == 60.0  # over the limit alone
    now[0] += 40
    assert limiter.take("a", 2) is None  # 1060: the first spending has left
    assert limiter.take("a") == pytest.approx(20.0)
    now[0] += 61
    assert limiter.take("a", 3) is None


# ------------------------------------------------------------------------------- /suggest


def test_suggestions_are_appended_as_json_lines(server, suggestions):
    before = suggestions.read_text().splitlines() if suggestions.exists() else []
    r = httpx.post(server.url + "/suggest", data={"q": "A cat.", "s": "Eine Katze.", "source": "en", "target": "de",
                                                  "translation": "Ein Katze."})
    assert r.json() == {"success": True}
    r = httpx.post(server.url + "/suggest", json={"q": "Un chat\nnoir.", "s": "Eine schwarze\nKatze.",
                                                  "source": "fr", "target": "de"})
    assert r.json() == {"success": True}
    lines = suggestions.read_text(encoding="utf-8").splitlines()[len(before):]
    records = [json.loads(line) for line in lines]
    assert [(x["q"], x["s"], x["source"], x["target"], x["translation"]) for x in records] == [
        ("A cat.", "Eine Katze.", "en", "de", "Ein Katze."), ("Un chat\nnoir.", "Eine schwarze\nKatze.", "fr", "de",
                                                              None)]
    assert all(time.strptime(x["time"], "%Y-%m-%dT%H:%M:%SZ") for x in records)


@pytest.mark.parametrize("body,status,message", [
    ({"s": "b", "source": "en", "target": "de"}, 400, "Invalid request: missing q parameter"),
    ({"q": "a", "source": "en", "target": "de"}, 400, "Invalid request: missing s parameter"),
    ({"q": "a", "s": ["b"], "source": "en", "target": "de"}, 400, "s must be a string"),
    ({"q": "a", "s": "b", "source": "auto", "target": "de"}, 400, "not auto"),
    ({"q": "a", "s": "b", "source": "en", "target": "zz"}, 400, "zz is not supported"),
    ({"q": "a", "s": "b" * 401, "source": "en", "target": "de"}, 413, "401 characters"),
])
def test_suggest_bad_input_writes_nothing(server, suggestions, body, status, message):
    before = suggestions.read_text()
    assert message in error_of(httpx.post(server.url + "/suggest", json=body), status)
    assert suggestions.read_text() == before


# ------------------------------------------------------------------------------- /spec, the page, internal errors


def test_spec_describes_every_endpoint_and_field(server):
    spec = httpx.get(server.url + "/spec").json()
    assert spec["openapi"].startswith("3.")
    routes = {"/", "/translate", "/detect", "/translate_file", "/download_file/{filename}", "/suggest",
              "/languages", "/health", "/info", "/spec", "/frontend/settings"}
    assert set(spec["paths"]) == routes
    for path in routes - {"/"}:
        for method, op in spec["paths"][path].items():
            r = httpx.request(method.upper(), server.url + path.replace("{filename}", "x"))
            assert r.status_code != 405, (method, path)  # the methods it lists are the ones served
            assert "200" in op["responses"]
    fields = spec["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(fields["properties"]) == {"q", "source", "target", "format", "alternatives", "api_key", "scores",
                                         *SEARCH_FIELDS}
    errors = {c for op in (m for p in spec["paths"].values() for m in p.values()) for c in op["responses"]}
    assert {"400", "403", "404", "405", "413", "415", "500", "503"} <= errors


def test_the_page_and_its_files_come_from_the_server(server):
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"), ("favicon.svg", "image/svg+xml")):
        asset = httpx.get(f"{server.url}/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert name in r.text
        assert "//" not in asset.text.replace("http://www.w3.org/2000/svg", "").replace("// ", "")  # no CDN
    assert "no file" in error_of(httpx.get(server.url + "/static/app.py"), 404)


def test_an_internal_error_says_its_request_id_and_logs_the_traceback(ckpt):
    s = Server("-m", str(ckpt), "--no-engine-process", env={FAULT: "languages"})
    try:
        r = httpx.get(s.url + "/languages")
        message = error_of(r, 500)
        rid = r.headers["X-Request-Id"]
        assert message == f"internal error (request id {rid}): RuntimeError"
        log = s.logged("a bug in the service")
        assert f"request id {rid}: GET /languages" in log
        assert "Traceback" in log.split(rid, 1)[1] and "a bug in the service" in log.split(rid, 1)[1]
        assert httpx.get(s.url + "/health").json() == {"status": "ok"}  # the server goes on
    finally:
        assert s.stop() == 0, "".join(s.log)
