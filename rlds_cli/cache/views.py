"""Views, the read side: derived datasets that select a parent's episodes and share its arrays.

A view's directory holds ``manifest.json`` (``layout: "view"``, the parent's name and manifest
digest, and a range ``[a, b)`` or ascending ``episode_ids``) and its own ``episodes.npy``. Its
columns are the parent's rows of those episodes: a :class:`SlicedColumn` for a range, a
:class:`GatheredColumn` for a selection, so the flat layout holds and every reader works
unchanged. A view refuses to open once its parent is replaced, and ``rlds rm`` refuses to remove
a parent with views. Making views: :mod:`rlds_cli.cache.derive`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli._util.numbers import parse_range  # also for formats/select.py, which imports it from here
from rlds_cli.cache.layout import VIEW_LAYOUT
from rlds_cli.cache.manifest import Manifest
from rlds_cli.errors import InvalidSelectionError

__all__ = ["VIEW_LAYOUT", "GatheredColumn", "SlicedColumn", "ViewSpec", "parse_episode_range", "parse_range"]


class SlicedColumn:
    """Rows ``[start, stop)`` of a column, indexed like a numpy array along the first axis."""

    def __init__(self, column: Any, start: int, stop: int) -> None:
        self._column = column
        self._start = start
        self.shape = (stop - start, *tuple(column.shape[1:]))
        self.dtype = np.dtype(column.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            return self._column[self._start + start : self._start + stop : step]
        if isinstance(index, int | np.integer):
            if not -self.shape[0] <= index < self.shape[0]:
                raise IndexError(f"row {index} out of range for {self.shape[0]} rows")
            return self._column[self._start + int(index) % self.shape[0]]
        idx = np.asarray(index, dtype=np.int64)
        return self._column[np.where(idx < 0, idx + self.shape[0], idx) + self._start]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._column[self._start : self._start + self.shape[0]])
        return data.astype(dtype) if dtype is not None else data

    @property
    def stored_format(self) -> Any:
        """The frame format the column's rows are stored in, where they can be given as stored
        (:meth:`encoded_rows`); ``None`` otherwise."""
        return getattr(self._column, "stored_format", None)

    def encoded_rows(self, rows: np.ndarray) -> Any:
        """Rows ``rows`` as stored (image files), where :attr:`stored_format` is not ``None``."""
        return self._column.encoded_rows(np.asarray(rows, np.int64) + self._start)


class GatheredColumn:
    """Rows ``rows`` (ascending) of a column, indexed like a numpy array along the first axis."""

    def __init__(self, column: Any, rows: np.ndarray) -> None:
        self._column = column
        self._rows = np.asarray(rows, np.int64)
        self.shape = (len(self._rows), *tuple(column.shape[1:]))
        self.dtype = np.dtype(column.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, int | np.integer):
            if not -self.shape[0] <= index < self.shape[0]:
                raise IndexError(f"row {index} out of range for {self.shape[0]} rows")
            return self._column[int(self._rows[int(index)])]
        rows = self._rows[index] if isinstance(index, slice) else self._rows[np.asarray(index, np.int64)]
        return self._column[rows]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._column[self._rows])
        return data.astype(dtype) if dtype is not None else data

    @property
    def stored_format(self) -> Any:
        """As :attr:`SlicedColumn.stored_format`."""
        return getattr(self._column, "stored_format", None)

    def encoded_rows(self, rows: np.ndarray) -> Any:
        """Rows ``rows`` as stored (image files), where :attr:`stored_format` is not ``None``."""
        return self._column.encoded_rows(self._rows[np.asarray(rows, np.int64)])


def parse_episode_range(spec: str, num_episodes: int) -> tuple[int, int]:
    """``"A:B"`` (either side may be empty or negative, as a Python slice) -> ``(a, b)``."""
    start, stop, _ = slice(*parse_range(spec, negative=True)).indices(num_episodes)
    if stop <= start:
        raise InvalidSelectionError(f"episode range {spec!r} selects no episode of {num_episodes}")
    return start, stop


@dataclass(frozen=True)
class ViewSpec:
    """Where a view's rows lie in its parent: the episodes ``[first_episode, stop_episode)``, or,
    for a selection, only ``episode_ids`` (ascending, within those bounds)."""

    parent: str
    parent_digest: str
    first_episode: int
    stop_episode: int
    step_offset: int
    episode_ids: tuple[int, ...] | None = None

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> ViewSpec:
        s = manifest.source
        ids = s.get("episode_ids")
        return cls(
            s["parent"],
            s["parent_digest"],
            int(s["episodes"][0]),
            int(s["episodes"][1]),
            int(s["step_offset"]),
            None if ids is None else tuple(int(i) for i in ids),
        )

    def parent_episodes(self) -> np.ndarray:
        """The parent's positions of the view's episodes, in the view's order."""
        if self.episode_ids is None:
            return np.arange(self.first_episode, self.stop_episode, dtype=np.int64)
        return np.asarray(self.episode_ids, np.int64)

    def rows(self, storage: str, num_steps: int) -> tuple[int, int]:
        """The parent rows of a column with this storage kind (a range view's)."""
        start = self.step_offset + (self.first_episode if storage == "flat" else 0)
        count = num_steps + (self.stop_episode - self.first_episode if storage == "flat" else 0)
        return start, start + count

    def gathered_rows(self, storage: str, parent_index: np.ndarray) -> np.ndarray:
        """The parent rows of a column with this storage kind, for a selection: each selected
        episode's steps (``flat``: and its final observation, the row after them)."""
        ids = self.parent_episodes()
        starts = parent_index["start"][ids].astype(np.int64)
        lengths = parent_index["length"][ids].astype(np.int64)
        if storage == "flat":  # step t of episode e sits in flat row t + e
            starts, lengths = starts + ids, lengths + 1
        before = np.cumsum(lengths) - lengths
        return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
