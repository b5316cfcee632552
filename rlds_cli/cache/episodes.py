"""The episode index and the step -> episode lookup.

The episode index (``episodes.npy``): one row per episode, written once per dataset by
whichever writer built it (conversion, a view, a preprocess job); read, and checked against
the manifest, by :class:`~rlds_cli.cache.dataset.Dataset`.

A row is :data:`~rlds_cli.cache.ted.EPISODE_DTYPE`: the episode's first step, its length, the
source's own id of it, and whether its final observation is the real one.

**Lookup.** The step -> episode lookup of a large dataset without a per-step table: a block index.

``np.searchsorted(ends, steps, side="right")`` answers "which episode holds step ``t``" with a
binary search per step: about ``log2(E)`` dependent reads over the episode ends, a cache miss
each once the ends outgrow the CPU caches. On a 256-step batch of a 50M-step dataset (50,000
episodes) that search cost about half as much as gathering the batch's rows, and it grows with
the dataset. A step -> episode table (one ``take``) costs 4-8 bytes a step (1.6 GB at 200M
steps) and a cache miss a step once it is large.

:class:`BlockIndex` keeps one entry per block of ``2**shift`` steps (the episode holding the
block's first step), with the blocks no longer than the shortest episode where that fits the
entry budget (:data:`MAX_BLOCKS`), so that a block holds at most one episode start. A lookup is
a shift, a ``take`` of the block's entry and one correction per episode start a block can hold
(``e += t >= ends[e]``, the first from the end kept in the block's entry): a fixed number of
vectorised steps over arrays of at most a few MB, whatever the dataset's size. Its answers are
exactly ``searchsorted``'s, for every integer step (negative steps give 0, steps past the end
give the number of episodes, as the search does); :meth:`BlockIndex.build` declines (``None``)
where a block would hold more than :data:`MAX_PASSES` episode starts (many very short episodes
over a huge dataset).
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


#: The most entries a block index holds (8 MB of int64): blocks grow past the shortest episode
#: beyond that, and each lookup then makes more corrections.
MAX_BLOCKS = 1 << 20
#: The most corrections a lookup makes (episode starts a block may hold); above, no index.
MAX_PASSES = 4
#: Below this many episodes a binary search over the ends (in the CPU's first-level cache) is
#: as fast as the index's fixed steps.
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
        # the episode ends, then a sentinel no step reaches: a correction past the last episode
        # (a step past the end) stops there instead of reading out of range
        self._ends = np.append(np.asarray(ends, np.int64), _END)
        # each block's first episode beside that episode's end, in one row: the first
        # correction reads the cache line the block's entry came in (one random read a step,
        # not two dependent ones)
        self._blocks = np.stack([first, self._ends[first]], axis=1)
        # bound once: a lookup runs at every batch, where each attribute lookup shows
        self._take_block = self._blocks.take
        self._take_end = self._ends.take

    @classmethod
    def build(cls, ends: np.ndarray) -> BlockIndex | None:
        """The index over episodes ending (exclusive) at the cumulative ``ends`` (int64, increasing,
        positive lengths), or ``None`` where a binary search is as good (fewer than
        :data:`MIN_EPISODES` episodes) or the index would need more than :data:`MAX_PASSES`
        corrections a lookup."""
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
        # the episode of each block's last step; the last block's "last step" is the end of the
        # data itself, so that steps past it reach len(ends) as the search does
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
