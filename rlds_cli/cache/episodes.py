"""The episode index and the step -> episode lookup.

The episode index (``episodes.npy``) has one :data:`~rlds_cli.cache.ted.EPISODE_DTYPE` row per
episode (first step, length, source id, whether the final observation is real), written once
per dataset and checked against the manifest by :class:`~rlds_cli.cache.dataset.Dataset`.

:class:`BlockIndex` answers "which episode holds step ``t``" in a fixed number of vectorised
steps: one entry per block of ``2**shift`` steps, then one correction per episode start a block
can hold. ``np.searchsorted`` over the ends cost about half a 256-step gather on a 50M-step
dataset, and a per-step table costs 4-8 bytes a step. Answers equal
``np.searchsorted(ends, steps, side="right")`` for every integer step; :meth:`BlockIndex.build`
returns ``None`` where a block would hold more than :data:`MAX_PASSES` starts.
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
    """The index of episodes ``[first, stop)`` with starts rebased to 0, and the first start
    (the step offset)."""
    part = np.zeros(stop - first, EPISODE_DTYPE)
    for field in EPISODE_DTYPE.names or ():
        part[field] = index[first:stop][field]
    offset = int(part["start"][0]) if len(part) else 0
    part["start"] -= offset
    return part, offset


def select_index(index: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rows of episodes ``ids`` (ascending positions), with starts recounted from 0."""
    part = np.zeros(len(ids), EPISODE_DTYPE)
    for field in EPISODE_DTYPE.names or ():
        part[field] = index[ids][field]
    part["start"] = np.cumsum(part["length"]) - part["length"]
    return part


def write_index(directory: Path, index: np.ndarray, *, fsync: bool) -> None:
    """Write ``index`` as the episode index of the build in ``directory`` (unread until the
    manifest commits it, so no temp file)."""
    with open(directory / EPISODES_FILE, "wb") as fh:
        np.save(fh, np.asarray(index, EPISODE_DTYPE), allow_pickle=False)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())


#: The most entries a block index holds (8 MB of int64); beyond, blocks grow past the shortest
#: episode and lookups make more corrections.
MAX_BLOCKS = 1 << 20
#: The most corrections a lookup makes (episode starts a block may hold); above, no index.
MAX_PASSES = 4
#: Below this many episodes a binary search is as fast as the index.
MIN_EPISODES = 16

_END = np.iinfo(np.int64).max


class BlockIndex:
    """The episode of each step, from one entry per block of ``2**shift`` steps.

    Built by :meth:`build`; :meth:`episode_of` returns what
    ``np.searchsorted(ends, steps, side="right")`` returns.

    Attributes:
        shift: log2 of the steps a block covers.
        first: The episode holding each block's first step, int64 (16 bytes a block are kept:
            this and that episode's end).
        passes: Corrections a lookup makes: the most episode starts one block holds after its
            first step (the end of the data counting as one for the last block).
    """

    def __init__(self, ends: np.ndarray, shift: int, first: np.ndarray, passes: int) -> None:
        self.shift = shift
        self.first = first
        self.passes = passes
        # a sentinel end no step reaches: a correction never reads out of range
        self._ends = np.append(np.asarray(ends, np.int64), _END)
        # first episode and its end in one row: one random read a step, not two dependent ones
        self._blocks = np.stack([first, self._ends[first]], axis=1)
        # bound once: a lookup runs at every batch
        self._take_block = self._blocks.take
        self._take_end = self._ends.take

    @classmethod
    def build(cls, ends: np.ndarray) -> BlockIndex | None:
        """The index over episodes ending (exclusive) at the increasing ``ends``, or ``None``
        below :data:`MIN_EPISODES` episodes or above :data:`MAX_PASSES` corrections a lookup."""
        ends = np.asarray(ends, np.int64)
        if len(ends) < MIN_EPISODES:
            return None
        n = int(ends[-1])
        shortest = int(np.diff(ends, prepend=0).min())
        # blocks no longer than the shortest episode (one start a block at most) ...
        shift = shortest.bit_length() - 1
        # ... unless that makes more than MAX_BLOCKS of them
        shift = max(shift, (-(-n // MAX_BLOCKS) - 1).bit_length())
        size = 1 << shift
        block_starts = np.arange(0, n, size, dtype=np.int64)
        first = np.searchsorted(ends, block_starts, side="right").astype(np.int64)
        # the last block's "last step" is the end of the data: steps past it reach len(ends)
        last = np.minimum(block_starts + size - 1, n - 1)
        last[-1] = n
        passes = int((np.searchsorted(ends, last, side="right") - first).max())
        if passes > MAX_PASSES:
            return None
        return cls(ends, shift, first, passes)

    def episode_of(self, steps: np.ndarray) -> np.ndarray:
        """The episode of each of ``steps`` (an integer array of any shape), int64."""
        # clip: a negative step reads block 0 (episode 0, as the search says), a step past the
        # data the last block (whose corrections end at len(ends))
        block = self._take_block(steps >> self.shift, 0, None, "clip")
        episode = block[..., 0] + (steps >= block[..., 1])
        # the other corrections, where a block holds more than one episode start
        for _ in range(self.passes - 1):
            episode += steps >= self._take_end(episode)
        return episode
