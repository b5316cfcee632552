"""``rlds audit``: which episodes of a dataset look broken, and a view of the others.

:func:`audit` measures every episode in one bounded pass (:mod:`rlds_cli.inspection.audit_scan`)
and flags it by the tolerances of :class:`AuditTolerances`:

* ``idle``: more than ``max_idle`` of its steps repeat the step before (action and state within
  ``atol``);
* ``spike``: an action changes by more than ``spike_factor`` times its typical change (the
  median over episodes of each dimension's RMS change);
* ``jerk``: its mean absolute third difference of the actions is more than ``jerk_factor``
  times the median episode's, in some dimension;
* ``frozen:<key>``: camera ``key`` shows the same frame (the same stored bytes) for
  ``frozen_steps`` or more steps in a row while the robot is not idle;
* ``nonfinite``: a NaN or infinite value in a float key;
* ``duplicate``: the same content (sha256 of every stored row) as an earlier episode;
* ``length_outlier`` / ``return_outlier``: outside Tukey's fences ``iqr_factor`` interquartile
  ranges beyond the quartiles (with 5 or more episodes);
* ``empty_instruction``: a step whose language instruction is empty (datasets with text).

:meth:`AuditReport.keep` publishes the episodes that pass, whole, as a view.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlds_cli.cache.blocks import Budget
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.selected import SelectedDataset
from rlds_cli.catalog.registry import resolve_name
from rlds_cli.errors import InvalidSelectionError
from rlds_cli.inspection.audit_scan import EpisodeMeasures, measure

__all__ = ["FLAGS", "AuditReport", "AuditTolerances", "audit"]

_HINT = "see 'rlds audit --help' for what each tolerance means"

#: Every flag an episode may get (``frozen`` as ``frozen:<key>``, one per camera key).
FLAGS = (
    "idle", "spike", "jerk", "frozen", "nonfinite", "duplicate", "length_outlier", "return_outlier",
    "empty_instruction",
)  # fmt: skip


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
        for name in ("atol", "spike_factor", "jerk_factor", "iqr_factor"):
            if not float(getattr(self, name)) > 0:
                raise InvalidSelectionError(
                    f"audit tolerance {name} must be above 0, got {getattr(self, name)}", hint=_HINT
                )
        if not 0.0 <= self.max_idle < 1.0:
            raise InvalidSelectionError(
                f"audit tolerance max_idle must be in [0, 1), got {self.max_idle}", hint=_HINT
            )
        if self.frozen_steps < 1:
            raise InvalidSelectionError(
                f"audit tolerance frozen_steps must be 1 or more, got {self.frozen_steps}", hint=_HINT
            )


@dataclass
class AuditReport:
    """The audit of one dataset: per-episode measures and flags.

    Attributes:
        dataset: The dataset's name.
        tolerances: The thresholds used.
        measures: What was measured (:class:`~rlds_cli.inspection.audit_scan.EpisodeMeasures`).
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

    Args:
        dataset: The dataset.
        tolerances: The thresholds (default :class:`AuditTolerances`); or pass them one by one
            as keywords (``max_idle=0.3``).
        root: Cache root, for a name.
        budget: Bytes of rows read at a time (default 16 MiB).

    Returns:
        The :class:`AuditReport`.
    """
    if tolerances is None:
        tolerances = AuditTolerances(**tolerance)
    elif tolerance:
        raise TypeError("pass tolerances= or keyword tolerances, not both")
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(resolve_name(dataset, root), root)
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
    if m.empty_text.any() or _has_text(ds):
        flags["empty_instruction"] = np.flatnonzero(m.empty_text > 0)
    report.flags = {k: v.astype(np.int64) for k, v in flags.items()}
    return report


def _has_text(ds: Dataset) -> bool:
    found = ds.view_parent()
    source = (found[0] if found is not None else ds).manifest.source
    return bool(((source.get("metadata") or {}).get("rlds") or {}).get("text"))
