"""A Hugging Face Hub stand-in on 127.0.0.1 that serves dataset repos from local folders (a test fixture).

It speaks the part of the Hub's file API that `huggingface_hub` 2.x and `datasets` 5.x use to read a dataset
repo (docs/design.md section 6): resolve (HEAD/GET with Range), repo info, tree listing and paths-info; and, for
`upload_folder`, repo creation, preupload, the LFS batch / upload / verify calls and the NDJSON commit. Every
revision of a repo is a snapshot folder with a fixed 40-hex commit sha; LFS objects already stored are not asked
for again. Pull requests: a commit with `create_pr` opens branch `refs/pr/<n>`; the discussions list, details and
merge calls are answered. Requests are logged so tests can check what was fetched or uploaded.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Revision:
    sha: str
    folder: Path


@dataclass
class Repo:
    revisions: dict[str, Revision] = field(default_factory=dict)
    commits: dict[str, Revision] = field(default_factory=dict)  # every commit by sha, as the Hub keeps history

    def resolve(self, rev: str) -> Revision | None:
        if rev in self.revisions:
            return self.revisions[rev]
        return self.commits.get(rev)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _sha1_of_blob(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@functools.lru_cache(maxsize=4096)
def _sha256_cached(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    """sha256 of a file, remembered while its size and mtime stay the same (ETags are asked for per request)."""
    st = path.stat()
    return _sha256_cached(path, st.st_size, st.st_mtime_ns)


class HubServer:
    """Serve `repo_id -> {revision: folder}` at http://127.0.0.1:<port>; use as a context manager."""

    def __init__(self, port: int = 0) -> None:
        """`port` 0 picks a free one; choose one yourself to set `HF_ENDPOINT` before `huggingface_hub` is imported
        (it reads the variable once, at import, and this package imports it)."""
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.storage = Path(tempfile.mkdtemp(prefix="stz-hub-"))
        self.lfs: dict[str, Path] = {}
        self.fail_next_commit = False
        self.discussions: dict[str, list[dict[str, Any]]] = {}  # repo id -> pull requests, number i at index i-1
        self.corrupt_once: set[str] = set()  # "repo/path": the next GET of it has one byte flipped (a bad transfer)
        self.fail_with: dict[str, int] = {}  # "repo/path": every GET of it is answered with this error status
        self.fail_everything: int | None = None  # every request of any kind is answered with this error status
        self.cut_short: set[str] = set()  # "repo/path": every GET of it sends half the bytes it announced, then stalls
        self.stall_seconds = 30.0
        self._snapshots = 0
        self._lock = threading.Lock()
        self.commits = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_dataset(self, repo_id: str, folder: str | os.PathLike[str], revision: str = "main") -> str:
        """Publish `folder` as `revision` of dataset `repo_id`; returns the commit sha."""
        folder = Path(folder)
        listing = "".join(f"{name}:{_sha256(folder / name)}\n" for name in _files(folder))
        sha = hashlib.sha1(f"{repo_id}\n{revision}\n{listing}".encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo())
        repo.revisions[revision] = repo.commits[sha] = Revision(sha, folder)
        return sha

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self.storage, ignore_errors=True)

    def commit(self, repo_id: str, revision: str, operations: list[dict[str, Any]], base_revision: str | None = None
               ) -> str:
        """Apply an upload commit: a new snapshot folder from the revision's files (or `base_revision`'s, for a new
        pull request branch) plus the operations."""
        repo = self.repos.setdefault(repo_id, Repo())
        base = repo.resolve(base_revision or revision)
        self._snapshots += 1
        folder = self.storage / "snapshots" / str(self._snapshots)
        if base is not None:
            shutil.copytree(base.folder, folder)
        folder.mkdir(parents=True, exist_ok=True)
        for op in operations:
            target = folder / op["path"]
            if op["key"] == "file":
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(op["content"]))
            elif op["key"] == "lfsFile":
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.lfs[op["oid"]], target)
            elif op["key"] == "deletedFile":
                target.unlink(missing_ok=True)
            elif op["key"] == "deletedFolder":
                shutil.rmtree(target, ignore_errors=True)
        return self.add_dataset(repo_id, folder, revision)

    def open_pull_request(self, repo_id: str, revision: str, operations: list[dict[str, Any]], title: str) -> int:
        """A commit with `create_pr`: branch `refs/pr/<n>` from `revision` with the operations applied."""
        pulls = self.discussions.setdefault(repo_id, [])
        num = len(pulls) + 1
        base = self.repos[repo_id].resolve(revision)
        self.commit(repo_id, f"refs/pr/{num}", operations, base_revision=revision)
        pulls.append({"num": num, "title": title, "status": "open", "base": base.folder, "events": []})
        return num

    def pull_request_changes(self, repo_id: str, num: int) -> dict[str, bytes | None]:
        """What pull request `num` changed against the snapshot it was opened from: path -> new bytes (None:
        deleted)."""
        head = self.repos[repo_id].resolve(f"refs/pr/{num}").folder
        base = self.discussions[repo_id][num - 1]["base"]
        changes: dict[str, bytes | None] = {}
        for name in sorted(set(_files(head)) | set(_files(base))):
            if not (head / name).is_file():
                changes[name] = None
            elif not (base / name).is_file() or (head / name).read_bytes() != (base / name).read_bytes():
                changes[name] = (head / name).read_bytes()
        return changes

    def merge_pull_request(self, repo_id: str, num: int) -> None:
        """Apply what the pull request changed onto the current main, as the Hub's merge does."""
        operations = [{"key": "deletedFile", "path": name} if data is None else
                      {"key": "file", "path": name, "content": base64.b64encode(data).decode()}
                      for name, data in self.pull_request_changes(repo_id, num).items()]
        self.commit(repo_id, "main", operations)
        self.discussions[repo_id][num - 1]["status"] = "merged"

    def log(self, method: str, path: str, range_header: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, range_header))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                return

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                      head: bool = False) -> None:
                headers = {"Content-Length": str(len(body)), **(headers or {})}
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if not head and body:
                    self.wfile.write(body)

            def _json(self, obj: Any, status: int = 200) -> None:
                self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
                body = json.dumps({"error": message}).encode()
                self._send(status, b"" if head else body,
                           {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"})

            def _repo_rev(self, repo_id: str, rev: str, head: bool = False) -> Revision | None:
                repo = server.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", f"Repository {repo_id} not found", head)
                    return None
                revision = repo.resolve(rev)
                if revision is None:
                    self._error(404, "RevisionNotFound", f"Revision {rev} not found", head)
                return revision

            def _entry(self, revision: Revision, name: str, expand: bool) -> dict[str, Any]:
                path = revision.folder / name
                if path.is_dir():
                    return {"type": "directory", "path": name, "oid": hashlib.sha1(name.encode()).hexdigest()}
                size = path.stat().st_size
                entry: dict[str, Any] = {"type": "file", "path": name, "size": size, "oid": _sha1_of_blob(path)}
                entry["lfs"] = {"oid": _sha256(path), "size": size, "pointerSize": 134}
                if expand:
                    entry["lastCommit"] = {"id": revision.sha, "title": "upload", "date": "2026-01-01T00:00:00Z"}
                return entry

            def _resolve(self, head: bool) -> None:
                match = re.match(r"^/datasets/(.+?/[^/]+)/resolve/([^/]+)/(.+)$", urlsplit(self.path).path)
                if not match:
                    return self._error(404, "EntryNotFound", "not found", head)
                repo_id, rev, name = match.group(1), unquote(match.group(2)), unquote(match.group(3))
                revision = self._repo_rev(repo_id, rev, head)
                if revision is None:
                    return
                path = revision.folder / name
                if not path.is_file():
                    return self._error(404, "EntryNotFound", f"{name} not found at {rev}", head)
                size = path.stat().st_size
                headers = {"X-Repo-Commit": revision.sha, "ETag": f'"{_sha256(path)}"',
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                range_header = self.headers.get("Range")
                server.log(self.command, f"{repo_id}/{name}", range_header)
                start, stop, status = 0, size, 200
                if range_header:
                    spec = re.match(r"bytes=(\d*)-(\d*)$", range_header.strip())
                    if not spec:
                        return self._error(416, "RangeNotSatisfiable", range_header, head)
                    first, last = spec.group(1), spec.group(2)
                    if first == "":
                        start = max(0, size - int(last))
                    else:
                        start, stop = int(first), min(size, int(last) + 1 if last else size)
                    if start >= size and size:
                        return self._error(416, "RangeNotSatisfiable", range_header, head)
                    status = 206
                    headers["Content-Range"] = f"bytes {start}-{max(start, stop - 1)}/{size}"
                headers["Content-Length"] = str(stop - start)
                if head:
                    return self._send(status, b"", headers, head=True)
                if f"{repo_id}/{name}" in server.fail_with:
                    return self._error(server.fail_with[f"{repo_id}/{name}"], "InternalError", "test fault", False)
                with open(path, "rb") as handle:
                    handle.seek(start)
                    body = handle.read(stop - start)
                key = f"{repo_id}/{name}"
                if key in server.corrupt_once and body:
                    server.corrupt_once.discard(key)
                    body = bytes([body[0] ^ 0x01]) + body[1:]
                if key in server.cut_short and len(body) > 1:
                    self.send_response(status)
                    for header, value in headers.items():
                        self.send_header(header, value)
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    time.sleep(server.stall_seconds)  # a server that hangs mid-response
                    self.close_connection = True
                    return
                self._send(status, body, headers)

            def _failing(self, head: bool = False) -> bool:
                if server.fail_everything is None:
                    return False
                self._error(server.fail_everything, "InternalError", "test fault: every request fails", head)
                return True

            def do_HEAD(self) -> None:
                if not self._failing(head=True):
                    self._resolve(head=True)

            def do_GET(self) -> None:
                if self._failing():
                    return
                url = urlsplit(self.path)
                if url.path.startswith("/datasets/"):
                    return self._resolve(head=False)
                server.log("GET", url.path, None)
                query = parse_qs(url.query)
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)(?:/revision/([^/]+))?$", url.path)
                if match:
                    repo_id, rev = match.group(1), unquote(match.group(2) or "main")
                    revision = self._repo_rev(repo_id, rev)
                    if revision:
                        self._json({"id": repo_id, "sha": revision.sha, "private": False, "disabled": False,
                                    "gated": False, "siblings": [{"rfilename": n} for n in _files(revision.folder)]})
                    return
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)/discussions(?:/(\d+))?$", url.path)
                if match:
                    return self._discussions(match.group(1), match.group(2), query)
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", url.path)
                if match:
                    repo_id, rev, sub = match.group(1), unquote(match.group(2)), unquote(match.group(3) or "")
                    revision = self._repo_rev(repo_id, rev)
                    if revision is None:
                        return
                    base = revision.folder / sub
                    if not base.is_dir():
                        return self._error(404, "EntryNotFound", f"{sub} not found", False)
                    recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                    expand = query.get("expand", ["false"])[0].lower() in ("1", "true")
                    children = sorted(base.rglob("*") if recursive else base.iterdir())
                    names = [p.relative_to(revision.folder).as_posix() for p in children]
                    return self._json([self._entry(revision, n, expand) for n in names])
                self._error(404, "EntryNotFound", f"no route for GET {url.path}")

            def _discussion(self, repo_id: str, pull: dict[str, Any]) -> dict[str, Any]:
                return {"num": pull["num"], "title": pull["title"], "status": pull["status"],
                        "author": {"name": "participant"}, "createdAt": "2026-01-01T00:00:00Z",
                        "repo": {"name": repo_id, "type": "dataset"}, "isPullRequest": True,
                        "events": pull["events"], "changes": {"base": "refs/heads/main"}, "filesWithConflicts": [],
                        "diff": "".join(f"diff --git a/{name} b/{name}\n{'deleted' if data is None else 'new'} file "
                                        f"mode 100644\n" for name, data in
                                        server.pull_request_changes(repo_id, pull["num"]).items())}

            def _discussions(self, repo_id: str, num: str | None, query: dict[str, list[str]]) -> None:
                """List a repo's pull requests (filtered by status) or show one."""
                if repo_id not in server.repos:
                    return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
                pulls = server.discussions.get(repo_id, [])
                if num is not None:
                    if not 1 <= int(num) <= len(pulls):
                        return self._error(404, "EntryNotFound", f"discussion {num} not found")
                    return self._json(self._discussion(repo_id, pulls[int(num) - 1]))
                status = query.get("status", ["all"])[0]
                shown = [self._discussion(repo_id, p) for p in pulls if status in ("all", p["status"])]
                start = int(query.get("p", ["0"])[0]) * 50
                self._json({"discussions": shown[start:start + 50], "count": len(shown), "start": start,
                            "numClosedDiscussions": 0})

            def _body(self) -> bytes:
                """The request body, plain or with chunked transfer encoding."""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def do_PUT(self) -> None:
                url = urlsplit(self.path)
                server.log("PUT", url.path, None)
                body = self._body()
                match = re.match(r"^/lfs-upload/([0-9a-f]{64})$", url.path)
                if not match:
                    return self._error(404, "EntryNotFound", f"no route for PUT {url.path}")
                oid = match.group(1)
                if hashlib.sha256(body).hexdigest() != oid:
                    return self._error(400, "BadRequest", "content does not match its sha256")
                path = server.storage / "lfs" / oid
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
                server.lfs[oid] = path
                self._send(200)

            def _upload_routes(self, url: Any, body: bytes) -> bool:
                """Repo creation, preupload, LFS batch and verify, and commit; True when handled."""
                if url.path == "/api/validate-yaml":
                    import yaml

                    content = json.loads(body or b"{}").get("content", "")
                    try:
                        yaml.safe_load(content.split("\n---\n", 1)[0].removeprefix("---\n"))
                        self._json({"errors": [], "warnings": []})
                    except yaml.YAMLError as exc:
                        self._json({"errors": [{"message": str(exc)}], "warnings": []}, status=400)
                    return True
                if url.path == "/api/repos/create":
                    form = json.loads(body or b"{}")
                    repo_id = f"{form['organization']}/{form['name']}" if form.get("organization") else form["name"]
                    if repo_id in server.repos:  # the Hub answers 409 with the repo's url
                        self._send(409, json.dumps({"error": "You already created this dataset repo",
                                                    "url": f"{server.endpoint}/datasets/{repo_id}"}).encode(),
                                   {"Content-Type": "application/json", "X-Error-Code": "RepoExists"})
                    else:
                        folder = server.storage / "empty" / repo_id
                        folder.mkdir(parents=True, exist_ok=True)
                        server.add_dataset(repo_id, folder)
                        self._json({"url": f"{server.endpoint}/datasets/{repo_id}", "name": repo_id, "id": repo_id})
                    return True
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)/preupload/([^/]+)$", url.path)
                if match:
                    files = json.loads(body or b"{}").get("files", [])
                    self._json({"files": [{"path": f["path"], "shouldIgnore": False,
                                           "uploadMode": "lfs" if f["path"].endswith((".safetensors", ".parquet"))
                                           else "regular"} for f in files]})
                    return True
                match = re.match(r"^/datasets/([^/]+/[^/]+)\.git/info/lfs/objects/batch$", url.path)
                if match:
                    objects = []
                    for obj in json.loads(body or b"{}").get("objects", []):
                        entry = {"oid": obj["oid"], "size": obj["size"]}
                        if obj["oid"] not in server.lfs:
                            entry["actions"] = {"upload": {"href": f"{server.endpoint}/lfs-upload/{obj['oid']}"},
                                                "verify": {"href": f"{server.endpoint}/lfs-verify/{obj['oid']}"}}
                        objects.append(entry)
                    self._json({"transfer": "basic", "objects": objects})
                    return True
                match = re.match(r"^/lfs-verify/([0-9a-f]{64})$", url.path)
                if match:
                    if match.group(1) in server.lfs:
                        self._json({"ok": True})
                    else:
                        self._error(404, "EntryNotFound", "object not uploaded")
                    return True
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)/commit/([^/]+)$", url.path)
                if match:
                    if server.fail_next_commit:
                        server.fail_next_commit = False
                        self._error(500, "InternalError", "commit failed (test fault)")
                        return True
                    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                    operations = [{"key": line["key"], **line["value"]} for line in lines if line["key"] != "header"]
                    missing = [op["oid"] for op in operations if op["key"] == "lfsFile" and op["oid"] not in server.lfs]
                    if missing:
                        self._error(400, "BadRequest", f"LFS objects not uploaded: {missing[:3]}")
                        return True
                    repo_id, revision = match.group(1), unquote(match.group(2))
                    if repo_id not in server.repos:
                        self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
                        return True
                    pr_url = None
                    header = next((line["value"] for line in lines if line["key"] == "header"), {})
                    parent = header.get("parentCommit")
                    head = server.repos[repo_id].resolve(revision)
                    if parent and (head is None or head.sha != parent):  # the Hub's check of `parent_commit`
                        self._error(412, "PreconditionFailed", f"{revision} is at {head.sha if head else None}, "
                                                               f"not at the parent commit {parent}")
                        return True
                    if parse_qs(url.query).get("create_pr", ["0"])[0] in ("1", "true"):
                        title = next(line["value"] for line in lines if line["key"] == "header").get("summary", "")
                        num = server.open_pull_request(repo_id, revision, operations, title)
                        revision, pr_url = f"refs/pr/{num}", f"{server.endpoint}/datasets/{repo_id}/discussions/{num}"
                        sha = server.repos[repo_id].resolve(revision).sha
                    else:
                        sha = server.commit(repo_id, revision, operations)
                    self._json({"commitUrl": f"{server.endpoint}/datasets/{repo_id}/commit/{sha}",
                                "commitOid": sha, "pullRequestUrl": pr_url})
                    return True
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)/discussions/(\d+)/merge$", url.path)
                if match:
                    repo_id, num = match.group(1), int(match.group(2))
                    pulls = server.discussions.get(repo_id, [])
                    if not 1 <= num <= len(pulls) or pulls[num - 1]["status"] != "open":
                        self._error(400, "BadRequest", f"pull request {num} is not open")
                        return True
                    server.merge_pull_request(repo_id, num)
                    self._json({"id": f"merge-{num}", "type": "status-change", "createdAt": "2026-01-01T00:00:00Z",
                                "author": {"name": "maintainer"}, "data": {"status": "merged"}})
                    return True
                return False

            def do_POST(self) -> None:
                if self._failing():
                    return
                url = urlsplit(self.path)
                server.log("POST", url.path, None)
                body = self._body()
                with server.commits:  # each commit or merge whole, as the Hub applies it (parent_commit included)
                    if self._upload_routes(url, body):
                        return
                match = re.match(r"^/api/datasets/([^/]+/[^/]+)/paths-info/([^/]+)$", url.path)
                if not match:
                    return self._error(404, "EntryNotFound", f"no route for POST {url.path}")
                revision = self._repo_rev(match.group(1), unquote(match.group(2)))
                if revision is None:
                    return
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    form = json.loads(body or b"{}")
                    paths, expand = form.get("paths", []), bool(form.get("expand"))
                else:
                    form = parse_qs(body.decode())
                    paths, expand = form.get("paths", []), form.get("expand", ["false"])[0] in ("1", "true", "True")
                entries = [self._entry(revision, p, expand) for p in paths if (revision.folder / p).exists()]
                self._json(entries)

        return Handler
