"""`POST /suggest` with `--suggestions FILE`: each correction a user sends is appended to FILE as one JSON line,
the post-edits to fine-tune on later (`nmt train --init-from`; docs/serve.md says how).

A line holds LibreTranslate's fields, as its own export of suggestions (`scripts/suggestions-to-jsonl.py`) writes
them: `q` (the text), `s` (the correction), `source`, `target` (language codes), and nmt's `translation` (the
machine translation the user corrected, when the client sends it; nmt's page does) and `time` (UTC, ISO 8601).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from nmt_cli.errors import DataError


class Suggestions:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise DataError(f"cannot write the suggestions file {path}: {exc.strerror or exc}") from None

    def add(self, q: str, s: str, source: str, target: str, translation: str | None) -> dict:
        record = {"q": q, "s": s, "source": source, "target": target, "translation": translation,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = memoryview((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        with self._lock, open(self.path, "ab", buffering=0) as f:  # under the lock: lines never interleave
            end = f.seek(0, os.SEEK_END)
            try:
                while data:
                    data = data[f.write(data):]
            except OSError:  # a full disk: the part of the line written is taken back, the file stays JSON lines
                f.truncate(end)
                raise
        return record
