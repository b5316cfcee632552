"""Facts about a cached dataset, as one JSON-serialisable dict (``rlds inspect``), and its figure
(``rlds inspect --plot``: matplotlib, an optional extra).

Normalized scores: an episode return on D4RL's 0-100 scale.

``normalized_score = 100 * (return - ref_min) / (ref_max - ref_min)``: 0 is the reference
random policy, 100 the reference expert (D4RL's and Minari's ``get_normalized_score`` return the
ratio without the factor 100).

Where the reference numbers come from:

* a D4RL id: the registry's ``ref_min_score``/``ref_max_score``, from D4RL's
  ``REF_MIN_SCORE``/``REF_MAX_SCORE`` (``d4rl/infos.py``; ``scripts/d4rl_ref_scores.py``): no
  download needed;
* a Minari dataset: its metadata's ``ref_min_score``/``ref_max_score``, kept in the cached
  manifest (``source.metadata.minari``): downloaded first;
* a cached dataset downloaded by registry id: that entry's numbers; a view: its parent's.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache import stats
from rlds_cli.cache.backends.frames import frame_files
from rlds_cli.cache.blocks import Budget, blocks
from rlds_cli.cache.card import dataset_card
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.episode_table import episode_returns
from rlds_cli.cache.layout import ARRAYS_DIR
from rlds_cli.errors import ExportError, NoReferenceScoresError, import_extra

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


def _length_stats(lengths: np.ndarray) -> dict[str, Any]:
    """:func:`_stats` of episode lengths, with ``min`` and ``max`` as the integers they are."""
    out: dict[str, Any] = _stats(lengths)
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
    scanned = blocks(column, budget, itemsize=8) if dtype.kind in "biuf" else iter(())
    for _, chunk in scanned:
        count += chunk.size
        if dtype.kind == "b":
            true += int(np.count_nonzero(chunk))
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
    out: dict[str, Any] = {"count": count if dtype.kind in "biuf" else int(np.prod(column.shape))}
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
    counts, edges = np.histogram(values, bins=bins)
    return {"counts": counts.tolist(), "edges": edges.tolist()}


def length_histogram(lengths: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, list[float]]:
    """:func:`histogram` of integers (episode lengths): edges halfway between integers, all bins
    an equal whole number of values wide."""
    if lengths.size == 0:
        return {"counts": [], "edges": []}
    lo, hi = int(lengths.min()), int(lengths.max())
    width = -(-(hi - lo + 1) // bins)
    edges = lo - 0.5 + width * np.arange(-(-(hi - lo + 1) // width) + 1)
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
    from rlds_cli.inspection.summary import dataset_scores

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


def plot_dataset(ds: Dataset, out: str | Path) -> Path:
    """Write a PNG: episode return and length histograms, and the first observation
    dimensions of a few episodes over time.

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install 'rlds-cli[plot]'``).
        ExportError: ``out`` is a folder, or its suffix is no image format matplotlib writes (its
            folder is made where missing, as an export's is).
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
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["ReferenceScores", "normalized_score", "reference_scores"]


@dataclass(frozen=True)
class ReferenceScores:
    """The returns that map to 0 (``min``) and 100 (``max``), and where they come from."""

    min: float
    max: float
    origin: str

    def normalize(self, returns: Any) -> Any:
        """``(returns - min) / (max - min) * 100`` (D4RL's ``get_normalized_score``, times 100, in
        its order: no overflow before the division): a float for a number, an array for an array."""
        with np.errstate(over="ignore"):
            out = (np.asarray(returns, dtype=np.float64) - self.min) / (self.max - self.min) * 100.0
        return float(out) if out.ndim == 0 else out

    def to_dict(self) -> dict[str, Any]:
        return {"ref_min_score": self.min, "ref_max_score": self.max, "origin": self.origin}


def _pair(lo: Any, hi: Any, origin: str) -> ReferenceScores | None:
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not (number(lo) and number(hi)) or lo == hi:
        return None
    return ReferenceScores(float(lo), float(hi), origin)


def _from_entry(dataset_id: str) -> ReferenceScores | None:
    from rlds_cli.catalog import registry

    if not registry.is_known(dataset_id):
        return None
    entry = registry.resolve(dataset_id)
    return _pair(entry.extra.get("ref_min_score"), entry.extra.get("ref_max_score"),
                 f"registry entry {entry.id!r}")  # fmt: skip


def scores_of_manifest(manifest: Any) -> ReferenceScores | None:
    """The reference scores a cached dataset's manifest knows: its Minari metadata's, else those
    of the registry entry it was downloaded as (``source.id``); ``None`` when neither has them."""
    metadata = manifest.source.get("metadata")
    minari = metadata.get("minari") if isinstance(metadata, dict) else None
    if isinstance(minari, dict):
        found = _pair(minari.get("ref_min_score"), minari.get("ref_max_score"),
                      "Minari metadata (manifest source.metadata.minari)")  # fmt: skip
        if found is not None:
            return found
    dataset_id = manifest.source.get("id")
    return _from_entry(dataset_id) if isinstance(dataset_id, str) else None


def dataset_scores(dataset: Any) -> ReferenceScores | None:
    """:func:`scores_of_manifest` of a :class:`~rlds_cli.cache.dataset.Dataset` (its parent's
    for a view; a merge's or trim's: its parents', where they all have the same)."""
    from rlds_cli.cache.env_spec import own_manifest
    from rlds_cli.cache.layout import COMPOSED_LAYOUT

    if dataset.manifest.layout == COMPOSED_LAYOUT:
        found = [dataset_scores(parent) for parent in dataset.segment_datasets()]
        return found[0] if found and all(f is not None and f == found[0] for f in found) else None
    manifest = own_manifest(dataset)
    return scores_of_manifest(manifest) if manifest is not None else None


def reference_scores(name_or_id: str, root: str | os.PathLike[str] | None = None) -> ReferenceScores:
    """The reference scores of a registry id (no download needed when the registry has them), or
    of a cached dataset (a cache name, alias or registry id, resolved by
    :func:`rlds_cli.resolve_name`).

    Raises:
        NoReferenceScoresError: Neither the registry nor the dataset has reference scores.
        DatasetNotFoundError: ``name_or_id`` is neither in the registry with scores nor cached.
    """
    from rlds_cli.catalog import registry
    from rlds_cli.catalog.registry import resolve_name

    from_registry = _from_entry(name_or_id)
    if from_registry is not None:
        return from_registry
    if registry.is_known(name_or_id) and registry.resolve(name_or_id).format == "d4rl":
        raise NoReferenceScoresError(  # the registry's scores are D4RL's whole table
            f"D4RL id {registry.resolve(name_or_id).id!r} has no reference scores in D4RL's "
            "REF_MIN_SCORE/REF_MAX_SCORE (d4rl/infos.py)"
        )
    name = resolve_name(name_or_id, root)
    from rlds_cli.cache.opening import open_dataset

    found = dataset_scores(open_dataset(name, root=root))
    if found is None:
        known = registry.is_known(name_or_id) or name != name_or_id
        shown = f"{name_or_id!r}" + (f" (cached as {name!r})" if known and name != name_or_id else "")
        raise NoReferenceScoresError(
            f"dataset {shown} has no reference scores (ref_min_score, ref_max_score)"
        )
    return found


def normalized_score(name_or_id: str, returns: Any, root: str | os.PathLike[str] | None = None) -> Any:
    """D4RL's normalized score of episode ``returns`` for a dataset:
    ``100 * (return - ref_min) / (ref_max - ref_min)``.

    Args:
        name_or_id: A registry id (``"hopper-medium-v2"``), a cache name or an alias.
        returns: An undiscounted episode return, or an array of them.
        root: Cache root (default: the configured one).

    Returns:
        A float for a number, a float64 array of the same shape for an array.

    Raises:
        NoReferenceScoresError: No reference scores are known for the dataset.
        DatasetNotFoundError: The name is neither a registry id with scores nor cached.
    """
    return reference_scores(name_or_id, root).normalize(returns)
