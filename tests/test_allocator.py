"""glibc's malloc settings for CPU decoding (allocator.py): made once, the environment's own left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers_translate import make_checkpoint
from nmt_cli.inference import allocator

GLIBC = sys.platform.startswith("linux") and allocator._glibc() is not None


def _applied_in_a_fresh_process(env: dict) -> list[str]:
    code = "from nmt_cli import allocator; print(','.join(allocator.keep_freed_memory()))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, timeout=120)
    return [name for name in out.stdout.strip().split(",") if name]


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_all_settings_are_made_unless_the_environment_gives_one(monkeypatch):
    for _, name, _ in allocator.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert _applied_in_a_fresh_process({}) == [name for _, name, _ in allocator.SETTINGS]
    assert _applied_in_a_fresh_process({"MALLOC_TOP_PAD_": "0"}) == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_",
                                                                     "MALLOC_TRIM_THRESHOLD_"]


def test_cpu_translation_makes_them(tmp_path, toy_tokenizer_bytes, monkeypatch):
    from nmt_cli.inference.translate import Translator

    monkeypatch.setattr(allocator, "_applied", None)  # as in a fresh process (mallopt again: the same values)
    Translator.load(str(make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes)), device="cpu")
    assert allocator._applied is not None  # asked (and made, on glibc)
    assert allocator.keep_freed_memory() == (allocator._applied if GLIBC else [])
