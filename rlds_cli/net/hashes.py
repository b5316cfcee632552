"""``hashes.json``: the sizes and sha256 of a dataset's downloaded files.

It sits beside the raw files (``<root>/raw/<entry>/hashes.json``). For files whose registry
entry knows no sha256, the first verified download records what it saw ("trust on first
use") and every later download or ``rlds verify`` must match it. It also remembers each
file's mtime, so a file that was verified and not touched since is not hashed again.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

HASHES_FILE = "hashes.json"
_THREAD_LOCK = threading.Lock()


@dataclass
class FileRecord:
    """What rlds knows about one downloaded file.

    Attributes:
        sha256: Hex digest of the verified bytes.
        size: Size in bytes.
        origin: Where the hash came from: ``"registry"``, ``"hub"`` (Hugging Face LFS
            metadata), ``"user"`` (``--sha256``) or ``"recorded"`` (observed on first download).
        url: The URL the bytes came from.
        mtime_ns: The file's mtime when it was last verified.
        verified_at: UTC time of that verification.
    """

    sha256: str
    size: int
    origin: str
    url: str = ""
    mtime_ns: int = 0
    verified_at: str = ""


class HashStore:
    """The ``hashes.json`` of one download folder.

    Args:
        directory: The folder holding the raw files.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / HASHES_FILE

    def _lock(self) -> FileLock:
        return FileLock(str(self.directory / f".{HASHES_FILE}.lock"))

    def read(self) -> dict[str, FileRecord]:
        """Every record, by file name (an unreadable file counts as empty)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {k: FileRecord(**v) for k, v in data.get("files", {}).items()}
        except (OSError, ValueError, TypeError):
            return {}

    def get(self, name: str) -> FileRecord | None:
        return self.read().get(name)

    def put(self, name: str, record: FileRecord) -> None:
        """Add or replace one record (read-modify-write under a process and a thread lock)."""
        record.verified_at = record.verified_at or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.directory.mkdir(parents=True, exist_ok=True)
        with _THREAD_LOCK, self._lock():
            records = self.read()
            records[name] = record
            self._write(records)

    def _write(self, records: dict[str, FileRecord]) -> None:
        data: dict[str, Any] = {"files": {k: asdict(v) for k, v in sorted(records.items())}}
        tmp = self.path.with_name(f".{HASHES_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
