"""``rlds download``: turn an id, URL or path into a cached dataset."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rlds_cli import registry
from rlds_cli.cache.root import CacheRoot
from rlds_cli.convert import ConvertResult, Progress, convert
from rlds_cli.errors import SourceNotFoundError, UnsupportedSourceError

_URL_PREFIXES = ("http://", "https://", "hf://")


def download(
    source: str,
    *,
    name: str | None = None,
    format: str | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    backend: str = "memmap",
    force: bool = False,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> ConvertResult:
    """Resolve ``source`` and convert it into the cache.

    Args:
        source: A local file path, or a registry id or alias (``rlds list --remote``).
        name: Name in the cache (default: the registry id, or the file's stem).
        format: Source format (default: the registry's, or detected from the file).
        root: Cache root.
        backend: ``"memmap"`` or ``"zarr"``.
        force: Re-convert and replace an existing dataset of that name.
        options: Reader options; registry hints (e.g. ``max_episode_steps``) fill the gaps.
        progress: See :data:`rlds_cli.convert.Progress`.

    Returns:
        A :class:`~rlds_cli.convert.ConvertResult`.
    """
    path = Path(source).expanduser()
    if path.exists():
        return convert(
            path,
            name or _default_name(path),
            format=format,
            root=root,
            backend=backend,
            force=force,
            options=options,
            progress=progress,
        )
    if source.startswith(_URL_PREFIXES):
        raise UnsupportedSourceError(
            f"cannot fetch {source}: this version of rlds converts local files and bundled "
            "registry entries only",
            hint="download the file yourself and run 'rlds download PATH --format FORMAT'",
        )
    if not registry.is_known(source) and _looks_like_path(source):
        raise SourceNotFoundError(f"source file {path} does not exist")
    entry = registry.resolve(source)
    remote = [f for f in entry.files if not f.is_bundled]
    if remote:
        raise UnsupportedSourceError(
            f"dataset {entry.id!r} must be fetched from {remote[0].urls[0]}, and this version of "
            "rlds converts local files and bundled registry entries only",
            hint="download the file yourself and run 'rlds download PATH --format "
            f"{entry.format} --name {entry.id}'",
        )
    merged = {**entry.options, **{k: v for k, v in (options or {}).items() if v is not None}}
    file = entry.files[0]
    return convert(
        file.bundled_path(),
        name or entry.id,
        format=format or entry.format,
        root=root,
        backend=backend,
        force=force,
        options=merged,
        source_info={"id": entry.id, "url": file.urls[0]},
        expected_sha256=file.sha256,
        progress=progress,
    )


def _looks_like_path(source: str) -> bool:
    return source.startswith((".", "~", os.sep)) or bool(Path(source).suffix)


def _default_name(path: Path) -> str:
    """A cache name from a file name: its stem with characters names cannot hold replaced."""
    stem = path.stem if path.is_file() else path.name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "dataset"
    return re.sub(r"-{2,}", "-", cleaned)
