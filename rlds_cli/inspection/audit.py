"""``rlds audit``: which episodes of a dataset look broken, and a view of the others.

:func:`audit` measures every episode in one bounded pass (:func:`measure`) and flags it by the
tolerances of :class:`AuditTolerances`:

* ``idle``: more than ``max_idle`` of its steps repeat the step before (action and state within
  ``atol``);
* ``spike``: an action changes by more than ``spike_factor`` times its typical change (the
  median over episodes of each dimension's RMS change);
* ``jerk``: its mean absolute third difference of the actions is more than ``jerk_factor``
  times the median episode's, in some dimension;
* ``frozen:<key>``: camera ``key`` shows the same frame (the same stored bytes) for
  ``frozen_steps`` or more steps in a row while the robot is not idle;
* ``nonfinite``: a NaN or infinite value in a float or complex key;
* ``duplicate``: the same content (sha256 of every stored row) as an earlier episode;
* ``length_outlier`` / ``return_outlier``: outside Tukey's fences ``iqr_factor`` interquartile
  ranges beyond the quartiles (with 5 or more episodes);
* ``empty_instruction``: a step whose language instruction is empty (datasets with text).

:meth:`AuditReport.keep` publishes the episodes that pass, whole, as a view.

The pass (:func:`measure`) reads the stored rows (of a view: its parent's) in groups of whole
episodes of about :attr:`Budget.nbytes <rlds_cli.cache.blocks.Budget>` (a longer episode in pieces,
each with :data:`CONTEXT` steps before it): memory is bounded, what is kept O(episodes). Frame
columns are compared and digested as stored image files, never decoded.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rlds_cli.cache.backends.frames import FramesColumn
from rlds_cli.cache.backends.memmap import release_pages
from rlds_cli.cache.blocks import Budget
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import SelectedDataset
from rlds_cli.cache.manifest import FieldSpec, Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.catalog.registry import resolve_name
from rlds_cli.errors import InvalidSelectionError

__all__ = ["FLAGS", "AuditReport", "AuditTolerances", "EpisodeMeasures", "KeyRoles", "audit", "measure"]

_HINT = "see 'rlds audit --help' for what each tolerance means"

#: Every flag an episode may get (``frozen`` as ``frozen:<key>``, one per camera key).
FLAGS = ("idle", "spike", "jerk", "frozen", "nonfinite", "duplicate", "length_outlier", "return_outlier",
         "empty_instruction")  # fmt: skip


@dataclass(frozen=True)
class AuditTolerances:
    """The thresholds of the checks (see the module docstring)."""

    atol: float = 1e-5
    max_idle: float = 0.2
    spike_factor: float = 8.0
    jerk_factor: float = 2.5
    frozen_steps: int = 3
    iqr_factor: float = 3.0

    def __post_init__(self) -> None:
        values = {n: getattr(self, n) for n in ("atol", "spike_factor", "jerk_factor", "iqr_factor")}
        problems = [f"{n} must be above 0, got {v}" for n, v in values.items() if not float(v) > 0]
        if not 0.0 <= self.max_idle < 1.0:
            problems.append(f"max_idle must be in [0, 1), got {self.max_idle}")
        if self.frozen_steps < 1:
            problems.append(f"frozen_steps must be 1 or more, got {self.frozen_steps}")
        if problems:
            raise InvalidSelectionError(f"audit tolerance {problems[0]}", hint=_HINT)


@dataclass
class AuditReport:
    """The audit of one dataset: per-episode measures and flags.

    Attributes:
        dataset: The dataset's name.
        tolerances: The thresholds used.
        measures: What was measured (:class:`EpisodeMeasures`).
        flags: flag -> the positions of the episodes that have it (ascending).
        duplicate_of: Per episode, the earlier episode with the same content (-1: none).
        bytes_read: Bytes of stored rows the pass read.
        root: The cache root the dataset was opened in (where :meth:`keep` publishes by default).
    """

    dataset: str
    tolerances: AuditTolerances
    measures: EpisodeMeasures
    flags: dict[str, np.ndarray]
    duplicate_of: np.ndarray
    bytes_read: int
    root: str | None = None
    #: For an unpublished selection (``select_episodes``): the parent's name and each episode's
    #: position in it; :meth:`keep` then publishes a view of the parent.
    selected_from: tuple[str, np.ndarray] | None = None

    @property
    def num_episodes(self) -> int:
        return len(self.measures.lengths)

    def flagged(self) -> np.ndarray:
        """Positions of the episodes with any flag (ascending)."""
        if not self.flags:
            return np.zeros(0, np.int64)
        return np.unique(np.concatenate([np.zeros(0, np.int64), *self.flags.values()]))

    def passing(self) -> np.ndarray:
        """Positions of the episodes with no flag (ascending)."""
        return np.setdiff1d(np.arange(self.num_episodes, dtype=np.int64), self.flagged())

    def episode_flags(self, i: int) -> list[str]:
        """The flags of episode ``i``."""
        return [f for f, ids in self.flags.items() if i in ids[np.searchsorted(ids, i) :][:1]]

    def episode(self, i: int) -> dict[str, Any]:
        """Episode ``i``'s measures and flags, JSON-serialisable."""
        m = self.measures
        length = int(m.lengths[i])
        out: dict[str, Any] = {
            "episode": i,
            "length": length,
            "return": _finite(m.returns[i]),
            "idle_fraction": float(m.idle_steps[i] / max(1, length - 1)),
            # idle steps before the first active one (steps 1..), and after the last
            "idle_start_steps": max(0, int(m.first_active[i]) - 1),
            "idle_end_steps": max(0, length - 1 - int(m.last_active[i]))
            if m.last_active[i] > 0
            else max(0, length - 1),
            "spike_score": _finite(self._spike_scores()[i]),
            "jerk_score": _finite(self._jerk_scores()[i]),
            "frozen_steps": {k: int(v[i]) for k, v in m.frozen.items()},
            "nonfinite": int(m.nonfinite[i]),
            "empty_instruction_steps": int(m.empty_text[i]),
            "fingerprint": f"{int(m.fingerprints[i]):016x}",
            "duplicate_of": int(self.duplicate_of[i]) if self.duplicate_of[i] >= 0 else None,
            "flags": self.episode_flags(i),
        }
        return out

    def _spike_scores(self) -> np.ndarray:
        return _ratio_to_median(
            self.measures.max_action_change, self.measures.rms_action_change, self.measures.lengths
        )

    def _jerk_scores(self) -> np.ndarray:
        return _ratio_to_median(
            self.measures.mean_abs_jerk, self.measures.mean_abs_jerk, self.measures.lengths, 4
        )

    def to_dict(self, *, episodes: bool = True) -> dict[str, Any]:
        """The report as JSON-serialisable data: counts per flag, the flagged episodes, and with
        ``episodes`` every episode's measures."""
        return {
            "dataset": self.dataset,
            "num_episodes": self.num_episodes,
            "num_steps": int(self.measures.lengths.sum()),
            "tolerances": asdict(self.tolerances),
            "flag_counts": {f: len(ids) for f, ids in self.flags.items()},
            "flags": {f: ids.tolist() for f, ids in self.flags.items()},
            "flagged": len(self.flagged()),
            "passing": len(self.passing()),
            "bytes_read": self.bytes_read,
            **({"episodes": [self.episode(i) for i in range(self.num_episodes)]} if episodes else {}),
        }

    def keep(
        self, name: str, *, replace: bool = False, root: str | os.PathLike[str] | CacheRoot | None = None
    ) -> Manifest:
        """Publish the episodes that pass (whole episodes) as view ``name`` of the dataset.

        The dataset's files and content digests were checked by :func:`audit` before it measured
        them: damage is never published as passing.

        Raises:
            InvalidSelectionError: No episode passes.
            DatasetExistsError: ``name`` exists and ``replace`` is false.
        """
        from rlds_cli.cache.derive import create_selection

        kept = self.passing()
        if len(kept) == 0:
            raise InvalidSelectionError(
                f"no episode of {self.dataset!r} passes the audit: no view made",
                hint="loosen the tolerances (see 'rlds audit --help')",
            )
        how = f"the {len(kept)} of {self.num_episodes} episodes that pass rlds audit"
        root = root if root is not None else self.root
        parent = self.dataset
        if self.selected_from is not None:
            parent, kept = self.selected_from[0], self.selected_from[1][kept]
        return create_selection(parent, name, kept, how=how, root=root, replace=replace)


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _ratio_to_median(
    values: np.ndarray, scale_of: np.ndarray, lengths: np.ndarray, min_len: int = 2
) -> np.ndarray:
    """Per episode, the largest over dimensions of ``values / median(scale_of)`` (medians over
    the episodes long enough to have a value; dimensions whose median is 0 left out)."""
    n = len(lengths)
    if values.size == 0 or n == 0:
        return np.zeros(n)
    ok = lengths >= min_len
    if not ok.any():
        return np.zeros(n)
    scale = np.median(scale_of[ok], axis=0)
    dims = scale > 0
    if not dims.any():
        return np.zeros(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (values[:, dims] / scale[dims]).max(axis=1)


def iqr_outliers(values: np.ndarray, k: float) -> np.ndarray:
    """Positions of ``values`` outside Tukey's fences (quartiles -/+ ``k`` IQRs); none with fewer
    than 5 finite values. The IQR is at least 5% of the median. With an IQR of 0 (sparse-reward
    returns, 0 or 1), values outside count as outliers only if at most 5% of the values."""
    finite = np.isfinite(values)
    count = int(finite.sum())
    if count < 5:
        return np.zeros(0, np.int64)
    q1, med, q3 = np.percentile(values[finite], [25, 50, 75])
    width = max(q3 - q1, 0.05 * abs(med))
    out = finite & ((values < q1 - k * width) | (values > q3 + k * width))
    if q3 == q1 and out.sum() > 0.05 * count:
        return np.zeros(0, np.int64)
    return np.flatnonzero(out)


# inf or float32-max actions overflow: counted as non-finite, without numpy's warnings
@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def audit(
    dataset: str | Dataset,
    *,
    tolerances: AuditTolerances | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    budget: Budget | None = None,
    **tolerance: Any,
) -> AuditReport:
    """Audit every episode of ``dataset`` (a name in the cache, an alias, or an opened dataset).
    Its files and content digests are checked first (a view's: its parent's): damaged values are
    never measured as if they were data.

    Args:
        dataset: The dataset.
        tolerances: The thresholds (default :class:`AuditTolerances`); or pass them one by one
            as keywords (``max_idle=0.3``).
        root: Cache root, for a name.
        budget: Bytes of rows read at a time (default 16 MiB).

    Returns:
        The :class:`AuditReport`.

    Raises:
        CorruptDatasetError: The dataset's files or digests do not match its manifest.
    """
    from rlds_cli.cache.compose import verify_parent

    if tolerances is None:
        tolerances = AuditTolerances(**tolerance)
    elif tolerance:
        raise TypeError("pass tolerances= or keyword tolerances, not both")
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(resolve_name(dataset, root), root)
    verify_parent(ds)
    m = measure(ds, atol=tolerances.atol, budget=budget)
    t = tolerances
    flags: dict[str, np.ndarray] = {}
    lengths = m.lengths
    idle_fraction = m.idle_steps / np.maximum(1, lengths - 1)
    flags["idle"] = np.flatnonzero(idle_fraction > t.max_idle)
    report = AuditReport(ds.name, t, m, flags, np.full(len(lengths), -1, np.int64), m.budget.total)
    report.root = None if root is None or isinstance(root, CacheRoot) else os.fspath(root)
    if isinstance(root, CacheRoot):
        report.root = os.fspath(root.path)
    found = ds.view_parent() if isinstance(ds, SelectedDataset) else None
    if found is not None:
        report.selected_from = (found[0].name, found[1])
    flags["spike"] = np.flatnonzero(report._spike_scores() > t.spike_factor)
    flags["jerk"] = np.flatnonzero(report._jerk_scores() > t.jerk_factor)
    for key, runs in m.frozen.items():
        flags[f"frozen:{key}"] = np.flatnonzero(runs >= t.frozen_steps)
    flags["nonfinite"] = np.flatnonzero(m.nonfinite > 0)
    first: dict[str, int] = {}
    for i, d in sorted(m.digests.items()):  # only episodes whose fingerprints meet have one
        j = first.setdefault(d, i)
        if j != i:
            report.duplicate_of[i] = j
    flags["duplicate"] = np.flatnonzero(report.duplicate_of >= 0)
    flags["length_outlier"] = iqr_outliers(lengths.astype(np.float64), t.iqr_factor)
    flags["return_outlier"] = iqr_outliers(m.returns, t.iqr_factor)
    if ds.instructions is not None:
        flags["empty_instruction"] = np.flatnonzero(m.empty_text > 0)
    report.flags = {k: v.astype(np.int64) for k, v in flags.items()}
    return report


#: Steps before a piece of a long episode read with it: the third difference (jerk) needs three.
CONTEXT = 3


@dataclass(frozen=True)
class KeyRoles:
    """What each stored key is to the audit (from its name, storage, dtype and shape)."""

    action: tuple[str, ...]  # per-step keys "action" and "action/..." (numbers)
    state: tuple[str, ...]  # observation-like low-dim number keys
    images: tuple[str, ...]  # frame columns, and uint8 arrays of 2 or more dims per step
    numbers: tuple[str, ...]  # float keys checked for NaN/inf (low-dim, any storage)
    text: dict[str, tuple[int, ...]]  # text index keys -> the indices of empty strings
    low_dim: tuple[str, ...]  # every non-image key (read as arrays)

    @classmethod
    def of(cls, ds: Dataset) -> KeyRoles:
        """The roles of ``ds``'s stored keys."""
        fields, tables = ds.stored_fields, ds.text_tables
        images = tuple(
            k for k, s in fields.items()
            if s.frame_format is not None or (np.dtype(s.dtype) == np.uint8 and len(s.shape) >= 2)
        )  # fmt: skip
        low = tuple(k for k in fields if k not in images)
        text = {k: tuple(i for i, s in enumerate(tables[k]) if not s.strip()) for k in low if k in tables}
        num = tuple(k for k in low if np.dtype(fields[k].dtype).kind in "fiu" and k not in text)
        return cls(
            action=tuple(
                k for k in num if fields[k].storage != "flat" and (k == "action" or k.startswith("action/"))
            ),
            state=tuple(k for k in num if fields[k].storage == "flat"),
            images=images,
            numbers=tuple(k for k in low if np.dtype(fields[k].dtype).kind in "fc"),
            text=text,
            low_dim=low,
        )


@dataclass
class EpisodeMeasures:
    """What :func:`measure` found, one entry (or row) per episode of the dataset audited."""

    lengths: np.ndarray
    returns: np.ndarray  # float64; NaN where a reward is NaN
    idle_steps: np.ndarray  # steps t >= 1 whose action and state equal step t-1's (within atol)
    first_active: np.ndarray  # first step t >= 1 that is not idle (length: none)
    last_active: np.ndarray  # last step that is not idle (0: none after the first)
    max_action_change: np.ndarray  # (episodes, action dims): max |a_t - a_{t-1}|
    rms_action_change: np.ndarray  # (episodes, action dims)
    mean_abs_jerk: np.ndarray  # (episodes, action dims): mean |third difference of a|
    # image key -> longest run of steps whose frame equals the one before while not idle
    frozen: dict[str, np.ndarray]
    nonfinite: np.ndarray  # NaN/inf values in float keys
    empty_text: np.ndarray  # steps whose language instruction (Dataset.instructions) is empty
    fingerprints: np.ndarray  # uint64 per episode: equal for equal content (see _word_sums)
    digests: dict[int, str]  # sha256 of the stored rows of the episodes whose fingerprints meet
    budget: Budget = field(default_factory=Budget)


@dataclass
class _Group:
    """Steps ``[a, b)`` of episodes ``view`` (stored at ``pos``), each read with ``ctx`` steps
    before ``a`` (only a piece of a long episode has context)."""

    view: np.ndarray
    pos: np.ndarray
    a: np.ndarray
    b: np.ndarray
    ctx: np.ndarray
    ends: np.ndarray  # whether the piece ends its episode


def _group(rows: list[tuple[int, int, int, int, int]], lens_by_pos: np.ndarray) -> _Group:
    v, p, a, b, c = (np.array(col, np.int64) for col in zip(*rows, strict=True))
    return _Group(v, p, a, b, c, b == lens_by_pos[p])


def _groups(
    lengths: np.ndarray, positions: np.ndarray, lens_by_pos: np.ndarray, max_rows: int
) -> Iterator[_Group]:
    """Groups of about ``max_rows`` steps: whole episodes together, a longer one alone in pieces."""
    ends = np.cumsum(lengths, dtype=np.int64)
    i, n = 0, len(lengths)
    while i < n:
        size = int(lengths[i])
        if size > max_rows:
            p = int(positions[i])
            for a in range(0, size, max_rows):
                yield _group([(i, p, a, min(size, a + max_rows), min(a, CONTEXT))], lens_by_pos)
            i += 1
            continue
        # the episodes from i whose steps together fit (a longer one never does)
        j = max(i + 1, int(np.searchsorted(ends, int(ends[i]) - size + max_rows, side="right")))
        pos, b = positions[i:j].astype(np.int64), lengths[i:j].astype(np.int64)
        zero = np.zeros(j - i, np.int64)
        yield _Group(np.arange(i, j, dtype=np.int64), pos, zero, b, zero, b == lens_by_pos[pos])
        i = j


def _row_bytes(spec: FieldSpec, column: Any) -> int:
    """Bytes one row of a key costs to read: a frame column's average stored frame."""
    if spec.frame_format is not None:
        return max(1, int(getattr(column, "size", 0)) // max(1, len(column)))
    return max(1, np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64)))


class _Reader:
    """Reads a group's rows of one stored column, adjacent pieces as one slice."""

    def __init__(self, ds: Dataset, key: str, starts: np.ndarray, lengths_by_pos: np.ndarray) -> None:
        self.key = key
        self.spec = ds.stored_fields[key]
        self.flat = self.spec.storage == "flat"
        self.column = ds.column(key)
        self.starts, self.lens = starts, lengths_by_pos
        self.held: list[np.ndarray] = []

    def release(self) -> None:
        """Drop the pages of the rows read last from the process's memory (``release_pages``)."""
        for part in self.held:
            release_pages(part)
        self.held = []

    def rows(self, g: _Group) -> tuple[np.ndarray, np.ndarray]:
        """The column's rows ``[lo, hi)`` of each piece: its context and steps, and its final
        row where it ends its episode (flat keys)."""
        base = self.starts[g.pos] + (g.pos if self.flat else 0)
        return base + g.a - g.ctx, base + g.b + (g.ends if self.flat else 0)

    def read(self, g: _Group, budget: Budget) -> np.ndarray:
        """The steps' rows of the group (with context), in order."""
        raw = self.read_raw(g, budget)
        if not self.flat or not g.ends.any():
            return raw
        lo, hi = self.rows(g)
        return np.delete(raw, (np.cumsum(hi - lo) - 1)[g.ends], axis=0)

    def read_raw(self, g: _Group, budget: Budget) -> np.ndarray:
        """:meth:`rows` (a flat key's final rows included), in order, as one (rows, elements) array."""
        lo, hi = self.rows(g)
        cut = np.flatnonzero(lo[1:] != hi[:-1]) + 1  # where a piece does not follow the one before
        firsts, lasts = np.concatenate([[0], cut]), np.concatenate([cut, [len(lo)]]) - 1
        parts = [np.asarray(self.column[int(lo[i]) : int(hi[j])]) for i, j in zip(firsts, lasts, strict=True)]
        raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
        for part in parts:
            budget.note(part)
        self.held = parts
        return raw.reshape(len(raw), -1)

    def episode(self, pos: int) -> Any:
        """Every stored row of episode ``pos`` (a flat key's final one too; a frame column's bytes)."""
        lo = int(self.starts[pos]) + (pos if self.flat else 0)
        hi = lo + int(self.lens[pos]) + (1 if self.flat else 0)
        column = self.column
        if _is_frames(column):
            first, last = int(column.starts[lo]), int(column.ends[hi - 1])
            return np.concatenate([np.frombuffer(column.fetch([first], [last])(0), np.uint8),
                                   (column.ends[lo:hi] - first).view(np.uint8)])  # fmt: skip
        return np.ascontiguousarray(column[lo:hi])


def _is_frames(column: Any) -> bool:
    return isinstance(column, FramesColumn)


def _frames_same(column: Any, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Whether each stored frame ``rows[i]`` is byte for byte frame ``rows[i] - 1`` (where ``valid``)."""
    same = np.zeros(len(rows), bool)
    where = np.flatnonzero(valid)
    same[where] = column.repeats(rows[where])
    return same


def _run_lengths(mask: np.ndarray, carry: int) -> np.ndarray:
    """Length of the run of trues ending at each row (0 at a false), the first run continuing
    one of ``carry`` rows before."""
    if mask.size == 0:
        return np.zeros(0, np.int64)
    c = np.cumsum(mask, dtype=np.int64)
    base = np.maximum.accumulate(np.where(~mask, c, 0))
    runs = c - base
    runs[base == 0] += carry
    return np.where(mask, runs, 0)


def _word_sums(rows: np.ndarray, bounds: np.ndarray, key: str) -> np.ndarray:
    """Per segment of rows (starting at ``bounds``), the sum of its uint32 words (bytes where a
    row is no whole number of words) mod 2**64, times a constant drawn from the key's name. Exact
    integers, so the pieces' sums add up to the episode's."""
    data = np.ascontiguousarray(rows)
    row_bytes = data.dtype.itemsize * (data.size // max(1, len(data)))
    words = data.reshape(-1).view(np.uint8)
    per_row = row_bytes
    if row_bytes % 4 == 0:
        words, per_row = words.view(np.uint32), row_bytes // 4
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") | 1
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(words, bounds * per_row, dtype=np.uint64)
        return sums * np.uint64(seed)


def measure(ds: Dataset, *, atol: float = 1e-5, budget: Budget | None = None) -> EpisodeMeasures:
    """Measure every episode of ``ds`` in one bounded pass (see the module docstring).

    Duplicates: episodes whose fingerprint (:func:`_word_sums`) and length match another's are
    read again and get the sha256 of their stored rows; only equal digests are duplicates.

    Args:
        ds: The dataset (a view reads its parent's rows of its episodes).
        atol: A step is idle when every element of its action and state is within ``atol`` of
            the step before's.
        budget: Bytes of rows per group (default: 16 MiB).
    """
    budget = budget if budget is not None else Budget(16 << 20)
    found = ds.view_parent()
    base, positions = found if found is not None else (ds, np.arange(ds.num_episodes, dtype=np.int64))
    roles = KeyRoles.of(base)
    starts = base.episode_index["start"].astype(np.int64)
    lens_by_pos = base.episode_index["length"].astype(np.int64)
    lengths = lens_by_pos[positions]
    n = len(positions)
    readers = {k: _Reader(base, k, starts, lens_by_pos) for k in base.stored_fields}
    ad = int(sum(int(np.prod(base.stored_fields[k].shape, dtype=np.int64)) for k in roles.action))
    m = EpisodeMeasures(
        lengths=lengths,
        returns=np.zeros(n, np.float64),
        idle_steps=np.zeros(n, np.int64),
        first_active=lengths.copy(),
        last_active=np.zeros(n, np.int64),
        max_action_change=np.zeros((n, ad), np.float64),
        rms_action_change=np.zeros((n, ad), np.float64),
        mean_abs_jerk=np.zeros((n, ad), np.float64),
        frozen={k: np.zeros(n, np.int64) for k in roles.images},
        nonfinite=np.zeros(n, np.int64),
        empty_text=np.zeros(n, np.int64),
        fingerprints=np.zeros(n, np.uint64),
        digests={},
        budget=budget,
    )
    acc = _Sums(n, ad, roles.images)
    step_bytes = sum(_row_bytes(r.spec, r.column) for r in readers.values())
    max_rows = max(CONTEXT + 1, budget.nbytes // step_bytes)
    # content sums and finiteness checks run on a second thread (numpy releases the GIL)
    with ThreadPoolExecutor(1, thread_name_prefix="rlds-audit") as worker:
        for group in _groups(lengths, positions, lens_by_pos, max_rows):
            _measure_group(group, readers, roles, m, budget, atol, acc, worker)
    with np.errstate(invalid="ignore", divide="ignore"):
        m.rms_action_change = np.sqrt(acc.sumsq / np.maximum(acc.diffs, 1)[:, None])
        m.mean_abs_jerk = acc.jerk / np.maximum(acc.jerks, 1)[:, None]
    _digest_candidates(m, positions, readers, budget)
    instructions = ds.instructions
    m.empty_text = instructions.empty_steps(ds) if instructions is not None else np.zeros(n, np.int64)
    return m


class _Sums:
    """Running sums over the pieces of each episode, finished into :class:`EpisodeMeasures`."""

    def __init__(self, n: int, ad: int, images: tuple[str, ...]) -> None:
        self.sumsq = np.zeros((n, ad), np.float64)
        self.jerk = np.zeros((n, ad), np.float64)
        self.diffs = np.zeros(n, np.int64)
        self.jerks = np.zeros(n, np.int64)
        self.frozen_run = dict.fromkeys(images, 0)  # the run at the end of the last piece


def _digest_candidates(
    m: EpisodeMeasures, positions: np.ndarray, readers: dict[str, _Reader], budget: Budget
) -> None:
    """sha256 of the episodes whose (fingerprint, length) is another's too."""
    keyed = m.fingerprints.astype(np.uint64) ^ (m.lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    _, inverse, counts = np.unique(keyed, return_inverse=True, return_counts=True)
    for i in np.flatnonzero(counts[inverse] > 1).tolist():
        h = hashlib.sha256()
        for key in sorted(readers):
            rows = readers[key].episode(int(positions[i]))
            budget.total += rows.nbytes
            h.update(f"{key}:{rows.dtype}:{rows.shape}:".encode())
            h.update(rows.reshape(-1).view(np.uint8).data)
        m.digests[i] = h.hexdigest()


def _measure_group(
    g: _Group,
    readers: dict[str, _Reader],
    roles: KeyRoles,
    m: EpisodeMeasures,
    budget: Budget,
    atol: float,
    acc: _Sums,
    worker: ThreadPoolExecutor,
) -> None:
    sizes = g.b - g.a + g.ctx
    k = len(sizes)
    ep = np.repeat(np.arange(k), sizes)  # each row's piece
    firsts = np.cumsum(sizes) - sizes
    t = np.arange(len(ep), dtype=np.int64) - np.repeat(firsts, sizes) + np.repeat(g.a - g.ctx, sizes)
    has_ctx = bool(g.ctx.any())
    own = np.repeat(g.a, sizes) <= t if has_ctx else None
    d1 = np.zeros(len(t), bool)
    d1[1:] = ep[1:] == ep[:-1]
    d3 = np.zeros(len(t), bool)
    d3[3:] = ep[3:] == ep[:-3]

    def cut(v: np.ndarray) -> np.ndarray:
        return v if own is None else v[own]

    bounds = firsts if own is None else np.searchsorted(cut(ep), np.arange(k))
    views = g.view
    # a flat key's rows hold each ended piece's final row too: the rows before each piece
    extra = np.cumsum(g.ends) - g.ends
    raws: dict[str, np.ndarray] = {}
    steps: dict[str, np.ndarray] = {}

    def rows_of(key: str) -> np.ndarray:  # a key's steps (with context), final rows left out
        if key not in steps:
            raw = raws[key]
            if readers[key].flat and g.ends.any():
                raw = np.delete(raw, (firsts + extra + sizes)[g.ends], axis=0)
            steps[key] = raw
        return steps[key]

    def raw_bounds(key: str) -> np.ndarray:  # each piece's own rows (a final one too) in raws[key]
        return firsts + g.ctx + (extra if readers[key].flat else 0)

    for key in roles.low_dim:
        raws[key] = readers[key].read_raw(g, budget)
    checked: Future[tuple[np.ndarray, np.ndarray | None]] = worker.submit(
        _content, {key: (raws[key], raw_bounds(key)) for key in roles.low_dim}, roles.numbers
    )
    still = d1.copy()  # idle until something changes
    if roles.action:
        for key in roles.action:
            still &= _close(rows_of(key), atol)
        # the state is compared only at the steps whose action did not move (few, as a rule)
        for key in roles.state:
            idx = np.flatnonzero(still)
            x = raws[key]
            r = idx + extra[ep[idx]]
            still[idx[~_rows_close(x[r], x[r - 1], atol)]] = False
    elif roles.state:
        for key in roles.state:
            still &= _close(rows_of(key), atol)
    else:
        still[:] = False
    own_t = cut(t)
    own_still = cut(still)
    active = ~own_still & (own_t >= 1)
    m.idle_steps[views] += np.add.reduceat(own_still.astype(np.int64), bounds)
    big = np.iinfo(np.int64).max
    first = np.minimum.reduceat(np.where(active, own_t, big), bounds)
    m.first_active[views] = np.minimum(m.first_active[views], first)
    m.last_active[views] = np.maximum(
        m.last_active[views], np.maximum.reduceat(np.where(active, own_t, 0), bounds)
    )
    if roles.action:
        _actions(
            np.concatenate([rows_of(key) for key in roles.action], axis=1), d1, d3, cut, bounds, views, m, acc
        )
    if "next/reward" in raws:
        m.returns[views] += np.add.reduceat(
            cut(rows_of("next/reward")), bounds, axis=0, dtype=np.float64
        ).sum(axis=1)
    sums, bad = checked.result()
    with np.errstate(over="ignore"):
        m.fingerprints[views] += sums
    if bad is not None:
        m.nonfinite[views] += bad
    for key in roles.images:
        frozen = cut(_image_same(readers[key], g, d1, budget, m, views, cut, bounds) & ~still)
        for i in range(k):
            lo, hi = int(bounds[i]), int(bounds[i + 1]) if i + 1 < k else len(frozen)
            runs = _run_lengths(frozen[lo:hi], acc.frozen_run[key] if g.a[i] > 0 else 0)
            if len(runs):
                m.frozen[key][views[i]] = max(int(m.frozen[key][views[i]]), int(runs.max()))
                acc.frozen_run[key] = int(runs[-1])
    for reader in readers.values():
        reader.release()


def _content(
    keys: dict[str, tuple[np.ndarray, np.ndarray]], numbers: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per piece, the low-dim keys' part of the fingerprints (:func:`_word_sums`) and the count of
    non-finite values in the float keys, final rows included (``None``: all finite)."""
    total: np.ndarray | None = None
    bad: np.ndarray | None = None
    for key, (x, bounds) in keys.items():
        sums = _word_sums(x, bounds, key)
        with np.errstate(over="ignore"):
            total = sums if total is None else total + sums
        if key in numbers and not np.isfinite(x).all():
            count = np.add.reduceat((~np.isfinite(x)).sum(axis=1), bounds)
            bad = count if bad is None else bad + count
    return (total if total is not None else np.zeros(0, np.uint64)), bad


def _close(x: np.ndarray, atol: float) -> np.ndarray:
    """Whether each row is within ``atol`` of the row before (element-wise; row 0: false)."""
    close = np.zeros(len(x), bool)
    if len(x) > 1:
        close[1:] = _rows_close(x[1:], x[:-1], atol)
    return close


def _rows_close(x: np.ndarray, y: np.ndarray, atol: float) -> np.ndarray:
    if x.dtype.kind == "f":
        d = np.subtract(x, y)
        return _all_columns(np.abs(d, out=d) <= atol)
    return _all_columns(x == y)


def _all_columns(c: np.ndarray) -> np.ndarray:
    """``c.all(axis=1)`` of a 2-D bool array, one pass per column (3x faster for short rows)."""
    if c.shape[1] == 0:
        return np.ones(len(c), bool)
    out = c[:, 0].copy()
    for j in range(1, c.shape[1]):
        out &= c[:, j]
    return out


def _actions(
    a: np.ndarray,
    d1: np.ndarray,
    d3: np.ndarray,
    cut: Any,
    bounds: np.ndarray,
    views: np.ndarray,
    m: EpisodeMeasures,
    acc: _Sums,
) -> None:
    """Action changes (max, sum of squares) and jerk (sum of |third difference|) per piece, in
    float32 (sums in float64)."""
    a = a.astype(np.float32, copy=False)
    d = np.zeros_like(a)
    np.subtract(a[1:], a[:-1], out=d[1:])
    j = np.zeros_like(a)
    if len(a) > 3:
        j[3:] = np.diff(d[1:], n=2, axis=0)
    d[~d1] = 0.0
    j[~d3] = 0.0
    ad = np.abs(cut(d), out=d if cut(d) is d else None)
    aj = np.abs(cut(j), out=j if cut(j) is j else None)
    if not (np.isfinite(ad).all() and np.isfinite(aj).all()):
        ad, aj = np.nan_to_num(ad), np.nan_to_num(aj)
    m.max_action_change[views] = np.maximum(
        m.max_action_change[views], np.maximum.reduceat(ad, bounds, axis=0)
    )
    acc.sumsq[views] += np.add.reduceat(np.square(ad, out=ad), bounds, axis=0, dtype=np.float64)
    acc.jerk[views] += np.add.reduceat(aj, bounds, axis=0, dtype=np.float64)
    acc.diffs[views] += np.add.reduceat(cut(d1).astype(np.int64), bounds)
    acc.jerks[views] += np.add.reduceat(cut(d3).astype(np.int64), bounds)


def _image_same(
    reader: _Reader,
    g: _Group,
    d1: np.ndarray,
    budget: Budget,
    m: EpisodeMeasures,
    views: np.ndarray,
    cut: Any,
    bounds: np.ndarray,
) -> np.ndarray:
    """Whether each step's frame equals the step before's (within the episode); adds the key's
    part of the fingerprints. Frame columns are compared as stored bytes, never decoded."""
    column = reader.column
    if _is_frames(column):
        lo, hi = reader.rows(g)
        hi = hi - (g.ends if reader.flat else 0)  # the steps' rows: no final frame
        rows = np.concatenate(
            [np.arange(a, b, dtype=np.int64) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
        )
        sizes = column.ends[rows] - column.starts[rows]
        budget.total += int(sizes.sum())
        with np.errstate(over="ignore"):
            m.fingerprints[views] += _word_sums(cut(sizes), bounds, reader.key)
        return _frames_same(column, rows, d1)
    steps = reader.read(g, budget)
    flat = steps.reshape(len(steps), -1)
    with np.errstate(over="ignore"):
        m.fingerprints[views] += _word_sums(cut(flat), bounds, reader.key)
    same = np.zeros(len(flat), bool)
    if len(flat) > 1:
        same[1:] = (flat[1:] == flat[:-1]).all(axis=1)
    return same & d1
