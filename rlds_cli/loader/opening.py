"""Open a dataset by cache name, registry id or alias, or URL (``rlds_cli.open_dataset``).

A URL is read in place (:mod:`rlds_cli.remote.reader`); an alias or registry id is resolved
(:mod:`rlds_cli.catalog.registry`) and opened with :func:`rlds_cli.cache.opening.open_dataset`.
Every user-given name (loader, ``NormalizationStats.from_dataset``, preprocess) opens through here.
"""

from __future__ import annotations

import os
from typing import Any

from rlds_cli.cache import opening
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import is_url
from rlds_cli.cache.root import CacheRoot
from rlds_cli.catalog.registry import resolve_name
from rlds_cli.errors import DatasetNotFoundError

__all__ = ["open_dataset"]


def open_dataset(
    name: str,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    *,
    cache: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
    cache_limit: int | str | None = None,
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
        cache_limit: For a URL: bytes ``cache`` may hold (``"20G"``; default
            ``$RLDS_REMOTE_CACHE_LIMIT``): it then keeps checked blocks, evicted least recently
            used (see :mod:`rlds_cli.remote.block_cache`).

    Returns:
        A :class:`~rlds_cli.cache.dataset.Dataset`.

    Raises:
        DatasetNotFoundError: No dataset of that name in the cache.
        CorruptDatasetError: The dataset's files do not match its manifest.
        RemoteNotReadableError: A URL of a memmap dataset (pull it instead).
    """
    if is_url(name):  # the remote reader is imported only for a URL
        from rlds_cli.remote.reader import open_remote

        return open_remote(
            name,
            cache=cache,
            storage_options=storage_options,
            endpoint_url=endpoint_url,
            cache_limit=cache_limit,
        )
    cache_root = root if isinstance(root, CacheRoot) else CacheRoot(root)
    return opening.open_dataset(_cache_name(name, cache_root), cache_root)


def _cache_name(name: str, cache: CacheRoot) -> str:
    """The cache name ``name`` refers to; an unknown name is returned unchanged, so the open that
    follows raises with the user's name (or finds it once a replacement under way finishes)."""
    try:
        return resolve_name(name, cache)
    except DatasetNotFoundError:
        return name
