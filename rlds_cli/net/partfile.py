"""The record beside a ``.part`` file: which version of the remote file its bytes belong to.

A resume is only safe when the bytes on disk and the bytes to come are of one version of the
file; :mod:`rlds_cli.net.http` sends the recorded validator as ``If-Range`` and restarts when a
response does not match it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlds_cli._util.io import atomic_write
from rlds_cli.net.layout import part_info_path


@dataclass
class PartInfo:
    """What identifies the version of the file a ``.part`` holds bytes of.

    Attributes:
        url: The URL asked for (a ``.part`` is only resumed from the same URL).
        etag: The first response's strong ``ETag`` (weak ones cannot validate byte ranges).
        last_modified: Its ``Last-Modified``.
        size: The file's total size, when the server said.
    """

    url: str
    etag: str | None = None
    last_modified: str | None = None
    size: int | None = None

    @property
    def validator(self) -> str | None:
        """The ``If-Range`` value: the strong ETag, else the date; ``None`` when neither."""
        return self.etag or self.last_modified

    @classmethod
    def of(cls, resp: Any, url: str, size: int | None) -> PartInfo:
        """The validators of a response."""
        etag = (resp.headers.get("ETag") or "").strip()
        strong = etag if etag.startswith('"') else None  # W/"..." is weak, bare tokens are invalid
        return cls(url, strong, (resp.headers.get("Last-Modified") or "").strip() or None, size)

    def matches(self, resp: Any) -> bool:
        """Whether a response's validators, where it sends them, are the recorded ones."""
        etag = (resp.headers.get("ETag") or "").strip()
        if self.etag and etag and etag != self.etag:
            return False
        date = (resp.headers.get("Last-Modified") or "").strip()
        return not (not self.etag and self.last_modified and date and date != self.last_modified)


def read_part_info(part: Path) -> PartInfo | None:
    """The validator record of a ``.part`` (``None`` when missing or unreadable)."""
    try:
        return PartInfo(**json.loads(part_info_path(part).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def write_part_info(part: Path, info: PartInfo) -> None:
    """Record (atomically) which version of the file a ``.part`` holds bytes of."""
    atomic_write(part_info_path(part), json.dumps(asdict(info)) + "\n")


def discard_part(part: Path) -> None:
    """Delete a partial download and its validator record."""
    part.unlink(missing_ok=True)
    part_info_path(part).unlink(missing_ok=True)
