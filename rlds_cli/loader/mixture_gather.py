"""A mixture's batch gathered in as few copies as a single dataset's: large keys (camera frames)
read straight into the batch (:class:`DirectKeys`), small keys packed once into one padded table
per dtype (:class:`PackedKeys`).

Both give the same values as the general path (:mod:`rlds_cli.loader.mixture_schema`), which
every other case takes; neither applies to mixtures with per-source transforms.

**Large keys, one copy.** A key every source stores with the same per-step shape and dtype
(nothing to pad, promote or cast), of at least :data:`MIN_STEP_BYTES` a step, is read from each
source's column straight into its rows of the batch (``HostSource.take_rows`` into a pooled
buffer), saving a second copy as costly as the read (12 KB frames). Sources read from the cache
only (not ``in_memory``); a growing source is reopened at each refresh that changes its view.

**Small keys packed.** Per-source gathers cost ~30 numpy calls a batch against a single dataset's
7 (issue 41: the mixture at 0.40x the slowest single-source loader). When every remaining key is
a stored column of at most one axis, one dtype in every source, not cast by ``float_dtype``, and
the whole fits :data:`MAX_PACK_BYTES`, the columns are copied once into one table per dtype laid
out as the mixture's flat rows (step ``t`` at row ``t + e(t)``), zero-padded, a ``next/`` key at
its own columns (row ``r`` holds flat row ``r + 1``). A batch is one ``take`` per table (plus one
for the masks), and the sources' ``Normalize`` two in-place operations with each row's statistics,
bit-identical to each source's own ``Normalize``. The tables snapshot the opened views (as
``in_memory=True``): when a refresh changes a growing source's view, they are dropped and the
mixture reads per source from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.mixture_schema import MASK_SUFFIX, FusedNormalize, PadSchema
from rlds_cli.loader.sources import HostSource

#: Keys of at least this many bytes a step are read straight into the batch (below it the
#: per-source calls cost more than the copy they save).
MIN_STEP_BYTES = 1024


def _column(ds: Dataset, stored: str) -> tuple[str, int, bool] | None:
    """The stored column of key ``stored``, the row offset of its ``next/`` twin, and whether
    rows are flat (observation-like); ``None`` for a key that is not one stored column."""
    fields = ds.manifest.fields
    if stored in fields:
        return stored, 0, fields[stored].storage == "flat"
    base = stored[5:] if stored.startswith("next/") else None
    if base is not None and base in fields and fields[base].storage == "flat":
        return base, 1, True
    return None


class DirectKeys:
    """The keys of a mixture read straight into the batch (see the module docstring).

    Args:
        datasets: The sources' datasets.
        stored: ``stored(i, key)``: the name source ``i`` stores common ``key`` under.
        schema: The mixture's schema.
        batch_dtype: ``(key, dtype) -> dtype`` in the batch (``float_dtype``'s cast).
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        stored: Callable[[int, str], str],
        schema: PadSchema,
        batch_dtype: Callable[[str, np.dtype], np.dtype],
    ) -> None:
        #: key -> per source (column, row offset, flat).
        self.plans: dict[str, list[tuple[str, int, bool]]] = {}
        for key, spec in schema.keys.items():
            dtypes = set(spec.dtypes)
            if spec.masks is not None or len(dtypes) != 1 or batch_dtype(key, spec.dtype) != spec.dtype:
                continue
            if spec.dtype.itemsize * int(np.prod(spec.shape, dtype=np.int64)) < MIN_STEP_BYTES:
                continue
            plan = [_column(ds, stored(i, key)) for i, ds in enumerate(datasets)]
            if all(p is not None for p in plan):
                self.plans[key] = [p for p in plan if p is not None]
        self.shapes = {k: (schema.keys[k].shape, schema.keys[k].dtype) for k in self.plans}
        self._columns = [sorted({self.plans[k][i][0] for k in self.plans}) for i in range(len(datasets))]
        self.hosts: list[HostSource | None] = [None] * len(datasets)
        for i, ds in enumerate(datasets):
            self.reopen(i, ds)
        self._pool = BufferPool()

    def reopen(self, i: int, ds: Dataset) -> None:
        """Read source ``i`` from ``ds`` (its new view, after a refresh; none while it has no steps)."""
        self.hosts[i] = HostSource(ds, self._columns[i], pack=False) if ds.num_steps else None

    def __bool__(self) -> bool:
        return bool(self.plans)

    def fill(self, batch: TedBatch, parts: Sequence[tuple[int, Any, np.ndarray]], size: int) -> None:
        """Add the direct keys to ``batch``: ``parts`` are ``(source, rows in the batch, steps in
        the source)``, rows a slice (grouped) or an index array."""
        for key, plan in self.plans.items():
            shape, dtype = self.shapes[key]
            arr = self._pool.empty((size, *shape), dtype)
            for i, rows, local in parts:
                host = self.hosts[i]
                assert host is not None
                column, offset, flat = plan[i]
                at = local + host.episode_of(local) + offset if flat else local
                if isinstance(rows, slice):  # a C-contiguous run of the batch: read into it
                    host.take_rows(column, at, arr[rows])
                else:
                    arr[rows] = host.take_rows(column, at)
            batch[key] = arr


#: Byte limit of the packed tables (and step -> episode table); beyond it the mixture reads
#: each source's columns per batch.
MAX_PACK_BYTES = 512 << 20
#: How a key's rows are read from its stored column: its step rows, its flat rows, the next flat
#: row; ``next/done`` (terminated or truncated, packed as one column); ``episode`` (computed per batch).
_STEP, _ROWS, _NEXT, _DONE, _EPISODE = 0, 1, 2, 3, 4
_FLAGS = ("next/terminated", "next/truncated")


def _plan(ds: Dataset, stored: str) -> tuple[str, int] | None:
    """``(column, how)`` of key ``stored`` in ``ds``, or ``None`` when it is not one raw column."""
    fields = ds.manifest.fields
    if stored == "episode":
        return "", _EPISODE
    if stored == "next/done" and stored not in fields:
        flags = [fields.get(k) for k in _FLAGS]
        plain = all(f is not None and f.storage == "step" and f.codec == "raw" for f in flags)
        return ("", _DONE) if plain else None
    spec = fields.get(stored)
    if spec is not None:
        if spec.codec != "raw":
            return None
        return stored, _ROWS if spec.storage == "flat" else _STEP
    base = stored[5:] if stored.startswith("next/") else None
    if base is not None and base in fields and fields[base].storage == "flat" and fields[base].codec == "raw":
        return base, _NEXT
    return None


class PackedKeys:
    """The mixture's keys read from packed tables (see the module docstring); build with :meth:`build`.

    Attributes:
        keys: The keys it gives, in the batch's order.
    """

    def __init__(
        self,
        views: list[tuple[str, int, int, int, bool]],
        tables: list[np.ndarray],
        episode_table: np.ndarray,
        first_episode: np.ndarray,
        masks: np.ndarray | None,
        mask_views: list[tuple[str, int, int, bool]],
        norm: tuple[int, int, np.ndarray] | None,
        fused: FusedNormalize | None,
    ) -> None:
        masks_of = {name: (c0, c1, one) for name, c0, c1, one in mask_views}
        #: (key, table, first column, end column, scalar, its mask's (first, end, scalar) or None)
        self._views = [(*v, masks_of.get(v[0] + MASK_SUFFIX)) for v in views]
        self._tables = tables
        self._episode_table = episode_table
        self._masks = masks
        self._norm = norm
        #: The sources' ``Normalize`` when it is not applied to the packed columns here (run on the batch).
        self.fused = fused
        self.keys = [name for name, *_ in views]
        #: Each source's first episode in the mixture (a row's ``episode`` is its source's own).
        self._first_episode = first_episode

    @classmethod
    def build(
        cls,
        datasets: Sequence[Dataset],
        stored: Callable[[int, str], str],
        schema: PadSchema,
        keys: Sequence[str],
        batch_dtype: Callable[[str, np.dtype], np.dtype],
        fused: FusedNormalize | None,
    ) -> PackedKeys | None:
        """The packed tables of ``keys`` (those of ``schema`` not read straight into the batch),
        or ``None`` where a key cannot be packed or the tables would pass :data:`MAX_PACK_BYTES`."""
        if not keys or any(ds.num_steps == 0 for ds in datasets):
            return None
        plans: dict[str, list[tuple[str, int] | None]] = {}
        for key in keys:
            spec = schema.keys[key]
            if len(spec.shape) > 1 or len({d for d in spec.dtypes if d is not None}) != 1:
                return None
            if spec.dtype.kind not in "biuf" or batch_dtype(key, spec.dtype) != spec.dtype:
                return None
            plan = [
                None if spec.shapes[i] is None else _plan(ds, stored(i, key)) for i, ds in enumerate(datasets)
            ]
            if any(p is None and spec.shapes[i] is not None for i, p in enumerate(plan)):
                return None
            plans[key] = plan
        # the episode is worked out per batch; every other key has columns in a table
        episode = [k for k in keys if any(p is not None and p[1] == _EPISODE for p in plans[k])]
        if any(len({p for p in plans[k]}) != 1 for k in episode):
            return None  # the episode in one source, a stored key in another
        tabled = [k for k in keys if k not in episode]
        # the normalized keys first in their table: one range of columns, normalized in place
        normed = set(fused.tables) if fused is not None else set()
        first = [k for k in tabled if k in normed]  # (a normalized key's next/ twin has its own table)
        ordered = first + [k for k in tabled if k not in first]
        widths = {k: int(np.prod(schema.keys[k].shape, dtype=np.int64)) for k in keys}
        columns: dict[np.dtype, int] = {}
        at: dict[str, tuple[np.dtype, int]] = {}
        for key in ordered:
            dtype = schema.keys[key].dtype
            at[key] = (dtype, columns.get(dtype, 0))
            columns[dtype] = at[key][1] + widths[key]
        lengths = [np.asarray(ds.episode_index["length"], np.int64) for ds in datasets]
        steps = sum(int(n.sum()) for n in lengths)
        flat = steps + sum(len(n) for n in lengths)
        nbytes = 8 * steps + sum(flat * d.itemsize * w for d, w in columns.items())
        if nbytes > MAX_PACK_BYTES:
            return None
        dtypes = list(columns)
        tables = [np.zeros((flat, columns[d]), d) for d in dtypes]
        row0 = 0  # the source's first flat row in the tables
        for i, ds in enumerate(datasets):
            own = lengths[i]
            n = int(own.sum())
            rows = np.arange(n, dtype=np.int64) + np.repeat(np.arange(len(own), dtype=np.int64), own)
            for key in tabled:
                where = plans[key][i]
                if where is None:
                    continue  # the source lacks the key: zeros (its mask says so)
                column, how = where
                dtype, c0 = at[key]
                width = int(np.prod(schema.keys[key].shapes[i] or (), dtype=np.int64))
                table = tables[dtypes.index(dtype)]
                # the view's rows of the column (a step column has n, a flat one n + episodes)
                need = n if how in (_STEP, _DONE) else n + len(own)
                names = _FLAGS if how == _DONE else (column,)
                data = [np.asarray(ds.column(k)).reshape(-1, width)[:need] for k in names]
                if any(len(d) != need for d in data):
                    return None  # not the view's rows: read per source
                if how == _DONE:  # what the reader derives per batch, once here
                    table[row0 + rows, c0 : c0 + width] = data[0] | data[1]
                elif how == _STEP:
                    table[row0 + rows, c0 : c0 + width] = data[0]
                elif how == _ROWS:
                    table[row0 : row0 + need, c0 : c0 + width] = data[0]
                else:  # row r holds flat row r + 1 (an episode's last flat row has no next)
                    table[row0 : row0 + need - 1, c0 : c0 + width] = data[0][1:]
            row0 += n + len(own)
        views = []
        # the per-source reader's key order (next/done last): the same batch either way
        for key in sorted(keys, key=lambda k: k == "next/done"):
            scalar = len(schema.keys[key].shape) == 0
            if key in episode:
                views.append((key, -1, 0, 0, scalar))
                continue
            dtype, c0 = at[key]
            views.append((key, dtypes.index(dtype), c0, c0 + widths[key], scalar))
        counts = np.array([len(n) for n in lengths], np.int64)
        episode_table = np.repeat(np.arange(int(counts.sum()), dtype=np.int64), np.concatenate(lengths))
        masks, mask_views = cls._mask_table(schema, keys)
        norm = cls._norm_table(fused, schema, at, widths, first)
        first_episode = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        return cls(
            views, tables, episode_table, first_episode, masks, mask_views, norm, None if norm else fused
        )

    @staticmethod
    def _mask_table(schema: PadSchema, keys: Sequence[str]) -> tuple[np.ndarray | None, list[Any]]:
        """Every padded key's mask rows side by side: ``(sources, width)`` bool, and the views."""
        parts, views, c0 = [], [], 0
        for key in keys:
            masks = schema.keys[key].masks
            if masks is None:
                continue
            width = int(np.prod(masks.shape[1:], dtype=np.int64))
            parts.append(masks.reshape(len(masks), width))
            views.append((key + MASK_SUFFIX, c0, c0 + width, masks.ndim == 1))
            c0 += width
        return (np.ascontiguousarray(np.concatenate(parts, axis=1)) if parts else None), views

    @staticmethod
    def _norm_table(
        fused: FusedNormalize | None,
        schema: PadSchema,
        at: dict[str, tuple[np.dtype, int]],
        widths: dict[str, int],
        first: list[str],
    ) -> tuple[int, int, np.ndarray] | None:
        """``(table, columns, statistics)``: the normalized keys' means and stds per source over
        their packed columns (``(sources, 2 * columns)``), or ``None`` unless all are packed in one
        table of their statistics' dtype (the fused ``Normalize`` then runs on the batch)."""
        if fused is None or not first:
            return None
        names = set(at)
        if any(k not in names for k in fused.tables):
            return None  # a normalized key read another way (a frame): the fused path normalizes all
        dtype = at[first[0]][0]  # the first table's dtype: the first keys are laid out first
        if any(at[k][0] != dtype for k in first):
            return None
        end = at[first[-1]][1] + widths[first[-1]]
        count = len(next(iter(fused.tables.values()))[0])
        means, stds = np.zeros((count, end), dtype), np.ones((count, end), dtype)
        for key in first:
            mean, std = fused.tables[key]
            if mean.dtype != dtype or std.dtype != dtype:
                return None
            c0 = at[key][1]
            means[:, c0 : c0 + widths[key]] = mean.reshape(count, -1)
            stds[:, c0 : c0 + widths[key]] = std.reshape(count, -1)
        # one table, so a batch's statistics are one take: means in the first half, stds after
        return 0, end, np.concatenate([means, stds], axis=1)

    def gather(self, flat: np.ndarray, source: np.ndarray) -> TedBatch:
        """The packed keys (and their masks) at mixture steps ``flat`` (1-D, in range) whose
        sources are ``source``, normalized when :attr:`fused` is ``None`` and a ``Normalize`` was given."""
        episode = self._episode_table.take(flat)
        rows = flat + episode
        blocks = [t.take(rows, axis=0) for t in self._tables]
        if self._norm is not None:
            table, end, stats = self._norm
            part, rows_stats = blocks[table][:, :end], stats.take(source, axis=0)
            np.subtract(part, rows_stats[:, :end], out=part)
            np.divide(part, rows_stats[:, end:], out=part)
        out = TedBatch()
        mask_block = self._masks.take(source, axis=0) if self._masks is not None else None
        for name, t, c0, c1, scalar, mask in self._views:
            if t < 0:  # the episode in its own source
                out[name] = episode - self._first_episode.take(source)
                continue
            out[name] = blocks[t][:, c0] if scalar else blocks[t][:, c0:c1]
            if mask is not None:
                assert mask_block is not None
                m0, m1, one = mask
                out[name + MASK_SUFFIX] = mask_block[:, m0] if one else mask_block[:, m0:m1]
        return out
