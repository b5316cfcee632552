"""Opening a cached dataset by its cache name.

:func:`open_dataset` retries while a replacement is being published, so a reader never sees half
of one version, and picks the reader class by layout. Registry aliases and URLs are resolved by
:func:`rlds_cli.loader.opening.open_dataset` (``rlds_cli.open_dataset``); the cache imports
neither :mod:`rlds_cli.catalog.registry` nor :mod:`rlds_cli.remote.reader`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlds_cli.cache.composed import ComposedDataset
from rlds_cli.cache.dataset import Dataset, version_identity
from rlds_cli.cache.layout import COMPOSED_LAYOUT, SEGMENTED_LAYOUT
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import CorruptDatasetError, DatasetNotFoundError, DatasetReplacedError

if TYPE_CHECKING:
    from rlds_cli.cache.manifest import Manifest

__all__ = ["open_dataset", "open_published"]

#: How often :func:`open_dataset` tries again while a replacement of the dataset is under way.
_OPEN_ATTEMPTS = 20
_OPEN_RETRY_SECONDS = 0.005


def open_dataset(name: str, root: str | os.PathLike[str] | CacheRoot | None = None) -> Dataset:
    """Open the cached dataset ``name`` read-only (a cache name: see ``rlds list``).

    Args:
        name: The dataset's name in the cache. A registry alias or a URL is opened by
            :func:`rlds_cli.open_dataset`, which resolves it first.
        root: Cache root; ``None`` uses ``$RLDS_HOME`` or the platform cache dir.

    Returns:
        A :class:`Dataset`.

    Raises:
        DatasetNotFoundError: No dataset of that name in the cache.
        CorruptDatasetError: The dataset's files do not match its manifest.
    """
    cache_root = root if isinstance(root, CacheRoot) else CacheRoot(root)
    directory = cache_root.dataset_dir(name)
    for attempt in range(_OPEN_ATTEMPTS):
        before = version_identity(directory)
        try:
            manifest = cache_root.manifest(name)
            dataset = open_published(directory, manifest)
            if dataset.identity == before:  # manifest, index and directory of one version
                return dataset
        except DatasetReplacedError:
            # a growing dataset's segment retired while its view was made (grace_seconds=0)
            if attempt + 1 == _OPEN_ATTEMPTS:
                raise
        except (DatasetNotFoundError, CorruptDatasetError):
            if attempt + 1 == _OPEN_ATTEMPTS or not _being_replaced(cache_root, directory, before):
                raise
        time.sleep(_OPEN_RETRY_SECONDS)
    raise DatasetReplacedError(f"dataset {name!r} kept being replaced while it was opened")


def open_published(directory: Path, manifest: Manifest) -> Dataset:
    """The dataset in ``directory`` whose manifest is ``manifest``, opened by its layout's reader
    (:class:`~rlds_cli.cache.growing.GrowingDataset`, :class:`~rlds_cli.cache.composed.ComposedDataset`
    or :class:`Dataset`)."""
    if manifest.layout == COMPOSED_LAYOUT:
        return ComposedDataset(directory, manifest)
    if manifest.layout == SEGMENTED_LAYOUT:
        from rlds_cli.cache.growing import GrowingDataset

        return GrowingDataset(directory, manifest)
    return Dataset(directory, manifest)


def _being_replaced(cache: CacheRoot, directory: Path, before: tuple[int, int, int] | None) -> bool:
    """Whether a failed open may have raced with a rebuild: the directory changed, or a
    replaced version sits in ``tmp/*.trash``."""
    if version_identity(directory) != before:
        return True
    return cache.tmp_dir.is_dir() and any(cache.tmp_dir.glob(f"{directory.name}.*.trash"))
