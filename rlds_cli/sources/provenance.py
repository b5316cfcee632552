"""What a download records about its origin: the manifest's ``source`` record (:func:`provenance`)
and the default cache name (:func:`default_name`), for a registry id, a URL or a Hub repo."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlds_cli.net.fetch import FetchResult
from rlds_cli.net.hub.repo import HubPath

#: Suffixes of archives and compressed files, all stripped from a default name (x.tar.gz -> x).
_ARCHIVE_SUFFIXES = (".tar", ".tgz", ".tbz2", ".tbz", ".txz", ".zip", ".gz", ".bz2", ".xz", ".zst")
#: Data suffixes also stripped once an archive suffix went (hopper.hdf5.zip -> hopper).
_DATA_SUFFIXES = (".hdf5", ".h5", ".npz", ".npy", ".traj")
#: A version folder's name (a TFDS dataset's ``name/1.0.0``).
_VERSION = re.compile(r"^v?\d+(\.\d+)*$")


def provenance(results: list[FetchResult], folder: Path, **source: Any) -> dict[str, Any]:
    """The ``source`` record of a downloaded dataset: ``source`` (the registry id; a Hub repo's
    ``hf://`` URL at its commit and its ``hub`` record), then ``url`` (``source``'s, else the
    first file's), ``raw_dir`` (the download folder) and ``downloads``: each fetched file's
    ``name``, ``url``, ``sha256``, ``size`` and ``hash_origin``, in the order fetched."""
    return {
        **source,
        "url": source["url"] if "url" in source else results[0].url,
        "raw_dir": str(folder),
        "downloads": [
            {"name": r.name, "url": r.url, "sha256": r.sha256, "size": r.size, "hash_origin": r.hash_origin}
            for r in results
        ],
    }


def default_name(source: Path | HubPath) -> str:
    """The cache name of a download given no name, always a valid one.

    A file: its name without its archive suffixes and data suffix (``x.tar.gz`` -> ``x``,
    ``d.hdf5.zip`` -> ``d``, ``a-v2.1.hdf5`` -> ``a-v2.1``); a folder: its name; a Minari dataset:
    its ``dataset_id``, namespace included (``pendulum/random-v0``). A Hub repo: the last part of
    its path (else the repo's name), a version folder with its parent (``name/1.0.0`` ->
    ``name-1.0.0``). Characters a name cannot hold become ``-``; ``dataset`` when none is left.
    """
    if isinstance(source, HubPath):
        parts = [p for p in source.path.split("/") if p] or [source.repo.split("/")[1]]
        stem = f"{parts[-2]}-{parts[-1]}" if _VERSION.match(parts[-1]) and len(parts) > 1 else parts[-1]
    else:
        from rlds_cli.formats.minari.layout import default_name as minari_name

        named = minari_name(source)
        if named is not None:
            return named
        stem = source.name if source.exists() and not source.is_file() else _strip_suffixes(source.name)
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "dataset"
    return re.sub(r"-{2,}", "-", cleaned)


def _strip_suffixes(file_name: str) -> str:
    """A file name without all its archive suffixes and then its data suffix; with no archive
    suffix, without its last suffix."""
    name, stripped = file_name, False
    while (suffix := Path(name).suffix.lower()) in _ARCHIVE_SUFFIXES and Path(name).stem:
        name, stripped = name[: -len(suffix)], True
    if not stripped:
        return Path(name).stem if Path(name).suffix else name
    suffix = Path(name).suffix.lower()
    return name[: -len(suffix)] if suffix in _DATA_SUFFIXES and Path(name).stem else name
