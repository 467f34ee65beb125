"""Self-contained, atomic, versioned checkpoints, loaded with torch.load(weights_only=True).

A checkpoint is a dict:
  format "nmt-checkpoint", version, nmt_version, model_config (dict), tokenizer (uint8 tensor holding the
  sentencepiece model), vocab_size, langs {"src", "tgt"}, model (state dict), and optionally `train_state`
  (optimizer, schedule, grad scaler, RNG states, data position, ...) and `meta` (free-form, JSON-like).
Translation needs nothing but this file. Loading never executes code from it.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.config import ModelConfig
from nmt_cli.errors import CheckpointError

FORMAT = "nmt-checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    """What a checkpoint holds, in memory."""

    model_config: ModelConfig
    model_state: dict[str, torch.Tensor]
    tokenizer: bytes
    langs: dict[str, str] = field(default_factory=dict)
    train_state: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def build_model(self, device: str | torch.device = "cpu"):
        """A Transformer with these weights, in eval mode."""
        from nmt_cli.model import Transformer

        model = Transformer(self.model_config)
        try:
            model.load_state_dict(self.model_state)
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint weights do not match its model config: {str(exc).splitlines()[0]}") from exc
        return model.to(device).eval()

    def tokenizer_obj(self):
        from nmt_cli.data.tokenizer import Tokenizer

        return Tokenizer(self.tokenizer)


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
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write_fn) -> None:
    """Call write_fn(fileobj) on a temporary file beside `path`, fsync it, then os.replace it into place.

    A crash, a full disk or Ctrl-C at any moment leaves either the old file or the new one, never half of one.
    The file gets the permissions of any new file (0666 less the umask), not mkstemp's 0600. A write that fails
    (disk full, read-only or unwritable directory) is a CheckpointError of one line.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_error(path, exc) from exc
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise _write_error(path, exc) from exc
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def _write_error(path: Path, exc: OSError) -> CheckpointError:
    what = exc.strerror or str(exc)
    kept = f"{path.name} keeps its previous content" if path.exists() else f"{path.name} was not written"
    return CheckpointError(f"cannot write {path}: {what}; {kept}. Free disk space or make {path.parent} writable, "
                           "then run the same command again")


def remove_stale_tmp(directory: str | os.PathLike) -> tuple[int, int]:
    """Delete the temporary files a killed atomic_write left in `directory` (NAME.XXXX.tmp beside NAME):
    -> (files, bytes) removed. Call it only where no other process writes."""
    files = size = 0
    for p in Path(directory).glob("*.*.tmp"):
        if p.is_file():
            size += p.stat().st_size
            p.unlink(missing_ok=True)
            files += 1
    return files, size


def save(ckpt: Checkpoint, path: str | os.PathLike) -> None:
    """Write `ckpt` to `path` atomically."""
    data = to_dict(ckpt)
    atomic_write(path, lambda f: torch.save(data, f))


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint; any problem becomes a one-line CheckpointError naming the file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file; check the path (nmt train writes RUN_DIR/checkpoint_last.pt)")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory; pass a checkpoint file such as {path}/checkpoint_best.pt")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty (an interrupted copy?); use another checkpoint")
    try:
        data = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused to load: the file contains objects other than tensors and plain data "
            f"(loading it could run code); only nmt checkpoints are accepted ({str(exc).splitlines()[0][:120]})"
        ) from exc
    except Exception as exc:  # RuntimeError, EOFError, BadZipFile, IndexError...: torch raises many kinds
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or corrupt: {str(exc).splitlines()[0][:120]}); "
            "use an earlier checkpoint or re-copy the file"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an nmt checkpoint (no '{FORMAT}' marker); pass a file written by nmt train or nmt average")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version} is newer than this nmt supports ({VERSION}); upgrade nmt"
        )
    try:
        config = ModelConfig.from_dict(data["model_config"])
        return Checkpoint(
            model_config=config,
            model_state=data["model"],
            tokenizer=data["tokenizer"].numpy().tobytes(),
            langs=dict(data.get("langs", {})),
            train_state=data.get("train_state"),
            meta=dict(data.get("meta", {})),
        )
    except (KeyError, AttributeError, TypeError) as exc:
        raise CheckpointError(f"{path}: checkpoint is missing or has a malformed field ({exc}); it may be damaged") from exc
