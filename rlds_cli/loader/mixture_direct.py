"""A mixture's large keys (camera frames) gathered straight into the batch: one copy, not two.

A mixture gathers each source's rows, then writes them into the batch's (padded) arrays. For a
frame of 12 KB a step that second copy costs as much as the read itself. A key that every source
stores with the same per-step shape and dtype (nothing to pad, promote or cast), of at least
:data:`MIN_STEP_BYTES` a step, is instead read from each source's column straight into its rows
of the batch's array (``HostSource.take_rows`` into a slice of a pooled buffer): what a single
dataset's gather costs. It applies to sources read from the cache (not ``in_memory``) without
transforms run per source (a growing source's view is reopened at each refresh that changes
it); everything else takes the general path (:mod:`rlds_cli.loader.mixture_pad`). The values
are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.mixture_pad import PadSchema
from rlds_cli.loader.sources import HostSource

#: Keys of at least this many bytes a step are read straight into the batch (frames, not vectors:
#: below it the per-source calls cost more than the copy they save).
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
    """The keys of a mixture read straight into the batch (module docstring).

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
