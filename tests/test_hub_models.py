"""Checkpoints on the hub: `hf:` references pulled through the real huggingface_hub client and its cache
(offline, or from a local fake hub), and `nmt push` through the real client up to (and including) HTTP on
127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import toy_pairs
from helpers_hub_models import FakeHub, write_model_repo
from helpers_translate import make_checkpoint
from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.errors import ConfigError
from nmt_cli.hub.pull import HubRef
from nmt_cli.inference.translate import Translator

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
INPUT = "".join(p[0] + "\n" for p in toy_pairs(6, seed=9))

pytestmark = pytest.mark.usefixtures("one_thread")


def run_nmt(*args, env=None, input=INPUT):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True, input=input,
                          timeout=300, env=env)


def hub_env(tmp_path: Path, offline: bool = True, endpoint: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_TELEMETRY="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    return env


@pytest.fixture()
def cached_repo(tmp_path, toy_tokenizer_bytes):
    """my-org/nmt-toy in the cache: commit A (main, tag v1) and commit B (branch dev), different weights."""
    a = make_checkpoint(tmp_path / "a.pt", toy_tokenizer_bytes, seed=1)
    b = make_checkpoint(tmp_path / "b.pt", toy_tokenizer_bytes, seed=2)
    write_model_repo(tmp_path / "hub", "my-org/nmt-toy", COMMIT_A, {"checkpoint.pt": a.read_bytes()}, ("main", "v1"))
    write_model_repo(tmp_path / "hub", "my-org/nmt-toy", COMMIT_B, {"checkpoint.pt": b.read_bytes(),
                                                                     "other/best.pt": b.read_bytes()}, ("dev",))
    return a, b


def local_translation(path: Path) -> str:
    """What `nmt translate -m PATH --max-len-b 5` prints for INPUT (the CLI builds the same Translator)."""
    lines = Translator.load(path, device="cpu", max_len_b=5).translate_best(INPUT.splitlines())
    return "".join(line + "\n" for line in lines)


def test_hub_reference_parsing():
    assert HubRef.parse("hf:org/name") == HubRef("org/name", "checkpoint.pt", None)
    assert HubRef.parse("hf:org/name@v1.0") == HubRef("org/name", "checkpoint.pt", "v1.0")
    assert HubRef.parse("hf:org/name/runs/best.pt@" + COMMIT_A) == HubRef("org/name", "runs/best.pt", COMMIT_A)
    assert str(HubRef.parse("hf:org/name/runs/best.pt@dev")) == "hf:org/name/runs/best.pt@dev"
    for bad in ("hf:name", "hf:/name", "hf:org/", "hf:org//x.pt", "hf:org/name@"):
        with pytest.raises(ConfigError):
            HubRef.parse(bad)


def test_translate_from_the_hub_cache_offline(tmp_path, cached_repo):
    a, b = cached_repo
    env = hub_env(tmp_path)
    r = run_nmt("translate", "-m", "hf:my-org/nmt-toy", "--max-len-b", "5", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == local_translation(a)
    assert f"commit {COMMIT_A}" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    assert f"hf:my-org/nmt-toy@{COMMIT_A}" in r.stderr  # how to pin it
    for ref, expected in ((f"@{COMMIT_B}", b), ("@v1", a), ("/other/best.pt@dev", b)):
        r = run_nmt("translate", "-m", f"hf:my-org/nmt-toy{ref}", "--max-len-b", "5", env=env)
        assert r.returncode == 0, (ref, r.stderr)
        assert r.stdout == local_translation(expected), ref


def test_unreachable_hub_uses_the_cache_with_a_note_and_fails_in_one_line_when_not_cached(tmp_path, cached_repo):
    a, _ = cached_repo
    env = hub_env(tmp_path, offline=False, endpoint="http://127.0.0.1:9")  # nothing listens on port 9
    r = run_nmt("translate", "-m", "hf:my-org/nmt-toy", "--max-len-b", "5", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == local_translation(a) and "cannot be reached" in r.stderr
    r = run_nmt("translate", "-m", "hf:my-org/not-cached", env=hub_env(tmp_path))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "hf:my-org/not-cached is not in the hub cache" in lines[0] and "HF_HUB_OFFLINE is set; unset it" in lines[0]
    assert "local checkpoint" not in lines[0]  # offline by choice: the one remedy is to go online
    r = run_nmt("translate", "-m", "hf:my-org/nmt-toy@no-such-tag", env=hub_env(tmp_path))
    assert r.returncode == 1 and "not in the hub cache" in r.stderr


def test_unreachable_hub_and_a_model_not_cached_is_one_short_line_with_the_network_remedy(tmp_path):
    env = hub_env(tmp_path, offline=False, endpoint="http://127.0.0.1:9")  # nothing listens on port 9
    r = run_nmt("translate", "-m", "hf:my-org/not-cached", env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    line = lines[0]
    assert "hf:my-org/not-cached is not in the hub cache" in line and "127.0.0.1:9 cannot be reached" in line
    assert "HTTPS_PROXY" in line and "HF_HUB_OFFLINE" not in line and "while online" not in line
    assert len(line) < 300, line


def test_average_and_export_take_hub_references(tmp_path, cached_repo):
    a, b = cached_repo
    env = hub_env(tmp_path)
    r = run_nmt("average", f"hf:my-org/nmt-toy@{COMMIT_A}", "hf:my-org/nmt-toy@dev", "-o", str(tmp_path / "avg.pt"),
                env=env)
    assert r.returncode == 0, r.stderr
    ca, cb, avg = (checkpoint.load(p) for p in (a, b, tmp_path / "avg.pt"))
    for key, value in avg.model_state.items():
        assert torch.allclose(value, (ca.model_state[key] + cb.model_state[key]) / 2, atol=1e-6), key
    pytest.importorskip("ctranslate2", reason="the export extra is not installed: pip install 'nmt-cli[export]'")
    r = run_nmt("export", "ctranslate2", "hf:my-org/nmt-toy@v1", "-o", str(tmp_path / "ct2"), env=env)
    assert r.returncode == 0, r.stderr
    import json

    source = json.loads((tmp_path / "ct2" / "nmt_export.json").read_text())["source"]
    assert source["hub"] == "my-org/nmt-toy" and source["commit"] == COMMIT_A


def test_push_dry_run_lays_out_the_repository(tmp_path, toy_tokenizer_bytes):
    pytest.importorskip("ctranslate2", reason="the export extra is not installed: pip install 'nmt-cli[export]'")
    pytest.importorskip("transformers", reason="the export extra is not installed: pip install 'nmt-cli[export]'")
    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=1)
    ck = checkpoint.load(path)
    ck.train_state = {"optimizer": {"step": torch.tensor(3)}}
    checkpoint.save(ck, path)
    r = run_nmt("push", str(path), "my-org/nmt-toy", "--huggingface", "--ctranslate2", "--license", "mit",
                "--dry-run", str(tmp_path / "staged"), env=hub_env(tmp_path))
    assert r.returncode == 0, r.stderr
    staged = tmp_path / "staged"
    files = sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file())
    assert files == ["README.md", "checkpoint.pt", "config.json", "ctranslate2/README.md", "ctranslate2/config.json",
                     "ctranslate2/model.bin", "ctranslate2/nmt_export.json", "ctranslate2/sentencepiece.model",
                     "ctranslate2/shared_vocabulary.json", "generation_config.json", "model.safetensors",
                     "nmt_export.json", "source.spm", "target.spm", "tokenizer_config.json", "vocab.json"]
    pushed = checkpoint.load(staged / "checkpoint.pt")
    assert pushed.train_state is None
    assert all(torch.equal(pushed.model_state[k], v) for k, v in ck.model_state.items())
    card = (staged / "README.md").read_text()
    assert "license: mit" in card and "nmt translate -m hf:my-org/nmt-toy" in card
    assert 'MarianMTModel.from_pretrained("my-org/nmt-toy")' in card and 'allow_patterns=["ctranslate2/*"]' in card
    from transformers import MarianMTModel, MarianTokenizer

    MarianTokenizer.from_pretrained(str(staged))
    MarianMTModel.from_pretrained(str(staged))


def test_push_without_a_token_is_one_line(tmp_path, toy_tokenizer_bytes):
    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes)
    r = run_nmt("push", str(path), "my-org/nmt-toy", env=hub_env(tmp_path, offline=False, endpoint="http://127.0.0.1:9"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "no Hugging Face token" in lines[0] and "HF_TOKEN" in lines[0]
    r = run_nmt("push", str(path), "not a repo", env=hub_env(tmp_path))
    assert r.returncode == 1 and "ORG/NAME" in r.stderr


def test_push_then_pull_through_the_real_client(tmp_path, toy_tokenizer_bytes):
    """`nmt push` speaks the hub's HTTP API (create repo, preupload, commit) to a local fake hub; `nmt translate -m
    hf:` then downloads the pushed checkpoint from it into an empty cache and translates as the local file does."""
    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=5)
    with FakeHub() as hub:
        env = {**hub_env(tmp_path, offline=False, endpoint=hub.url), "HF_TOKEN": "hf_test_token"}
        r = run_nmt("push", str(path), "my-org/pushed", "--private", "--training-data", "toy pairs", env=env)
        assert r.returncode == 0, r.stderr
        assert hub.repos["my-org/pushed"]["private"] is True
        files = hub.files("my-org/pushed")
        assert sorted(files) == ["README.md", "checkpoint.pt"] and b"toy pairs" in files["README.md"]
        assert "Bearer hf_test_token" in [a for a in hub.auth if a]
        oid = hub.repos["my-org/pushed"]["commits"][-1][0]
        assert f"commit {oid}" in r.stderr and f"hf:my-org/pushed@{oid}" in r.stderr
        r = run_nmt("translate", "-m", "hf:my-org/pushed", "--max-len-b", "5", env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout == local_translation(path) and f"commit {oid} from the hub" in r.stderr
        for ref, expected in (("hf:my-org/pushed/missing.pt", "the hub has no missing.pt in my-org/pushed"),
                              ("hf:my-org/nope", "the hub says my-org/nope does not exist or needs a login")):
            r = run_nmt("translate", "-m", ref, env=env)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert r.returncode == 1 and len(lines) == 1 and expected in lines[0], r.stderr
        hub.fail = 401
        r = run_nmt("push", str(path), "my-org/pushed", env=env)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and "pushing to my-org/pushed failed" in lines[0], r.stderr
