"""Where downloads live: ``<root>/raw/<entry>/`` (``/`` in a name written as ``--``)."""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from pathlib import Path

from rlds_cli.cache.root import CacheRoot, validate_name


def raw_root(cache: CacheRoot) -> Path:
    """The folder of every download."""
    return cache.path / "raw"


def raw_dir(cache: CacheRoot, key: str) -> Path:
    """The download folder of a registry entry (``key`` is its cache name)."""
    return raw_root(cache) / validate_name(key).replace("/", "--")


def url_dir(cache: CacheRoot, url: str) -> Path:
    """The download folder of an ad-hoc URL: one per URL, so recorded hashes never collide."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return raw_root(cache) / f"url-{digest}"


def url_file_name(url: str) -> str:
    """A safe local file name from a URL's last path segment."""
    last = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", last).strip("._")
    return cleaned or "download"
