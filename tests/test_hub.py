"""The hub path of `nmt prepare` through the real huggingface_hub client, no fake download function:

- offline: a huggingface_hub cache in the hub's real layout (blobs named by sha256, snapshot links at the pinned
  revision) holding every named hub corpus; `nmt prepare NAME` runs with HF_HUB_OFFLINE=1 and HF_HUB_CACHE
  pointing at it (the real lookup, pyarrow reading, cleaning, BPE, binarization), and `nmt train` trains on it;
- online: a local HTTP server answering the hub's routes (HF_ENDPOINT, or HTTP_PROXY) serves the same files;
- corrupt cached files, every pre-flight check, and one-line errors for hub failures.
Run with an old huggingface_hub too: `make test-lowest` (the lowest release pyproject.toml admits).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_hub import LocalHub, corpus_files, write_repo  # noqa: I001
from nmt_cli.data import corpora, hub_corpora
from nmt_cli.data.prepare import PrepareOptions, prepare
from nmt_cli.data.sample_corpus import generate
from nmt_cli.data.store import MANIFEST
from nmt_cli.errors import ConfigError, DataError, DownloadError

SIZES = {"train": 240, "valid": 20, "test": 20}
HUB_CORPORA = [n for n, s in corpora.CORPORA.items() if s.hub]
TRAIN = ["--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--layers", "1", "--max-tokens", "256",
         "--update-freq", "1", "--warmup", "10", "--precision", "fp32", "--gpus", "0", "--max-steps", "5"]


def hub_files(names=HUB_CORPORA) -> dict[tuple[str, str, str], bytes]:
    """{(repo, revision, path): parquet bytes} for the named corpora (wmt14 en-de and en-fr share a repo)."""
    out = {}
    for name in names:
        spec = corpora.CORPORA[name]
        for path, body in corpus_files(spec, SIZES).items():
            out[(spec.hub.repo, spec.hub.revision, path)] = body
    return out


def fill_cache(cache: Path, files: dict[tuple[str, str, str], bytes]) -> Path:
    by_repo: dict[tuple[str, str], dict[str, bytes]] = {}
    for (repo, rev, path), body in files.items():
        by_repo.setdefault((repo, rev), {})[path] = body
    for (repo, rev), group in by_repo.items():
        write_repo(cache, repo, rev, group)
    return cache


@pytest.fixture(scope="module")
def offline_cache(tmp_path_factory) -> Path:
    return fill_cache(tmp_path_factory.mktemp("hf") / "hub", hub_files())


def env_for(cache: Path, tmp: Path, offline: bool = True, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HTTP_PROXY", "HTTPS_PROXY"))
           and k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
    env.update(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def nmt(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def error_line(r: subprocess.CompletedProcess) -> str:
    """The one line a failed command prints (nothing before it), exit code 1."""
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error:") and len(r.stderr.splitlines()) == 1, r.stderr
    return r.stderr


def test_runs_against_the_expected_releases():
    """`make test-lowest` runs this file with the lowest huggingface-hub and pyarrow pyproject.toml admits."""
    import huggingface_hub
    import pyarrow

    want = os.environ.get("NMT_EXPECT_VERSIONS")
    if not want:
        pytest.skip("NMT_EXPECT_VERSIONS is set by make test-lowest")
    assert f"huggingface-hub=={huggingface_hub.__version__} pyarrow=={pyarrow.__version__}" == want


# ------------------------------------------------------------------------------------------ offline cache


@pytest.mark.parametrize("name", [*HUB_CORPORA, *corpora.REVERSED])
def test_named_corpus_prepares_from_the_offline_hub_cache(name, offline_cache, tmp_path):
    spec, reverse = corpora.resolve(name)
    out = tmp_path / "data"
    r = nmt("prepare", name, "-o", out, "--vocab-size", 250, "--workers", 1, env=env_for(offline_cache, tmp_path))
    assert r.returncode == 0, r.stderr
    m = json.loads((out / MANIFEST).read_text())
    src, tgt = (spec.tgt, spec.src) if reverse else (spec.src, spec.tgt)
    assert (m["corpus"], m["src_lang"], m["tgt_lang"]) == (name, src, tgt)
    assert m["origin"] == {"kind": "hub", "repo": spec.hub.repo, "revision": spec.hub.revision,
                           "files": {s: list(v) for s, v in spec.hub.files.items()}}
    assert {s: v["read"] for s, v in m["splits"].items()} == SIZES
    # the columns are the right languages: the test split's first line is the sample's first test pair
    en, other = generate(SIZES, seed=3)["test"][0]
    lang = spec.tgt if spec.src == "en" else spec.src
    assert (out / "raw" / "test.en").read_text().splitlines()[0] == en
    assert (out / "raw" / f"test.{lang}").read_text().splitlines()[0] == other
    if name in ("wmt14-en-de", "wmt14-en-fr", "wmt14-de-en"):
        run = tmp_path / "run"
        t = nmt("train", out, "-o", run, *TRAIN, env=env_for(offline_cache, tmp_path))
        assert t.returncode == 0, t.stderr
        assert (run / "checkpoint_last.pt").is_file()


def test_corrupt_cached_file_is_caught_offline_and_removed(tmp_path):
    spec = corpora.CORPORA["wmt14-en-de"]
    cache = fill_cache(tmp_path / "hub", hub_files(["wmt14-en-de"]))
    name = spec.hub.files["train"][1]
    link = cache / "datasets--wmt--wmt14" / "snapshots" / spec.hub.revision / name
    blob = link.resolve()
    blob.write_bytes(blob.read_bytes()[:-10] + b"0123456789")  # same size, other bytes
    out = tmp_path / "o"
    r = nmt("prepare", "wmt14-en-de", "-o", out, env=env_for(cache, tmp_path))
    line = error_line(r)
    assert name in line and "corrupt" in line and "HF_HUB_OFFLINE" in line and "wmt/wmt14" in line
    assert not blob.exists() and not link.is_symlink()  # never used again, and not re-linked by the client
    assert not out.exists()


def test_offline_without_cache_is_one_line_with_what_to_do(tmp_path):
    """HF_HUB_OFFLINE set by the user: the line says the one remedy that applies (unset it), and nothing else."""
    r = nmt("prepare", "wmt16-en-ro", "-o", tmp_path / "o", env=env_for(tmp_path / "empty", tmp_path))
    line = error_line(r)
    for part in ("wmt/wmt16@3923157a", "ro-en/train-00000-of-00001.parquet", "HF_HUB_OFFLINE is set",
                 "unset it to download them"):
        assert part in line
    assert "--from-dir" not in line and "prepare custom" not in line and len(line) < 300, line


def test_check_file_uses_the_blob_name_and_the_listed_sha256(tmp_path):
    cache = tmp_path / "hub"
    root = write_repo(cache, "o/r", "a" * 40, {"x.parquet": b"good bytes"})
    link = root / "snapshots" / ("a" * 40) / "x.parquet"
    assert hub_corpora.check_file(link) is None
    assert "the hub lists" in hub_corpora.check_file(link, expected_sha256="0" * 64)
    link.resolve().write_bytes(b"bad bytes!")
    assert "its blob is named" in hub_corpora.check_file(link)
    # a small non-LFS file: its blob is named by git's sha1 of "blob <size>\0" + bytes
    git = root / "blobs" / "95d09f2b10159347eece71399a7e2e907ea3df4f"  # `git hash-object` of "hello world"
    git.write_bytes(b"hello world")
    assert hub_corpora.check_file(git) is None
    git.write_bytes(b"hello there")
    assert "git sha1" in hub_corpora.check_file(git)


def test_disk_full_during_a_download_is_one_line():
    spec = corpora.CORPORA["wmt14-en-de"]
    err = hub_corpora.hub_error(OSError(28, "No space left on device"), spec.hub, "de-en/test-00000-of-00001.parquet",
                        "download", "pass local files")
    msg = str(err)
    assert "\n" not in msg and "disk is full" in msg and "wmt/wmt14" in msg and "b199e406" in msg
    assert "de-en/test-00000-of-00001.parquet" in msg and "HF_HUB_CACHE" in msg and msg.endswith("pass local files")


# ------------------------------------------------------------------------------------------ online (local hub)


def test_download_through_the_client_then_reuse_offline(tmp_path):
    files = hub_files(["wmt16-en-ro"])
    cache = tmp_path / "hub"
    with LocalHub(files) as server:
        r = nmt("prepare", "wmt16-en-ro", "-o", tmp_path / "o", "--vocab-size", 250, "--workers", 1,
                env=env_for(cache, tmp_path, offline=False, HF_ENDPOINT=server.url))
        assert r.returncode == 0, r.stderr
        assert len(server.downloads()) == 3 and "download ro-en/train-00000-of-00001.parquet (1/3)" in r.stderr
    r = nmt("prepare", "wmt16-ro-en", "-o", tmp_path / "o2", "--vocab-size", 250, "--workers", 1,
            env=env_for(cache, tmp_path))  # offline now: everything is in the cache
    assert r.returncode == 0, r.stderr


def test_corrupt_cached_file_is_downloaded_again_online(tmp_path):
    files = hub_files(["wmt16-en-ro"])
    spec = corpora.CORPORA["wmt16-en-ro"]
    cache = fill_cache(tmp_path / "hub", files)
    name = spec.hub.files["test"][0]
    link = cache / "datasets--wmt--wmt16" / "snapshots" / spec.hub.revision / name
    link.resolve().write_bytes(b"garbage")
    with LocalHub(files) as server:
        r = nmt("prepare", "wmt16-en-ro", "-o", tmp_path / "o", "--vocab-size", 250, "--workers", 1,
                env=env_for(cache, tmp_path, offline=False, HF_ENDPOINT=server.url))
        assert r.returncode == 0, r.stderr
        assert server.downloads() == [f"/datasets/wmt/wmt16/resolve/{spec.hub.revision}/{name}"]
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and name in warnings[0] and "corrupt" in warnings[0], r.stderr
    assert hub_corpora.check_file(link) is None
    assert json.loads((tmp_path / "o" / MANIFEST).read_text())["splits"]["test"]["read"] == SIZES["test"]


def test_download_progress_counts_bytes_while_the_file_arrives(tmp_path):
    """Progress polls the growing .incomplete file, whatever the hub release (no tqdm_class, no TTY needed). The
    download stops halfway until the progress has reported a part of it (a marker file its callback writes)."""
    rev = "c" * 40
    body = os.urandom(24 << 20)  # bigger than the client's 10 MiB read chunks, so a part lands on disk first
    seen = tmp_path / "partial-seen"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from nmt_cli.data import hub_corpora\n"
        "events = []\n"
        "def progress(stage, done, total):\n"
        "    events.append((stage, done, total))\n"
        "    if stage.startswith('download') and 0 < done < total:\n"
        f"        Path({str(seen)!r}).touch()\n"
        f"files = hub_corpora.HubFiles('o/r', '{rev}', {{'train': ('big.parquet',)}})\n"
        "paths = hub_corpora.fetch(files, progress=progress)\n"
        "partial = [d for s, d, t in events if s.startswith('download') and 0 < d < t]\n"
        "print(paths['train'][0].stat().st_size, len(partial))\n")
    with LocalHub({("o/r", rev, "big.parquet"): body}) as server:
        server.pause_until = seen
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=env_for(tmp_path / "hub", tmp_path, offline=False, HF_ENDPOINT=server.url))
    assert r.returncode == 0, r.stderr
    size, partial = map(int, r.stdout.split())
    assert size == len(body) and partial >= 1


def test_proxy_variables_are_honoured(tmp_path):
    """The hub host does not resolve; only the proxy (the local hub) can answer: the old raw-socket check failed."""
    files = hub_files(["wmt16-en-ro"])
    with LocalHub(files) as server:
        env = env_for(tmp_path / "hub", tmp_path, offline=False, HF_ENDPOINT="http://hub.invalid",
                      HTTP_PROXY=server.url, http_proxy=server.url)
        r = nmt("prepare", "wmt16-en-ro", "-o", tmp_path / "o", "--vocab-size", 250, "--workers", 1, env=env)
        assert r.returncode == 0, r.stderr
        assert len(server.downloads()) == 3


@pytest.mark.parametrize("status, headers, expect", [
    (401, {"X-Error-Code": "RepoNotFound"}, "log in"),
    (403, {}, "refused access"),
    (404, {"X-Error-Code": "RevisionNotFound"}, "no revision"),
    (429, {}, "rate-limited"),
    (503, {}, "HTTP 503"),
])
def test_hub_failures_are_one_line_naming_repo_revision_file(tmp_path, status, headers, expect):
    with LocalHub({}) as server:
        server.fail = (status, headers)
        r = nmt("prepare", "wmt17-en-de", "-o", tmp_path / "o",
                env=env_for(tmp_path / "hub", tmp_path, offline=False, HF_ENDPOINT=server.url))
    line = error_line(r)
    assert expect in line and "wmt/wmt17" in line and "4d4005cd" in line
    assert "nmt prepare wmt17-en-de --from-dir DIR" in line
    assert not (tmp_path / "o").exists()


def test_unreachable_hub_fails_at_once(tmp_path):
    r = nmt("prepare", "wmt14-en-fr", "-o", tmp_path / "o",
            env=env_for(tmp_path / "hub", tmp_path, offline=False, HF_ENDPOINT="http://127.0.0.1:9"))
    line = error_line(r)
    assert "http://127.0.0.1:9 cannot be reached" in line and "HTTPS_PROXY" in line and "fr-en/" in line
    assert "--from-dir DIR" in line and "prepare custom" not in line and "HF_HUB_OFFLINE" not in line


def test_file_missing_on_the_hub_is_named(tmp_path):
    files = hub_files(["wmt16-en-ro"])
    spec = corpora.CORPORA["wmt16-en-ro"]
    del files[(spec.hub.repo, spec.hub.revision, spec.hub.files["valid"][0])]
    with LocalHub(files) as server:
        r = nmt("prepare", "wmt16-en-ro", "-o", tmp_path / "o",
                env=env_for(tmp_path / "hub", tmp_path, offline=False, HF_ENDPOINT=server.url))
        assert server.downloads() == []  # found before any download started
    assert "the hub has no ro-en/validation-00000-of-00001.parquet" in error_line(r)


# ------------------------------------------------------------------------------------------ pre-flight checks


def test_no_disk_room_fails_before_downloading(tmp_path):
    with LocalHub(hub_files(["wmt16-en-ro"])) as server:
        server.listed_size = 10**13  # the hub lists 10 TB per file: more than this disk has
        r = nmt("prepare", "wmt16-en-ro", "-o", tmp_path / "o",
                env=env_for(tmp_path / "hub", tmp_path, offline=False, HF_ENDPOINT=server.url))
        assert server.downloads() == []
    line = error_line(r)
    assert "needs 30000" in line and "free" in line and "HF_HUB_CACHE" in line
    assert not (tmp_path / "o").exists()


@pytest.fixture()
def no_listing(monkeypatch):
    """In-process checks must fail before the hub is asked anything."""
    def listing(*args):
        raise AssertionError("the hub was asked for the file listing before the pre-flight checks")

    monkeypatch.setattr(hub_corpora, "_list", listing)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)


def test_unwritable_cache_fails_before_downloading(tmp_path, no_listing):
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(DownloadError, match="not writable.*HF_HUB_CACHE"):
        prepare(PrepareOptions("wmt16-en-ro", str(tmp_path / "o"), cache_dir=str(tmp_path / "afile" / "hub")))
    assert not (tmp_path / "o").exists()


def test_missing_pyarrow_fails_before_downloading(tmp_path, no_listing, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # `import pyarrow.parquet` now raises ImportError
    with pytest.raises(ConfigError, match="pyarrow"):
        prepare(PrepareOptions("wmt16-en-ro", str(tmp_path / "o"), cache_dir=str(tmp_path / "hub")))


def test_unwritable_output_fails_before_downloading(tmp_path, no_listing):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match="afile is not a writable directory"):
        prepare(PrepareOptions("wmt16-en-ro", str(tmp_path / "afile" / "o"), cache_dir=str(tmp_path / "hub")))


def test_named_corpora_combine_into_one_multilingual_directory(offline_cache, tmp_path):
    """wmt14-en-de,wmt14-en-fr,wmt14-de-en: each read as it is on its own (a reverse too), one BPE, tagged sources."""
    out = tmp_path / "data"
    r = nmt("prepare", "wmt14-en-de,wmt14-en-fr,wmt14-de-en", "-o", out, "--vocab-size", 300, "--workers", 1,
            env=env_for(offline_cache, tmp_path))
    assert r.returncode == 0, r.stderr
    m = json.loads((out / MANIFEST).read_text())
    assert [(d["src"], d["tgt"], d["tag"], d["corpus"]) for d in m["directions"]] == [
        ("en", "de", ">>de<<", "wmt14-en-de"), ("en", "fr", ">>fr<<", "wmt14-en-fr"),
        ("de", "en", ">>en<<", "wmt14-de-en")]
    assert (m["src_lang"], m["tgt_lang"]) == ("mul", "mul")
    assert all({s: v["read"] for s, v in d["splits"].items()} == SIZES for d in m["directions"])
    en, de = generate(SIZES, seed=3)["test"][0]
    assert (out / "raw" / "test.de-en.de").read_text().splitlines()[0] == de
    assert (out / "raw" / "test.de-en.en").read_text().splitlines()[0] == en
    assert (out / "raw" / "test.en-fr.en").read_text().splitlines()[0] == en
