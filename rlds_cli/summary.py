"""Facts about a cached dataset, as one JSON-serialisable dict (``rlds inspect``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.cache import stats
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import ARRAYS_DIR

#: Steps read at a time when scanning a column (bounded memory for any dataset size).
SCAN_ROWS = 1 << 20
#: Bytes read at a time when computing per-key statistics.
SCAN_BYTES = 64 * 1024 * 1024
#: Bins of the episode length and return histograms.
HISTOGRAM_BINS = 20


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


def key_statistics(ds: Dataset, key: str) -> dict[str, Any]:
    """Element-wise statistics of one stored key, scanned in bounded chunks.

    Returns:
        ``count`` (elements), ``nan``, ``posinf``, ``neginf`` counts, and ``min``/``max``/
        ``mean``/``std`` over the finite elements (``None`` when there are none). Booleans
        report ``true`` (the number of true elements) instead.
    """
    spec = ds.stored_fields[key]
    column = ds.column(key)
    rows = int(column.shape[0])
    dtype = np.dtype(spec.dtype)
    row_bytes = max(1, dtype.itemsize * int(np.prod(spec.shape, dtype=np.int64)))
    step = max(1, SCAN_BYTES // row_bytes)
    count = nan = posinf = neginf = true = 0
    # the accumulator of `preprocess --stats` and Normalize, over all elements: they agree
    acc: stats.Partial | None = None
    for start in range(0, rows, step):
        chunk = np.asarray(column[start : min(start + step, rows)])
        count += chunk.size
        if dtype.kind == "b":
            true += int(np.count_nonzero(chunk))
            continue
        if dtype.kind not in "iuf":
            continue
        values = chunk.astype(np.float64, copy=False).ravel()
        if dtype.kind == "f":
            nan += int(np.isnan(values).sum())
            posinf += int(np.isposinf(values).sum())
            neginf += int(np.isneginf(values).sum())
            values = values[np.isfinite(values)]
        acc = stats.merge(acc, stats.partial(values.reshape(-1, 1), quantiles=False))
    out: dict[str, Any] = {"count": count}
    if dtype.kind == "b":
        out["true"] = true
        return out
    out.update(
        nan=nan,
        posinf=posinf,
        neginf=neginf,
        min=float(acc.min[0]) if acc else None,
        max=float(acc.max[0]) if acc else None,
        mean=float(acc.mean[0]) if acc else None,
        std=float(np.sqrt(acc.m2[0] / acc.count)) if acc else None,
    )
    return out


def histogram(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, list[float]]:
    """Bin counts and edges (``len(edges) == len(counts) + 1``) of a 1-D array's finite values
    (an episode return is NaN or infinite where a reward is: it has no bin)."""
    values = values.astype(np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"counts": [], "edges": []}
    counts, edges = np.histogram(values, bins=bins)
    return {"counts": counts.tolist(), "edges": edges.tolist()}


def stored_key_bytes(ds: Dataset, key: str) -> int:
    """Bytes of one stored key's files (its .npy file or its zarr array directory): their
    lengths, what its codec wrote, so ``logical / stored`` is the compression ratio. The
    dataset's size (:meth:`~rlds_cli.Dataset.size_bytes`) is disk use instead: allocated
    blocks, which round each small file up to a whole block."""
    parts = getattr(ds, "segment_datasets", None)  # a growing dataset: its segments' files
    if parts is not None:
        return sum(stored_key_bytes(part, key) for part in parts())
    base = ds.directory / ARRAYS_DIR
    npy = base / f"{key}.npy"
    if npy.is_file():
        return npy.stat().st_size
    folder = base / key
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def describe(ds: Dataset, *, statistics: bool = True) -> dict[str, Any]:
    """Schema, counts, episode statistics, disk use and provenance of a dataset.

    Returns:
        A JSON-serialisable dict with at least ``name``, ``num_steps``, ``num_episodes``,
        ``backend``, ``fields`` (TED key -> ``{shape, dtype}`` per step) and ``size_bytes``;
        with ``statistics``, ``stored[key]["stats"]`` holds :func:`key_statistics` (a full
        scan of every stored array).
    """
    m = ds.manifest
    lengths = ds.episodes["length"]
    last = ds.episodes["start"] + lengths - 1
    terminated = np.asarray(ds.column("next/terminated")[last]).reshape(-1)
    truncated = np.asarray(ds.column("next/truncated")[last]).reshape(-1)
    stored: dict[str, dict[str, Any]] = {
        key: {
            "shape": list(spec.shape),
            "dtype": spec.dtype,
            "storage": spec.storage,
            "rows": ds.num_steps + (ds.num_episodes if spec.storage == "flat" else 0),
            "bytes": stored_key_bytes(ds, key),
            "logical_bytes": (ds.num_steps + (ds.num_episodes if spec.storage == "flat" else 0))
            * np.dtype(spec.dtype).itemsize
            * int(np.prod(spec.shape, dtype=np.int64)),
        }
        for key, spec in m.fields.items()
    }
    for key, entry in stored.items():
        entry["compression_ratio"] = entry["logical_bytes"] / entry["bytes"] if entry["bytes"] else None
        if statistics:
            entry["stats"] = key_statistics(ds, key)
    returns = episode_returns(ds)
    from rlds_cli.scores import dataset_scores

    env, scores = ds.env_spec, dataset_scores(ds)
    growth = getattr(ds, "growth", None)
    return {
        **({"growing": growth()} if growth is not None else {}),
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
        "episode_return": _stats(returns),
        "histograms": {"episode_length": histogram(lengths), "episode_return": histogram(returns)},
        "episodes_terminated": int(terminated.sum()),
        "episodes_truncated": int((truncated & ~terminated).sum()),
        "final_observations_synthesized": int((~ds.episodes["final_known"]).sum()),
        "source": m.source,
        # the environment the data was recorded in (Dataset.recover_environment makes it) and the
        # reference returns of normalized scores; None when unknown
        "env": env.to_dict() if env is not None else None,
        "reference_scores": scores.to_dict() if scores is not None else None,
        "conversion": m.conversion,
        "lineage": m.lineage,
        "content_digest": m.content_digest,
        "created_by": m.created_by,
        "created_at": m.created_at,
    }
