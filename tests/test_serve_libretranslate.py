"""LibreTranslate's own API tests (`libretranslate/tests/test_api` of its 1.9.6 wheel: /detect, /languages,
/health, /spec, /frontend/settings, /translate) run against a real `nmt serve` process.

Their files are LibreTranslate's (AGPL-3.0) and are not part of this repository: at collection the wheel is
downloaded once with pip (`pip download libretranslate==1.9.6 --no-deps`) into .cache/libretranslate/ (ignored by
git) and its test modules are loaded from there; each of their test functions is one test here. Offline, with no
wheel in the cache, the test skips and says why.

Their conftest's `client` fixture (Flask's test client of a LibreTranslate app with `--load-only en,es`) is replaced
by `client` below: the same `.get`/`.post` over HTTP to `nmt serve` with a tiny model as en-es and es-en, whose
responses have what their tests read from Flask's (`.status_code`, `.data`, `.json`, `.get_json()`, `.text`,
`.headers`).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
httpx = pytest.importorskip("httpx", reason="the test-serve extra is not installed")

from helpers_serve import Server  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402

VERSION = "1.9.6"
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "libretranslate"
TESTS = "libretranslate/tests/test_api/"


def fetch_tests(version: str = VERSION, cache: Path = CACHE) -> Path | str:
    """The folder of LibreTranslate's test_api modules, from the cache or downloaded now -> its path, or why not (a
    one-line reason). Safe with several pytest workers at once: each unpacks into a folder of its own, then renames
    it into place (the first one wins)."""
    target = cache / version / "test_api"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"libretranslate-{version}-*.whl"))
    if not wheels:
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            r = subprocess.run([sys.executable, "-m", "pip", "download", f"libretranslate=={version}", "--no-deps",
                                "--disable-pip-version-check", "--retries", "0", "--timeout", "20", "-q", "-d", tmp],
                               capture_output=True, text=True)
            found = sorted(Path(tmp).glob("libretranslate-*.whl"))
            if r.returncode != 0 or not found:
                errors = [line for line in r.stderr.splitlines() if line.startswith("ERROR")]
                why = (errors or r.stderr.strip().splitlines() or [f"pip exited {r.returncode}"])[-1]
                return f"cannot download libretranslate=={version} (offline?): {why.strip()[:200]}"
            wheel = cache / found[0].name
            os.replace(found[0], wheel)
    else:
        wheel = wheels[0]
    unpacked = Path(tempfile.mkdtemp(dir=cache))
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(TESTS) and name.endswith(".py") and Path(name).name.startswith("test_"):
                (unpacked / Path(name).name).write_bytes(z.read(name))
    if not any(unpacked.iterdir()):
        shutil.rmtree(unpacked)
        return f"{wheel.name} has no {TESTS}test_*.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(unpacked, target)
    except OSError:  # another worker put it there first
        shutil.rmtree(unpacked)
    return target


def their_tests() -> list:
    """pytest params: each test function of LibreTranslate's test_api (a function of `client`), or one skipped param
    saying why there are none."""
    found = fetch_tests()
    if isinstance(found, str):
        return [pytest.param(None, id="libretranslate-tests", marks=pytest.mark.skip(reason=found))]
    params = []
    for path in sorted(found.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"libretranslate_test_api.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("test_") and fn.__module__ == module.__name__:
                params.append(pytest.param(fn, id=f"{path.name}::{name}"))
    return params


class Response:
    """What LibreTranslate's tests read from a Flask (werkzeug) test response."""

    def __init__(self, r: httpx.Response):
        self.status_code, self.data, self.text, self.headers = r.status_code, r.content, r.text, r.headers
        self.mimetype = r.headers.get("content-type", "").split(";")[0].strip()
        self.is_json = self.mimetype == "application/json" or self.mimetype.endswith("+json")

    def get_json(self):
        import json

        return json.loads(self.data) if self.is_json else None

    @property
    def json(self):
        return self.get_json()


class Client:
    """Flask's test client's `.get/.post/.open` against a server URL: `data=` a dict is sent as a form (urlencoded),
    a str or bytes as the body; `json=` as JSON; `query_string=` as the query."""

    def __init__(self, url: str):
        self.http = httpx.Client(base_url=url, timeout=120)

    def open(self, path: str, method: str = "GET", data=None, json=None, query_string=None, headers=None):
        kwargs = {"params": query_string, "headers": headers}
        if json is not None:
            kwargs["json"] = json
        elif isinstance(data, dict):
            kwargs["data"] = data
        elif data is not None:
            kwargs["content"] = data
        return Response(self.http.request(method, path, **kwargs))

    def get(self, path: str, **kwargs):
        return self.open(path, "GET", **kwargs)

    def post(self, path: str, **kwargs):
        return self.open(path, "POST", **kwargs)

    def close(self):
        self.http.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, toy_tokenizer_bytes):
    """As their conftest's app (`--load-only en,es`): en-es and es-en, from one tiny checkpoint."""
    ckpt = make_checkpoint(tmp_path_factory.mktemp("libretranslate") / "tiny.pt", toy_tokenizer_bytes,
                           max_positions=128)
    s = Server("-m", str(ckpt), "--langs", "en-es", "-m", str(ckpt), "--langs", "es-en", "--no-engine-process")
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def client(server):
    """Their conftest's `client`, over HTTP."""
    c = Client(server.url)
    yield c
    c.close()


@pytest.mark.parametrize("their_test", their_tests())
def test_libretranslate_api(their_test, client):
    their_test(client)


def test_the_adapter_sees_failures(client):
    """The adapter passes on what the server answers (a test of theirs could not pass whatever nmt serve did)."""
    r = client.post("/translate", data={"q": "Hello", "source": "en", "target": "zz", "format": "text"})
    assert r.status_code == 400 and r.json == {"error": "zz is not supported"}
    r = client.post("/translate", json={"q": ["Hello", "World"], "source": "en", "target": "es"})
    assert r.status_code == 200 and len(r.get_json()["translatedText"]) == 2
    assert client.get("/no-such-page").status_code == 404
    assert client.post("/languages").status_code == 405
