"""Hub model repositories for tests, used through the real huggingface_hub client.

- `write_model_repo`: files put into a huggingface_hub cache exactly as the client lays out a download:
  `models--ORG--NAME/blobs/<sha256>`, `snapshots/<commit>/<path>` symlinks to the blobs and `refs/<branch or tag>`
  holding the commit. With HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointing there, the client finds them as if it had
  downloaded them.
- `FakeHub`: an HTTP server on 127.0.0.1 answering the routes the client uses to create a repository, upload a
  commit (every file declared "regular", so they travel inline in the commit request) and download files
  (HEAD/GET resolve). Point HF_ENDPOINT at `hub.url` (in a subprocess: the client reads it at import).
"""

from __future__ import annotations

import base64
import hashlib
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from helpers_hub import HubServer, write_snapshot


def write_model_repo(cache: Path, repo: str, commit: str, files: dict[str, bytes],
                     refs: tuple[str, ...] = ("main",)) -> Path:
    """Put `files` into the hub cache `cache` at `commit`; each name in `refs` (branches, tags) points to it."""
    root = write_snapshot(cache / ("models--" + repo.replace("/", "--")), commit, files)
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return root


class FakeHub(HubServer):
    """A local stand-in for the hub's HTTP API: repositories {repo: {"private", "commits": [(oid, files)]}}."""

    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.requests: list[str] = []
        self.auth: list[str | None] = []
        self.fail: int | None = None  # an HTTP status to answer every request with (e.g. 401)
        HubServer.__init__(self)

    def files(self, repo: str) -> dict[str, bytes]:
        """The repository's files at its last commit."""
        out: dict[str, bytes] = {}
        for _, files in self.repos[repo]["commits"]:
            out.update(files)
        return out

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append(f"{method} {path}")
        self.auth.append(h.headers.get("Authorization"))
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if method == "POST" else b""
        parts = path.strip("/").split("/")
        if self.fail:
            return self._reply(h, self.fail, b'{"error": "refused by the test"}', {"Content-Type": "application/json"},
                               method)
        if method == "POST" and path == "/api/repos/create":
            data = json.loads(body)
            repo = f"{data['organization']}/{data['name']}"
            private = data.get("visibility") == "private" or data.get("private") is True  # hub >= 1.x, < 1.x
            self.repos.setdefault(repo, {"private": private, "commits": []})
            return self._json(h, {"url": f"{self.url}/{repo}", "name": repo}, method)
        if method == "POST" and path == "/api/validate-yaml":  # the client checks README.md's metadata first
            content = json.loads(body)["content"]
            ok = content.startswith("---\n") and "\n---\n" in content
            return self._reply(h, 200 if ok else 400, json.dumps(
                {"errors": [] if ok else [{"message": "no YAML front matter"}], "warnings": []}).encode(),
                {"Content-Type": "application/json"}, method)
        if method == "POST" and parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "preupload":
            files = json.loads(body).get("files", [])
            return self._json(h, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                            for f in files]}, method)
        if method == "POST" and parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "commit":
            repo = "/".join(parts[2:4])
            files = {}
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            oid = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
                               + str(len(self.repos[repo]["commits"])).encode()).hexdigest()
            self.repos[repo]["commits"].append((oid, files))
            return self._json(h, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid,
                                  "pullRequestUrl": None, "success": True}, method)
        if len(parts) >= 5 and parts[2] == "resolve":  # /ORG/NAME/resolve/REVISION/FILE
            repo, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            commits = self.repos.get(repo, {}).get("commits", [])
            match = [(oid, files) for oid, files in commits if revision in ("main", oid)]
            if not match:
                return self._reply(h, 404, b"", {"X-Error-Code": "RepoNotFound" if not commits else "RevisionNotFound"},
                                   method)
            oid, _ = match[-1]
            data = self.files(repo).get(name)
            if data is None:
                return self._reply(h, 404, b"", {"X-Error-Code": "EntryNotFound"}, method)
            sha = hashlib.sha256(data).hexdigest()
            return self._reply(h, 200, data, {"X-Repo-Commit": oid, "ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                                              "X-Linked-Size": str(len(data))}, method)
        if method == "HEAD" and path in ("", "/"):
            return self._reply(h, 200, b"", {}, method)
        return self._reply(h, 404, b"no such route", {}, method)

    def _json(self, h, data: dict, method: str) -> None:
        self._reply(h, 200, json.dumps(data).encode(), {"Content-Type": "application/json"}, method)
