"""One JSON table of every source's normalization statistics, to un-normalize actions at inference.

A policy trained on a mixture with per-source ``Normalize`` (``MixtureLoader(...,
transforms={name: Normalize(...)})``) predicts normalized, padded actions; robot ``a``'s action
is un-normalized with ``a``'s statistics and cut to ``a``'s width. :class:`NormalizationTable`
holds, per source and key, ``Normalize``'s ``mean``, ``std``, ``eps``, plus ``min``, ``max`` and
the 1st/99th percentiles ``q01`` / ``q99`` (OpenVLA's and Octo's ``bounds_q99``), and each key's
real ``shape`` in that source.

The file (``rlds-normalization-table``, JSON)::

    {"format": "rlds-normalization-table", "version": 1,
     "sources": {"<name>": {"index": 0, "dataset": "<cache name>", "statistics_of": "dataset '...'",
                            "keys": {"<key>": {"shape": [7], "eps": 1e-06, "mean": [...], "std": [...],
                                               "min": [...], "max": [...],
                                               "q01": [...] or null, "q99": [...] or null}}}}}

Keys are the mixture's names (after ``rename=``); ``shape`` is the key's own per-step shape in
that source (statistics given as plain numbers are broadcast to it); a value that is not finite
(a key with no finite value) is ``null``; ``index`` is the value of the batch's ``source``
column for that source (unique). ``q01``/``q99`` come from the same dataset as the mean
(stored by ``rlds preprocess --stats``, else scanned with quantile sketches,
:func:`rlds_cli.cache.stats.scan`); ``null`` for statistics given as numbers, for keys of more
than 256 elements per step, and for a source that grew since its statistics were taken (its
quantiles now would not be those of its mean).
"""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import join_key
from rlds_cli.errors import MixtureError
from rlds_cli.loader.normalization import DEFAULT_EPS, NormalizationStats, json_ready, statistics_dataset

_FORMAT = "rlds-normalization-table"
_VERSION = 1
_STATS = ("mean", "std", "min", "max", "q01", "q99")
#: How :meth:`NormalizationTable.unnormalize` may invert: the ``Normalize``'s mean/std, or the
#: ``[-1, 1]`` bounds of the 1st and 99th percentiles (OpenVLA's and Octo's ``bounds_q99``).
MODES = ("mean_std", "q01_q99")


def _quantiles(origin: Dataset, stored: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """q01 and q99 of ``stored`` in ``origin`` (the shipped statistics', else scanned)."""
    from rlds_cli.cache import stats as accumulator

    base = stored[5:] if stored.startswith("next/") and stored[5:] in origin.manifest.fields else stored
    try:
        known = accumulator.load(origin).get(base)
    except (KeyError, TypeError, ValueError):  # malformed stored statistics: scan instead
        known = None
    if known is None or 0.01 not in known.quantiles:
        merged = accumulator.scan(origin, base, quantiles=True)
        if merged is None:
            return None, None
        known = accumulator.key_stats(merged, origin.manifest.fields[base].shape)
    if 0.01 not in known.quantiles or 0.99 not in known.quantiles:
        return None, None  # large per-step shapes keep no quantiles
    return known.quantiles[0.01], known.quantiles[0.99]


def _entry(
    stats: NormalizationStats, key: str, quantiles: Any, shape: tuple[int, ...] | None
) -> dict[str, Any]:
    """One key's statistics at the source's own per-step ``shape`` (statistics given as plain
    numbers broadcast to it; ``None``: the statistics' shape)."""
    q01, q99 = quantiles
    shape = tuple(np.shape(stats.mean[key])) if shape is None else tuple(shape)
    out: dict[str, Any] = {"shape": list(shape), "eps": stats.eps}
    for name in ("mean", "std", "min", "max"):
        value = np.asarray(getattr(stats, name)[key], np.float64)
        try:
            out[name] = np.broadcast_to(value, shape).copy()
        except ValueError:
            raise MixtureError(
                f"the {name} of key {key!r} is of shape {value.shape}, which does not fit the "
                f"source's {shape}"
            ) from None
    out["q01"] = None if q01 is None else np.asarray(q01, np.float64)
    out["q99"] = None if q99 is None else np.asarray(q99, np.float64)
    return out


#: One ``Normalize``'s share of a source's entry: its statistics (keys in the mixture's names),
#: the name each key is stored under in the dataset they came from, and that dataset (``None``:
#: statistics given as numbers).
Normalized = tuple[NormalizationStats, Mapping[str, str], Dataset | None]


def source_entry(
    index: int,
    dataset: str,
    normalized: Sequence[Normalized],
    shapes: Mapping[str, tuple[int, ...] | None] | None = None,
) -> dict[str, Any]:
    """One source's entry of the table, from the ``Normalize`` transforms of its chain (none:
    an entry without keys, the source is not normalized); ``shapes``: each key's per-step shape
    in the source (where known)."""
    keys: dict[str, Any] = {}
    origins = []
    for stats, stored, origin in normalized:
        origins.append(stats.source)
        for key in stats.keys:
            if key in keys:  # a table holds one inverse a key: two Normalize would need both
                raise MixtureError(
                    f"source {dataset!r} normalizes key {key!r} twice in its chain: the table can "
                    "un-normalize one Normalize a key",
                    hint="normalize each key once per source",
                )
            quantiles = _quantiles(origin, stored.get(key, key)) if origin is not None else (None, None)
            base = key[5:] if key.startswith("next/") else key
            keys[key] = _entry(stats, key, quantiles, (shapes or {}).get(key, (shapes or {}).get(base)))
    of = "; ".join(dict.fromkeys(origins))
    return {"index": index, "dataset": dataset, "statistics_of": of, "keys": keys}


class NormalizationTable:
    """Per-source normalization statistics (see the module docstring): made by
    ``MixtureLoader.normalization_table()`` or :meth:`from_datasets` (``rlds stats``), saved as
    JSON, read back with :meth:`load`.

    Args:
        data: The table as :meth:`to_dict` gives it (checked).
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            raise MixtureError("not a normalization table: no 'format': 'rlds-normalization-table'")
        if data.get("version") != _VERSION:
            raise MixtureError(
                f"the normalization table is of version {data.get('version')!r}; this rlds reads version "
                f"{_VERSION}",
                hint="write it again with this rlds ('rlds stats ... --normalization-table')",
            )
        sources = data.get("sources")
        if not isinstance(sources, Mapping) or not sources:
            raise MixtureError("the normalization table has no 'sources'")
        self._sources: dict[str, dict[str, Any]] = {}
        self._by_index: dict[int, str] = {}
        for name, entry in sources.items():
            checked = self._sources[str(name)] = self._checked(str(name), entry)
            other = self._by_index.setdefault(checked["index"], str(name))
            if other != str(name):
                raise MixtureError(
                    f"sources {other!r} and {str(name)!r} of the normalization table have one index "
                    f"({checked['index']}): a batch's source value would name either"
                )

    @staticmethod
    def _checked(name: str, entry: Any) -> dict[str, Any]:
        try:
            keys = {}
            index = entry["index"]
            if type(index) is not int or index < 0:
                raise ValueError(f"its index {index!r} is no source number (an int from 0)")
            for key, s in entry["keys"].items():
                if not isinstance(s["shape"], list) or not all(type(n) is int and n >= 0 for n in s["shape"]):
                    raise ValueError(f"the shape of key {key!r} is {s['shape']!r}, not a list of sizes")
                shape = tuple(s["shape"])
                eps = s["eps"]
                if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 <= eps < float("inf"):
                    raise ValueError(f"the eps of key {key!r} is {eps!r}, not a finite number >= 0")
                arrays = {}
                for stat in _STATS:
                    value = s.get(stat)
                    if value is None and stat in ("mean", "std") and stat in s and not shape:
                        value = float("nan")  # written as null: a scalar key with no finite value
                    array = None if value is None else _stored_numbers(value, f"{stat} of key {key!r}")
                    if array is not None and array.shape != shape:
                        raise ValueError(f"{stat} of key {key!r} is not of shape {shape}")
                    arrays[stat] = array
                if arrays["mean"] is None or arrays["std"] is None:
                    raise ValueError(f"key {key!r} has no mean or std")
                if (arrays["std"] < 0).any():
                    raise ValueError(f"the std of key {key!r} has negative values")
                for low, high in (("min", "max"), ("q01", "q99")):
                    below, above = arrays[low], arrays[high]
                    if below is not None and above is not None and (below > above).any():
                        raise ValueError(f"the {low} of key {key!r} is above its {high}")
                keys[str(key)] = {"shape": shape, "eps": float(eps), **arrays}
            return {"index": index, "dataset": str(entry.get("dataset", "")),
                    "statistics_of": str(entry.get("statistics_of", "")), "keys": keys}  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise MixtureError(f"source {name!r} of the normalization table is malformed: {exc}") from None

    # ------------------------------------------------------------------ making

    @classmethod
    def from_sources(cls, entries: Mapping[str, dict[str, Any]]) -> NormalizationTable:
        """From ``{source name: source_entry(...)}``."""
        return cls({"format": _FORMAT, "version": _VERSION, "sources": dict(entries)})

    @classmethod
    def from_datasets(
        cls,
        datasets: Sequence[str | Dataset],
        keys: Iterable[str | tuple[str, ...]] = ("action",),
        *,
        eps: float | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> NormalizationTable:
        """The table of a ``MixtureLoader`` over ``datasets`` (names as sources, no renaming) with
        a ``Normalize(keys=keys)`` per source (a view uses its parent's statistics)."""
        from rlds_cli.loader.opening import open_dataset

        entries = {}
        for i, given in enumerate(datasets):
            ds = given if isinstance(given, Dataset) else open_dataset(given, root)
            if ds.name in entries:
                raise MixtureError(
                    f"dataset {ds.name!r} is named twice: a table has one entry per source",
                    hint="name each dataset once",
                )
            stored = ds.manifest.fields  # what statistics are computed of (not derived keys)
            for k in keys:
                name = join_key(k)
                base = name[5:] if name.startswith("next/") else name
                if name not in stored and base not in stored:
                    raise MixtureError(
                        f"dataset {ds.name!r} stores no key {name!r} to compute statistics of (it "
                        f"stores {sorted(stored)})",
                        hint="pick keys the dataset stores ('rlds inspect NAME' lists them)",
                    )
            if not ds.num_steps:
                raise MixtureError(f"dataset {ds.name!r} has no steps to compute statistics of",
                                   hint="record or convert some first")  # fmt: skip
            # Normalize's statistics, those not finite kept (shown unknown; Normalize refuses them)
            stats = NormalizationStats.from_dataset(ds, keys, eps=DEFAULT_EPS if eps is None else eps)
            shapes = {key: shape for key, (shape, _) in ds.fields.items()}
            same = {key: key for key in stats.keys}
            entries[ds.name] = source_entry(i, ds.name, [(stats, same, statistics_dataset(ds))], shapes)
        return cls.from_sources(entries)

    # ------------------------------------------------------------------ reading

    @property
    def names(self) -> list[str]:
        """The sources, in table order."""
        return list(self._sources)

    def keys(self, source: str | int) -> list[str]:
        """The keys with statistics for ``source``."""
        return list(self._source(source)["keys"])

    def _source(self, source: str | int) -> dict[str, Any]:
        if not isinstance(source, str):  # a number: an int, or a batch's 0-d source tensor
            try:
                number = operator.index(source)
            except TypeError:
                raise MixtureError(f"a source is a name or an index, not {source!r}") from None
            if isinstance(source, bool) or number not in self._by_index:
                raise MixtureError(f"no source of index {source!r} in the normalization table")
            return self._sources[self._by_index[number]]
        if source not in self._sources:
            raise MixtureError(f"no source {source!r} in the normalization table; it has {self.names}")
        return self._sources[str(source)]

    def _key(self, source: str | int, key: str, needs: tuple[str, ...] = ("mean", "std")) -> dict[str, Any]:
        """``source``'s statistics of ``key``; :class:`MixtureError` where one of ``needs`` is
        not finite (a table stores such a value as ``null``: the arithmetic would give NaN)."""
        entry = self._source(source)
        if key not in entry["keys"]:
            raise MixtureError(
                f"no statistics of key {key!r} for source {source!r}; it has {list(entry['keys'])}"
            )
        found = entry["keys"][key]
        for name in needs:
            value = np.asarray(np.nan if found.get(name) is None else found[name], np.float64)
            bad = np.flatnonzero(~np.isfinite(value).reshape(-1))
            if len(bad):
                raise MixtureError(
                    f"the {name} of key {key!r} for source {source!r} is not finite at dimensions "
                    f"{[int(d) for d in bad[:8]]} (null in the table): it would give NaN",
                    hint="make the table from statistics of finite data ('rlds audit NAME' lists "
                    "non-finite values)",
                )
        return found

    def statistics(self, source: str | int) -> NormalizationStats:
        """``source``'s statistics as :class:`NormalizationStats` (``Normalize(stats=...)``)."""
        entry = self._source(source)
        stats = {k: {n: s[n] for n in ("mean", "std", "min", "max")} for k, s in entry["keys"].items()}
        eps = {s["eps"] for s in entry["keys"].values()}
        if len(eps) > 1:
            raise MixtureError(
                f"the keys of source {source!r} have different eps {sorted(eps)}: read them one by one"
            )
        return NormalizationStats.from_mapping(
            stats, eps=eps.pop() if eps else 1e-6, source=entry["statistics_of"]
        )

    def unnormalize(self, source: str | int, key: str, x: Any, *, mode: str = "mean_std") -> np.ndarray:
        """``x`` (normalized, as the mixture's batches hold it; padded or not) back in
        ``source``'s units, cut to its own shape: ``x * (std + eps) + mean`` (``"mean_std"``,
        what ``Normalize`` inverts), or ``(x + 1) / 2 * (q99 - q01) + q01`` (``"q01_q99"``).

        Args:
            source: The source's name or index (the batch's ``source`` value).
            key: The key (the mixture's name).
            x: ``[..., *shape]`` with each axis at least the source's width (leading axes kept).
        """
        if mode not in MODES:
            raise MixtureError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "q01_q99":
            found = self._source(source)["keys"].get(key, {})
            if found.get("q01") is None or found.get("q99") is None:
                raise MixtureError(f"the table has no q01/q99 of key {key!r} for source {source!r}")
        s = self._key(source, key, ("mean", "std") if mode == "mean_std" else ("q01", "q99"))
        eps = s["eps"]
        arr = self._cut(_numbers(x, key), s["shape"], source, key)
        if mode == "mean_std":
            return arr * (s["std"] + eps) + s["mean"]
        return (arr + 1.0) / 2.0 * (s["q99"] - s["q01"]) + s["q01"]

    def normalize(self, source: str | int, key: str, x: Any) -> np.ndarray:
        """``(x - mean) / (std + eps)`` with ``source``'s statistics (an observation at
        inference, at the source's own shape), what the source's ``Normalize`` did in training."""
        s = self._key(source, key)
        arr = self._cut(_numbers(x, key), s["shape"], source, key)
        return (arr - s["mean"]) / (s["std"] + s["eps"])

    @staticmethod
    def _cut(x: np.ndarray, shape: tuple[int, ...], source: str | int, key: str) -> np.ndarray:
        tail = x.shape[x.ndim - len(shape) :] if len(shape) else ()
        if x.ndim < len(shape) or any(a < b for a, b in zip(tail, shape, strict=True)):
            raise MixtureError(
                f"{key!r} of shape {x.shape} is narrower than the shape {shape} of source {source!r}"
            )
        real: tuple[Any, ...] = (..., *(slice(0, n) for n in shape))
        return x[real] if shape else x

    # ------------------------------------------------------------------ files

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the module docstring's layout."""
        sources = {}
        for name, e in self._sources.items():
            keys = {}
            for key, s in e["keys"].items():
                keys[key] = {"shape": list(s["shape"]), "eps": s["eps"]}
                keys[key].update({n: json_ready(s[n]) for n in _STATS})
            sources[name] = {"index": e["index"], "dataset": e["dataset"],
                             "statistics_of": e["statistics_of"], "keys": keys}  # fmt: skip
        return {"format": _FORMAT, "version": _VERSION, "sources": sources}

    def save(self, path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Path:
        """Write the table as JSON to ``path``, whole or not at all (refused inside the cache's
        own folders at ``root``, default: ``$RLDS_HOME``'s, and over a file that is no table).
        Returns the path."""
        from rlds_cli._util.io import atomic_write, refuse_foreign_output
        from rlds_cli.cache.root import refuse_cache_output

        target = Path(path)
        if target.is_dir():
            raise MixtureError(f"cannot write the normalization table to {target}: it is a folder",
                               hint="give a file name, e.g. norm.json")  # fmt: skip
        refuse_cache_output(target, root, "the normalization table", MixtureError)
        mark = json.dumps({"format": _FORMAT})[1:-1].encode()  # '"format": "rlds-normalization-table"'
        refuse_foreign_output(target, "the normalization table", mark, MixtureError)
        atomic_write(target, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n", fsync=False)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NormalizationTable:
        """Read a table :meth:`save` wrote (a ``FileNotFoundError`` when ``path`` is missing,
        :class:`~rlds_cli.errors.MixtureError` naming the file when it is not one)."""
        source = Path(path)
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MixtureError(f"{source} is not a normalization table (not JSON: {exc})") from None
        except RecursionError:
            raise MixtureError(f"{source} is not a normalization table (JSON nested too deep)") from None
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise MixtureError(f"{source} is not a normalization table ({exc.strerror})") from None
        try:
            return cls(data)
        except MixtureError as exc:
            raise MixtureError(f"{source}: {exc.message}") from None


def _stored_numbers(value: Any, what: str) -> np.ndarray:
    """A statistic as the table stores it (a number or nested lists of numbers; ``null`` for a
    value that was not finite) as float64; ``ValueError`` for anything else, infinities included
    (a saved table writes them as ``null``). An array (a table made in memory) is taken as it is."""
    if isinstance(value, np.ndarray | np.generic):
        return np.asarray(value, np.float64)

    def check(x: Any) -> None:
        if isinstance(x, list):
            for item in x:
                check(item)
        elif x is not None and (isinstance(x, bool) or not isinstance(x, int | float) or math.isinf(x)):
            raise ValueError(f"{what} holds {x!r}, not a finite number (or null)")

    check(value)
    return np.asarray(value, np.float64)


def _numbers(x: Any, key: str) -> np.ndarray:
    """``x`` as float64, or :class:`MixtureError` naming ``key``."""
    try:
        return np.asarray(x, np.float64)
    except (TypeError, ValueError) as exc:
        raise MixtureError(f"the values given for key {key!r} are not numbers ({exc})") from None
