"""TED reads: step indices -> TED columns, from the flat layout the cache stores.

An observation-like key (``storage="flat"``) has ``N + E`` rows: step ``t`` of episode ``e(t)``
has ``key[t] = flat[t + e(t)]`` and ``next/key[t] = flat[t + e(t) + 1]`` (at an episode's end,
its final observation). Step keys (``storage="step"``) have ``N`` rows. ``next/done =
next/terminated | next/truncated`` and ``episode = e(t)`` are derived, never stored.

* :class:`Episodes`: episode bounds and the step -> episode lookup (table, block index of
  :mod:`rlds_cli.cache.episodes`, or binary search);
* :class:`VersionedColumn`: a column whose every read checks the dataset was not replaced;
* :class:`TedReader`: the TED keys of one dataset over any column source, at random steps
  (:meth:`TedReader.gather`) or over consecutive steps (:meth:`TedReader.range`).

The packed layouts of :mod:`rlds_cli.loader.sources` and :mod:`rlds_cli.loader.device` use
:meth:`Episodes.flat_rows` and a :class:`TedReader` for the keys they did not pack.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from rlds_cli.cache.buffers import BufferPool, gather_into, in_range
from rlds_cli.cache.episodes import BlockIndex
from rlds_cli.cache.manifest import FieldSpec
from rlds_cli.cache.ted import TedBatch, join_key

#: The two stored flags ``next/done`` is derived from.
DONE_FLAGS = ("next/terminated", "next/truncated")

_getitem = dict.__getitem__
# where a key comes from (TedReader's plan)
_FROM_STEPS, _FROM_ROWS, _FROM_NEXT_ROWS, _FROM_EPISODE, _FROM_DONE, _FROM_DONE_READ = range(6)


def ted_fields(fields: Mapping[str, FieldSpec]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The TED view of stored ``fields``: every readable key -> (per-step shape, dtype), root
    keys first, then the ``next/`` ones, each group sorted."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for key, spec in fields.items():
        out[key] = (spec.shape, spec.dtype)
        if spec.storage == "flat":
            out[f"next/{key}"] = (spec.shape, spec.dtype)
    out["next/done"] = ((1,), "bool")
    out["episode"] = ((), "int64")
    return dict(sorted(out.items(), key=lambda kv: (kv[0].startswith("next/"), kv[0])))


def resolve_keys(
    fields: Mapping[str, FieldSpec], keys: Iterable[str | tuple[str, ...]] | None, name: str
) -> list[str]:
    """The TED keys to read: ``keys`` (strings or tuples, deduplicated) checked against
    ``fields`` (``None``: every key, in :func:`ted_fields` order).

    Raises:
        KeyError: A key dataset ``name`` does not have.
    """
    available = ted_fields(fields)
    if keys is None:
        return list(available)
    wanted = list(dict.fromkeys(join_key(k) for k in keys))
    unknown = [k for k in wanted if k not in available]
    if unknown:
        raise KeyError(f"dataset {name!r} has no keys {unknown}; it has {sorted(available)}")
    return wanted


def stored_keys(fields: Mapping[str, FieldSpec], keys: Iterable[str]) -> set[str]:
    """The stored columns the TED ``keys`` are read from."""
    keys = set(keys)
    stored = {k for k in keys if k in fields}
    stored |= {k[5:] for k in keys if k.startswith("next/") and k[5:] in fields}
    if "next/done" in keys:
        stored |= set(DONE_FLAGS)
    return stored


class Episodes:
    """Episode boundaries as arrays, and the step -> episode lookup.

    Args:
        lengths: Steps per episode, in dataset order (episodes are contiguous).
        table: Keep a step -> episode table of this dtype (4 or 8 bytes a step, one ``take``
            per lookup); ``None``: a :class:`BlockIndex` or binary search.
    """

    # Class-level defaults: an Episodes made without __init__ (growing.empty_episodes) has them.
    #: The block index of :meth:`episode_of` once built (``None``: not built, or declined).
    _index: BlockIndex | None = None
    #: Whether the block index was built (or declined) already.
    _index_tried = False

    def __init__(self, lengths: np.ndarray, table: Any = None) -> None:
        self.lengths = np.asarray(lengths, np.int64).ravel()
        if self.lengths.size == 0 or (self.lengths <= 0).any():
            raise ValueError("episodes must be a non-empty list of positive lengths")
        self.ends = np.cumsum(self.lengths)
        self.starts = self.ends - self.lengths
        self.num_steps = int(self.ends[-1])
        #: The step -> episode table, when asked for.
        self.table: np.ndarray | None = None
        if table is not None:
            self.table = np.repeat(np.arange(len(self.lengths), dtype=table), self.lengths)

    @classmethod
    def of(cls, dataset: Any) -> Episodes:
        """The episodes of an opened :class:`~rlds_cli.cache.dataset.Dataset`."""
        return cls(dataset.episode_index["length"])

    def episode_of(self, steps: np.ndarray) -> np.ndarray:
        """The episode of each step, int64, as ``searchsorted(ends, steps, side="right")`` (a step
        past the end gives the number of episodes)."""
        if self.table is not None:
            episode = self.table.take(steps)
            return episode if episode.dtype == np.int64 else episode.astype(np.int64)
        index = self.block_index()
        # signed steps only: a uint64 step would compare as unsigned with the int64 ends
        if index is not None and type(steps) is np.ndarray and steps.dtype.kind == "i":
            return index.episode_of(steps)
        return np.searchsorted(self.ends, steps, side="right")

    def block_index(self) -> BlockIndex | None:
        """The block index, built at the first call, or ``None`` (a table, or
        :meth:`BlockIndex.build` declined)."""
        if not self._index_tried:
            self._index = BlockIndex.build(self.ends) if self.table is None else None
            self._index_tried = True
        return self._index

    def flat_rows(self, steps: np.ndarray) -> np.ndarray:
        """The flat row of each step: ``t + e(t)`` (its observation; the next one is the row after)."""
        return steps + self.episode_of(steps)

    def final_rows(self) -> np.ndarray:
        """The flat row of each episode's final observation (the row after its last step's)."""
        return self.ends + np.arange(len(self.ends))

    def steps_of_flat_rows(self, rows: np.ndarray) -> np.ndarray:
        """The step whose observation each flat row holds; an episode's final row (its last
        step's next observation) maps to that last step."""
        episode = np.searchsorted(self.starts + np.arange(len(self.starts)), rows, side="right") - 1
        return np.minimum(rows - episode, self.ends[episode] - 1)


class VersionedColumn:
    """A stored column whose reads check, after reading, that its dataset was not replaced.

    For backends that open files by path at every access (zarr): ``check`` raises
    :class:`~rlds_cli.errors.DatasetReplacedError`, so rows of two versions never mix. A read
    failing with ``OSError`` is checked too. Other attributes are the column's own.

    Args:
        column: The backend's column (numpy-style first-axis indexing, ``shape``, ``dtype``).
        check: Raises when the dataset was replaced.
    """

    __slots__ = ("_check", "column", "dtype", "shape")

    def __init__(self, column: Any, check: Callable[[], None]) -> None:
        self.column = column
        self.shape = tuple(column.shape)
        self.dtype = np.dtype(column.dtype)
        self._check = check

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            # numpy's protocols (``__array_interface__``) would bypass the check in __array__
            raise AttributeError(name)
        return getattr(self.column, name)

    def __getitem__(self, index: Any) -> np.ndarray:
        try:
            data = self.column[index]
        except OSError:
            self._check()
            raise
        self._check()
        return data

    def read_into(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (int64, in range) into ``out`` (C-contiguous), then checked."""
        read_into = getattr(self.column, "read_into", None)
        try:
            if read_into is not None:
                read_into(rows, out)
            else:
                out[...] = self.column[rows]
        except OSError:
            self._check()
            raise
        self._check()
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self[slice(None)]
        return data.astype(dtype) if dtype is not None else np.asarray(data)


def take(column: Any, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (any shape) of a column: ``take`` for numpy arrays, indexing otherwise."""
    if isinstance(column, np.ndarray):
        return column.take(rows, axis=0)
    return column[rows]


class TedReader:
    """The TED ``keys`` of one dataset, read from a column cache.

    The plan (each key's source and column) is resolved once, so :meth:`gather` does no
    per-key lookups.

    Args:
        fields: The dataset's stored fields (its manifest's).
        episodes: Its episodes (with a table, lookups are one ``take``).
        column: The stored column of a key: the backend's (memory maps, versioned zarr
            columns), copies in RAM, anything with numpy-style first-axis indexing.
        keys: TED keys, resolved (see :func:`resolve_keys`); the output keeps their order.
        pool: Reusable buffers for :meth:`gather`'s large outputs
            (:mod:`rlds_cli.cache.buffers`); ``None``: new arrays.
    """

    def __init__(
        self,
        fields: Mapping[str, FieldSpec],
        episodes: Episodes,
        column: Callable[[str], Any],
        keys: Iterable[str],
        pool: BufferPool | None = None,
    ) -> None:
        self.fields = fields
        self.pool = pool
        self.episodes = episodes
        self.keys = list(keys)
        # next/done last, so that it reuses the flags when those are read too
        self._order = sorted(self.keys, key=lambda k: k == "next/done")
        self._plan = self._make_plan(column)
        self.need_episode = any(p[1] in (_FROM_ROWS, _FROM_NEXT_ROWS, _FROM_EPISODE) for p in self._plan)
        self._next_rows = any(p[1] == _FROM_NEXT_ROWS for p in self._plan)
        #: Flat keys read with their ``next/`` twin in one read (one-row-chunk columns, e.g.
        #: frames), so each overlapping row is decoded once.
        self._paired = self._pairs()
        #: One-row-chunk keys read alone, decoded into a pooled buffer (a fresh batch of 150 KB
        #: frames page-faulted for a fifth of its decode time)
        self._into = {
            key
            for key, source, col, is_array in self._plan
            if source <= _FROM_NEXT_ROWS
            and not is_array
            and key not in self._paired
            and getattr(col, "one_row_chunks", False)
            and hasattr(col, "read_into")
        }
        # the largest pooled row: batches of small rows skip the pool and its bounds check
        self._pooled_row_bytes = max(
            (
                np.dtype(col.dtype).itemsize * math.prod(col.shape[1:])
                for key, _, col, is_array in self._plan
                if is_array or key in self._paired or key in self._into
            ),
            default=0,
        )
        #: ``(key, source, column.take or None, column)`` for :meth:`_gather_arrays` when every
        #: column is a numpy array and nothing is paired or pooled (saves a tenth of a low-dim
        #: batch's Python time); else ``None``.
        self._array_plan: list[tuple[str, int, Any, Any]] | None = None
        self._min_pooled = pool.min_bytes if pool is not None else 0
        if not self._paired and not self._into and all(a or s > _FROM_NEXT_ROWS for _, s, _, a in self._plan):
            self._array_plan = [(k, s, c.take if a else None, c) for k, s, c, a in self._plan]
        table = episodes.table  # an int64 table's values are the batch's episodes as they are
        self._table64 = table if table is not None and table.dtype == np.int64 else None
        # the step -> episode lookup, resolved once
        index = episodes.block_index() if self.need_episode and self._table64 is None else None
        self._episode_of: Callable[[np.ndarray], np.ndarray] = (
            self._table64.take
            if self._table64 is not None
            else index.episode_of
            if index is not None
            else episodes.episode_of
        )

    def _make_plan(self, column: Callable[[str], Any]) -> list[tuple[str, int, Any, bool]]:
        """``(name, source, column, is_array)`` of each key, in output order: ``source`` a
        ``_FROM_*`` code; ``column`` ``None`` for a derived key, or the two flags for
        ``_FROM_DONE_READ``."""

        def column_of(key: str) -> Any:
            col = column(key)
            # a plain ndarray view: np.memmap's subclass hooks cost more than small gathers
            return col.view(np.ndarray) if isinstance(col, np.ndarray) else col

        plan: list[tuple[str, int, Any, bool]] = []
        for key in self._order:
            col: Any = None
            if key == "episode":
                source = _FROM_EPISODE
            elif key == "next/done":
                if set(DONE_FLAGS) <= set(self.keys):
                    source = _FROM_DONE  # the flags come first: next/done is last
                else:
                    source, col = _FROM_DONE_READ, tuple(column_of(k) for k in DONE_FLAGS)
            elif key in self.fields:
                source = _FROM_ROWS if self.fields[key].storage == "flat" else _FROM_STEPS
                col = column_of(key)
            else:  # next/<flat key>: the flat row after
                source, col = _FROM_NEXT_ROWS, column_of(key[5:])
            plan.append((key, source, col, isinstance(col, np.ndarray)))
        return plan

    def _pairs(self) -> dict[str, str]:
        """``{key: twin}``, both ways, for flat keys read with their ``next/`` twin from one
        ``one_row_chunks`` column."""
        by_key = {key: (source, column, is_array) for key, source, column, is_array in self._plan}
        pairs: dict[str, str] = {}
        for key, (source, column, is_array) in by_key.items():
            twin = by_key.get(f"next/{key}")
            if (
                source == _FROM_ROWS
                and not is_array
                and getattr(column, "one_row_chunks", False)
                and hasattr(column, "read_into")
                and twin is not None
                and twin[1] is column
            ):
                pairs[key], pairs[f"next/{key}"] = f"next/{key}", key
        return pairs

    def gather(self, idx: np.ndarray) -> TedBatch:
        """The keys at step indices ``idx`` (int64, any shape, in range), as numpy arrays of
        ``idx``'s shape in front."""
        # inlined, not a method: a call frame is a percent of a low-dim batch
        episode = self._episode_of(idx) if self.need_episode else None
        rows = idx if episode is None else idx + episode
        if self._array_plan is not None and (
            self.pool is None or idx.size * self._pooled_row_bytes < self._min_pooled
        ):
            return self._gather_arrays(idx, episode, rows)
        return self.gather_located(idx, episode, rows)

    def gather_located(self, idx: np.ndarray, episode: np.ndarray | None, rows: np.ndarray) -> TedBatch:
        """:meth:`gather` with the episodes and flat rows of :meth:`locate` computed already."""
        pool = self.pool
        if pool is not None and idx.size * self._pooled_row_bytes < pool.min_bytes:
            pool = None
        if pool is None and self._array_plan is not None:
            return self._gather_arrays(idx, episode, rows)
        out = TedBatch()
        # indexed by the _FROM_STEPS, _FROM_ROWS and _FROM_NEXT_ROWS codes
        at = (idx, rows, rows + 1 if self._next_rows else rows)
        # steps in [0, N) put every row read in range: checked once here, not per key
        checked = pool is not None and in_range(idx, self.episodes.num_steps)
        twins: dict[str, np.ndarray] = {}  # the twin of a pair read already, until its turn
        for key, source, column, is_array in self._plan:
            if key in self._paired:
                if key not in twins:
                    pair = np.stack([at[source], at[_FROM_ROWS + _FROM_NEXT_ROWS - source]])
                    if checked:  # rows in range: decoded straight into a pooled buffer
                        assert pool is not None
                        both = column.read_into(pair, pool.empty(pair.shape + column.shape[1:], column.dtype))
                    else:
                        both = column[pair]
                    out[key], twins[self._paired[key]] = both[0], both[1]
                else:
                    out[key] = twins.pop(key)
            elif source <= _FROM_NEXT_ROWS:
                if checked and key in self._into:
                    assert pool is not None
                    rows = at[source]
                    out[key] = column.read_into(rows, pool.empty(rows.shape + column.shape[1:], column.dtype))
                elif not is_array:
                    out[key] = column[at[source]]
                elif pool is None:
                    out[key] = column.take(at[source], 0)
                else:
                    out[key] = gather_into(column, at[source], pool, checked=checked)
            elif source == _FROM_EPISODE:
                out[key] = episode
            elif source == _FROM_DONE:  # plain dict lookups: the keys are joined already
                out[key] = _getitem(out, "next/terminated") | _getitem(out, "next/truncated")
            else:  # _FROM_DONE_READ
                out[key] = take(column[0], idx) | take(column[1], idx)
        return out

    def _gather_arrays(self, idx: np.ndarray, episode: np.ndarray | None, rows: np.ndarray) -> TedBatch:
        """:meth:`gather_located` over numpy columns alone, no output pooled: the same arrays."""
        assert self._array_plan is not None
        out = TedBatch()
        at = (idx, rows, rows + 1 if self._next_rows else rows)
        for key, source, take_rows, column in self._array_plan:
            if take_rows is not None:
                out[key] = take_rows(at[source], 0)
            elif source == _FROM_EPISODE:
                out[key] = episode
            elif source == _FROM_DONE:
                out[key] = _getitem(out, "next/terminated") | _getitem(out, "next/truncated")
            else:  # _FROM_DONE_READ
                out[key] = take(column[0], idx) | take(column[1], idx)
        return out

    def range(self, start: int, stop: int) -> TedBatch:
        """The keys over the consecutive steps ``[start, stop)`` (in range, not empty), with
        contiguous reads. A step key is one slice (for a memory map, a read-only view, no copy);
        a flat key's ``key`` and ``next/key`` are new arrays from one slab."""
        e0, e1 = (int(e) for e in self.episodes.episode_of(np.array([start, stop - 1])))
        steps = slice(start, stop)
        episode: np.ndarray | None = None
        local: np.ndarray | None = None
        slabs: dict[str, np.ndarray] = {}  # by stored key: key and next/key share one
        out = TedBatch()
        for key, source, column, _ in self._plan:
            if source == _FROM_STEPS:
                out[key] = np.asarray(column[steps])
            elif source in (_FROM_ROWS, _FROM_NEXT_ROWS):
                stored = key[5:] if source == _FROM_NEXT_ROWS else key
                slab = slabs.get(stored)
                if slab is None:
                    slab = slabs[stored] = np.asarray(column[start + e0 : stop + e1 + 1])
                if local is None:
                    idx = np.arange(start, stop, dtype=np.int64)
                    local = (idx - start) + (self.episodes.episode_of(idx) - e0)
                out[key] = slab.take(local + 1 if source == _FROM_NEXT_ROWS else local, axis=0)
            elif source == _FROM_EPISODE:
                if episode is None:
                    episode = self.episodes.episode_of(np.arange(start, stop, dtype=np.int64))
                out[key] = episode
            elif source == _FROM_DONE:
                out[key] = _getitem(out, "next/terminated") | _getitem(out, "next/truncated")
            else:
                out[key] = np.asarray(column[0][steps]) | np.asarray(column[1][steps])
        return out

    def episode(self, i: int) -> TedBatch:
        """The keys over every step of episode ``i`` (in ``[0, num_episodes)``)."""
        start = int(self.episodes.starts[i])
        return self.range(start, start + int(self.episodes.lengths[i]))
