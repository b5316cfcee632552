"""A local stand-in for the Hugging Face Hub on 127.0.0.1, serving the calls huggingface_hub makes.

- ``GET /api/datasets/{repo}/revision/{rev}``: the repo's info with the commit ``sha``.
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=...``: the listing, paged
  (:attr:`HubStandin.page_size` entries a page, ``Link: <...>; rel="next"``).
- ``HEAD``/``GET /datasets/{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit``,
  ``ETag`` (an LFS file's sha256), ``X-Linked-Etag``, ``X-Linked-Size``, ``Content-Length`` and
  ``Range`` support.

Writes, as ``HfApi.create_commit`` makes them (every one needs the stand-in's token):

- ``POST /api/datasets/{repo}/preupload/{rev}``: each file's upload mode (``lfs`` as :func:`is_lfs`
  says, else ``regular``) and, for a file ``rev`` holds, its ``oid`` (an LFS file's sha256, else its
  git blob id), as the Hub answers: ``create_commit`` drops an addition whose ``oid`` equals the
  local one and makes no commit when none is left (huggingface_hub PR #2389).
- ``POST /datasets/{repo}.git/info/lfs/objects/batch``: the basic LFS batch API; an object the
  stand-in already holds gets no upload action (an interrupted push's uploads are kept).
- ``PUT /lfs-upload/{oid}``: an LFS object's bytes, checked against its sha256 and size.
- ``POST /api/datasets/{repo}/commit/{rev}``: the NDJSON commit (``file``, ``lfsFile``,
  ``deletedFile``), refused with 412 when ``parentCommit`` is not the branch's head.
- ``POST /api/datasets/{repo}/paths-info/{rev}``: files' info (what ``HfFileSystem.info`` asks).
- ``POST /api/validate-yaml``: a root README.md's front matter, checked to be a YAML mapping.

Knobs: a gated repo answers 401 without ``Authorization: Bearer <token>``; :attr:`throttle`
answers 429 with ``Retry-After`` (:attr:`retry_after`) a number of times to the requests whose
``METHOD /path`` holds a key; :attr:`corrupt` serves other bytes than the
listed sha256; :attr:`missing` answers 404 for files the listing holds; :attr:`fail_commits`
answers the next commits with 500 (a push that dies before its commit); :attr:`on_upload` is
called before each LFS upload is taken (a test kills the pushing process there); :attr:`cut`
ends a file's next answers after some bytes each (the client resumes).
Every request is logged (method, path, Range, whether a token came) in :attr:`log`; a write also
logs the file bytes it carried (:meth:`HubStandin.file_bytes`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Repo:
    """A dataset repo: commits (sha -> {path: bytes}) and refs (branch -> sha)."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def add_commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        """Add a commit holding ``files`` and point ``branch`` at it; returns its sha."""
        sha = hashlib.sha1(
            json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
        ).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[branch] = sha
        return sha

    def commit(self, rev: str) -> str | None:
        return rev if rev in self.commits else self.refs.get(rev)


def folder_files(root: Path, prefix: str = "") -> dict[str, bytes]:
    """Every file below ``root`` as ``{prefix + relative path: bytes}``."""
    return {
        prefix + p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def record_minari(root: Path, dataset_id: str) -> Path:
    """A small Pendulum dataset recorded by minari's own ``DataCollector`` under ``root``; returns
    its folder (``data/main_data.hdf5``, ``data/metadata.json``). Needs minari[create] (jax)."""
    import gymnasium as gym

    from tests.minari_fixtures import minari_path, record_random

    with minari_path(root):
        record_random(
            gym.make("Pendulum-v1", max_episode_steps=15), dataset_id, 3,
            eval_env=gym.make("Pendulum-v1", max_episode_steps=15),
            code_permalink="tests/hub_standin.py", description="rlds Hub stand-in dataset",
        )  # fmt: skip
    return root.joinpath(*dataset_id.split("/"))


#: The stand-in's token in the ``hub`` fixture (tests/conftest.py): writes and gated repos need it.
TOKEN = "hf_standinSecretToken0123456789"


def hub_env(endpoint: str, home: Path, token: str | None = None) -> dict[str, str]:
    """The environment that points huggingface_hub at the stand-in at ``endpoint``: ``home`` as
    ``HF_HOME`` (no token file there), telemetry off, Xet off (the stand-in speaks the basic LFS
    protocol), and ``HF_TOKEN`` when ``token`` is given."""
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }
    if token:
        env["HF_TOKEN"] = token
    return env


def is_lfs(path: str) -> bool:
    """Which files the stand-in stores in LFS (like the Hub: binaries; JSON stays in git)."""
    return not path.endswith((".json", ".jsonl", ".md", ".gitattributes"))


class HubStandin:
    """The server; use as a context manager. ``endpoint`` is its base URL."""

    def __init__(self, token: str = "") -> None:
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.page_size = 3
        self.throttle: dict[str, int] = {}  # substring of "METHOD /path" -> 429s left
        self.retry_after = "1"
        self.corrupt: dict[str, bytes] = {}  # repo path -> bytes served instead
        self.missing: set[str] = set()  # repo paths listed, but answered 404
        self.cut: dict[str, list[int]] = {}  # repo path -> bytes sent by its next GETs, one each
        self.fail_commits = 0
        self.on_upload: Callable[[str], None] | None = None  # called with the oid of each upload
        self.lfs: dict[str, bytes] = {}  # sha256 -> bytes of every LFS object uploaded
        self.log: list[dict[str, Any]] = []
        #: The README contents huggingface_hub asked ``/api/validate-yaml`` to check, in order.
        self.validated: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandin:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_repo(self, name: str, files: dict[str, bytes]) -> Repo:
        """A new repo ``name`` whose ``main`` is one commit holding ``files``."""
        repo = Repo()
        repo.add_commit(files)
        self.repos[name] = repo
        return repo

    def uploads(self) -> list[str]:
        """The sha256 of every LFS object uploaded (successful PUTs)."""
        return [e["oid"] for e in self.log if e.get("oid") and e.get("status") == 200]

    def file_bytes(self, since: int = 0) -> int:
        """The bytes of file content received by the requests ``log[since:]``: LFS uploads, the
        content of the commits' git files, and the 512-byte samples of the preupload calls."""
        return sum(e.get("file_bytes", 0) for e in self.log[since:])

    def commits(self) -> list[dict[str, Any]]:
        """The commits made (their operations: path -> ``add``/``delete``)."""
        return [e["commit"] for e in self.log if "commit" in e]

    def downloads(self, method: str = "GET") -> list[str]:
        """The repo paths of the files fetched with ``method`` (resolve requests)."""
        return [e["file"] for e in self.log if e["method"] == method and e.get("file")]


def _handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # TCP_NODELAY: headers then body, no 40 ms delayed-ACK wait

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_POST(self) -> None:
            self._write()

        def do_PUT(self) -> None:
            self._write()

        def _send(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False
        ) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
            self._send(
                status, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})}
            )

        def _serve(self, head: bool) -> None:
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            auth = self.headers.get("Authorization", "")
            entry: dict[str, Any] = {
                "method": self.command,
                "path": path,
                "range": self.headers.get("Range"),
                "auth": bool(auth),
            }
            with hub._lock:
                hub.log.append(entry)
                for key, left in hub.throttle.items():
                    if key in f"{self.command} {path}" and left > 0:
                        hub.throttle[key] = left - 1
                        entry["status"] = 429
                        return self._send(429, b"slow down", {"Retry-After": hub.retry_after}, head)
            parts = path.strip("/").split("/")
            api = parts[:2] == ["api", "datasets"]
            rest = parts[2:] if api else parts[1:]
            if (parts[0] != "datasets" and not api) or len(rest) < 3:
                return self._send(404, b"not found", head=head)
            repo_id, kind, rev = "/".join(rest[:2]), rest[2], rest[3] if len(rest) > 3 else "main"
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            if repo.gated and auth != f"Bearer {hub.token}":
                entry["status"] = 401
                return self._json(
                    401, {"error": "Access to this dataset is restricted"}, {"X-Error-Code": "GatedRepo"}
                )
            sha = repo.commit(urllib.parse.unquote(rev))
            if sha is None:
                return self._json(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
            files = repo.commits[sha]
            if api and kind == "revision":
                return self._json(
                    200,
                    {
                        "id": repo_id,
                        "sha": sha,
                        "private": False,
                        "gated": repo.gated,
                        "siblings": [{"rfilename": p} for p in files],
                    },
                )
            if api and kind == "tree":
                return self._tree(
                    repo_id, rev, sha, files, "/".join(rest[4:]), urllib.parse.parse_qs(url.query)
                )
            if not api and kind == "resolve":
                return self._file(sha, files, "/".join(rest[4:]), entry, head)
            return self._send(404, b"not found", head=head)

        def _tree(
            self,
            repo_id: str,
            rev: str,
            sha: str,
            files: dict[str, bytes],
            sub: str,
            query: dict[str, list[str]],
        ) -> None:
            prefix = sub.strip("/") + "/" if sub.strip("/") else ""
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            entries: list[dict[str, Any]] = []
            dirs: set[str] = set()
            for p, data in sorted(files.items()):
                if not p.startswith(prefix):
                    continue
                tail = p[len(prefix) :]
                if not recursive and "/" in tail:
                    dirs.add(prefix + tail.split("/")[0])
                    continue
                for i in range(1, tail.count("/") + 1):
                    dirs.add(prefix + "/".join(tail.split("/")[:i]))
                entries.append(_file_entry(p, data))
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
            if not entries and prefix:
                return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start : start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                q = urllib.parse.urlencode(
                    {"recursive": str(recursive).lower(), "cursor": start + hub.page_size}
                )
                headers["Link"] = f'<{hub.endpoint}/api/datasets/{repo_id}/tree/{rev}/{sub}?{q}>; rel="next"'
            self._json(200, page, headers)

        def _file(
            self, sha: str, files: dict[str, bytes], path: str, entry: dict[str, Any], head: bool
        ) -> None:
            if path not in files or path in hub.missing:
                return self._send(
                    404, b"Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, head
                )
            entry["file"] = path
            data = files[path]
            etag = _oid(path, data)
            body = hub.corrupt.get(path, data)
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if is_lfs(path):
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            rng = self.headers.get("Range")
            status = 200
            if rng and rng.startswith("bytes=") and not head:
                lo_text, _, hi_text = rng[6:].partition("-")
                lo = int(lo_text)
                hi = min(int(hi_text), len(body) - 1) if hi_text else len(body) - 1
                if lo >= len(body):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(body)}"})
                headers["Content-Range"] = f"bytes {lo}-{hi}/{len(body)}"
                body, status = body[lo : hi + 1], 206
            headers["Content-Length"] = str(len(body))
            with hub._lock:
                left = hub.cut.get(path) if not head else None
                cut = left.pop(0) if left else None
            if cut is not None:  # an interrupted transfer: the promised length, fewer bytes, then close
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(status, body, headers, head)

        # ------------------------------------------------------------------ writes

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _validate_yaml(self, body: bytes) -> None:
            """The README's front matter must be a YAML mapping (the Hub checks more: its fields)."""
            import yaml

            content = str(json.loads(body).get("content", ""))
            hub.validated.append(content)
            if not content.startswith("---\n"):
                return self._json(
                    200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]}
                )
            try:
                meta = yaml.safe_load(content.split("---\n")[1])
            except yaml.YAMLError as exc:
                return self._json(400, {"errors": [{"message": f"invalid YAML: {exc}"}]})
            if not isinstance(meta, dict):
                return self._json(400, {"errors": [{"message": "the metadata is no mapping"}]})
            return self._json(200, {"errors": [], "warnings": []})

        def _write(self) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            body = self._body()
            auth = self.headers.get("Authorization", "")
            entry: dict[str, Any] = {"method": self.command, "path": path, "auth": bool(auth)}
            with hub._lock:
                hub.log.append(entry)
            parts = path.strip("/").split("/")
            if self.command == "PUT" and parts[0] == "lfs-upload" and len(parts) == 2:
                return self._lfs_put(parts[1], body, entry)
            if parts == ["api", "validate-yaml"]:  # create_commit asks it of a root README.md
                return self._validate_yaml(body)
            if parts[0] == "datasets" and parts[-4:] == ["info", "lfs", "objects", "batch"]:
                repo_id = "/".join(parts[1:-4]).removesuffix(".git")
                kind, rev = "batch", "main"
            elif parts[:2] == ["api", "datasets"] and len(parts) >= 6:
                repo_id, kind, rev = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            else:
                return self._send(404, b"not found")
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            if kind == "paths-info":  # a read: gated like the others
                if repo.gated and auth != f"Bearer {hub.token}":
                    entry["status"] = 401
                    return self._json(401, {"error": "Access restricted"}, {"X-Error-Code": "GatedRepo"})
                return self._paths_info(repo, rev, body)
            if not hub.token or auth != f"Bearer {hub.token}":
                entry["status"] = 401
                return self._json(401, {"error": "Invalid credentials in Authorization header"})
            if kind == "preupload":
                files = json.loads(body)["files"]
                entry["file_bytes"] = sum(len(base64.b64decode(f.get("sample", ""))) for f in files)
                sha = repo.commit(urllib.parse.unquote(rev))
                there = repo.commits[sha] if sha else {}
                modes = [
                    {"path": f["path"], "uploadMode": "lfs" if is_lfs(f["path"]) else "regular",
                     "shouldIgnore": False}
                    for f in files
                ]  # fmt: skip
                for mode in modes:
                    if mode["path"] in there:
                        mode["oid"] = _oid(mode["path"], there[mode["path"]])
                return self._json(200, {"files": modes})
            if kind == "batch":
                return self._lfs_batch(json.loads(body))
            if kind == "commit":
                return self._commit(repo, repo_id, urllib.parse.unquote(rev), body, entry)
            return self._send(404, b"not found")

        def _paths_info(self, repo: Repo, rev: str, body: bytes) -> None:
            sha = repo.commit(urllib.parse.unquote(rev))
            if sha is None:
                return self._json(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
            form = urllib.parse.parse_qs(body.decode())
            files = repo.commits[sha]
            out: list[dict[str, Any]] = []
            for p in form.get("paths", []):
                p = p.strip("/")
                if p in files:
                    out.append(_file_entry(p, files[p]))
                elif any(f.startswith(p + "/") for f in files):
                    out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": p})
            self._json(200, out)

        def _lfs_batch(self, request: dict[str, Any]) -> None:
            objects = []
            for obj in request.get("objects", []):
                oid, size = str(obj["oid"]), int(obj["size"])
                item: dict[str, Any] = {"oid": oid, "size": size}
                with hub._lock:
                    have = oid in hub.lfs
                if not have:
                    item["actions"] = {"upload": {"href": f"{hub.endpoint}/lfs-upload/{oid}", "header": {}}}
                objects.append(item)
            self._json(200, {"transfer": "basic", "objects": objects})

        def _lfs_put(self, oid: str, body: bytes, entry: dict[str, Any]) -> None:
            entry["oid"], entry["file_bytes"] = oid, len(body)
            if hub.on_upload is not None:
                hub.on_upload(oid)
            if hashlib.sha256(body).hexdigest() != oid:
                entry["status"] = 400
                return self._send(400, b"sha256 mismatch")
            with hub._lock:
                hub.lfs[oid] = body
            entry["status"] = 200
            self._send(200)

        def _commit(self, repo: Repo, repo_id: str, branch: str, body: bytes, entry: dict[str, Any]) -> None:
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            header = next((x["value"] for x in lines if x["key"] == "header"), {})
            with hub._lock:
                fail = hub.fail_commits > 0
                hub.fail_commits -= 1 if fail else 0
                if fail:
                    entry["status"] = 500
                    return self._json(500, {"error": "Internal Error"})
                head = repo.refs.get(branch)
                parent = header.get("parentCommit")
                if parent and parent != head:
                    entry["status"] = 412
                    return self._json(
                        412, {"error": "A commit has happened since. Please refresh and try again."}
                    )
                files = dict(repo.commits[head]) if head else {}
                ops: dict[str, str] = {}
                for line in lines:
                    key, value = line["key"], line["value"]
                    if key == "file":
                        files[value["path"]] = base64.b64decode(value["content"])
                        entry["file_bytes"] = entry.get("file_bytes", 0) + len(files[value["path"]])
                    elif key == "lfsFile":
                        if value["oid"] not in hub.lfs:
                            entry["status"] = 422
                            return self._json(422, {"error": f"LFS object {value['oid']} not uploaded"})
                        files[value["path"]] = hub.lfs[value["oid"]]
                    elif key == "deletedFile":
                        files.pop(value["path"], None)
                    else:
                        continue
                    ops[value["path"]] = "delete" if key == "deletedFile" else "add"
                sha = repo.add_commit(files, branch)
                entry["commit"], entry["status"] = ops, 200
            self._json(
                200, {"commitUrl": f"{hub.endpoint}/datasets/{repo_id}/commit/{sha}", "commitOid": sha,
                      "success": True},
            )  # fmt: skip

    return Handler


def _file_entry(path: str, data: bytes) -> dict[str, Any]:
    """A file as the tree and paths-info endpoints describe it."""
    item: dict[str, Any] = {"type": "file", "oid": _git_oid(data), "size": len(data), "path": path}
    if is_lfs(path):
        item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return item


def _oid(path: str, data: bytes) -> str:
    """A file's ``oid`` in a preupload answer and its ``ETag``: an LFS file's sha256, else its git
    blob id (what huggingface_hub computes locally to compare with the preupload's)."""
    return hashlib.sha256(data).hexdigest() if is_lfs(path) else _git_oid(data)


def _git_oid(data: bytes) -> str:
    """The git blob id of ``data`` (what the Hub lists as a file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
