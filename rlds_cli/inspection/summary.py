"""Facts about a cached dataset, as one JSON-serialisable dict (``rlds inspect``), and its figure
(``rlds inspect --plot``: matplotlib, an optional extra).

Reference scores (``reference_scores`` in the dict) come from
:mod:`rlds_cli.catalog.scores`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.io import atomic_path, make_parent, refuse_foreign_output
from rlds_cli.cache import stats
from rlds_cli.cache.backends.frames import frame_files
from rlds_cli.cache.blocks import Budget, blocks
from rlds_cli.cache.card import dataset_card
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.episode_table import episode_returns
from rlds_cli.cache.layout import ARRAYS_DIR
from rlds_cli.cache.root import refuse_cache_output
from rlds_cli.catalog.scores import dataset_scores
from rlds_cli.errors import ExportError, import_extra

#: Bins of the episode length and return histograms.
HISTOGRAM_BINS = 20


def _stats(values: np.ndarray) -> dict[str, float | None]:
    """Min, max, mean and std of ``values``; ``None`` each where there is none (no episode: zeros
    read as real figures)."""
    if values.size == 0:
        return {"min": None, "max": None, "mean": None, "std": None}
    values = values.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # inf returns: numpy's inf/nan, no warning
        return {
            "min": float(values.min()),
            "max": float(values.max()),
            "mean": float(values.mean()),
            "std": float(values.std()),
        }


def _length_stats(lengths: np.ndarray) -> dict[str, Any]:
    """:func:`_stats` of episode lengths, with ``min`` and ``max`` as the integers they are."""
    out: dict[str, Any] = _stats(lengths)
    if lengths.size:
        out["min"], out["max"] = int(out["min"]), int(out["max"])
    return out


def at_episode_ends(ds: Dataset, key: str, budget: Budget | None = None) -> np.ndarray:
    """Whether flag key ``key`` is true at each episode's last step (one bool per episode)."""
    last = ds.episode_bounds.ends - 1
    out = np.zeros(ds.num_episodes, bool)
    for start, chunk in blocks(ds.column(key), budget):
        lo, hi = np.searchsorted(last, [start, start + len(chunk)])
        out[lo:hi] = chunk.reshape(len(chunk), -1)[last[lo:hi] - start].any(axis=1)
    return out


def key_statistics(ds: Dataset, key: str, budget: Budget | None = None) -> dict[str, Any]:
    """Element-wise statistics of one stored key, read in bounded blocks (sized for their
    float64 copy) and merged with Chan et al.'s update (:func:`rlds_cli.cache.stats.merge`).

    Returns:
        ``count`` (elements), ``nan``, ``posinf``, ``neginf`` counts, and ``min``/``max``/
        ``mean``/``std`` over the finite elements (``None`` when there are none). Booleans
        report ``true`` (the number of true elements) instead.
    """
    spec = ds.stored_fields[key]
    dtype = np.dtype(spec.dtype)
    column = ds.column(key)
    budget = budget if budget is not None else Budget()
    count = nan = posinf = neginf = true = 0
    # the accumulator of `preprocess --stats` and Normalize, so the figures agree
    acc: stats.Partial | None = None
    scanned = blocks(column, budget, itemsize=dtype.itemsize if dtype.kind == "c" else 8)
    for _, chunk in scanned if dtype.kind in "biufc" else iter(()):
        count += chunk.size
        if dtype.kind == "b":
            true += int(np.count_nonzero(chunk))
            continue
        if dtype.kind == "c":  # counted (a part NaN or infinite), not ordered: no min, max or mean
            nan += int(np.isnan(chunk).sum())
            posinf += int((np.isposinf(chunk.real) | np.isposinf(chunk.imag)).sum())
            neginf += int((np.isneginf(chunk.real) | np.isneginf(chunk.imag)).sum())
            continue
        values = chunk.reshape(-1)
        if dtype.kind == "f":
            finite = np.isfinite(values, out=budget.pool.empty(values.shape, bool))
            if not finite.all():  # all finite (the common case): no second copy
                nan += int(np.isnan(values).sum())
                posinf += int(np.isposinf(values).sum())
                neginf += int(np.isneginf(values).sum())
                values = values[finite]
        acc = stats.merge(acc, stats.partial(values.reshape(-1, 1), quantiles=False, pool=budget.pool))
    out: dict[str, Any] = {"count": count if dtype.kind in "biufc" else int(np.prod(column.shape))}
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
    """Bin counts and edges (``len(edges) == len(counts) + 1``) of a 1-D array's finite values."""
    values = values.astype(np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"counts": [], "edges": []}
    lo, hi = float(values.min()), float(values.max())
    if np.isfinite(hi - lo):
        counts, edges = np.histogram(values, bins=bins)
    else:  # a range past float64's largest (numpy refuses it): edges mixed without the difference
        t = np.arange(bins + 1) / bins
        counts, edges = np.histogram(values, bins=lo * (1 - t) + hi * t)
    return {"counts": counts.tolist(), "edges": edges.tolist()}


def length_histogram(lengths: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, list[float]]:
    """:func:`histogram` of integers (episode lengths): edges halfway between integers, all bins
    an equal whole number of values wide but the last, which ends at the largest value (a bin
    "100 .. 104" of lengths that end at 100 named lengths no episode has)."""
    if lengths.size == 0:
        return {"counts": [], "edges": []}
    lo, hi = int(lengths.min()), int(lengths.max())
    width = -(-(hi - lo + 1) // bins)
    edges = lo - 0.5 + width * np.arange(-(-(hi - lo + 1) // width) + 1)
    edges[-1] = hi + 0.5
    counts, _ = np.histogram(lengths, bins=edges)
    return {"counts": counts.tolist(), "edges": edges.tolist()}


def stored_key_bytes(ds: Dataset, key: str) -> int:
    """Bytes of one stored key's files (``.npy``, zarr array directory or frame files): file
    lengths, for the compression ratio; unlike :meth:`~rlds_cli.Dataset.size_bytes` (disk use)."""
    parts = getattr(ds, "segment_datasets", None)  # a growing dataset: its segments' files
    if parts is not None:
        return sum(stored_key_bytes(part, key) for part in parts())
    base = ds.directory / ARRAYS_DIR
    npy = base / f"{key}.npy"
    frames = frame_files(ds.directory, key)
    if frames[0].is_file():  # a frame column (cache/backends/frames.py)
        return sum(p.stat().st_size for p in frames if p.is_file())
    if npy.is_file():
        return npy.stat().st_size
    folder = base / key
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def codec_of(fields: dict[str, Any], key: str) -> str:
    """How TED key ``key`` is stored: its frame codec (``next/key`` is ``key``'s), else ``raw``."""
    spec = fields.get(key) or (fields.get(key[5:]) if key.startswith("next/") else None)
    return spec.codec if spec is not None else "raw"


def describe(ds: Dataset, *, statistics: bool = True, budget: Budget | None = None) -> dict[str, Any]:
    """Schema, counts, episode statistics, disk use and provenance of a dataset.

    Columns are read in bounded blocks (``budget``, default
    :data:`~rlds_cli.cache.blocks.BLOCK_BYTES`); memory is O(episodes).

    Returns:
        A JSON-serialisable dict with at least ``name``, ``num_steps``, ``num_episodes``,
        ``backend``, ``fields`` (TED key -> ``{shape, dtype}`` per step) and ``size_bytes``;
        with ``statistics``, ``stored[key]["stats"]`` holds :func:`key_statistics` (a full
        scan of every stored array).
    """
    m = ds.manifest
    budget = budget if budget is not None else Budget()
    lengths = ds.episode_index["length"]
    terminated = at_episode_ends(ds, "next/terminated", budget)
    truncated = at_episode_ends(ds, "next/truncated", budget)
    stored: dict[str, dict[str, Any]] = {
        key: {
            "shape": list(spec.shape),
            "dtype": spec.dtype,
            "codec": spec.codec,
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
            entry["stats"] = key_statistics(ds, key, budget)
    returns = episode_returns(ds, budget)
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
        "fields": {
            k: {"shape": list(shape), "dtype": dtype, "codec": codec_of(m.fields, k)}
            for k, (shape, dtype) in ds.fields.items()
        },
        "stored": stored,
        "size_bytes": ds.size_bytes(),
        "episode_length": _length_stats(lengths),
        "episode_return": _stats(returns),
        "histograms": {"episode_length": length_histogram(lengths), "episode_return": histogram(returns)},
        "episodes_terminated": int(terminated.sum()),
        "episodes_truncated": int((truncated & ~terminated).sum()),
        "final_observations_synthesized": int((~ds.episode_index["final_known"]).sum()),
        "source": m.source,
        # the recording environment (Dataset.recover_environment) and the normalized scores'
        # reference returns; None when unknown
        "env": env.to_dict() if env is not None else None,
        "reference_scores": scores.to_dict() if scores is not None else None,
        # licence, citation, robot type, fps, description (a view: its parent's); {} when unknown
        "card": dataset_card(ds),
        "conversion": m.conversion,
        "lineage": m.lineage,
        "content_digest": m.content_digest,
        "created_by": m.created_by,
        "created_at": m.created_at,
    }


#: Episodes whose observation traces are drawn.
TRACED_EPISODES = 3
#: Kept in a plot's metadata (where its format has a place for it).
PLOT_MARK = "rlds inspect --plot"


def plot_dataset(ds: Dataset, out: str | Path, root: str | Path | None = None) -> Path:
    """Write a PNG: episode return and length histograms, and the first observation
    dimensions of a few episodes over time (refused inside the cache's own folders at ``root``).

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install 'rlds-cli[plot]'``).
        ExportError: ``out`` is a folder, or its suffix is no image format matplotlib writes (its
            folder is made where missing, as an export's is), or a file there is no plot an
            earlier run wrote (:func:`~rlds_cli._util.io.refuse_foreign_output`).
    """
    hint = "pip install 'rlds-cli[plot]'"
    import_extra("matplotlib", "--plot", hint=hint).use("Agg")  # files only: never needs a display
    plt = import_extra("matplotlib.pyplot", "--plot", hint=hint, package="matplotlib")

    out = Path(out)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    formats = fig.canvas.get_supported_filetypes()
    suffix = out.suffix.lower().lstrip(".")
    problem = (
        "is a folder" if out.is_dir()
        else f"has no image suffix ({', '.join('.' + f for f in ('png', 'pdf', 'svg'))}, ...)" if not suffix
        else f"ends .{suffix}, which is no image format matplotlib writes" if suffix not in formats
        else None
    )  # fmt: skip
    if problem is not None:
        plt.close(fig)
        raise ExportError(f"--plot {out} {problem}", hint="give a file name such as plot.png")
    try:
        refuse_cache_output(out, root, "the plot", ExportError)
        refuse_foreign_output(out, "the plot", PLOT_MARK.encode(), ExportError)
    except ExportError:
        plt.close(fig)
        raise
    table = ds.episodes
    axes[0].hist(table.returns, bins=30, color="tab:blue")
    axes[0].set(title="episode return", xlabel="return", ylabel="episodes")
    axes[1].hist(table.lengths, bins=30, color="tab:orange")
    axes[1].set(title="episode length", xlabel="steps", ylabel="episodes")
    obs_key = next((k for k, s in ds.stored_fields.items() if s.storage == "flat"), None)
    for i in range(min(TRACED_EPISODES, ds.num_episodes)):
        if obs_key is None:
            break
        values = np.asarray(ds.episode(i, [obs_key])[obs_key], dtype=np.float64).reshape(
            int(table.lengths[i]), -1
        )
        axes[2].plot(values[:, : min(3, values.shape[1])], alpha=0.8, label=f"episode {i}")
    axes[2].set(title=f"{obs_key} (first dims) over time", xlabel="step")
    fig.suptitle(f"{ds.name}: {ds.num_steps:,} steps, {ds.num_episodes:,} episodes")
    fig.tight_layout()
    # the mark that lets a later run write over this plot (refuse_foreign_output), where the format
    # keeps one: PNG's text chunks, the others' creator
    key = {"png": "Software", **dict.fromkeys(("pdf", "svg", "eps", "ps"), "Creator")}.get(suffix)
    try:
        make_parent(out, ExportError)
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=100, format=suffix, metadata={key: PLOT_MARK} if key else None)
    finally:
        plt.close(fig)
    return out
