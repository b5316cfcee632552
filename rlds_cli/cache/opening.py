"""Opening a dataset by name or URL: the one entry point every reader of the cache goes through.

:func:`open_dataset` resolves a registry alias to its cache name, retries while a replacement of
the dataset is being published (so a reader never sees half of one version), and hands a URL to
:mod:`rlds_cli.remote.reader`. It lives apart from :mod:`rlds_cli.cache.dataset` because the
remote reader's dataset *is* a :class:`~rlds_cli.cache.dataset.Dataset`: with the opener in
``dataset.py`` the two modules would import each other.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rlds_cli.cache.dataset import Dataset, _identity
from rlds_cli.cache.layout import SEGMENTED_LAYOUT, is_url
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import CorruptDatasetError, DatasetNotFoundError, DatasetReplacedError

__all__ = ["open_dataset"]

#: How often :func:`open_dataset` tries again while a replacement of the dataset is under way.
_OPEN_ATTEMPTS = 20
_OPEN_RETRY_SECONDS = 0.005


def open_dataset(
    name: str,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    *,
    cache: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
) -> Dataset:
    """Open a converted dataset read-only.

    Args:
        name: The dataset's name in the cache (see ``rlds list``), or a registry id or alias
            of a downloaded dataset (see :func:`rlds_cli.resolve_name`), or the URL of a zarr
            dataset pushed with ``rlds push`` (``s3://bucket/prefix/NAME``, any fsspec URL): it
            is then read where it lies (see :class:`rlds_cli.remote.reader.RemoteDataset`).
        root: Cache root; ``None`` uses ``$RLDS_HOME`` or the platform cache dir.
        cache: For a URL: a folder where the files read are kept, so that a second pass reads
            nothing from the store (default ``$RLDS_REMOTE_CACHE``; none: ranged reads only).
        storage_options: For a URL: keyword arguments of its fsspec filesystem (credentials...).
        endpoint_url: For an ``s3://`` URL: an S3-compatible server.

    Returns:
        A :class:`Dataset`.

    Raises:
        DatasetNotFoundError: No dataset of that name in the cache.
        CorruptDatasetError: The dataset's files do not match its manifest.
        RemoteNotReadableError: A URL of a memmap dataset (pull it instead).
    """
    if is_url(name):  # the remote reader is imported only for a URL
        from rlds_cli.remote.reader import open_remote

        return open_remote(name, cache=cache, storage_options=storage_options, endpoint_url=endpoint_url)
    cache_root = root if isinstance(root, CacheRoot) else CacheRoot(root)
    name = _cache_name(name, cache_root)
    directory = cache_root.dataset_dir(name)
    for attempt in range(_OPEN_ATTEMPTS):
        before = _identity(directory)
        try:
            manifest = cache_root.manifest(name)
            dataset = _dataset_class(manifest)(directory, manifest)
            if dataset._identity == before:  # manifest, index and directory of one version
                return dataset
        except (DatasetNotFoundError, CorruptDatasetError, DatasetReplacedError):
            if attempt + 1 == _OPEN_ATTEMPTS or not _being_replaced(cache_root, directory, before):
                raise
        time.sleep(_OPEN_RETRY_SECONDS)
    raise DatasetReplacedError(f"dataset {name!r} kept being replaced while it was opened")


def _dataset_class(manifest: Any) -> type[Dataset]:
    """The reader class of a manifest's layout: a growing dataset's segments and commit log
    are read by :class:`~rlds_cli.cache.growing.GrowingDataset`."""
    if manifest.layout == SEGMENTED_LAYOUT:
        from rlds_cli.cache.growing import GrowingDataset

        return GrowingDataset
    return Dataset


def _cache_name(name: str, cache: CacheRoot) -> str:
    """The cache name ``name`` refers to (a registry alias resolves to its dataset's name).

    A name found nowhere is returned as it is: the open that follows either finds it once a
    replacement under way has finished, or raises with the name the user gave."""
    from rlds_cli.names import resolve_name

    try:
        return resolve_name(name, cache)
    except DatasetNotFoundError:
        return name


def _being_replaced(cache: CacheRoot, directory: Path, before: tuple[int, int, int] | None) -> bool:
    """Whether a failed open may have raced with a rebuild: the directory changed, or a
    replaced version is on its way out (``publish`` renames it to ``tmp/*.trash`` first)."""
    if _identity(directory) != before:
        return True
    return cache.tmp_dir.is_dir() and any(cache.tmp_dir.glob(f"{directory.name}.*.trash"))
