"""The Python API: `from nmt_cli import Translator`; the documented examples run; the CLI gives the same results."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import toy_pairs
from helpers_export import train_tiny
from helpers_hub_models import write_model_repo
from nmt_cli.errors import ConfigError
from nmt_cli.inference.translate import Translator

ROOT = Path(__file__).resolve().parents[1]
LINES = [p[0] for p in toy_pairs(12, seed=21)] + [""]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_tokenizer_bytes) -> Path:
    return train_tiny(tmp_path_factory.mktemp("api") / "model.pt", toy_tokenizer_bytes)


def run_nmt(*args, input=None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True,
                          input=input, timeout=300)


def test_docs_examples_run(tmp_path, trained):
    """docs/api.md's Python blocks, run in order as one script, with model.pt and a hub cache holding it."""
    (tmp_path / "model.pt").write_bytes(trained.read_bytes())
    write_model_repo(tmp_path / "hub", "my-org/nmt-en-de", "c" * 40, {"checkpoint.pt": trained.read_bytes()},
                     ("main", "v1.0"))
    code = "\n".join(re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), flags=re.S))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HF_")}, "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(tmp_path / "hub")}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    doc_lines = ["the dog sees a cat", "", "a small child sleeps"]
    cli = run_nmt("translate", "-m", str(trained), input="".join(line + "\n" for line in doc_lines)).stdout.splitlines()
    assert out[:3] == [f"{a!r} -> {b!r}" for a, b in zip(doc_lines, cli, strict=True)]
    assert [line.split()[0] for line in out[3:6]] == ["1", "2", "3"]
    assert f"commit {'c' * 40}" in r.stdout
    assert any(line.startswith("cannot load: missing.pt") for line in out)


def test_options_and_nbest_match_the_cli(trained):
    translator = Translator.load(trained, device="cpu", beam=3, nbest=2, lenpen=1.0, lenpen_form="fairseq")
    rows = [f"{i}\t{rank}\t{h.score:.4f}\t{h.text}" for i, hyps in enumerate(translator.translate(LINES), 1)
            for rank, h in enumerate(hyps, 1)]
    r = run_nmt("translate", "-m", str(trained), "--beam", "3", "--nbest", "2", "--lenpen", "1.0",
                "--lenpen-form", "fairseq", input="".join(line + "\n" for line in LINES))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == rows
    best = translator.translate_best(LINES)
    assert best == [hyps[0].text for hyps in translator.translate(LINES)] and best[-1] == ""


def test_unknown_or_bad_option_is_a_config_error(trained):
    with pytest.raises(ConfigError, match="unknown translation option"):
        Translator.load(trained, beam_size=4)
    with pytest.raises(ConfigError, match="nbest"):
        Translator.load(trained, beam=2, nbest=3)


def test_import_is_light_and_the_top_level_name_is_the_class():
    code = ("import sys, nmt_cli; assert 'torch' not in sys.modules; from nmt_cli import Translator, Translation; "
            "import nmt_cli.inference.translate as t; assert Translator is t.Translator and Translation is t.Translation")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
