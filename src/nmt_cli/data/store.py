"""Binarized parallel data: token ids in flat arrays with offset indexes, memory-mapped, plus a JSON manifest.

Layout of a prepared data directory (written by `nmt prepare`):
  manifest.json            corpus, languages, counts, vocabulary, checksums, versions, options
  spm.model                the joint sentencepiece model (bytes also stored in every checkpoint)
  {split}.{lang}.bin       all token ids of a split/side back to back (uint16 when the vocabulary fits, else int32)
  {split}.{lang}.idx       int64 offsets, n + 1 of them: sentence i is bin[idx[i]:idx[i + 1]]
A multilingual directory (data/multilingual.py) has {split}.src and {split}.tgt instead (manifest "sides"): every
direction's pairs one after the other, each source starting with its target's `>>xx<<` tag, and the manifest's
"directions" say where each direction's rows start.
Ids on disk carry no BOS/EOS; `collate` adds them.
Files are written to a temporary name and renamed when complete, so a later run never trusts a half-written file.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where tensors are made: `nmt prepare` never needs it (1.3 s saved)
    import torch

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.errors import DataError

MANIFEST = "manifest.json"
SPM_MODEL = "spm.model"  # the joint sentencepiece model (or an imported tokenizer's source one)
SPM_TARGET = "spm.target.model"  # an imported tokenizer's target sentencepiece model (nmt prepare --tokenizer-from)
VOCAB_JSON = "vocab.json"  # an imported tokenizer's pieces, one per model id


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


class BinaryWriter:
    """Streams sentences (lists of ids) into `{prefix}.bin/.idx`; `close()` renames the finished files into place.

    Both files are streamed to disk (memory stays constant whatever the number of sentences)."""

    def __init__(self, prefix: str | os.PathLike, vocab_size: int):
        self.prefix = Path(prefix)
        self.dtype = dtype_for(vocab_size)
        self._bin_tmp = self.prefix.with_name(self.prefix.name + ".bin.tmp")
        self._idx_tmp = self.prefix.with_name(self.prefix.name + ".idx.tmp")
        self._bin = open(self._bin_tmp, "wb")
        self._idx = open(self._idx_tmp, "wb")
        self._idx.write(np.zeros(1, dtype=np.int64).tobytes())
        self.n_tokens = 0
        self.n_sentences = 0

    def add_many(self, sentences: list[list[int]]) -> None:
        if not sentences:
            return
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        flat = np.fromiter(itertools.chain.from_iterable(sentences), dtype=self.dtype, count=int(lengths.sum()))
        self._bin.write(flat.tobytes())
        ends = self.n_tokens + np.cumsum(lengths)
        self._idx.write(ends.tobytes())
        self.n_tokens = int(ends[-1])
        self.n_sentences += len(sentences)

    def close(self) -> None:
        for f in (self._bin, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        os.replace(self._bin_tmp, self.prefix.with_name(self.prefix.name + ".bin"))
        os.replace(self._idx_tmp, self.prefix.with_name(self.prefix.name + ".idx"))

    def abort(self) -> None:
        for f, p in ((self._bin, self._bin_tmp), (self._idx, self._idx_tmp)):
            f.close()
            p.unlink(missing_ok=True)

    def __enter__(self) -> BinaryWriter:
        return self

    def __exit__(self, exc_type, *_):
        self.abort() if exc_type else self.close()


class IndexedArray:
    """Read-only view of `{prefix}.bin/.idx`: `arr[i]` -> np.ndarray of ids, `arr.lengths` -> [n] int64."""

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype):
        prefix = Path(prefix)
        bin_path, idx_path = prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")
        for p in (bin_path, idx_path):
            if not p.exists():
                raise DataError(f"{p} is missing; re-run nmt prepare for this data directory")
        # mapped, not read: a process that only reads sentences (a training rank) never reads the whole index
        size = idx_path.stat().st_size
        if size % 8:
            raise DataError(f"{idx_path} is truncated (its size is not a whole number of offsets); re-run nmt prepare "
                            "with --force")
        self.offsets = (np.memmap(idx_path, dtype=np.int64, mode="r") if size >= 8 else np.zeros(0, dtype=np.int64))
        n_tokens = int(self.offsets[-1]) if len(self.offsets) else 0
        if bin_path.stat().st_size != n_tokens * dtype.itemsize:
            raise DataError(f"{bin_path} does not match its index (truncated?); re-run nmt prepare with --force")
        self.data = np.memmap(bin_path, dtype=dtype, mode="r") if n_tokens else np.zeros(0, dtype=dtype)

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        return np.diff(np.asarray(self.offsets))

    def __len__(self) -> int:
        return max(0, len(self.offsets) - 1)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i] : self.offsets[i + 1]]


def load_manifest(data_dir: str | os.PathLike) -> dict:
    """The manifest of a prepared data directory, or a DataError saying how to make one."""
    path = Path(data_dir) / MANIFEST
    if not Path(data_dir).exists():
        raise DataError(_missing_dir_message(Path(data_dir)))
    if not Path(data_dir).is_dir():
        raise DataError(f"{data_dir} is a file, not a data directory; give the directory nmt prepare wrote (-o DIR)")
    if not path.exists():
        raise DataError(f"{data_dir} was not written by nmt prepare (no {MANIFEST}); run nmt prepare first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not valid JSON ({exc}); re-run nmt prepare with --force") from exc


def _missing_dir_message(data_dir: Path) -> str:
    """A data directory that does not exist: most often a typo, so name the similar directories beside it."""
    import difflib

    parent = data_dir.parent
    siblings = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    close = difflib.get_close_matches(data_dir.name, siblings, n=3, cutoff=0.6)
    if close:
        names = " or ".join(str(parent / name) for name in close)
        return f"{data_dir} does not exist; did you mean {names}?"
    prepared = [str(parent / name) for name in siblings if (parent / name / MANIFEST).exists()][:3]
    if prepared:
        return f"{data_dir} does not exist; prepared data beside it: {', '.join(prepared)}"
    return f"{data_dir} does not exist; nmt prepare writes a data directory (e.g. nmt prepare sample -o {data_dir})"


class ParallelData:
    """One split of a prepared data directory: `data[i]` -> (src ids, tgt ids) as np arrays, without BOS/EOS."""

    def __init__(self, data_dir: str | os.PathLike, split: str, manifest: dict | None = None):
        self.manifest = manifest or load_manifest(data_dir)
        src, tgt = self.manifest["src_lang"], self.manifest["tgt_lang"]
        if split not in self.manifest.get("splits", {}):
            raise DataError(f"{data_dir} has no '{split}' split; it has {sorted(self.manifest.get('splits', {}))}")
        dtype = dtype_for(int(self.manifest["vocab_size"]))
        src, tgt = self.manifest.get("sides", (src, tgt))  # a multilingual directory's files: {split}.src/.tgt
        self.src = IndexedArray(Path(data_dir) / f"{split}.{src}", dtype)
        self.tgt = IndexedArray(Path(data_dir) / f"{split}.{tgt}", dtype)
        if len(self.src) != len(self.tgt):
            raise DataError(f"{data_dir}: {split} has {len(self.src)} source but {len(self.tgt)} target sentences; "
                            "re-run nmt prepare with --force")

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    def directions(self, split: str) -> dict[str, Rows]:
        """A multilingual directory's split, per direction ("en-de": its rows); {} for one direction."""
        out = {}
        for d in self.manifest.get("directions", []):
            if split in d["splits"]:
                start = int(d["splits"][split]["start"])
                out[f"{d['src']}-{d['tgt']}"] = Rows(self, start, start + int(d["splits"][split]["kept"]))
        return out

    @property
    def src_lengths(self) -> np.ndarray:
        """Lengths as the model sees them: ids + EOS."""
        return self.src.lengths + 1

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Lengths as the model sees them: BOS + ids (input) or ids + EOS (output)."""
        return self.tgt.lengths + 1


class _Range:
    """Rows [start, stop) of an IndexedArray, numbered from 0."""

    def __init__(self, arr: IndexedArray, start: int, stop: int):
        self.arr, self.start, self.stop = arr, start, stop

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        return self.arr.lengths[self.start : self.stop]

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> np.ndarray:
        return self.arr[self.start + i]


class Rows(ParallelData):
    """Rows [start, stop) of a split (one direction of a multilingual split), read as a ParallelData of its own."""

    def __init__(self, data: ParallelData, start: int, stop: int):  # no file is opened again
        self.manifest = data.manifest
        self.src, self.tgt = _Range(data.src, start, stop), _Range(data.tgt, start, stop)


@dataclass
class Batch:
    """A padded batch. src [B, S] (ids + EOS), src_pad_mask [B, S] True at padding, tgt_in [B, T] (BOS + ids),
    tgt_out [B, T] (ids + EOS, PAD where padded), n_tgt_tokens and n_src_tokens: the sentences' tokens (the empty
    rows that `collate(shape=...)` adds count none)."""

    src: torch.Tensor
    src_pad_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_tgt_tokens: int
    n_src_tokens: int

    def pin_memory(self) -> Batch:
        """The same batch in page-locked memory (copies to a GPU can then be asynchronous)."""
        return Batch(self.src.pin_memory(), self.src_pad_mask.pin_memory(), self.tgt_in.pin_memory(),
                     self.tgt_out.pin_memory(), self.n_tgt_tokens, self.n_src_tokens)

    def to(self, device, non_blocking: bool = False) -> Batch:
        return Batch(self.src.to(device, non_blocking=non_blocking),
                     self.src_pad_mask.to(device, non_blocking=non_blocking),
                     self.tgt_in.to(device, non_blocking=non_blocking),
                     self.tgt_out.to(device, non_blocking=non_blocking), self.n_tgt_tokens, self.n_src_tokens)


def collate(pairs: list[tuple[np.ndarray, np.ndarray]], pad_id: int = PAD_ID,
            shape: tuple[int, int] | None = None) -> Batch:
    """Pad a list of (src ids, tgt ids) into a Batch (adds EOS to sources, BOS/EOS to targets).

    `shape` (rows, length): pad source and target to `length` positions and add rows up to `rows` (compiled
    training, batching.bucket_shape). An added row is an empty sentence, source [EOS] and target input [BOS], whose
    target output is all padding: it adds nothing to the loss, its gradient or the token counts, and no attention
    row of it is fully masked (which would give NaN). No pairs: one such row (a micro-batch that keeps a process in
    step with the others, batching.deal)."""
    import torch

    n = len(pairs)
    s_len = max((len(s) for s, _ in pairs), default=0) + 1
    t_len = max((len(t) for _, t in pairs), default=0) + 1
    rows = max(n, 1)
    if shape is not None:
        rows, length = shape
        if rows < n or length < max(s_len, t_len):
            raise ValueError(f"{n} sentences of up to {max(s_len, t_len)} tokens do not fit shape {shape}")
        s_len = t_len = length
    src = np.full((rows, s_len), pad_id, dtype=np.int64)
    tgt_in = np.full((rows, t_len), pad_id, dtype=np.int64)
    tgt_out = np.full((rows, t_len), pad_id, dtype=np.int64)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s)] = s
        src[i, len(s)] = EOS_ID
        tgt_in[i, 0] = BOS_ID
        tgt_in[i, 1 : len(t) + 1] = t
        tgt_out[i, : len(t)] = t
        tgt_out[i, len(t)] = EOS_ID
    src[n:, 0], tgt_in[n:, 0] = EOS_ID, BOS_ID  # the added rows' empty sentences
    src_t = torch.from_numpy(src)
    pad_mask = src_t.eq(pad_id)
    return Batch(src_t, pad_mask, torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 sum(len(t) + 1 for _, t in pairs), sum(len(s) + 1 for s, _ in pairs))


def read_tokenizer(data_dir: str | os.PathLike):
    """The tokenizer a data directory was encoded with: spm.model, and for an imported one (nmt prepare
    --tokenizer-from) spm.target.model and vocab.json beside it."""
    import json

    from nmt_cli.data.tokenizer import Tokenizer, is_sentencepiece_model

    data_dir = Path(data_dir)
    if not (data_dir / SPM_MODEL).is_file():
        raise DataError(f"{data_dir}/{SPM_MODEL} is missing; re-run nmt prepare for this data directory")
    target = data_dir / SPM_TARGET
    vocab = data_dir / VOCAB_JSON
    models = {p: p.read_bytes() for p in (data_dir / SPM_MODEL, target) if p.is_file()}
    for path, model in models.items():
        if not is_sentencepiece_model(model):
            raise DataError(f"{path} is not a valid sentencepiece model (damaged?); re-run nmt prepare with --force "
                            "for this data directory")
    try:
        words = json.loads(vocab.read_text(encoding="utf-8")) if vocab.is_file() else None
    except ValueError as exc:  # not JSON, not UTF-8
        raise DataError(f"{vocab} is damaged ({exc}); re-run nmt prepare with --force for this data directory") from None
    return Tokenizer(models[data_dir / SPM_MODEL], models.get(target), words)


def check_vocab_size(data_dir: str | os.PathLike, manifest: dict, tokenizer) -> None:
    """The manifest's vocab_size is the tokenizer's (an edited manifest would index past the embedding)."""
    if int(manifest["vocab_size"]) != tokenizer.vocab_size:
        raise DataError(f"{Path(data_dir) / MANIFEST} says vocab_size {manifest['vocab_size']} but {SPM_MODEL} has "
                        f"{tokenizer.vocab_size} pieces (an edited or mixed-up directory); re-run nmt prepare with --force")
