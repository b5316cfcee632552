"""The journal of a push: the files a push to one URL has uploaded, kept in the local cache
(``tmp/.push-<id>.journal``, one per URL and cache) between runs, so that a push killed midway is
taken up where it stopped.

One JSON line per event, appended: a file whose upload started (``pending``), a file uploaded
(its size, sha256 and the store's stamp of the object just written: :func:`object_stamp`). A line
torn by a kill is skipped (its file is uploaded again). A later push skips a file only when the
store's object still has the stamp recorded: another push (from another cache) that wrote the
same path since changed it, and its bytes are not the ones the journal vouches for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import LockTimeoutError
from rlds_cli.remote.store import FileEntry

#: fsspec info keys that change when an object is written again (S3's ETag, GCS's generation,
#: local and memory file systems' times), the first present is the stamp.
STAMP_KEYS = ("ETag", "etag", "generation", "mtime", "LastModified", "last_modified", "created")


def object_stamp(info: dict[str, Any]) -> str | None:
    """What identifies the object ``info`` (fsspec's) describes as written once: ``None`` where
    the store says nothing that would change (the journal then vouches by size alone)."""
    for key in STAMP_KEYS:
        if info.get(key) is not None:
            return f"{key}={info[key]}"
    return None


def stamp_of(fs: Any, path: str) -> str | None:
    """:func:`object_stamp` of the object at ``path``; ``None`` where the store will not say (a
    credential that may write but not look: the journal then vouches by size, as before)."""
    try:
        return object_stamp(fs.info(path))
    except Exception:  # any store's error: a stamp only narrows what a later push skips
        return None


class PushJournal:
    """The files a push to one URL has uploaded, kept in the local cache between runs."""

    def __init__(self, cache: CacheRoot, key: str) -> None:
        ident = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.cache = cache
        self.path = cache.layout.push_journal(ident)
        self.lock_path = cache.layout.lock_file(f".push-{ident}")

    @contextmanager
    def locked(self, url: str) -> Iterator[None]:
        """Hold the lock of this URL: two pushes to one URL would interleave their files."""
        lock = FileLock(self.lock_path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise LockTimeoutError(f"another rlds push to {url} is running") from None
        try:
            yield
        finally:
            lock.release()

    def entries(self) -> dict[str, FileEntry]:
        """The files whose bytes at the URL are known (a file being uploaded is not)."""
        return self._read()[0]

    def pending(self) -> set[str]:
        """The files an upload started on and did not finish (a kill mid-file): this push's."""
        return self._read()[1]

    def stamps(self) -> dict[str, str]:
        """The store's stamp of each known file as it was just after its upload (where it gave one)."""
        return self._read()[2]

    def _read(self) -> tuple[dict[str, FileEntry], set[str], dict[str, str]]:
        out: dict[str, FileEntry] = {}
        started: set[str] = set()
        stamps: dict[str, str] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return out, started, stamps
        for line in lines:
            try:  # a line torn by a kill is skipped: its file is uploaded again
                rec = json.loads(line)
                rel = str(rec["rel"])
                if rec.get("pending"):
                    out.pop(rel, None)
                    stamps.pop(rel, None)
                    started.add(rel)
                else:
                    out[rel] = FileEntry(int(rec["size"]), str(rec["sha256"]))
                    stamps.pop(rel, None)
                    if rec.get("stamp") is not None:
                        stamps[rel] = str(rec["stamp"])
                    started.discard(rel)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return out, started, stamps

    def add_pending(self, rel: str) -> None:
        self.cache.tmp_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"rel": rel, "pending": True}) + "\n")

    def add(self, rel: str, entry: FileEntry, stamp: str | None = None) -> None:
        self.add_all({rel: entry}, {rel: stamp} if stamp is not None else None)

    def add_all(self, entries: dict[str, FileEntry], stamps: dict[str, str] | None = None) -> None:
        if not entries:
            return
        self.cache.tmp_dir.mkdir(parents=True, exist_ok=True)
        lines = "".join(
            json.dumps(
                {"rel": rel, "size": e.size, "sha256": e.sha256}
                | ({"stamp": stamps[rel]} if stamps and rel in stamps else {})
            )
            + "\n"
            for rel, e in entries.items()
        )
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(lines)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
