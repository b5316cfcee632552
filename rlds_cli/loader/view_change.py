"""How the rows of one view of a growing dataset map to the next one's.

A refresh of a :class:`~rlds_cli.cache.growing.GrowingDataset` appends episodes and evicts
unprotected ones (oldest first, possibly leaving holes), so row ``t`` of two views differs in
general. Episodes are tied by their log number (:attr:`GrowingDataset.episode_ids`: stable across
views, increasing along a view); a surviving episode keeps its length. :class:`ViewChange` lets a
sampler carry per-row state (priorities, an epoch's remaining order) by row identity, never by
position. Numpy, linear in the episodes (and rows carried), computed lazily.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.cumsum(lengths) - lengths


class ViewChange:
    """Maps rows of an old view to a new view by episode id (see the module docstring).

    Args:
        old_ids, old_lengths: Episode ids (increasing) and lengths of the old view.
        new_ids, new_lengths: The same of the new view.
    """

    def __init__(
        self, old_ids: np.ndarray, old_lengths: np.ndarray, new_ids: np.ndarray, new_lengths: np.ndarray
    ) -> None:
        self.old_ids = np.asarray(old_ids, np.int64)
        self.new_ids = np.asarray(new_ids, np.int64)
        self.old_lengths = np.asarray(old_lengths, np.int64)
        #: Episode lengths of the new view.
        self.lengths = np.asarray(new_lengths, np.int64)
        #: Steps of the new view; ``old_steps``: of the old one.
        self.num_steps = int(self.lengths.sum())
        self.old_steps = int(self.old_lengths.sum())
        n = len(self.old_ids)
        #: Only appends: every old row is the new view's row of the same number.
        self.appended_only = n <= len(self.new_ids) and bool(np.array_equal(self.new_ids[:n], self.old_ids))

    @cached_property
    def _episode_to(self) -> np.ndarray:
        """Each old episode's place in the new view, -1 where it left (evicted)."""
        if not len(self.new_ids):
            return np.full(len(self.old_ids), -1, np.int64)
        at = np.searchsorted(self.new_ids, self.old_ids)
        clipped = np.minimum(at, len(self.new_ids) - 1)
        return np.where(self.new_ids[clipped] == self.old_ids, clipped, -1).astype(np.int64)

    def map_rows(self, rows: np.ndarray) -> np.ndarray:
        """The new view's row of each old row in ``rows`` (any shape), -1 for an evicted one."""
        rows = np.asarray(rows, np.int64)
        if self.appended_only:
            return rows.copy()
        old_starts = _starts(self.old_lengths)
        episode = np.searchsorted(np.cumsum(self.old_lengths), rows, side="right")
        to = self._episode_to[episode]
        new_starts = _starts(self.lengths)
        moved = new_starts[np.maximum(to, 0)] + rows - old_starts[episode]
        return np.where(to >= 0, moved, -1)

    def survivors(self) -> tuple[np.ndarray | slice, np.ndarray | slice]:
        """``(old rows, new rows)`` of every row in both views, in the same order (slices when
        only appends happened)."""
        if self.appended_only:
            return slice(0, self.old_steps), slice(0, self.old_steps)
        kept = np.flatnonzero(self._episode_to >= 0)
        lengths = self.old_lengths[kept]
        total = int(lengths.sum())
        within = np.arange(total, dtype=np.int64) - np.repeat(_starts(lengths), lengths)
        old = np.repeat(_starts(self.old_lengths)[kept], lengths) + within
        new = np.repeat(_starts(self.lengths)[self._episode_to[kept]], lengths) + within
        return old, new

    def carry(self, values: np.ndarray, fill: float) -> np.ndarray:
        """Per-row ``values`` of the old view as the new view's: a surviving row keeps its value,
        a new row gets ``fill``."""
        out = np.full(self.num_steps, fill, np.asarray(values).dtype)
        old, new = self.survivors()
        out[new] = np.asarray(values)[old]
        return out
