"""A model argument -> an nmt checkpoint: a checkpoint file, a MarianMT (OPUS-MT) folder, or `hf:ORG/NAME[@REV]`
naming either on the hub. `nmt translate -m`, `nmt export`, `nmt push`, `nmt import`, `nmt train --init-from`,
`nmt prepare --tokenizer-from` and `Translator.load` all take their models through `load`.

A MarianMT model is converted (marian.py) once and the result cached as an nmt checkpoint under $NMT_CACHE
(default ~/.cache/nmt)/converted/: a hub model by repository and commit (`ORG--NAME/<commit>-v1.pt`), a local folder
by the sha256 of its files. The second use reads the cached checkpoint.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from nmt_cli.checkpoints import format as ckpt_io
from nmt_cli.errors import CheckpointError
from nmt_cli.hub import pull as hub
from nmt_cli.importers import marian

CONVERTER_VERSION = 1  # part of every cache key: a fixed converter never reuses an older conversion


def cache_root() -> Path:
    return Path(os.environ.get("NMT_CACHE") or Path.home() / ".cache" / "nmt")


def load(model: str | os.PathLike, note: hub.Note | None = None, digest: bool = False,
         ) -> tuple[ckpt_io.Checkpoint, dict]:
    """The checkpoint a model argument names, and where it came from: path or hub commit, `path` (the local file
    read: the checkpoint, or a MarianMT model's converted one, also under `converted`) and, with `digest` (exports
    record it), its sha256: a read of the whole file that translating does not need."""
    if hub.is_hub_ref(model):
        pulled = hub.pull(hub.HubRef.parse(str(model)), note)
        origin = {"hub": pulled.ref.repo, "file": pulled.ref.filename, "commit": pulled.commit}
        path = pulled.path
        key = Path(pulled.ref.repo.replace("/", "--")) / f"{pulled.commit}-v{CONVERTER_VERSION}.pt"
    else:
        path = Path(model)
        origin = {"checkpoint": str(path)}
        key = None
    if path.is_dir() and marian.is_marian(path):
        if hub.is_hub_ref(model):
            origin = {"hub": origin["hub"], "commit": origin["commit"], "format": "marian"}
        else:
            origin = {"marian": str(path), "format": "marian"}
        key = key or Path("local") / f"{_folder_digest(path)}-v{CONVERTER_VERSION}.pt"
        ckpt, cached = converted(path, cache_root() / "converted" / key, note)
        origin.update(converted=str(cached), path=str(cached))
    else:
        if path.is_dir():
            raise CheckpointError(f"{path} is a directory but not a MarianMT model (no config.json with model_type "
                                  f"marian); pass a checkpoint file such as {path}/checkpoint_best.pt")
        ckpt = ckpt_io.load(path)
        origin["path"] = str(path)
    if digest:
        origin["sha256"] = hub.sha256(Path(origin["path"]))
    return ckpt, origin


def converted(folder: Path, cached: Path, note: hub.Note | None = None) -> tuple[ckpt_io.Checkpoint, Path]:
    """The MarianMT model in `folder` as a checkpoint: read from `cached`, or converted and saved there."""
    if cached.is_file():
        try:
            return ckpt_io.load(cached), cached
        except CheckpointError:
            pass  # a damaged cache entry: convert again
    ckpt = marian.convert(folder)
    try:
        ckpt_io.save(ckpt, cached)
    except CheckpointError as exc:  # an unwritable cache costs a conversion next time, nothing else
        if note is not None:
            note(f"the converted model could not be cached ({exc}); set NMT_CACHE to a writable directory")
    if note is not None:
        note(f"converted the MarianMT model {folder} to an nmt checkpoint: {cached}")
    return ckpt, cached


def _folder_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in marian.FILES:
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + hub.sha256(folder / name).encode())
    return digest.hexdigest()[:32]
