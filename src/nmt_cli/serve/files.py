"""`POST /translate_file` and `GET /download_file/<name>`: a file's texts out, their translations back in, and the
translated files kept for a while in a folder of the server's own.

Formats (by the file name's extension): `.txt` (UTF-8; each line with a letter or digit is translated, its
white space and line ends kept), `.html`/`.htm` (UTF-8; as `format: html`, nmt_cli/serve/html.py) and `.docx`
(python-docx: every paragraph of the body, its tables, headers and footers; a paragraph's translation goes into its
first run, which keeps that run's formatting, and the paragraph's other runs are emptied).

The client's file name is never a path: a translated file is stored as `<random id>` in the store's folder, and
its download name `<random id>.<the client's name, reduced to letters, digits, '.', '-', '_'>` is only a key of
the store. Files are removed `ttl` seconds after they were made, and the folder when the server stops (the folder
of a server that was killed, by the next server that starts).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.serve import html

FORMATS = (".txt", ".html", ".htm", ".docx")
MEDIA_TYPES = {".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8",
               ".htm": "text/html; charset=utf-8",
               ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
MAX_UNZIPPED = 64 << 20  # bytes a .docx may unpack to (a zip bomb is refused before it is read)
_LINE_BREAK = re.compile(r"(\r\n|\n|\r)")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class FileError(Exception):
    """A file that cannot be read as its format says (a 400 in one line)."""


@dataclass
class Texts:
    """A file's texts to translate, and how to write the file back with their translations."""

    texts: list[str]
    build: Callable[[list[str]], bytes]


def extension(name: str) -> str:
    """The extension of a client's file name, lower case ('' when none)."""
    base = re.split(r"[/\\]", name)[-1]
    return base[base.rfind("."):].lower() if "." in base.strip(".") else ""


def read(ext: str, data: bytes) -> Texts:
    if ext == ".docx":
        return _docx(data)
    try:
        text = data.decode("utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8")
    except UnicodeDecodeError as exc:
        raise FileError(f"the file is not UTF-8 text (byte {exc.start})") from None
    bom = "\ufeff" if data.startswith(b"\xef\xbb\xbf") else ""
    if "\x00" in text:
        raise FileError("the file holds NUL characters: not a text file")
    if ext in (".html", ".htm"):
        doc = html.parse(text)
        return Texts(doc.texts, lambda out: (bom + doc.render(out)).encode("utf-8"))
    return _txt(text, bom)


def _txt(text: str, bom: str) -> Texts:
    pieces = _LINE_BREAK.split(text)
    slots = [k for k in range(0, len(pieces), 2) if any(c.isalnum() for c in pieces[k])]
    texts = [pieces[k].strip() for k in slots]

    def build(out: list[str]) -> bytes:
        new = list(pieces)
        for k, translation in zip(slots, out, strict=True):
            line = pieces[k]
            new[k] = line[:len(line) - len(line.lstrip())] + translation + line[len(line.rstrip()):]
        return (bom + "".join(new)).encode("utf-8")

    return Texts(texts, build)


def _docx(data: bytes) -> Texts:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if sum(i.file_size for i in z.infolist()) > MAX_UNZIPPED:
                raise FileError(f"the .docx unpacks to more than {MAX_UNZIPPED >> 20} MiB")
        import docx

        document = docx.Document(io.BytesIO(data))
    except FileError:
        raise
    except Exception as exc:  # zipfile's, python-docx's and lxml's errors: the file is not a Word document
        raise FileError(f"not a .docx file ({type(exc).__name__})") from None
    paragraphs = [p for p in _paragraphs(document) if any(c.isalnum() for c in "".join(r.text for r in p.runs))]
    texts = ["".join(r.text for r in p.runs).strip() for p in paragraphs]

    def build(out: list[str]) -> bytes:
        for p, translation in zip(paragraphs, out, strict=True):
            runs = [r for r in p.runs if r.text]
            runs[0].text = translation
            for r in runs[1:]:
                r.text = ""
        buffer = io.BytesIO()
        document.save(buffer)
        return buffer.getvalue()

    return Texts(texts, build)


def _paragraphs(document):
    """Every paragraph of a document: the body's, those in its tables (nested too), its headers' and footers'."""

    def of(container):
        yield from container.paragraphs
        for table in container.tables:
            for row in table.rows:
                for cell in row.cells:
                    yield from of(cell)

    seen = set()
    parts = [document] + [hf for s in document.sections for hf in (s.header, s.footer)
                          if not hf.is_linked_to_previous]
    for part in parts:
        for p in of(part):
            if id(p._p) not in seen:  # a merged table cell is listed once per grid cell
                seen.add(id(p._p))
                yield p


_PREFIX = "nmt-serve-files-"


def remove_orphans() -> None:
    """Remove the folders of servers that were killed (SIGKILL, a crash) before they could remove their own: each
    folder's name holds its server's process id, and a folder whose process is gone holds users' files no one
    will download."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid = folder.name[len(_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class FileStore:
    """Translated files in a private folder, by download name, each removed `ttl` seconds after it was made."""

    def __init__(self, ttl: float):
        self.ttl = ttl
        remove_orphans()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self._files: dict[str, tuple[Path, float, str]] = {}  # name -> (path, expiry, download file name)
        self._lock = threading.Lock()

    def add(self, data: bytes, client_name: str, target: str) -> str:
        """Store a translated file -> its name for /download_file."""
        self.sweep()
        ext = extension(client_name)
        base = re.split(r"[/\\]", client_name)[-1]
        stem = _UNSAFE.sub("_", base[:len(base) - len(ext)]).strip("._")[:80] or "file"
        key = uuid.uuid4().hex
        path = self.dir / key
        try:
            path.write_bytes(data)
        except OSError:  # a full disk: no partial file stays behind (none was ever listed)
            path.unlink(missing_ok=True)
            raise
        name = f"{key}.{stem}.{target}{ext}"
        with self._lock:
            self._files[name] = (path, time.monotonic() + self.ttl, name[len(key) + 1:])
        return name

    def get(self, name: str) -> tuple[Path, str] | None:
        """(path, download file name) of a stored file, None when there is none by that name (or it expired)."""
        self.sweep()
        with self._lock:
            found = self._files.get(name)
        return (found[0], found[2]) if found else None

    def sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [name for name, (_, expiry, _) in self._files.items() if expiry <= now]
            paths = [self._files.pop(name)[0] for name in expired]
        for path in paths:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._files.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
