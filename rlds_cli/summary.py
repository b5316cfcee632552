"""Facts about a cached dataset, as one JSON-serialisable dict (``rlds inspect``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.cache.backends import ARRAYS_DIR
from rlds_cli.cache.dataset import Dataset

#: Steps read at a time when scanning a column (bounded memory for any dataset size).
SCAN_ROWS = 1 << 20


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0.0, "max": 0.0, "mean": 0.0, "std": 0.0}
    values = values.astype(np.float64)
    return {
        "min": float(values.min()),
        "max": float(values.max()),
        "mean": float(values.mean()),
        "std": float(values.std()),
    }


def episode_returns(ds: Dataset) -> np.ndarray:
    """Sum of ``next/reward`` per episode, scanning the column in bounded chunks."""
    returns = np.zeros(ds.num_episodes, np.float64)
    reward = ds.column("next/reward")
    for start in range(0, ds.num_steps, SCAN_ROWS):
        stop = min(start + SCAN_ROWS, ds.num_steps)
        chunk = np.asarray(reward[start:stop], dtype=np.float64).reshape(stop - start, -1).sum(axis=1)
        episode = ds.episode_of(np.arange(start, stop))
        first = int(episode[0])
        returns[first : int(episode[-1]) + 1] += np.bincount(episode - first, weights=chunk)
    return returns


def stored_key_bytes(ds: Dataset, key: str) -> int:
    """Bytes one stored key uses on disk (its .npy file or its zarr array directory)."""
    base = ds.directory / ARRAYS_DIR
    npy = base / f"{key}.npy"
    if npy.is_file():
        return npy.stat().st_size
    folder = base / key
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def describe(ds: Dataset) -> dict[str, Any]:
    """Schema, counts, episode statistics, disk use and provenance of a dataset.

    Returns:
        A JSON-serialisable dict with at least ``name``, ``num_steps``, ``num_episodes``,
        ``backend``, ``fields`` (TED key -> ``{shape, dtype}`` per step) and ``size_bytes``.
    """
    m = ds.manifest
    lengths = ds.episodes["length"]
    last = ds.episodes["start"] + lengths - 1
    terminated = np.asarray(ds.column("next/terminated")[last]).reshape(-1)
    truncated = np.asarray(ds.column("next/truncated")[last]).reshape(-1)
    stored = {
        key: {
            "shape": list(spec.shape),
            "dtype": spec.dtype,
            "storage": spec.storage,
            "rows": ds.num_steps + (ds.num_episodes if spec.storage == "flat" else 0),
            "bytes": stored_key_bytes(ds, key),
        }
        for key, spec in m.fields.items()
    }
    return {
        "name": m.name,
        "path": str(ds.directory),
        "backend": m.backend,
        "layout": m.layout,
        "format_version": m.format_version,
        "num_steps": m.num_steps,
        "num_episodes": m.num_episodes,
        "fields": {k: {"shape": list(shape), "dtype": dtype} for k, (shape, dtype) in ds.fields.items()},
        "stored": stored,
        "size_bytes": ds.size_bytes(),
        "episode_length": _stats(lengths),
        "episode_return": _stats(episode_returns(ds)),
        "episodes_terminated": int(terminated.sum()),
        "episodes_truncated": int((truncated & ~terminated).sum()),
        "final_observations_synthesized": int((~ds.episodes["final_known"]).sum()),
        "source": m.source,
        "conversion": m.conversion,
        "lineage": m.lineage,
        "created_by": m.created_by,
        "created_at": m.created_at,
    }
