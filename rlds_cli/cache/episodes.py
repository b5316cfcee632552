"""The episode index (``episodes.npy``): one row per episode, written once per dataset by
whichever writer built it (conversion, a view, a preprocess job); read, and checked against
the manifest, by :class:`~rlds_cli.cache.dataset.Dataset`.

A row is :data:`~rlds_cli.cache.ted.EPISODE_DTYPE`: the episode's first step, its length, the
source's own id of it, and whether its final observation is the real one.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rlds_cli.cache.layout import EPISODES_FILE
from rlds_cli.cache.ted import EPISODE_DTYPE


def build_index(ends: np.ndarray, source_ids: np.ndarray, final_known: np.ndarray) -> np.ndarray:
    """The index of consecutive episodes whose last steps are ``ends`` (sorted step numbers).

    A negative source id (the source did not say) becomes the episode's position.
    """
    ends = np.asarray(ends, np.int64).reshape(-1)
    ids = np.asarray(source_ids, np.int64).reshape(-1)
    index = np.zeros(len(ends), EPISODE_DTYPE)
    index["start"][1:] = ends[:-1] + 1
    index["length"] = ends + 1 - index["start"]
    index["source_id"] = np.where(ids >= 0, ids, np.arange(len(ends)))
    index["final_known"] = np.asarray(final_known, bool).reshape(-1)
    return index


def slice_index(index: np.ndarray, first: int, stop: int) -> tuple[np.ndarray, int]:
    """The index of episodes ``[first, stop)`` of ``index`` as a dataset of their own (a view):
    starts counted from the first one's, and that first start (the steps before it)."""
    part = np.zeros(stop - first, EPISODE_DTYPE)
    for field in EPISODE_DTYPE.names or ():
        part[field] = index[first:stop][field]
    offset = int(part["start"][0]) if len(part) else 0
    part["start"] -= offset
    return part, offset


def select_index(index: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The index of episodes ``ids`` (ascending positions in ``index``) as a dataset of their own
    (a view of a selection): their rows, with starts counted anew from 0."""
    part = np.zeros(len(ids), EPISODE_DTYPE)
    for field in EPISODE_DTYPE.names or ():
        part[field] = index[ids][field]
    part["start"] = np.cumsum(part["length"]) - part["length"]
    return part


def write_index(directory: Path, index: np.ndarray, *, fsync: bool) -> None:
    """Write ``index`` as the episode index of the dataset being built in ``directory`` (a
    build directory nobody reads yet: no temp file needed; the manifest commits it)."""
    with open(directory / EPISODES_FILE, "wb") as fh:
        np.save(fh, np.asarray(index, EPISODE_DTYPE), allow_pickle=False)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
