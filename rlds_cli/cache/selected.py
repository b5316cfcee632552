"""Views made in memory and never published: a selection of episodes, or a filter key's.

:func:`select_episodes` (``Loader(NAME, episodes=[...])``) builds the manifest and index ``rlds
view`` would publish (:func:`rlds_cli.cache.derive.view_manifest`, O(episodes)) and opens them
as a :class:`SelectedDataset`, which reads its parent's columns as a published view does.
Nothing is written to the cache.

Filter keys are named episode subsets kept from the source (robomimic's ``mask/<key>``): names
in the manifest's ``source.metadata.filter_keys`` and, in ``source_metadata.npz``, the bool array
:data:`MEMBER_ARRAY` (one row per episode, one column per name). A view reads its parent's rows.
:func:`filtered_dataset` (``Loader(NAME, filter_key="train")``) is the in-memory view of one
key; ``rlds view NAME --filter-key KEY --name N`` publishes it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import view_manifest
from rlds_cli.cache.episode_table import parse_episode_list
from rlds_cli.cache.integrity import check_episode_index
from rlds_cli.cache.layout import MANIFEST_FILE
from rlds_cli.cache.manifest import Manifest
from rlds_cli.errors import InvalidSelectionError

__all__ = [
    "MEMBER_ARRAY",
    "SelectedDataset",
    "filter_key_episodes",
    "filter_key_names",
    "filtered_dataset",
    "select_episodes",
]


class SelectedDataset(Dataset):
    """A view of some episodes of a stored dataset, held in memory.

    :attr:`directory` is the parent's folder, so reads fail once the parent is replaced;
    :meth:`size_bytes` is 0. Pickles as its manifest and index (workers reopen the same selection).
    """

    def __init__(self, parent_dir: str | os.PathLike[str], manifest: Manifest, index: np.ndarray) -> None:
        self._given_index = index
        super().__init__(parent_dir, manifest)

    def _load_episode_index(self) -> np.ndarray:
        index = self._given_index
        check_episode_index(index, self.num_steps, self.num_episodes, self.directory, name=self.name)
        return index

    def size_bytes(self) -> int:
        return 0

    def __getstate__(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "manifest": self.manifest.to_dict(),
            "index": self.episode_index,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        SelectedDataset.__init__(
            self, state["directory"], Manifest.from_dict(state["manifest"]), state["index"]
        )


def select_episodes(
    dataset: Dataset,
    episodes: Sequence[int] | np.ndarray | str,
    *,
    name: str | None = None,
) -> SelectedDataset:
    """The episodes ``episodes`` of ``dataset`` (positions, any order, each once; or a list
    such as ``"0,5,9-20"``) as an unpublished view, in the dataset's order.

    Raises:
        InvalidSelectionError: A position outside the dataset, or ``dataset`` is not stored in
            the cache (a growing dataset, one read at a URL).
    """
    if isinstance(episodes, str):
        ids = parse_episode_list(episodes, dataset.num_episodes)
    else:
        raw = np.asarray(episodes).reshape(-1)
        spec: list[int] = raw.tolist() if raw.dtype.kind in "iu" or raw.size == 0 else []
        if raw.size and raw.dtype.kind not in "iu":
            raise InvalidSelectionError(f"episode positions must be integers, got {raw.dtype}")
        ids = parse_episode_list(spec, dataset.num_episodes)
        if len(ids) != len(raw):
            raise InvalidSelectionError(f"episodes: {len(raw) - len(ids)} position(s) given twice")
    parent = dataset.view_parent()
    if parent is not None:  # a selection of a view reads the stored arrays of its parent
        dataset, ids = parent[0], parent[1][ids]
    if not (dataset.directory / MANIFEST_FILE).is_file():
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} is not stored in the local cache: a selection reads a stored dataset",
            hint="pull it first ('rlds pull URL')",
        )
    label = name if name is not None else f"{dataset.name}[{len(ids)} episodes]"
    manifest, index = view_manifest(dataset, dataset.name, label, ids, "")
    return SelectedDataset(dataset.directory, manifest, index)


#: The source array of filter-key membership (bool ``[episodes, keys]``).
MEMBER_ARRAY = "filter_keys/episode_member"


def filter_key_names(dataset: Dataset) -> list[str]:
    """The filter keys of ``dataset`` (a view: its parent's), in :data:`MEMBER_ARRAY` column
    order; empty when none."""
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
    """``dataset``'s episodes of filter key ``key`` as an in-memory view named ``NAME[key]``.

    Raises:
        InvalidSelectionError: As :func:`filter_key_episodes`.
    """
    return select_episodes(dataset, filter_key_episodes(dataset, key), name=f"{dataset.name}[{key}]")


def selection(
    dataset: Dataset, *, episodes: Sequence[int] | np.ndarray | str | None, filter_key: str | None
) -> SelectedDataset:
    """``dataset``'s episodes ``episodes`` (:func:`select_episodes`) or those of filter key
    ``filter_key`` (:func:`filtered_dataset`): exactly one of the two.

    Raises:
        ValueError: Both or neither given.
        InvalidSelectionError: As :func:`select_episodes` and :func:`filter_key_episodes`.
    """
    if (episodes is None) == (filter_key is None):
        raise ValueError(
            "give episodes= or filter_key=, not both (make a view of one, then select)"
            if episodes is not None
            else "give episodes= or filter_key="
        )
    if filter_key is not None:
        return filtered_dataset(dataset, filter_key)
    assert episodes is not None
    return select_episodes(dataset, episodes)
