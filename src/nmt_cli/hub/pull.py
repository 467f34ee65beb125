"""Models from Hugging Face hub repositories, through huggingface_hub's own client and cache (the offline rule and
the error lines are client.py's, shared with the corpus files of data/hub_corpora.py).

A model argument `hf:ORG/NAME[/FILE][@REVISION]` (FILE defaults to checkpoint.pt, REVISION to main) is
fetched with `hf_hub_download` into the hub cache (HF_HUB_CACHE, default ~/.cache/huggingface/hub) and loaded from
there like any checkpoint file (torch.load(weights_only=True): a downloaded file never runs code). The commit it
resolved to is reported, so a run can be pinned (`@<commit>`). A commit revision that is cached needs no network;
a branch or tag is looked up on the hub, or, when the hub cannot be reached (or HF_HUB_OFFLINE=1), taken from the
cache with a note saying so; not cached and offline is one line saying what to do. A MarianMT (OPUS-MT)
repository is fetched as a snapshot folder of its files.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nmt_cli import __version__
from nmt_cli.errors import ConfigError, DownloadError
from nmt_cli.hub import client as hubclient

PREFIX = "hf:"
DEFAULT_FILE = "checkpoint.pt"
Note = Callable[[str], None]
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")  # ORG/NAME
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def is_hub_ref(text: str | os.PathLike) -> bool:
    return str(text).startswith(PREFIX)


@dataclass(frozen=True)
class HubRef:
    """`hf:ORG/NAME[/FILE][@REVISION]`: a file in a hub model repository at a branch, tag or commit."""

    repo: str
    filename: str = DEFAULT_FILE
    revision: str | None = None  # None: the default branch (main)

    @classmethod
    def parse(cls, text: str) -> HubRef:
        body, _, revision = str(text)[len(PREFIX):].partition("@")
        parts = body.split("/")
        repo, filename = "/".join(parts[:2]), "/".join(parts[2:]) or DEFAULT_FILE
        if not REPO.match(repo) or "" in parts:
            raise ConfigError(f"{text!r} is not a hub model reference; write hf:ORG/NAME, hf:ORG/NAME@REVISION or "
                              "hf:ORG/NAME/FILE.pt@REVISION")
        if "@" in text and not revision:
            raise ConfigError(f"{text!r} has an empty revision after '@'; give a branch, tag or commit")
        return cls(repo, filename, revision or None)

    def __str__(self) -> str:
        file = "" if self.filename == DEFAULT_FILE else f"/{self.filename}"
        return f"{PREFIX}{self.repo}{file}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class Pulled:
    """A hub checkpoint in the local cache."""

    ref: HubRef
    path: Path
    commit: str
    offline: bool  # True: the hub was not asked (offline or a cached commit)

    def pinned(self) -> str:
        return str(HubRef(self.ref.repo, self.ref.filename, self.commit))




def pull(ref: HubRef, note: Note | None = None) -> Pulled:
    """The local path of `ref`'s file: from the cache, or downloaded into it (see the module doc)."""
    import huggingface_hub as hf
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError

    if ref.revision and _COMMIT.match(ref.revision):  # a commit never changes: a cached file is final
        cached = hf.try_to_load_from_cache(ref.repo, ref.filename, revision=ref.revision)
        if isinstance(cached, str):
            if note is not None:
                note(f"{ref} -> the cached commit (no network needed)")
            return Pulled(ref, Path(cached), ref.revision, offline=True)
    why = hubclient.offline_reason()
    offline = why is not None
    try:
        with _download_errors(ref, why):
            path = Path(hf.hf_hub_download(ref.repo, ref.filename, revision=ref.revision, local_files_only=offline,
                                           library_name="nmt", library_version=__version__))
    except DownloadError as exc:
        if ref.filename != DEFAULT_FILE or not isinstance(exc.__cause__, (EntryNotFoundError,
                                                                           LocalEntryNotFoundError)):
            raise
        marian = _pull_marian(ref, offline, why)  # no checkpoint.pt: an OPUS-MT (MarianMT) repository?
        if marian is None:
            raise
        path = marian
    # .../snapshots/<commit>/<filename>, or the snapshot folder itself (a MarianMT repository)
    commit = path.name if path.is_dir() else path.parents[len(Path(ref.filename).parts) - 1].name
    pulled = Pulled(ref, path, commit, offline)
    if note is not None:
        where = f"the cache ({why})" if offline else "the hub"
        note(f"{ref} -> commit {commit} from {where}; pin it with -m {pulled.pinned()}")
    return pulled


@contextmanager
def _download_errors(ref: HubRef, why: str | None):
    """huggingface_hub's failures as one-line DownloadErrors (hubclient.error; the client's error the cause)."""
    try:
        yield
    except Exception as exc:
        target = hubclient.Target(ref.repo, ref.filename, ref.revision, label=str(ref))
        raise hubclient.error(exc, target, "download", "pass a local checkpoint file", why) from exc


def _pull_marian(ref: HubRef, offline: bool, why: str) -> Path | None:
    """The MarianMT files of `ref`'s repository (config.json, weights, tokenizer) as a snapshot folder in the
    hub cache, or None when its config.json is not a MarianMT one."""
    import huggingface_hub as hf

    from nmt_cli.importers import marian

    config = HubRef(ref.repo, "config.json", ref.revision)
    try:
        with _download_errors(config, why):
            path = Path(hf.hf_hub_download(ref.repo, "config.json", revision=ref.revision, local_files_only=offline,
                                           library_name="nmt", library_version=__version__))
    except DownloadError:
        return None
    if not marian.is_marian(path.parent):
        return None
    files = [name for name in marian.FILES if name not in marian.WEIGHT_FILES]
    with _download_errors(HubRef(ref.repo, "*", ref.revision), why):
        if offline:
            files += marian.WEIGHT_FILES  # whichever the cache holds
        else:  # one weight file: safetensors where the repository has it (OPUS-MT repositories often have both)
            listed = set(hf.list_repo_files(ref.repo, revision=ref.revision))
            files += [next((w for w in marian.WEIGHT_FILES if w in listed), marian.WEIGHT_FILES[-1])]
        folder = hf.snapshot_download(ref.repo, revision=ref.revision, allow_patterns=files,
                                      local_files_only=offline, library_name="nmt", library_version=__version__)
    return Path(folder)


def resolve(model: str | os.PathLike, note: Note | None = None) -> Path:
    """A local checkpoint path for a model argument: a path as it is, an hf: reference pulled (the checkpoint file,
    or a MarianMT repository's snapshot folder)."""
    if is_hub_ref(model):
        return pull(HubRef.parse(str(model)), note).path
    return Path(model)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
