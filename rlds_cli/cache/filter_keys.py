"""Filter keys: named subsets of a dataset's episodes kept from its source (robomimic's
``mask/<key>``), and the views they make.

A reader keeps them at conversion by episode position: their names in the manifest
(``source.metadata.filter_keys``, a list) and, in ``source_metadata.npz``, a bool array
:data:`MEMBER_ARRAY` with one row per episode and one column per name (row ``i`` says which keys
hold the dataset's episode ``i``; ``--episodes A:B`` cuts it with the episodes). A view (``rlds
view``, ``rlds split``) reads its parent's, row for row.

:func:`filtered_dataset` is the view of one key made in memory, unpublished
(``Loader(NAME, filter_key="train")``); ``rlds view NAME --filter-key KEY --name N`` publishes
the same episodes as a view of its own.
"""

from __future__ import annotations

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.selected import SelectedDataset, select_episodes
from rlds_cli.errors import InvalidSelectionError

__all__ = ["MEMBER_ARRAY", "filter_key_episodes", "filter_key_names", "filtered_dataset"]

#: The source array of filter-key membership (bool ``[episodes, keys]``).
MEMBER_ARRAY = "filter_keys/episode_member"


def filter_key_names(dataset: Dataset) -> list[str]:
    """The filter keys of ``dataset`` (its source's, or its parent's for a view), in the order
    of :data:`MEMBER_ARRAY`'s columns; empty when it has none."""
    names = dataset.source_metadata.get("filter_keys")
    return [str(n) for n in names] if isinstance(names, list) else []


def filter_key_episodes(dataset: Dataset, key: str) -> np.ndarray:
    """The positions (ascending, int64) of ``dataset``'s episodes that filter key ``key`` holds.

    Raises:
        InvalidSelectionError: ``dataset`` has no such key (the message lists those it has), or
            the key holds none of its episodes.
    """
    names = filter_key_names(dataset)
    if key not in names:
        known = ", ".join(names) if names else "none (its source had no mask/ filter keys)"
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} has no filter key {key!r}; its filter keys: {known}",
            hint="pick one of its filter keys, or select episodes with --episodes A:B",
        )
    view = dataset.view_parent()
    owner, rows = (dataset, None) if view is None else view
    member = owner.source_arrays.get(MEMBER_ARRAY)
    if member is None or member.ndim != 2 or member.shape[1] != len(names):
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} names filter keys but keeps no {MEMBER_ARRAY!r} array of "
            f"{len(names)} columns",
            hint=f"convert the source again ('rlds download SOURCE --name {dataset.name} --force')",
        )
    column = member[:, names.index(key)] if rows is None else member[rows, names.index(key)]
    ids = np.flatnonzero(column).astype(np.int64)
    if len(ids) == 0:
        raise InvalidSelectionError(
            f"filter key {key!r} holds none of the episodes of dataset {dataset.name!r}"
        )
    return ids


def filtered_dataset(dataset: Dataset, key: str) -> SelectedDataset:
    """``dataset``'s episodes of filter key ``key``, as a view made in memory and never
    published (:func:`rlds_cli.cache.selected.select_episodes`), named ``NAME[key]``.

    Raises:
        InvalidSelectionError: As :func:`filter_key_episodes`.
    """
    return select_episodes(dataset, filter_key_episodes(dataset, key), name=f"{dataset.name}[{key}]")
