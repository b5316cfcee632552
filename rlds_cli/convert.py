"""Conversion of a local source into the cache: reader -> builder, with provenance."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import (
    ChecksumMismatchError,
    DatasetExistsError,
    SourceFormatError,
    SourceNotFoundError,
)
from rlds_cli.formats import detect_format, reader_class
from rlds_cli.hashing import sha256_file


@dataclass
class ConvertResult:
    """What :func:`convert` did.

    Attributes:
        manifest: The manifest of the dataset now in the cache.
        reused: ``True`` when the same source was already converted under that name and
            nothing was written.
        path: The dataset's directory.
    """

    manifest: Manifest
    reused: bool
    path: Path


#: Progress callback: ``(event, amount)`` with events ``"start"`` (total rows),
#: ``"advance"`` (rows done) and ``"hash"`` (source hashed).
Progress = Callable[[str, int], None]


def convert(
    source: str | os.PathLike[str],
    name: str,
    *,
    format: str | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    backend: str = "memmap",
    force: bool = False,
    options: dict[str, Any] | None = None,
    source_info: dict[str, Any] | None = None,
    expected_sha256: str | None = None,
    progress: Progress | None = None,
) -> ConvertResult:
    """Convert a local source file into a cached TED dataset.

    The source is hashed first; if a dataset of the same name was converted from the same
    bytes with the same options, it is reused untouched (unless ``force``).

    Args:
        source: Path to the source file.
        name: Dataset name in the cache.
        format: Source format (``None``: detect from the file).
        root: Cache root.
        backend: ``"memmap"`` or ``"zarr"``.
        force: Rebuild and replace an existing dataset of this name.
        options: Reader options (e.g. ``{"max_episode_steps": 1000}``).
        source_info: Extra provenance for the manifest (e.g. the registry id).
        expected_sha256: Refuse the source unless its sha256 is this.
        progress: Optional callback, see :data:`Progress`.

    Returns:
        A :class:`ConvertResult`.
    """
    path = Path(source).expanduser()
    if not path.exists():
        raise SourceNotFoundError(f"source file {path} does not exist")
    fmt = format or detect_format(path)
    options = {k: v for k, v in (options or {}).items() if v is not None}
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    sha256 = sha256_file(path)
    if expected_sha256 and sha256 != expected_sha256.lower():
        raise ChecksumMismatchError(f"{path} has sha256 {sha256}, expected {expected_sha256.lower()}")
    if progress:
        progress("hash", path.stat().st_size)
    with DatasetBuilder(name, root=cache, backend=backend, replace=force) as builder:
        if builder.existing is not None and not force:
            old = builder.existing.source
            if old.get("sha256") == sha256 and old.get("format") == fmt and old.get("options", {}) == options:
                return ConvertResult(builder.existing, True, cache.dataset_dir(name))
            raise DatasetExistsError(
                f"dataset {name!r} already exists in {cache.path} (converted from {old.get('path', '?')})"
            )
        with reader_class(fmt)(path, **options) as reader:
            if progress:
                progress("start", reader.total_rows())
            advance = (lambda rows: progress("advance", rows)) if progress else None
            for block in reader.blocks(advance):
                builder.append(block)
            if builder.num_steps == 0:
                raise SourceFormatError(
                    f"{path} holds no complete transition (every row's next observation is unknown)",
                    hint="see docs/formats.md for the episode-boundary rules of this format",
                )
            source_meta = {
                "format": fmt,
                "path": str(path.resolve()),
                "sha256": sha256,
                "size": path.stat().st_size,
                "options": options,
                "metadata": reader.source_metadata(),
                **(source_info or {}),
            }
            manifest = builder.commit(
                source=source_meta,
                conversion=reader.report.to_dict(),
                source_arrays=reader.source_arrays(),
            )
    return ConvertResult(manifest, False, cache.dataset_dir(name))
