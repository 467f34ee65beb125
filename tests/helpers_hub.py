"""Hub data for tests, in the hub's real layout, read through the real huggingface_hub client.

- `write_repo`: parquet files like the pinned ones (one `translation` struct column) written into a
  huggingface_hub cache exactly as the client lays it out: `datasets--OWNER--NAME/blobs/<sha256>` (an LFS blob is
  named by its sha256) and `snapshots/<revision>/<path>` symlinks to them. With HF_HUB_OFFLINE=1 and HF_HUB_CACHE
  pointing there, the client finds them as if it had downloaded them.
- `LocalHub`: an HTTP server on 127.0.0.1 that answers the hub's routes the client uses (paths-info, HEAD/GET
  resolve, with ranges) from files kept in memory, or fails with a chosen HTTP status. It also answers requests
  sent to it as an HTTP proxy (absolute URLs), so a test can point HTTP_PROXY at it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from nmt_cli.data.corpora import CorpusSpec
from nmt_cli.data.sample_corpus import generate


def parquet_bytes(rows: list[tuple[str, str]], langs: tuple[str, str]) -> bytes:
    """A parquet file with one column `translation` = struct{langs[0], langs[1]} (as the hub's files)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    struct = pa.struct([(langs[0], pa.string()), (langs[1], pa.string())])
    table = pa.table({"translation": pa.array([{langs[0]: a, langs[1]: b} for a, b in rows], type=struct)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=64)
    return buf.getvalue()


def corpus_files(spec: CorpusSpec, sizes: dict[str, int], seed: int = 3) -> dict[str, bytes]:
    """{path in the repository: parquet bytes} for every pinned file of `spec`: sample-corpus sentences, the
    English side under `en`, the other side under the corpus' other language; train rows spread over the shards."""
    other = spec.tgt if spec.src == "en" else spec.src
    data = generate(sizes, seed=seed)
    files = {}
    for split, names in spec.hub.files.items():
        for i, name in enumerate(names):
            rows = [(de, en) for en, de in data[split][i :: len(names)]]
            files[name] = parquet_bytes(rows, (other, "en"))
    return files


def write_repo(cache: Path, repo: str, revision: str, files: dict[str, bytes]) -> Path:
    """Put `files` into a huggingface_hub cache at `revision`, as the client stores downloads."""
    return write_snapshot(cache / ("datasets--" + repo.replace("/", "--")), revision, files)


def write_snapshot(root: Path, commit: str, files: dict[str, bytes]) -> Path:
    """The client's layout under a cached repository `root`: each file a blob named by its sha256, linked from
    snapshots/COMMIT/NAME."""
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        blob = root / "blobs" / hashlib.sha256(body).hexdigest()
        blob.write_bytes(body)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(blob, link.parent), link)
    return root


class HubServer:
    """A local HTTP server in a thread that hands every request to `self._handle(request, method)`; a `with`
    block runs it at `self.url` (the hub fakes of the tests derive from it)."""

    pause_until: Path | None = None  # a download stops halfway until this file exists (a slow network; 60 s at most)

    def __init__(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                hub._handle(self, "POST")

            def do_HEAD(self):
                hub._handle(self, "HEAD")

            def do_GET(self):
                hub._handle(self, "GET")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        raise NotImplementedError

    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict, method: str,
               pause: bool = False) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if method != "HEAD":
            pause = pause and self.pause_until is not None  # (a file's bytes only; listings answer at once)
            half = len(body) // 2 if pause else len(body)
            h.wfile.write(body[:half])
            h.wfile.flush()
            deadline = time.monotonic() + 60
            while pause and not self.pause_until.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            h.wfile.write(body[half:])


class LocalHub(HubServer):
    """A local stand-in for huggingface.co's HTTP routes, serving `files` {(repo, revision, path): bytes}."""

    def __init__(self, files: dict[tuple[str, str, str], bytes]):
        self.files = files
        self.fail: tuple[int, dict[str, str]] | None = None  # (status, headers) for every request
        self.listed_size: int | None = None  # a size paths-info reports instead of the real one
        self.requests: list[str] = []
        HubServer.__init__(self)

    def downloads(self) -> list[str]:
        return [r.split(" ", 1)[1] for r in self.requests if r.startswith("GET ") and "/resolve/" in r]

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(urlsplit(h.path).path)  # a proxied request carries an absolute URL
        self.requests.append(f"{method} {path}")
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if method == "POST" else b""
        if self.fail:
            status, headers = self.fail
            return self._reply(h, status, b'{"error": "refused by the test"}', headers, method)
        parts = path.strip("/").split("/")
        if method == "POST" and parts[:2] == ["api", "datasets"] and parts[4] == "paths-info":
            repo, rev = "/".join(parts[2:4]), parts[5]
            form = parse_qs(body.decode())
            wanted = form.get("paths") or json.loads(body or b"{}").get("paths", [])
            out = []
            for name in wanted:
                data = self.files.get((repo, rev, name))
                if data is not None:
                    sha = hashlib.sha256(data).hexdigest()
                    size = self.listed_size or len(data)
                    out.append({"type": "file", "path": name, "size": size, "oid": sha[:40],
                                "lfs": {"oid": sha, "size": size, "pointerSize": 134}})
            return self._reply(h, 200, json.dumps(out).encode(), {"Content-Type": "application/json"}, method)
        if parts[0] == "datasets" and parts[3] == "resolve":
            repo, rev, name = "/".join(parts[1:3]), parts[4], "/".join(parts[5:])
            data = self.files.get((repo, rev, name))
            if data is None:
                return self._reply(h, 404, b"not found", {"X-Error-Code": "EntryNotFound"}, method)
            sha = hashlib.sha256(data).hexdigest()
            headers = {"X-Repo-Commit": rev, "ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                       "X-Linked-Size": str(len(data)), "Accept-Ranges": "bytes"}
            start = 0
            rng = h.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0] or 0)
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._reply(h, 206 if start else 200, data[start:], headers, method, pause=True)
        return self._reply(h, 404, b"no such route", {}, method)
