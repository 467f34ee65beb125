"""`nmt push`: a checkpoint into a Hugging Face hub model repository.

`stage()` lays out a repository folder (model card, the checkpoint without its training state, optionally the
Hugging Face export at the root and the CTranslate2 export under ctranslate2/); `upload()` creates the repository
and uploads that folder in one commit with `HfApi`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nmt_cli import __version__
from nmt_cli.atomic import owner_gone, owner_tag
from nmt_cli.checkpoints import format as ckpt_io
from nmt_cli.errors import ConfigError, DownloadError
from nmt_cli.hub import client as hubclient
from nmt_cli.hub.pull import DEFAULT_FILE, PREFIX, REPO, is_hub_ref
from nmt_cli.runtime import defaults

CT2_FOLDER = "ctranslate2"
_STAGING = "nmt-push-"  # the system's temporary folder holds nmt-push-PID@HOST.XXXX/ while a push stages and uploads


def check_repo_id(repo_id: str) -> str:
    if is_hub_ref(repo_id):
        repo_id = repo_id[len(PREFIX):]
    if not REPO.match(repo_id):
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
        slim = ckpt_io.Checkpoint(ckpt.model_config, ckpt.model_state, ckpt.tokenizer, ckpt.langs, None, ckpt.meta,
                                  shortlist=ckpt.shortlist)
        ckpt_io.save(slim, tmp / DEFAULT_FILE)
        title = f"nmt {ckpt.langs.get('src', '?')}→{ckpt.langs.get('tgt', '?')}"
        library = "transformers" if huggingface else "nmt"
        text = model_card(ckpt, card, title=title, library=library, usage=repo_usage(repo_id, ckpt, huggingface,
                          ctranslate2), tags=(["marian"] if huggingface else []) + (["ctranslate2"] if ctranslate2 else []))
        (tmp / "README.md").write_text(text, encoding="utf-8")
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def staging_folder() -> tempfile.TemporaryDirectory:
    """The temporary folder a push stages the repository in (removed when the push ends), after removing those
    that killed pushes left (their process has ended on this host; never a live push's)."""
    pattern = re.compile(re.escape(_STAGING) + r"([0-9]+@[A-Za-z0-9_-]+)\.[a-z0-9_]+")
    for path in Path(tempfile.gettempdir()).glob(_STAGING + "*"):
        found = pattern.fullmatch(path.name)
        if found and path.is_dir() and owner_gone(found.group(1)):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{_STAGING}{owner_tag()}.")


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
