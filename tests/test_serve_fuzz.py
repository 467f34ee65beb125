"""`nmt serve` fuzzed from its own OpenAPI description (GET /spec) by Schemathesis: every endpoint, bodies valid
and invalid, as JSON, forms and multipart, a fixed number of examples per endpoint and a fixed seed. Every answer
must be a non-5xx status that /spec lists, with a body and headers that match it; every request the schema calls
invalid is refused (4xx); none waits past the request timeout; the server logs no traceback and still answers.

The languages a request names are drawn half the time from the server's own (`steer`), so that the fuzzed
requests reach the translation itself, not only the check of their languages. Slow (about a minute): CI runs it
through `make test-fuzz`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
httpx = pytest.importorskip("httpx", reason="the test-serve extra is not installed")
pytest.importorskip("schemathesis", reason="the test-fuzz extra is not installed (schemathesis)")

from helpers_serve import Server  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402

# per endpoint and content type: 60 in CI's time budget; NMT_FUZZ_EXAMPLES=120 gives docs/results.md#reliability's run
EXAMPLES = int(os.environ.get("NMT_FUZZ_EXAMPLES", "60"))
SEED = 55
CONFIG = """\
# an invalid request may be refused for its size first (413): still refused
[checks.negative_data_rejection]
expected-statuses = [400, 403, 404, 405, 413, 415, 422]
"""


def steer(node, languages: list[str]):
    """`source` and `target` of every request body: one of the server's languages or, as /spec allows, any
    string."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            for name in ("source", "target"):
                if name in props:
                    props[name] = {"anyOf": [{"type": "string", "enum": languages}, props[name]]}
        for value in node.values():
            steer(value, languages)
    elif isinstance(node, list):
        for value in node:
            steer(value, languages)
    return node


@pytest.fixture(scope="module")
def server(tmp_path_factory, toy_tokenizer_bytes):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("fuzz") / "tiny.pt", toy_tokenizer_bytes, seed=3,
                           max_positions=128)
    s = Server("-m", str(ckpt), "--langs", "en-de", "-m", str(ckpt), "--langs", "fr-de", "--batch-limit", "8",
               "--char-limit", "400", "--file-char-limit", "2000",
               "--suggestions", str(tmp_path_factory.mktemp("suggestions") / "corrections.jsonl"))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.mark.slow
def test_every_endpoint_fuzzed_from_spec_answers_as_spec_says(server, tmp_path):
    spec = httpx.get(server.url + "/spec", timeout=30).json()
    languages = sorted({x["code"] for x in httpx.get(server.url + "/languages", timeout=30).json()} | {"auto"})
    (tmp_path / "spec.json").write_text(json.dumps(steer(spec, languages)))
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(tmp_path / "schemathesis.toml"), "run",
         str(tmp_path / "spec.json"), "--url", server.url, "--checks", "all",
         # a request the schema allows may still be refused for what it cannot say (an unknown language, empty q)
         "--exclude-checks", "positive_data_acceptance", "--max-examples", str(EXAMPLES),
         "--seed", str(SEED), "--request-timeout", "30", "--no-color"],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    report = done.stdout[-6000:] + done.stderr[-2000:]
    print(next((line for line in done.stdout.splitlines() if " generated, " in line), ""))  # pytest -s shows it
    assert done.returncode == 0, report
    assert "unique failure" not in done.stdout and "passed" in done.stdout, report
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    log = "".join(server.log)
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]
