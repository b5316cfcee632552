"""Where downloads live: ``<root>/raw/<entry>/`` (``/`` in a name written as ``--``), and the
files inside a download folder (the names are :mod:`rlds_cli.cache.layout`'s)."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from rlds_cli.cache.layout import (
    DOWNLOAD_LOCKS_DIR,
    LISTING_FILE,
    LOCK_SUFFIX,
    META_DIR,
    PART_SUFFIX,
    PARTS_DIR,
)
from rlds_cli.cache.root import CacheRoot

__all__ = [
    "META_DIR",
    "PART_SUFFIX",
    "is_reserved",
    "listing_path",
    "lock_path",
    "meta_dir",
    "part_info_path",
    "part_path",
    "raw_dir",
    "stored_listing",
    "url_dir",
    "url_file_name",
]


def raw_dir(cache: CacheRoot, key: str) -> Path:
    """The download folder of a registry entry (``key`` is its cache name)."""
    return cache.layout.download_dir(key)


def url_dir(cache: CacheRoot, url: str) -> Path:
    """The download folder of an ad-hoc URL: one per URL, so recorded hashes never collide."""
    return cache.layout.url_download_dir(url)


def url_file_name(url: str) -> str:
    """A safe local file name from a URL's last path segment."""
    last = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", last).strip("._")
    return cleaned or "download"


def is_reserved(name: str) -> bool:
    """Whether a downloaded file's relative name would land in the bookkeeping folder."""
    return name.replace("\\", "/").split("/", 1)[0] == META_DIR


def meta_dir(folder: Path) -> Path:
    """The bookkeeping folder of a download folder."""
    return folder / META_DIR


def part_path(folder: Path, name: str) -> Path:
    """Where the partial download of file ``name`` grows."""
    return meta_dir(folder) / PARTS_DIR / (name + PART_SUFFIX)


def part_info_path(part: Path) -> Path:
    """The validator record (URL, ETag / Last-Modified, size) of a partial download."""
    return part.with_name(part.name + ".json")


def lock_path(folder: Path, name: str) -> Path:
    """The lock taken while file ``name`` is fetched."""
    return meta_dir(folder) / DOWNLOAD_LOCKS_DIR / (name + LOCK_SUFFIX)


def listing_path(folder: Path) -> Path:
    """Where a Hugging Face folder's file list is remembered."""
    return meta_dir(folder) / LISTING_FILE


def stored_listing(folder: Path) -> Path | None:
    """The remembered file list of a Hugging Face folder entry (``None`` if never fetched)."""
    path = listing_path(folder)
    return path if path.is_file() else None
