"""A local stand-in for the Hugging Face Hub on 127.0.0.1, serving the calls huggingface_hub makes.

- ``GET /api/datasets/{repo}/revision/{rev}``: the repo's info with the commit ``sha``.
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=...``: the listing, paged
  (:attr:`HubStandin.page_size` entries a page, ``Link: <...>; rel="next"``).
- ``HEAD``/``GET /datasets/{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit``,
  ``ETag`` (an LFS file's sha256), ``X-Linked-Etag``, ``X-Linked-Size``, ``Content-Length`` and
  ``Range`` support.

Knobs: a gated repo answers 401 without ``Authorization: Bearer <token>``; :attr:`throttle`
answers 429 with ``Retry-After`` a number of times; :attr:`corrupt` serves other bytes than the
listed sha256; :attr:`cut` ends a file's next answers after some bytes each (the client resumes).
Every request is logged (method, path, Range, whether a token came) in :attr:`log`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
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
    import os

    import gymnasium as gym
    import minari

    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        collector = minari.DataCollector(gym.make("Pendulum-v1", max_episode_steps=15))
        for seed in range(3):
            collector.reset(seed=seed)
            while True:
                _, _, term, trunc, _ = collector.step(collector.action_space.sample())
                if term or trunc:
                    break
        collector.create_dataset(
            dataset_id=dataset_id,
            eval_env=gym.make("Pendulum-v1", max_episode_steps=15),
            algorithm_name="random",
            author="rlds tests",
            author_email="tests@example.invalid",
            code_permalink="tests/hub_standin.py",
            description="rlds Hub stand-in dataset",
        )
        collector.close()
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old
    return root.joinpath(*dataset_id.split("/"))


def is_lfs(path: str) -> bool:
    """Which files the stand-in stores in LFS (like the Hub: binaries; JSON stays in git)."""
    return not path.endswith((".json", ".jsonl", ".md", ".gitattributes"))


class HubStandin:
    """The server; use as a context manager. ``endpoint`` is its base URL."""

    def __init__(self, token: str = "") -> None:
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.page_size = 3
        self.throttle: dict[str, int] = {}  # substring of a request path -> 429s left
        self.retry_after = "1"
        self.corrupt: dict[str, bytes] = {}  # repo path -> bytes served instead
        self.cut: dict[str, list[int]] = {}  # repo path -> bytes sent by its next GETs, one each
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandin:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloads(self, method: str = "GET") -> list[str]:
        """The repo paths of the files fetched with ``method`` (resolve requests)."""
        return [e["file"] for e in self.log if e["method"] == method and e.get("file")]


def _handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

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
                    if key in path and left > 0:
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
                item: dict[str, Any] = {
                    "type": "file",
                    "oid": hashlib.sha1(data).hexdigest(),
                    "size": len(data),
                    "path": p,
                }
                if is_lfs(p):
                    item["lfs"] = {
                        "oid": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                entries.append(item)
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
            if path not in files:
                return self._send(
                    404, b"Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, head
                )
            entry["file"] = path
            data = files[path]
            etag = hashlib.sha256(data).hexdigest() if is_lfs(path) else hashlib.sha1(data).hexdigest()
            body = hub.corrupt.get(path, data)
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if is_lfs(path):
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            rng = self.headers.get("Range")
            status = 200
            if rng and rng.startswith("bytes=") and not head:
                lo = int(rng[6:].split("-")[0])
                headers["Content-Range"] = f"bytes {lo}-{len(body) - 1}/{len(body)}"
                body, status = body[lo:], 206
            headers["Content-Length"] = str(len(body))
            with hub._lock:
                left = hub.cut.get(path) if not head else None
                cut = left.pop(0) if left else None
            if cut is not None:  # an interrupted transfer: the promised length, fewer bytes, then close
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(status, body, headers, head)

    return Handler
