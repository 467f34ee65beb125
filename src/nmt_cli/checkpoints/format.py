"""Self-contained, atomic, versioned checkpoints, loaded with torch.load(weights_only=True).

A checkpoint is a dict:
  format "nmt-checkpoint", version, nmt_version, model_config (dict), tokenizer (uint8 tensor holding the
  sentencepiece model: the joint one, or an imported model's source one), vocab_size, langs {"src", "tgt"}, model
  (state dict), and optionally `train_state` (optimizer, schedule, grad scaler, RNG states, data position, ...),
  `meta` (free-form, JSON-like) and, for imported tokenizers (data/tokenizer.py), `target_tokenizer` (uint8
  tensor: the target sentencepiece model) and `vocab` (list of pieces, one per model id).
Translation needs nothing but this file. Loading never executes code from it.

Versions: 1 (nmt 0.1.0), 2 adds the model config's `activation` and `output_bias` and the optional
`target_tokenizer` and `vocab`. A version 1 file loads as a version 2 one with the defaults (ReLU, no output bias,
a joint tokenizer); a version 2 file is refused by an nmt that reads version 1 only.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.atomic import atomic_write
from nmt_cli.checkpoints.integrity import check_archive
from nmt_cli.config import ModelConfig
from nmt_cli.data.tokenizer import is_sentencepiece_model
from nmt_cli.errors import CheckpointError

FORMAT = "nmt-checkpoint"
VERSION = 2


@dataclass
class Checkpoint:
    """What a checkpoint holds, in memory."""

    model_config: ModelConfig
    model_state: dict[str, torch.Tensor]
    tokenizer: bytes
    langs: dict[str, str] = field(default_factory=dict)
    train_state: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    target_tokenizer: bytes | None = None  # an imported tokenizer's target sentencepiece model
    vocab: list[str] | None = None  # an imported tokenizer's pieces, one per model id
    shortlist: dict[str, Any] | None = None  # a vocabulary shortlist (data/shortlist.py's Shortlist.to_dict)

    def build_model(self, device: str | torch.device = "cpu", share: bool = False):
        """A Transformer with these weights, in eval mode. `share`: the model's tensors are the checkpoint's own
        where their dtypes match, not a copy of them (translation, which never writes them: one copy of the weights
        in memory, not two, while the Translator packs or quantizes them)."""
        from nmt_cli.model import Transformer

        model = Transformer.without_weights(self.model_config) if share else Transformer(self.model_config)
        state = self.model_state
        if share:
            own = model.state_dict()
            state = {k: v.to(own[k].dtype) if k in own and v.dtype != own[k].dtype else v for k, v in state.items()}
        try:
            model.load_state_dict(state, assign=share)
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint weights do not match its model config: {str(exc).splitlines()[0]}") from exc
        return model.to(device).eval()

    def tokenizer_obj(self):
        from nmt_cli.data.tokenizer import Tokenizer

        return Tokenizer(self.tokenizer, self.target_tokenizer, self.vocab)

    def tokenizer_key(self) -> tuple:
        """What makes two checkpoints' tokenizers the same (without loading sentencepiece)."""
        from nmt_cli.data.tokenizer import tokenizer_key

        return tokenizer_key(self.tokenizer, self.target_tokenizer, self.vocab)


def to_dict(ckpt: Checkpoint) -> dict[str, Any]:
    out = {
        "format": FORMAT,
        "version": VERSION,
        "nmt_version": __version__,
        "model_config": ckpt.model_config.to_dict(),
        "tokenizer": torch.frombuffer(bytearray(ckpt.tokenizer), dtype=torch.uint8),
        "vocab_size": ckpt.model_config.vocab_size,
        "langs": dict(ckpt.langs),
        "model": ckpt.model_state,
        "meta": ckpt.meta,
    }
    if ckpt.train_state is not None:
        out["train_state"] = ckpt.train_state
    if ckpt.target_tokenizer is not None:
        out["target_tokenizer"] = torch.frombuffer(bytearray(ckpt.target_tokenizer), dtype=torch.uint8)
    if ckpt.vocab is not None:
        out["vocab"] = list(ckpt.vocab)
    if ckpt.shortlist is not None:
        out["shortlist"] = dict(ckpt.shortlist)
    return out


def write_error(path: Path, exc: OSError) -> CheckpointError:
    what = exc.strerror or str(exc)
    kept = f"{path.name} keeps its previous content" if path.exists() else f"{path.name} was not written"
    return CheckpointError(f"cannot write {path}: {what}; {kept}. Free disk space or make {path.parent} writable, "
                           "then run the same command again")


def save(ckpt: Checkpoint, path: str | os.PathLike) -> None:
    """Write `ckpt` to `path` atomically."""
    data = to_dict(ckpt)
    atomic_write(path, lambda f: torch.save(data, f), write_error)


# How a file written by torch.save starts: a zip archive (the default since torch 1.6) or, in the legacy format,
# a pickle (protocol 2) of torch's magic number.
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
_NOT_OURS = "pass a checkpoint written by nmt train or nmt average"
_USE_ANOTHER = "use another checkpoint, or copy or download this one again"


def _torch_load(path: Path, map_location, mmap: bool = False, verify: bool = True) -> Any:
    """torch.load(weights_only=True), every failure a CheckpointError of our own words naming the file: not a
    PyTorch file at all, a truncated, corrupt or damaged one (with `verify`, each record's CRC-32 is compared:
    checkpoints/integrity.py), or one holding objects that are not tensors or plain data.
    torch's warnings are silenced (e.g. about a pickle protocol): the error says what matters. `mmap`: the tensors
    are mapped from the file, not read (zip archives only; a legacy file is read whole)."""
    with open(path, "rb") as f:
        head = f.read(len(_LEGACY_MAGIC))
    if head.startswith(b"\x80") and not head.startswith(_LEGACY_MAGIC):
        raise CheckpointError(f"{path}: a plain Python pickle, not a PyTorch checkpoint (torch.save writes a zip "
                              f"archive); {_NOT_OURS}")
    if not head.startswith((_ZIP_MAGIC, _LEGACY_MAGIC)):
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (it is neither the zip archive torch.save writes "
                              f"nor its legacy pickle); {_NOT_OURS}")
    if head.startswith(_ZIP_MAGIC):
        check_archive(path, _USE_ANOTHER, crc=verify)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=map_location, weights_only=True,
                              mmap=mmap and head.startswith(_ZIP_MAGIC))
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL\s+([\w.]+)", str(exc))
        if found:
            raise CheckpointError(
                f"{path}: refused: it holds a {found.group(1)} object, not only tensors and plain data, and loading "
                f"it could run code; {_NOT_OURS}") from exc
        raise CheckpointError(f"{path}: corrupt (its pickled data cannot be read); re-copy the file or use an "
                              "earlier checkpoint") from exc
    except Exception as exc:  # RuntimeError, EOFError, KeyError...: torch raises many kinds on damaged data
        raise CheckpointError(f"{path}: truncated or corrupt ({type(exc).__name__} while reading it); re-copy the "
                              "file or use an earlier checkpoint") from exc


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu", mmap: bool = False) -> Checkpoint:
    """Read a checkpoint; any problem becomes a one-line CheckpointError naming the file, a damaged one too: every
    record's CRC-32 is compared before torch.load reads the file (checkpoints/integrity.py: about one more pass
    over the file in memory, 1.5-2.4x a warm torch.load but a small part of any command; docs/results.md). Every
    full load is one whose weights are translated with or written onward (translate, serve, average, export, push,
    a resumed or initialised run), so each is checked. `mmap=True` maps the tensors instead of reading them (cheap
    when only the configuration is looked at, e.g. not the optimizer state of a training checkpoint) and so
    compares no CRC-32: reading every byte to check it would undo what mapping saves; such a load must not be the
    one whose weights are used."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file; check the path (nmt train writes RUN_DIR/checkpoint_last.pt)")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory; pass a checkpoint file such as {path}/checkpoint_best.pt")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty (an interrupted copy?); use another checkpoint")
    data = _torch_load(path, map_location, mmap, verify=not mmap)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an nmt checkpoint (no '{FORMAT}' marker); pass a file written by nmt train or nmt average")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version} is newer than this nmt supports ({VERSION}); upgrade nmt"
        )
    try:
        config = ModelConfig.from_dict(data["model_config"])
        ckpt = Checkpoint(
            model_config=config,
            model_state=data["model"],
            tokenizer=data["tokenizer"].numpy().tobytes(),
            langs=dict(data.get("langs", {})),
            train_state=data.get("train_state"),
            meta=dict(data.get("meta", {})),
            target_tokenizer=data["target_tokenizer"].numpy().tobytes() if "target_tokenizer" in data else None,
            vocab=list(data["vocab"]) if "vocab" in data else None,
            shortlist=dict(data["shortlist"]) if isinstance(data.get("shortlist"), dict) else None,
        )
    except (KeyError, AttributeError, TypeError) as exc:
        raise CheckpointError(f"{path}: checkpoint is missing or has a malformed field ({exc}); it may be damaged") from exc
    for name, model in (("tokenizer", ckpt.tokenizer), ("target tokenizer", ckpt.target_tokenizer)):
        if model is not None and not is_sentencepiece_model(model):
            raise CheckpointError(f"{path}: its {name} is not a valid sentencepiece model (a damaged file?); use "
                                  "another checkpoint")
    return ckpt
