"""Reference scores: an episode return on D4RL's 0-100 scale.

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
from typing import Any

import numpy as np

from rlds_cli.errors import NoReferenceScoresError

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
    """The reference scores of a cached dataset (a cache name, alias or registry id, resolved by
    :func:`rlds_cli.resolve_name`: a name in the cache wins, so a dataset another one's id names
    gets its own), or of a registry id not in the cache (no download needed when the registry
    has them).

    Raises:
        NoReferenceScoresError: Neither the registry nor the dataset has reference scores.
        DatasetNotFoundError: ``name_or_id`` is neither in the registry with scores nor cached.
    """
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog import registry
    from rlds_cli.catalog.registry import resolve_name

    cached = CacheRoot(root).exists(name_or_id)  # a name in the cache wins (as for every command)
    from_registry = None if cached else _from_entry(name_or_id)
    if from_registry is not None:
        return from_registry
    if not cached and registry.is_known(name_or_id) and registry.resolve(name_or_id).format == "d4rl":
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
