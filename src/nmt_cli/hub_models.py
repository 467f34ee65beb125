"""Checkpoints in Hugging Face hub model repositories, through huggingface_hub's own client and cache (the offline
rule and the error lines are hubclient.py's, shared with the corpus files of data/hub_corpora.py).

Pull: a model argument `hf:ORG/NAME[/FILE][@REVISION]` (FILE defaults to checkpoint.pt, REVISION to main) is
fetched with `hf_hub_download` into the hub cache (HF_HUB_CACHE, default ~/.cache/huggingface/hub) and loaded from
there like any checkpoint file (torch.load(weights_only=True): a downloaded file never runs code). The commit it
resolved to is reported, so a run can be pinned (`@<commit>`). A commit revision that is cached needs no network;
a branch or tag is looked up on the hub, or, when the hub cannot be reached (or HF_HUB_OFFLINE=1), taken from the
cache with a note saying so; not cached and offline is one line saying what to do.

Push: `stage()` lays out a repository folder (model card, the checkpoint without its training state, optionally
the Hugging Face export at the root and the CTranslate2 export under ctranslate2/); `upload()` creates the
repository and uploads that folder in one commit with `HfApi`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nmt_cli import __version__, defaults, hubclient
from nmt_cli import checkpoint as ckpt_io
from nmt_cli.errors import ConfigError, DownloadError

PREFIX = "hf:"
DEFAULT_FILE = "checkpoint.pt"
CT2_FOLDER = "ctranslate2"
Note = Callable[[str], None]
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
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
        if not _REPO.match(repo) or "" in parts:
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


cache_dir = hubclient.cache_dir
hub_reachable = hubclient.reachable


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

    from nmt_cli import marian

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


# ---------------------------------------------------------------------------------------------------- push


def check_repo_id(repo_id: str) -> str:
    if is_hub_ref(repo_id):
        repo_id = repo_id[len(PREFIX):]
    if not _REPO.match(repo_id):
        raise ConfigError(f"{repo_id!r} is not a hub repository name; write ORG/NAME (e.g. my-name/nmt-en-de)")
    return repo_id


def token() -> str:
    """The hub token (HF_TOKEN or the one `hf auth login` stored); a ConfigError when there is none."""
    from huggingface_hub import get_token

    found = get_token()
    if not found:
        raise ConfigError("no Hugging Face token: log in with `hf auth login` (or `huggingface-cli login`) or set "
                          "HF_TOKEN to a token with write access, then push again")
    return found


def stage(ckpt: ckpt_io.Checkpoint, folder: Path, repo_id: str, card=None, ctranslate2: bool = False,
          huggingface: bool = False, quantization: str | None = None, source: dict | None = None) -> list[str]:
    """Lay out the repository in `folder` (atomically) -> its files, relative, sorted.

    checkpoint.pt (the weights, model config and tokenizer; no training state), README.md (the model card with
    usage for nmt, the Python API and each export), the Hugging Face export at the root (so that
    `from_pretrained("ORG/NAME")` works) and the CTranslate2 export under ctranslate2/.
    """
    from nmt_cli.export import ctranslate2 as ct2_export
    from nmt_cli.export import huggingface as hf_export
    from nmt_cli.export.card import CardInfo, model_card
    from nmt_cli.export.folder import atomic_folder

    card = card or CardInfo()
    if huggingface:
        hf_export.check_convertible(ckpt)  # refuse before any work
    with atomic_folder(folder, force_option=None) as tmp:
        if huggingface:
            hf_export.export(ckpt, tmp / "hf", card, source)
            for item in (tmp / "hf").iterdir():
                os.replace(item, tmp / item.name)
            (tmp / "hf").rmdir()
        if ctranslate2:
            ct2_export.export(ckpt, tmp / CT2_FOLDER, quantization, card, source)
        slim = ckpt_io.Checkpoint(ckpt.model_config, ckpt.model_state, ckpt.tokenizer, ckpt.langs, None, ckpt.meta)
        ckpt_io.save(slim, tmp / DEFAULT_FILE)
        title = f"nmt {ckpt.langs.get('src', '?')}→{ckpt.langs.get('tgt', '?')}"
        library = "transformers" if huggingface else "nmt"
        text = model_card(ckpt, card, title=title, library=library, usage=repo_usage(repo_id, ckpt, huggingface,
                          ctranslate2), tags=(["marian"] if huggingface else []) + (["ctranslate2"] if ctranslate2 else []))
        (tmp / "README.md").write_text(text, encoding="utf-8")
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def repo_usage(repo_id: str, ckpt: ckpt_io.Checkpoint, huggingface: bool, ctranslate2: bool) -> str:
    parts = [f"""## Use with nmt

```bash
pip install nmt-cli
nmt translate -m hf:{repo_id} < input.txt > output.txt
```

```python
from nmt_cli import Translator
translator = Translator.load("hf:{repo_id}")
print(translator.translate_best(["A man is riding a bike."]))
```

`checkpoint.pt` is an nmt checkpoint (weights, model config and sentencepiece model in one file); add `@REVISION`
to pin a commit: `hf:{repo_id}@<commit>`."""]
    if huggingface:
        parts.append(f"""## Use with transformers

```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer, model = MarianTokenizer.from_pretrained("{repo_id}"), MarianMTModel.from_pretrained("{repo_id}")
batch = tokenizer(["A man is riding a bike."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch, num_beams={defaults.BEAM}), skip_special_tokens=True))
```""")
    if ctranslate2:
        parts.append(f"""## Use with CTranslate2

```python
import ctranslate2, sentencepiece
from huggingface_hub import snapshot_download
model = snapshot_download("{repo_id}", allow_patterns=["{CT2_FOLDER}/*"]) + "/{CT2_FOLDER}"
sp, translator = sentencepiece.SentencePieceProcessor(model_file=model + "/sentencepiece.model"), ctranslate2.Translator(model)
print(sp.decode(translator.translate_batch([sp.encode("A man is riding a bike.", out_type=str)], beam_size={defaults.BEAM}, length_penalty={defaults.LENPEN})[0].hypotheses[0]))
```""")
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Pushed:
    repo_id: str
    commit: str
    url: str


def upload(folder: Path, repo_id: str, private: bool = False, message: str | None = None,
           hub_token: str | None = None) -> Pushed:
    """Create `repo_id` (if needed) and upload `folder` as one commit -> where it went."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HfHubHTTPError

    api = HfApi(token=hub_token or token(), library_name="nmt", library_version=__version__)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                                 commit_message=message or f"nmt {__version__}: upload checkpoint")
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = {401: "the token was refused: log in again with `hf auth login`",
                403: f"the token may not write to {repo_id}: use a token with write access to that namespace"}.get(
            status, "check the repository name and your access")
        raise DownloadError(f"pushing to {repo_id} failed ({str(exc).splitlines()[0][:160]}); {hint}") from exc
    except Exception as exc:
        if hubclient.is_network_error(exc):
            raise DownloadError(f"pushing to {repo_id} failed: the hub cannot be reached ({exc}); check the "
                                "network (HTTPS_PROXY) and push again") from exc
        raise
    return Pushed(repo_id, info.oid, info.commit_url)
