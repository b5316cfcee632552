"""Dataset-wide statistics merged from chunks: exact mean/std/min/max, approximate quantiles.

A chunk's :class:`Partial` holds count, mean, sum of squared deviations, min, max and a
quantile sketch (exact quantiles on the :data:`GRID`). Partials merge pairwise in chunk order,
so results do not depend on the worker count or backend:

* mean and variance: Chan et al.'s parallel update in float64, exact up to rounding
  (population std, ``ddof=0``);
* quantiles: each chunk's sketch holds its own values (``inverted_cdf``); the merge mixes the
  sketches' CDFs (linear between a sketch's values, a jump at a value it holds over several grid
  points: the atoms of discrete data) and reads them back on the grid. Rank error under one grid
  step (1/256 of the data) on continuous or discrete data measured, discrete data's common values
  kept as values (a rare one, over a grid point or two, may read between two); not a bound (0.7
  grid steps at q0.01 on bimodal data in 1,000 chunks of 20 steps; 8 where infinities border
  finite values). Infinite values are values; a NaN makes every
  quantile of its element NaN, as ``np.quantile`` does.

Statistics are per element of a key's per-step shape; above :data:`MAX_ELEMENTS` elements
(images) one value over all elements is kept, and quantiles only up to
:data:`MAX_QUANTILE_ELEMENTS`. Observation-like keys leave out final observations. Bool keys are
skipped. ``rlds preprocess --stats``, the loader's ``Normalize`` / ``compute_stats``
(:func:`scan`) and ``rlds inspect`` share this accumulator, so they agree up to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.cache.backends.memmap import release_pages
from rlds_cli.cache.blocks import read, spans
from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.reader import Episodes

#: Points of the per-chunk quantile sketch (0, 1/256, ..., 1).
GRID = np.linspace(0.0, 1.0, 257)
#: Quantiles reported in the manifest.
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
MAX_ELEMENTS = 4096
MAX_QUANTILE_ELEMENTS = 256
METHOD = "chan-parallel mean/var (float64); quantiles from merged 257-point chunk sketches"


@dataclass
class Partial:
    """Mergeable statistics of one key over some rows."""

    count: int
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sketch: np.ndarray | None  # (len(GRID), elements) or None
    reduced: bool  # one value over all elements (large per-step shapes)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {
            f"{prefix}count": np.asarray(self.count, np.int64),
            f"{prefix}mean": self.mean,
            f"{prefix}m2": self.m2,
            f"{prefix}min": self.min,
            f"{prefix}max": self.max,
            f"{prefix}reduced": np.asarray(self.reduced),
        }
        if self.sketch is not None:
            out[f"{prefix}sketch"] = self.sketch
        return out

    @classmethod
    def from_arrays(cls, data: Any, prefix: str) -> Partial:
        sketch = data.get(f"{prefix}sketch")
        return cls(
            int(data[f"{prefix}count"]),
            np.asarray(data[f"{prefix}mean"]),
            np.asarray(data[f"{prefix}m2"]),
            np.asarray(data[f"{prefix}min"]),
            np.asarray(data[f"{prefix}max"]),
            None if sketch is None else np.asarray(sketch),
            bool(data[f"{prefix}reduced"]),
        )


def wants_stats(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "iuf"


def partial(values: np.ndarray, *, quantiles: bool = True, pool: BufferPool | None = None) -> Partial | None:
    """Statistics of ``values`` (rows x per-step shape); ``None`` for an empty chunk.

    Args:
        values: The rows.
        quantiles: Keep the quantile sketch (small per-step shapes only); ``False`` is cheaper
            when only mean/std/min/max are needed.
        pool: Where the float64 temporaries come from (a scan's, reused chunk after chunk);
            ``None``: new arrays.
    """
    n = values.shape[0]
    if n == 0:
        return None
    elements = int(np.prod(values.shape[1:], dtype=np.int64))
    reduced = elements > MAX_ELEMENTS
    x = values.reshape(n * elements, 1) if reduced else values.reshape(n, elements)
    if pool is None or x.dtype == np.float64:
        x64 = x.astype(np.float64, copy=False)
    else:
        x64 = pool.empty(x.shape, np.float64)
        np.copyto(x64, x, casting="unsafe")  # as astype converts
    sketch = None
    with np.errstate(invalid="ignore", over="ignore"):  # inf values: an inf mean, a nan m2, as numpy's
        mean = x64.mean(axis=0)
        if quantiles and not reduced and elements <= MAX_QUANTILE_ELEMENTS:
            sketch = _sketch(x64)
        dev = np.subtract(x64, mean, out=None if pool is None else pool.empty(x64.shape, np.float64))
        m2 = np.square(dev, out=dev).sum(axis=0)  # in place: one temporary the size of the chunk
    return Partial(x.shape[0], mean, m2, x64.min(axis=0), x64.max(axis=0), sketch, reduced)


def _sketch(x: np.ndarray) -> np.ndarray:
    """The exact quantiles of each column of ``x`` on the :data:`GRID`, each one of its values
    (numpy's ``inverted_cdf``: the least value whose share of the rows reaches the rank), so a
    chunk's values stay values in the merge (interpolated ones spread a few rows' mass over the
    gaps between them); a column holding a NaN is NaN throughout, as ``np.quantile`` gives."""
    ordered = np.sort(x, axis=0)  # NaN sorts last
    at = np.clip(np.ceil(GRID * len(ordered)).astype(np.int64) - 1, 0, len(ordered) - 1)
    out = ordered[at]
    out[:, np.isnan(ordered[-1])] = np.nan
    return out


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``a + (b - a) * t`` for ``a <= b``, with ``t`` of 0 or 1 giving ``a`` or ``b`` exactly and an
    infinite end taken for every ``t`` short of the other end (numpy's gives NaN there)."""
    with np.errstate(invalid="ignore", over="ignore"):
        out = a + (b - a) * t
    out = np.where(t <= 0, a, np.where(t >= 1, b, out))
    out = np.where(np.isneginf(a) & (t < 1), a, out)
    return np.where(np.isposinf(b) & (t > 0), b, out)


def _merge_sketch(a: np.ndarray, na: int, b: np.ndarray, nb: int) -> np.ndarray:
    """The sketch of the count-weighted mix of the distributions ``a`` and ``b`` sketch (every
    column at once).

    Each sketch is read as its piecewise-linear quantile function, whose flat runs (a value held
    over several grid points: the atoms of discrete data) are jumps of its CDF; the mixed CDF,
    linear between the sketches' values and jumping at them, is inverted on the grid. Two alike
    sketches of discrete data give back their atoms exactly. A column with a NaN is NaN.
    """
    out = np.empty_like(a)
    wa, wb = na / (na + nb), nb / (na + nb)
    for first in range(0, a.shape[1], MERGE_COLUMNS):  # temporaries of a block of columns
        part_a, part_b = a[:, first : first + MERGE_COLUMNS], b[:, first : first + MERGE_COLUMNS]
        nan = np.isnan(part_a).any(axis=0) | np.isnan(part_b).any(axis=0)
        part_a, part_b = np.where(nan, 0.0, part_a), np.where(nan, 0.0, part_b)
        xs, (a_below, a_upto), (b_below, b_upto) = _merged_counts(part_a, part_b)
        below = wa * _cdf(xs, part_a, a_below) + wb * _cdf(xs, part_b, b_below)  # F(x-)
        at = wa * _cdf(xs, part_a, a_upto) + wb * _cdf(xs, part_b, b_upto)  # F(x)
        merged = np.maximum.accumulate(_invert(xs, below, at), axis=0)  # rounding never makes it fall
        merged[:, nan] = np.nan
        out[:, first : first + MERGE_COLUMNS] = merged
    return out


#: Columns of two sketches merged at once (their temporaries: about 50 arrays of 514 rows each).
MERGE_COLUMNS = 32


def _merged_counts(
    a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Each column's values of ``a`` and ``b`` (sorted columns, no NaN) in one sorted column
    (a value met twice: twice), and, for each, how many of ``a``'s and of ``b``'s values lie
    below it and at or below it: one stable sort of every column at once."""
    both = np.concatenate([a, b]).T  # a row per column: each sorted along its row
    order = np.argsort(both, axis=1, kind="stable")
    xs = np.take_along_axis(both, order, axis=1)
    places = np.arange(xs.shape[1])
    tied = xs[:, 1:] == xs[:, :-1]  # each value's first and last place among its equals
    first = np.maximum.accumulate(np.where(np.pad(tied, ((0, 0), (1, 0))), 0, places), axis=1)
    last = np.where(np.pad(tied, ((0, 0), (0, 1))), len(places), places)
    last = np.minimum.accumulate(last[:, ::-1], axis=1)[:, ::-1]

    def counts(mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        upto = np.pad(np.cumsum(mine, axis=1), ((0, 0), (1, 0)))  # upto[:, p]: at places < p
        return np.take_along_axis(upto, first, axis=1).T, np.take_along_axis(upto, last + 1, axis=1).T

    from_a = order < len(a)
    return xs.T, counts(from_a), counts(~from_a)


def _cdf(x: np.ndarray, sketch: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The CDF at each ``x`` (rows x columns) of the distribution, column by column, whose quantile
    function is the sketch's piecewise-linear interpolation over the :data:`GRID`, given how many
    of the sketch's values lie below each ``x`` (its limit from below) or at or below it (its
    value there): the highest rank whose quantile is below, or at most, ``x``."""
    k = count - 1
    inner = np.clip(k, 0, len(sketch) - 2)
    lo, hi = np.take_along_axis(sketch, inner, axis=0), np.take_along_axis(sketch, inner + 1, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        step = np.where(hi > lo, (x - lo) / (hi - lo), 0.0)
    # a piece from a finite value to an infinite one: the split of its ranks between them is not
    # known; half each (taking all on one side lost up to a grid step per merge, which added up)
    step = np.where((np.isneginf(lo) | np.isposinf(hi)) & (hi > lo), 0.5, step)
    rank = GRID[inner] + np.clip(np.nan_to_num(step), 0.0, 1.0) * (GRID[inner + 1] - GRID[inner])
    return np.where(k < 0, 0.0, np.where(k >= len(sketch) - 1, 1.0, rank))


def _invert(xs: np.ndarray, below: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The :data:`GRID`'s quantiles, column by column, of the CDF that is ``below[i]`` just under
    ``xs[i]``, ``at[i]`` at it, and linear between ``(xs[i], at[i])`` and ``(xs[i + 1],
    below[i + 1])``: the least value whose CDF reaches each grid rank."""
    columns = xs.shape[1]
    # the first value reaching each rank q = the number of values whose CDF is below q; a value's
    # CDF is below every grid rank from the first one past it (the grid is every column's)
    reached = np.searchsorted(GRID, at, side="right")
    per_rank = np.bincount(
        (reached + (len(GRID) + 1) * np.arange(columns)).ravel(), minlength=columns * (len(GRID) + 1)
    )
    i = np.minimum(np.cumsum(per_rank.reshape(columns, -1), axis=1)[:, : len(GRID)].T, len(xs) - 1)
    grid = np.broadcast_to(GRID[:, None], i.shape)

    def of(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.take_along_axis(values, rows, axis=0)

    prev = np.maximum(i - 1, 0)
    x_prev, x_at, below_at, at_prev = of(xs, prev), of(xs, i), of(below, i), of(at, prev)
    between = (i > 0) & (below_at > grid)  # q is reached on the linear piece before xs[i]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.nan_to_num(np.clip((grid - at_prev) / (below_at - at_prev), 0.0, 1.0))
    # a piece from or to an infinity holds finite values (the infinity's own ranks are its jump)
    finite_end = np.where(np.isneginf(x_prev), x_at, x_prev)
    piece = np.where(np.isneginf(x_prev) | np.isposinf(x_at), finite_end, _lerp(x_prev, x_at, t))
    # a piece between two atoms (values of jumps: discrete data) is a sketch's interpolation, not
    # data: its ranks go to the nearer atom (else the values between atoms spread merge by merge)
    jump = at - below > 1e-12
    piece = np.where(of(jump, prev) & of(jump, i), np.where(t < 0.5, x_prev, x_at), piece)
    return np.where(between, piece, x_at)


def merge(a: Partial | None, b: Partial | None) -> Partial | None:
    """Combine two partials (Chan et al.'s update for mean and variance)."""
    if a is None or b is None:
        return a if b is None else b
    n = a.count + b.count
    with np.errstate(invalid="ignore", over="ignore"):
        delta = b.mean - a.mean
        mean = a.mean + delta * (b.count / n)
        # an infinite mean (a value of inf): delta is inf - inf or inf - x; the weighted sum is
        # what numpy's mean gives (inf, or nan for +inf with -inf)
        mean = np.where(np.isfinite(delta), mean, a.mean * (a.count / n) + b.mean * (b.count / n))
        m2 = a.m2 + b.m2 + delta**2 * (a.count * b.count / n)
    sketch = None
    if a.sketch is not None and b.sketch is not None:
        sketch = _merge_sketch(a.sketch, a.count, b.sketch, b.count)
    return Partial(n, mean, m2, np.minimum(a.min, b.min), np.maximum(a.max, b.max), sketch, a.reduced)


def finalize(p: Partial, shape: tuple[int, ...]) -> dict[str, Any]:
    """The manifest's JSON form of one key's statistics."""
    target = () if p.reduced else shape

    def lst(v: np.ndarray) -> Any:
        return np.asarray(v, np.float64).reshape(target).tolist()

    out: dict[str, Any] = {
        "count": p.count,
        "shape": list(target),
        "mean": lst(p.mean),
        "std": lst(np.sqrt(np.maximum(p.m2 / p.count, 0.0))),
        "min": lst(p.min),
        "max": lst(p.max),
    }
    if p.sketch is not None:
        out["quantiles"] = {f"{q:g}": lst(_quantile(p.sketch, q)) for q in QUANTILES}
    return out


def _quantile(sketch: np.ndarray, q: float) -> np.ndarray:
    """The sketch's quantile ``q``: between two grid points, interpolated, unless either end is a
    value the sketch holds over several grid points (an atom, as discrete data has): then the
    upper end, the least value reaching ``q`` (an interpolated count of 2.8 is no count)."""
    k = min(int(np.searchsorted(GRID, q, side="right")) - 1, len(GRID) - 2)
    t = (q - GRID[k]) / (GRID[k + 1] - GRID[k])
    lo, hi = sketch[k], sketch[k + 1]
    held_below = sketch[k - 1] == lo if k > 0 else np.zeros(lo.shape, bool)
    held_above = sketch[k + 2] == hi if k + 2 < len(GRID) else np.zeros(hi.shape, bool)
    atom = held_below | held_above
    return np.where(atom & (t > 0), hi, _lerp(lo, hi, np.asarray(t)))


#: Bytes of float64 values converted at a time by :func:`scan` (bounded memory on any dataset).
SCAN_BYTES = 64 * 1024 * 1024


def scan(dataset: Any, key: str, *, quantiles: bool = False) -> Partial | None:
    """Statistics of a stored key over the dataset's steps, read in bounded chunks and merged in
    order (as ``--stats`` does); a flat key leaves out each episode's final observation.

    Args:
        dataset: A :class:`~rlds_cli.cache.dataset.Dataset`.
        key: A stored key (``dataset.manifest.fields``).
        quantiles: Keep quantile sketches (see :func:`partial`).

    Returns:
        The merged :class:`Partial`, ``None`` for an empty dataset.
    """
    if not len(dataset.episode_index["length"]):  # a growing dataset before its first episode
        return None
    column = dataset.column(key)
    spec = dataset.manifest.fields[key]
    # each episode's final observation, left out of a flat key (O(episodes), not a mask per row)
    finals = Episodes.of(dataset).final_rows() if spec.storage == "flat" else np.zeros(0, np.int64)
    elements = max(1, int(np.prod(spec.shape, dtype=np.int64)))
    acc: Partial | None = None
    pool = BufferPool(size_classes=True)  # the chunks' float64 temporaries, reused
    for start, stop in spans(int(column.shape[0]), max(1, SCAN_BYTES // (8 * elements))):
        chunk = read(column, start, stop)
        lo, hi = np.searchsorted(finals, [start, stop])
        kept = np.delete(chunk, finals[lo:hi] - start, axis=0) if hi > lo else chunk
        acc = merge(acc, partial(kept, quantiles=quantiles, pool=pool))
        release_pages(chunk)  # a memory map's pages: memory stays that of one chunk
    return acc


def key_stats(p: Partial, shape: tuple[int, ...]) -> KeyStats:
    """A merged :class:`Partial` as :class:`KeyStats` (what :func:`load` returns)."""
    data = finalize(p, shape)
    arr = {f: np.asarray(data[f], np.float64) for f in ("mean", "std", "min", "max")}
    quantiles = {float(q): np.asarray(v, np.float64) for q, v in data.get("quantiles", {}).items()}
    return KeyStats(int(data["count"]), quantiles=quantiles, **arr)


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class KeyStats:
    """Statistics of one TED key, as arrays of the key's per-step shape (``()`` when reduced
    over all elements).

    Attributes:
        count: Values summarized per element.
        mean, std, min, max: float64 arrays (``std`` is the population std, ``ddof=0``).
        quantiles: ``{q: array}`` for q in :data:`QUANTILES` (empty for large shapes).
    """

    count: int
    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray
    quantiles: dict[float, np.ndarray]


def load(dataset: Any) -> dict[str, KeyStats]:
    """Statistics stored in a dataset's manifest by ``rlds preprocess --stats``.

    Args:
        dataset: A :class:`~rlds_cli.cache.dataset.Dataset`, a
            :class:`~rlds_cli.cache.manifest.Manifest`, or a manifest dict.

    Returns:
        TED key -> :class:`KeyStats`; empty when the dataset has no statistics.
    """
    manifest = getattr(dataset, "manifest", dataset)
    data = manifest.get("stats", {}) if isinstance(manifest, dict) else getattr(manifest, "stats", {})
    out: dict[str, KeyStats] = {}
    for key, s in (data or {}).get("keys", {}).items():
        arr = {f: np.asarray(s[f], np.float64) for f in ("mean", "std", "min", "max")}
        quantiles = {float(q): np.asarray(v, np.float64) for q, v in s.get("quantiles", {}).items()}
        out[key] = KeyStats(int(s["count"]), quantiles=quantiles, **arr)
    return out
