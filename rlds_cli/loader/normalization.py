"""Normalization statistics as one public, saveable object, for normalizing the environment's
observations at evaluation time.

:class:`NormalizationStats` holds per-key ``mean``, ``std``, ``min`` and ``max`` (float64 arrays
of the key's per-step shape) and the ``eps`` added to ``std``. ``normalize(x)`` is exactly
:class:`~rlds_cli.loader.Normalize`'s ``(x - mean) / (std + eps)`` (a loader's ``Normalize``
exposes its statistics as ``Normalize.statistics``). ``save``/``load`` use ``.npz`` (no pickle)
or ``.json``. :func:`statistics_dataset` picks the dataset whose statistics are used;
:func:`compute_stats` computes them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import join_key

__all__ = ["NormalizationStats", "compute_stats", "statistics_dataset"]

_FIELDS = ("mean", "std", "min", "max")
#: Written into every saved file, so a file from something else is refused clearly.
_FORMAT = "rlds-normalization-stats"
DEFAULT_EPS = 1e-6


def _shipped_stats(dataset: Dataset) -> dict[str, Any]:
    """Statistics stored in the manifest by ``rlds preprocess --stats`` (empty when none)."""
    from rlds_cli.cache.stats import load

    try:
        return load(dataset)
    except (KeyError, TypeError, ValueError):  # malformed statistics: compute them instead
        return {}


def compute_stats(
    dataset: Dataset, keys: Iterable[str | tuple[str, ...]] = ("observation",)
) -> dict[str, dict[str, np.ndarray]]:
    """Per-dimension ``mean``, ``std``, ``min`` and ``max`` of stored keys, over every step of
    ``dataset`` itself (for a view: the view's steps; see :func:`statistics_dataset`).

    Statistics stored in the manifest (``rlds preprocess --stats``) are used when present, else
    computed in one streaming pass (:func:`rlds_cli.cache.stats.scan`: float64, Chan et al.'s
    merge of bounded chunks). Observation-like keys are summarized over the steps (final
    observations left out); ``next/<key>`` uses ``<key>``'s. Keys with more than 4,096 elements
    per step (images) get one value over all elements.

    Returns:
        ``{key: {"mean": ..., "std": ..., "min": ..., "max": ...}}`` as float64 arrays of the
        key's per-step shape (``()`` for images).
    """
    from rlds_cli.cache import stats as accumulator

    out: dict[str, dict[str, np.ndarray]] = {}
    shipped = _shipped_stats(dataset)
    for key in (join_key(k) for k in keys):
        base = key[5:] if key.startswith("next/") and key[5:] in dataset.manifest.fields else key
        if base not in dataset.manifest.fields:
            raise KeyError(f"dataset {dataset.name!r} stores no key {base!r} to compute statistics of")
        known = shipped.get(base)
        if known is None:
            merged = accumulator.scan(dataset, base)
            if merged is None:
                raise ValueError(f"dataset {dataset.name!r} has no steps to compute statistics of")
            known = accumulator.key_stats(merged, dataset.manifest.fields[base].shape)
        out[key] = {s: np.asarray(getattr(known, s), np.float64) for s in _FIELDS}
    return out


def statistics_dataset(dataset: Dataset) -> Dataset:
    """The dataset whose statistics normalize ``dataset`` by default: the parent of a view or of a
    selection of a merge or trim (so validation data is never normalized with its own
    statistics), else the dataset itself.

    Raises:
        CorruptDatasetError: That parent is gone or was replaced since (its statistics are
            another dataset's).
    """
    from rlds_cli.cache.composed import open_directory
    from rlds_cli.cache.dataset import pinned_parent
    from rlds_cli.cache.layout import COMPOSED_LAYOUT, VIEW_LAYOUT
    from rlds_cli.cache.views import ViewSpec

    manifest = dataset.manifest
    if manifest.layout == COMPOSED_LAYOUT and manifest.source.get("op") == "select" and manifest.lineage:
        made_of = manifest.lineage[0]
        parent_dir, parent = pinned_parent(
            dataset.directory.parent, f"dataset {dataset.name!r}", str(made_of.get("name")),
            str(made_of.get("digest")),
            remove_hint="normalize with its own statistics (NormalizationStats.from_dataset(..., of='self'))",
            remake_hint="make the selection again from the new version, or normalize with its own "
            "statistics (NormalizationStats.from_dataset(..., of='self'))",
        )  # fmt: skip
        return open_directory(parent_dir, parent)
    if manifest.layout != VIEW_LAYOUT:
        return dataset
    dataset.column(next(iter(dataset.manifest.fields)))  # raises unless the parent is there, unchanged
    spec = ViewSpec.from_manifest(dataset.manifest)
    return Dataset(dataset.directory.parent / spec.parent.replace("/", "--"))


def json_ready(value: np.ndarray | None) -> Any:
    """Nested lists, each value that is not finite (NaN: a key with no finite value) as ``null``:
    JSON has no NaN (``json.dumps`` would write a token other readers refuse)."""
    if value is None:
        return None
    numbers = np.asarray(value, np.float64)
    array = numbers.astype(object)
    array[~np.isfinite(numbers)] = None
    return array.tolist()


def checked_eps(eps: Any) -> float:
    """``eps`` (what normalizing adds to ``std``) as a float, or ``ValueError`` where it is not a
    finite number >= 0 (a NaN or negative eps made every value NaN, or a table that was refused)."""
    try:
        value = float(eps)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(eps, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"eps must be a finite number >= 0 (added to std when normalizing), got {eps!r}")
    return value


@dataclass
class NormalizationStats:
    """Per-key normalization statistics: ``{key: {"mean", "std", "min", "max"}}`` as float64
    arrays of the key's per-step shape, and the ``eps`` added to ``std``.

    Attributes:
        keys: The TED keys, in order (``next/<key>`` is normalized with ``<key>``'s statistics).
        mean, std, min, max: ``{key: array}``.
        eps: Added to ``std`` when normalizing.
        source: Where the numbers came from, in words (``"dataset 'hopper'"``).
    """

    mean: dict[str, np.ndarray]
    std: dict[str, np.ndarray]
    min: dict[str, np.ndarray]
    max: dict[str, np.ndarray]
    eps: float = DEFAULT_EPS
    source: str = ""
    keys: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.keys = list(self.mean)
        for name in _FIELDS:
            table = getattr(self, name)
            if list(table) != self.keys:
                raise ValueError(f"NormalizationStats: {name!r} has keys {list(table)}, mean has {self.keys}")
            setattr(self, name, {k: np.asarray(v, np.float64) for k, v in table.items()})
        negative = [k for k, v in self.std.items() if (v < 0).any()]
        if negative:  # it flipped the sign of what it normalized
            raise ValueError(f"NormalizationStats: the std of {negative[0]!r} has negative values")
        self.eps = checked_eps(self.eps)

    # ------------------------------------------------------------------ making

    @classmethod
    def from_mapping(
        cls, stats: Mapping[str, Any], keys: Iterable[str] | None = None, *,
        eps: float = DEFAULT_EPS, source: str = "statistics given",
    ) -> NormalizationStats:  # fmt: skip
        """From ``{key: stats}``, each ``stats`` a mapping with ``"mean"`` and ``"std"`` (and
        optionally ``"min"``, ``"max"``) or an object with those attributes (``KeyStats``)."""
        wanted = [join_key(k) for k in keys] if keys is not None else list(stats)
        missing = [k for k in wanted if k not in stats]
        if missing:
            raise ValueError(
                f"stats has no entry for {missing} (it has {sorted(stats)}); pass keys=[...] to "
                "choose the keys to normalize"
            )
        tables: dict[str, dict[str, np.ndarray]] = {name: {} for name in _FIELDS}
        for key in wanted:
            mean, std = _field(stats[key], "mean", key), _field(stats[key], "std", key)
            tables["mean"][key], tables["std"][key] = mean, std
            for name in ("min", "max"):  # optional: not needed to normalize
                value = _get(stats[key], name)
                absent = np.full_like(mean, np.nan)
                tables[name][key] = np.asarray(value, np.float64) if value is not None else absent
        return cls(**tables, eps=eps, source=source)

    @classmethod
    def from_dataset(cls, dataset: str | Dataset, keys: Iterable[str | tuple[str, ...]] = ("observation",),
                     *, of: str = "parent", eps: float = DEFAULT_EPS) -> NormalizationStats:  # fmt: skip
        """The statistics a :class:`~rlds_cli.loader.Normalize` with the same arguments would use.

        Args:
            dataset: A :class:`~rlds_cli.cache.dataset.Dataset`, or a cache name, alias or
                registry id (opened with :func:`rlds_cli.open_dataset`).
            keys: TED keys.
            of: ``"parent"`` (default): a view's parent (a validation view is normalized like the
                training data); ``"self"``: the dataset itself, even a view.
            eps: Added to ``std``.
        """
        if of not in ("parent", "self"):
            raise ValueError(f"of must be 'parent' or 'self', got {of!r}")
        if not isinstance(dataset, Dataset):
            from rlds_cli.loader.opening import open_dataset

            dataset = open_dataset(dataset)
        origin = statistics_dataset(dataset) if of == "parent" else dataset
        source = f"dataset {origin.name!r}" + (
            f" (the parent of view {dataset.name!r})" if origin is not dataset else ""
        )
        return cls.from_mapping(compute_stats(origin, keys), eps=eps, source=source)

    # ------------------------------------------------------------------ using

    def _key(self, key: str | tuple[str, ...]) -> str:
        name = join_key(key)
        if name not in self.mean and name.startswith("next/") and name[5:] in self.mean:
            name = name[5:]
        if name not in self.mean:
            raise KeyError(f"no normalization statistics for {name!r} (they cover {self.keys})")
        return name

    def pair(self, key: str | tuple[str, ...], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std + eps)`` of ``key`` for values of ``dtype``: float64 where numpy computes
        such values against float32 in float64 anyway (float64, 64- and 32-bit integers: float32
        statistics would round a mean of 1.7e9 by up to 64), else float32, so float32 and uint8
        values give float32 results."""
        k = self._key(key)
        wide = np.result_type(_numpy_dtype(dtype), np.float32) == np.float64
        kind = np.dtype(np.float64 if wide else np.float32)
        std = self.std[k].astype(kind) + np.asarray(self.eps, kind)
        return self.mean[k].astype(kind), std.astype(kind)

    def normalize(self, x: Any, key: str | tuple[str, ...] = "observation") -> np.ndarray:
        """``(x - mean) / (std + eps)`` with ``key``'s statistics (float32 when ``x`` is float32,
        see :meth:`pair`): what :class:`~rlds_cli.loader.Normalize` does to a batch, for one
        observation or many."""
        values = np.asarray(x)
        mean, std = self.pair(key, values.dtype)
        return (values - mean) / std

    def denormalize(self, x: Any, key: str | tuple[str, ...] = "observation") -> np.ndarray:
        """The inverse of :meth:`normalize`: ``x * (std + eps) + mean``."""
        values = np.asarray(x)
        mean, std = self.pair(key, values.dtype)
        return values * std + mean

    # ------------------------------------------------------------------ files

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"format", "eps", "source", "keys": {key: {"mean": [...], ...}}}`` (a value
        that is not finite as ``null``)."""
        return {
            "format": _FORMAT,
            "eps": self.eps,
            "source": self.source,
            "keys": {k: {name: json_ready(getattr(self, name)[k]) for name in _FIELDS} for k in self.keys},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write to ``path``: ``.json`` as :meth:`to_dict`, anything else as ``.npz`` (arrays
        ``<key>//<stat>``, read back without pickle). Returns the path written."""
        from rlds_cli._util.io import atomic_write

        target = Path(path)
        if target.suffix == ".json":
            atomic_write(target, json.dumps(self.to_dict(), indent=2) + "\n", fsync=False)
            return target
        if target.suffix != ".npz":
            target = target.with_name(target.name + ".npz")  # as np.savez would
        arrays = {f"{k}//{name}": getattr(self, name)[k] for k in self.keys for name in _FIELDS}
        meta = json.dumps({"format": _FORMAT, "eps": self.eps, "source": self.source, "keys": self.keys})
        atomic_write(target, lambda f: np.savez(f, __meta__=np.array(meta), **arrays), fsync=False)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NormalizationStats:
        """Read what :meth:`save` wrote (``.json`` or ``.npz``).

        Raises:
            ValueError: The file is not normalization statistics saved by rlds.
        """
        source = Path(path)
        try:
            if source.suffix == ".json":
                data = json.loads(source.read_text(encoding="utf-8"))
                if not isinstance(data, dict) or data.get("format") != _FORMAT:
                    raise ValueError("no 'format': 'rlds-normalization-stats'")
                keys = data["keys"]
                tables = {name: {k: keys[k][name] for k in keys} for name in _FIELDS}
                return cls(**tables, eps=data["eps"], source=data.get("source", ""))
            with np.load(source, allow_pickle=False) as npz:
                meta = json.loads(str(npz["__meta__"]))
                if meta.get("format") != _FORMAT:
                    raise ValueError("no 'format': 'rlds-normalization-stats'")
                tables = {name: {k: npz[f"{k}//{name}"] for k in meta["keys"]} for name in _FIELDS}
                return cls(**tables, eps=meta["eps"], source=meta.get("source", ""))
        except FileNotFoundError:
            raise
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source} is not normalization statistics saved by rlds: {exc}") from exc


def _numpy_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as numpy's: a numpy dtype, or a torch one (a batch on the device) by its name;
    float32 for a torch type numpy has none of (bfloat16)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        try:
            return np.dtype(str(dtype).removeprefix("torch."))
        except TypeError:
            return np.dtype(np.float32)


def _get(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, Mapping) else getattr(entry, name, None)


def _field(entry: Any, name: str, key: str) -> np.ndarray:
    """``entry[name]`` or ``entry.name`` as float64: a dict of arrays or a ``KeyStats``."""
    value = _get(entry, name)
    if value is None:
        raise ValueError(f"the statistics of {key!r} have no {name!r}")
    return np.asarray(value, np.float64)
