"""Pinned corpus files from Hugging Face hub dataset repositories, through huggingface_hub's own client and cache
(the offline rule and the error lines are hub/client.py's, shared with hub model repositories).

`fetch(files)` returns the local paths of a `HubFiles` (a dataset repository, a pinned revision, file names):

- A cached file is used only after it has been checked: the hub's cache names each blob by its content hash
  (sha256 for LFS files, the git blob sha1 for small ones), so a file whose bytes changed is caught offline.
  A corrupt file is removed (blob and snapshot link, so the hub cannot link it again) and, online, downloaded again.
- Before the first byte is downloaded, every check that can fail runs: the cache directory is writable, nmt is
  not offline (hubclient.offline_reason), the hub answers through its own HTTP client (so HTTPS_PROXY/HTTP_PROXY/NO_PROXY apply as they do to the hub), it lists
  every file (size and sha256) at the revision, and the cache's disk has room for them.
- A downloaded file is checked against the sha256 the hub listed, and removed when it differs.
- Every failure is one `DownloadError` line naming the repository, revision and file and saying what to do.
- Progress counts the bytes of the growing `*.incomplete` file in the cache (the hub's own bars are switched off),
  which works the same in every huggingface_hub release nmt admits.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.errors import DownloadError
from nmt_cli.hub import client as hubclient
from nmt_cli.hub.client import tail as _tail

Progress = Callable[[str, int, "int | None"], None]  # (stage, done, total)
Warn = Callable[[str], None]
LIST_TIMEOUT_S = 30.0  # the file listing (the first request) must answer within this: no network fails fast
DISK_MARGIN = 64 << 20  # bytes kept free beyond the download itself


@dataclass(frozen=True)
class HubFiles:
    """Files of a dataset repository on the hub at a pinned commit: {split: (path in the repository, ...)}."""

    repo: str
    revision: str  # a full commit hash: the files never change under a pinned name
    files: dict[str, tuple[str, ...]]

    def names(self) -> list[str]:
        return [n for split in self.files.values() for n in split]

    @property
    def where(self) -> str:
        return f"{self.repo}@{self.revision[:8]}"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The hub cache nmt reads and writes: `cache_dir`, else HF_HUB_CACHE (default HF_HOME/hub)."""
    return hubclient.cache_dir(cache_dir)


def fetch(hub: HubFiles, cache_dir=None, progress: Progress | None = None, warn: Warn | None = None,
          hint: str = "") -> dict[str, list[Path]]:
    """{split: local paths} of `hub`'s files: checked cached files, the rest downloaded (see the module doc).
    `hint` ends every error line (how to pass local files instead)."""
    from huggingface_hub import try_to_load_from_cache

    root = cache_root(cache_dir)
    local: dict[str, Path] = {}
    missing: list[str] = []
    corrupt: dict[str, str] = {}
    cached = {}
    for name in hub.names():
        path = try_to_load_from_cache(hub.repo, name, cache_dir=str(root), revision=hub.revision,
                                      repo_type="dataset")
        if isinstance(path, str):
            cached[name] = Path(path)
        else:
            missing.append(name)
    for name, problem in _verify(cached, {}, progress).items():
        if problem is None:
            local[name] = cached[name]
        else:
            _evict(cached[name])
            corrupt[name] = problem
            missing.append(name)
    if missing:
        _check_writable(hub, root, hint)
        why = hubclient.offline_reason()
        if why is not None:
            raise DownloadError(_offline_message(hub, missing, corrupt, root, hint, why))
        for name, problem in corrupt.items():
            if warn:
                warn(f"the cached {name} of {hub.where} was corrupt ({problem}); it was removed and is downloaded "
                     "again")
        sizes, expected = _preflight(hub, missing, root, hint)
        for i, name in enumerate(missing):
            path = _download(hub, name, root, sizes.get(name), f"download {name} ({i + 1}/{len(missing)})",
                             progress, hint)
            problem = _verify({name: path}, expected, progress)[name]
            if problem is not None:
                _evict(path)
                raise DownloadError(f"{hub.where}: the downloaded {name} does not match the hub ({problem}); it "
                                    "was removed from the cache: run again (a proxy or a failing disk may have "
                                    f"changed it){_tail(hint)}")
            local[name] = path
    return {split: [local[n] for n in names] for split, names in hub.files.items()}


# ------------------------------------------------------------------------------------------ verification


def check_file(path: Path, expected_sha256: str | None = None, on_bytes: Callable[[int], None] | None = None
               ) -> str | None:
    """None when a cached file's bytes match the hash its blob is named by (and `expected_sha256`, when given);
    otherwise what differs. A file that is no blob link (a cache on a filesystem without symlinks) is checked
    against `expected_sha256` only."""
    blob = path.resolve()
    named = blob.name if blob.parent.name == "blobs" else ""
    sha256, sha1 = hashlib.sha256(), None
    git_sha1 = re.fullmatch(r"[0-9a-f]{40}", named) is not None
    if git_sha1:  # a small non-LFS file: git's blob hash, sha1("blob <size>\0" + bytes)
        sha1 = hashlib.sha1(b"blob %d\0" % blob.stat().st_size)
    with open(blob, "rb") as f:
        while block := f.read(1 << 24):
            sha256.update(block)
            if sha1 is not None:
                sha1.update(block)
            if on_bytes:
                on_bytes(len(block))
    got = sha256.hexdigest()
    if re.fullmatch(r"[0-9a-f]{64}", named) and got != named:
        return f"sha256 {got[:12]}..., its blob is named {named[:12]}..."
    if git_sha1 and sha1.hexdigest() != named:
        return f"git sha1 {sha1.hexdigest()[:12]}..., its blob is named {named[:12]}..."
    if expected_sha256 and got != expected_sha256:
        return f"sha256 {got[:12]}..., the hub lists {expected_sha256[:12]}..."
    return None


def _verify(paths: dict[str, Path], expected: dict[str, str], progress: Progress | None) -> dict[str, str | None]:
    """{name: problem or None} for each file, hashing them all under one progress stage (bytes)."""
    if not paths:
        return {}
    total = sum(p.stat().st_size for p in paths.values())
    done = [0]

    def on_bytes(n: int) -> None:
        done[0] += n
        if progress:
            progress("verify cached files" if not expected else "verify download", done[0], total)

    return {name: check_file(p, expected.get(name), on_bytes) for name, p in paths.items()}


def _evict(path: Path) -> None:
    """Remove a cached file: its blob and the snapshot link to it (else the hub would link the blob again)."""
    blob = path.resolve()
    if path.is_symlink():
        path.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ pre-flight


def _check_writable(hub: HubFiles, root: Path, hint: str) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as exc:
        raise DownloadError(f"cannot download {hub.where}: the Hugging Face cache {root} is not writable "
                            f"({exc.strerror or exc}); set HF_HUB_CACHE (or HF_HOME) to a writable "
                            f"directory{_tail(hint)}") from None


def _preflight(hub: HubFiles, missing: list[str], root: Path, hint: str) -> tuple[dict[str, int], dict[str, str]]:
    """Every check that can fail, before any download: cache writable, the hub's listing (through its own HTTP
    client, so proxies apply), every file present at the revision, disk room. Returns ({name: size}, {name:
    sha256})."""
    _check_writable(hub, root, hint)
    infos = _list(hub, missing, hint)
    absent = [n for n in missing if n not in infos]
    if absent:
        raise DownloadError(f"the hub has no {absent[0]} in {hub.repo} at revision {hub.revision[:8]} "
                            f"({len(absent)} of {len(missing)} files absent): nmt's pinned file list does not "
                            f"match the hub; please report it{_tail(hint)}")
    sizes = {n: int(getattr(infos[n], "size", 0) or 0) for n in missing}
    expected = {}
    for n in missing:
        lfs = getattr(infos[n], "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        if sha is None and isinstance(lfs, dict):
            sha = lfs.get("sha256")
        if sha:
            expected[n] = sha
    need = sum(sizes.values())
    free = shutil.disk_usage(root).free
    if need + DISK_MARGIN > free:
        raise DownloadError(f"downloading {len(missing)} files of {hub.where} needs {_gb(need + DISK_MARGIN)} in "
                            f"{root} but only {_gb(free)} are free; free some space or set HF_HUB_CACHE to a disk "
                            f"with room{_tail(hint)}")
    return sizes, expected


def _list(hub: HubFiles, names: list[str], hint: str) -> dict:
    """{path: RepoFile} from the hub's paths-info API, through huggingface_hub's client; a DownloadError when no
    answer comes within LIST_TIMEOUT_S (the client itself may wait much longer on a dead network)."""
    from huggingface_hub import HfApi

    box: dict = {}

    def call():
        try:
            box["infos"] = HfApi().get_paths_info(hub.repo, names, revision=hub.revision, repo_type="dataset")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=call, daemon=True, name="nmt-hub-list")
    thread.start()
    thread.join(LIST_TIMEOUT_S)
    if thread.is_alive():
        raise DownloadError(f"cannot list {hub.where}: {hubclient.endpoint()} gave no answer within {LIST_TIMEOUT_S:.0f} s; "
                            f"check the network or the proxy (HTTPS_PROXY){_tail(hint)}")
    if "error" in box:
        raise hub_error(box["error"], hub, names[0], "list", hint) from box["error"]
    return {i.path: i for i in box["infos"]}


def _blob_dir(hub: HubFiles, root: Path) -> Path:
    return root / ("datasets--" + hub.repo.replace("/", "--")) / "blobs"  # the hub cache's layout


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# ------------------------------------------------------------------------------------------ download


def _download(hub: HubFiles, name: str, root: Path, size: int | None, label: str, progress: Progress | None,
              hint: str) -> Path:
    """One file through `hf_hub_download` (resumable; the hub's own progress bars off, ours polled)."""
    import huggingface_hub as hf
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    stop = threading.Event()
    poller = None
    if progress:
        poller = threading.Thread(target=_poll, args=(_blob_dir(hub, root), label, size, progress, stop,
                                                      time.time() - 1), daemon=True, name="nmt-hub-progress")
        poller.start()
    try:
        path = hf.hf_hub_download(hub.repo, name, repo_type="dataset", revision=hub.revision, cache_dir=str(root))
    except Exception as exc:
        raise hub_error(exc, hub, name, "download", hint) from exc
    finally:
        stop.set()
        if poller:
            poller.join()
        if not was_disabled:
            enable_progress_bars()
    if progress:
        progress(label, size or 0, size)
    return Path(path)


def _poll(blobs: Path, label: str, size: int | None, progress: Progress, stop: threading.Event,
          since: float) -> None:
    """Report the bytes of the `*.incomplete` file(s) written since the download started, every 0.25 s."""
    while not stop.wait(0.25):
        try:
            stats = [p.stat() for p in blobs.glob("*.incomplete")]
        except OSError:  # a file renamed into place between listing and stat
            continue
        progress(label, sum(st.st_size for st in stats if st.st_mtime >= since), size)


# ------------------------------------------------------------------------------------------ errors


def hub_error(exc: BaseException, hub: HubFiles, name: str, action: str, hint: str = "") -> DownloadError:
    """One line for any failure of the hub client (hubclient.error): repository, revision, file, what to do."""
    return hubclient.error(exc, hubclient.Target(hub.repo, name, hub.revision, pinned=True), action, hint)


def _offline_message(hub: HubFiles, missing: list[str], corrupt: dict[str, str], root: Path, hint: str,
                     why: str) -> str:
    if corrupt:
        name, problem = next(iter(corrupt.items()))
        return (f"the cached {name} of {hub.where} was corrupt ({problem}) and was removed; {why}, so it cannot be "
                f"downloaded again: run again online{_tail(hint)}")
    files = f"cannot download {len(missing)} files of {hub.where} (first: {missing[0]}): they are not in the cache {root}"
    if why == hubclient.OFFLINE_SET:  # the user chose offline: the one remedy is to go online
        return f"{files} and HF_HUB_OFFLINE is set; unset it to download them"
    return f"{files} and {why}{_tail(hint)}"
