"""Shared fixtures: a tiny prepared data directory and a tiny checkpoint, built in seconds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from nmt_cli.data.store import MANIFEST, SPM_MODEL, BinaryWriter
from nmt_cli.data.tokenizer import Tokenizer, train_bpe

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

_WORDS_EN = "the a cat dog house man woman child sees likes has big small red green old new runs sleeps eats".split()
_DE = {"the": "die", "a": "eine", "cat": "Katze", "dog": "Hund", "house": "Haus", "man": "Mann", "woman": "Frau",
       "child": "Kind", "sees": "sieht", "likes": "mag", "has": "hat", "big": "große", "small": "kleine",
       "red": "rote", "green": "grüne", "old": "alte", "new": "neue", "runs": "läuft", "sleeps": "schläft",
       "eats": "isst"}


def toy_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Deterministic word-by-word toy pairs (not grammatical German; enough for mechanics tests)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(_WORDS_EN) for _ in range(rng.randint(2, 9))]
        pairs.append((" ".join(words), " ".join(_DE[w] for w in words)))
    return pairs


@pytest.fixture(scope="session")
def toy_tokenizer_bytes() -> bytes:
    pairs = toy_pairs(400, seed=1)
    return train_bpe([s for p in pairs for s in p], vocab_size=64)


def write_toy_data_dir(path: Path, model_bytes: bytes, n_train: int = 300, n_valid: int = 40) -> Path:
    """A prepared data directory in nmt prepare's format, made directly with the store API."""
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(model_bytes)
    (path / SPM_MODEL).write_bytes(model_bytes)
    (path / "raw").mkdir(exist_ok=True)
    splits = {}
    for split, n, seed in (("train", n_train, 2), ("valid", n_valid, 3), ("test", n_valid, 4)):
        pairs = toy_pairs(n, seed)
        for side, lang in ((0, "en"), (1, "de")):
            lines = [p[side] for p in pairs]
            (path / "raw" / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
            with BinaryWriter(path / f"{split}.{lang}", tok.vocab_size) as w:
                w.add_many(tok.encode(lines))
        splits[split] = {"read": n, "kept": n, "dropped": {}}
    manifest = {"format_version": 1, "corpus": "toy", "src_lang": "en", "tgt_lang": "de",
                "vocab_size": tok.vocab_size, "splits": splits}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return path


@pytest.fixture()
def toy_data_dir(tmp_path, toy_tokenizer_bytes) -> Path:
    return write_toy_data_dir(tmp_path / "data", toy_tokenizer_bytes)


@pytest.fixture
def one_thread():
    """In-process translation with one torch thread (`pytestmark = pytest.mark.usefixtures("one_thread")`): the
    models are tiny, and two threads on a busy 2-core machine spin against each other (several times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory):
    """The bundled sample corpus, prepared: 3000 training pairs of real sentences, a 400-token vocabulary."""
    prepare = pytest.importorskip("nmt_cli.data.prepare")
    out = tmp_path_factory.mktemp("sample") / "data"
    prepare.prepare(prepare.PrepareOptions("sample", str(out), vocab_size=400,
                                           sample_sizes={"train": 3000, "valid": 100, "test": 100}))
    return out
