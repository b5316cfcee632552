"""Each source's ``Normalize`` applied once to the whole mixed batch, with per-row statistics.

When every source's transforms (``MixtureSource(..., transforms=...)``) are ``Normalize`` only, a
batch is normalized after padding in one pass per key instead of once per source: each key's
statistics become two tables of ``(sources, *padded shape)``, the source's ``mean`` and
``std + eps`` at its own width and ``0`` and ``1`` elsewhere (and for a source that does not
normalize the key), and row ``r`` becomes ``(x[r] - mean[source[r]]) / std[source[r]]``.

That is the same arithmetic, element by element, as the source's own ``Normalize`` on its rows
(``(x - mean) / (std + eps)`` in the same dtypes), so the rows are equal bit for bit; padding
stays 0 (``(0 - 0) / 1``). It is used only where that holds: the chains hold nothing but
``Normalize``, no key is normalized twice in one source, and every normalized key has one
floating dtype in every source that ``float_dtype`` does not change. Anything else runs each
source's chain on its own rows (:mod:`rlds_cli.loader.mixture_transforms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.mixture_pad import PadSchema
from rlds_cli.loader.transforms import Normalize


class FusedNormalize:
    """The sources' ``Normalize`` statistics as per-row tables (module docstring).

    Args:
        tables: ``{key: (means, stds)}``, each ``(sources, *shape)``; ``next/<key>`` uses them too.
    """

    def __init__(self, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.tables = tables

    def __call__(self, batch: TedBatch, source: np.ndarray) -> TedBatch:
        """Normalize ``batch`` in place of its keys; ``source``: each row's source."""
        for key, (means, stds) in self.tables.items():
            mean = std = None
            for name in (key, f"next/{key}"):
                if name in batch:
                    if mean is None:
                        mean, std = means.take(source, axis=0), stds.take(source, axis=0)
                    batch[name] = (batch[name] - mean) / std
        return batch


def fuse(
    chains: Sequence[Sequence[Any]],
    schema: PadSchema,
    batch_dtype: Callable[[str, np.dtype], np.dtype],
) -> FusedNormalize | None:
    """The chains as one :class:`FusedNormalize`, or ``None`` where that would not give each
    source's own rows exactly (module docstring)."""
    if not any(chains) or not all(
        isinstance(t, Normalize) and t.stats is not None for c in chains for t in c
    ):
        return None
    tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    count = len(chains)
    for i, chain in enumerate(chains):
        seen: set[str] = set()
        for t in chain:
            assert t.stats is not None
            for key, (mean, std) in t.stats.items():
                if key in seen:
                    return None  # normalized twice in one source: its chain's order matters
                seen.add(key)
                spec = schema.keys.get(key) or schema.keys.get(f"next/{key}")
                if spec is None:
                    continue  # not in the batch: the source's Normalize skips it too
                floating = spec.dtype.kind == "f" and batch_dtype(key, spec.dtype) == spec.dtype
                stored = {schema.keys[n].dtype for n in (key, f"next/{key}") if n in schema.keys}
                if not floating or len(stored) != 1 or not _one_dtype(schema, key, spec.dtype):
                    return None
                if key not in tables:
                    shape = spec.shape
                    tables[key] = (np.zeros((count, *shape), mean.dtype), np.ones((count, *shape), std.dtype))
                means, stds = tables[key]
                if mean.dtype != means.dtype or std.dtype != stds.dtype:
                    return None
                own = spec.shapes[i]
                if own is None:
                    continue  # the source has no such key: its rows stay zeros, as unnormalized
                at: tuple[Any, ...] = (i, *(slice(0, n) for n in own))
                means[at], stds[at] = np.broadcast_to(mean, own), np.broadcast_to(std, own)
    return FusedNormalize(tables)


def _one_dtype(schema: PadSchema, key: str, dtype: np.dtype) -> bool:
    """Every source stores ``key`` (and its ``next/`` twin) as ``dtype``: no promotion."""
    twins = [schema.keys[n] for n in (key, f"next/{key}") if n in schema.keys]
    return all(d is None or d == dtype for spec in twins for d in spec.dtypes)
