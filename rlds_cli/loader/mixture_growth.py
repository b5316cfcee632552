"""Mixtures over datasets that grow: readiness, annealing, fixed-ratio batches, refresh.

The rules a :class:`~rlds_cli.loader.mixture.MixtureSampler` applies to its weights, kept here
so they can be read (and tested) on their own:

* **Readiness.** A member is *ready* when it has steps and, for a growing dataset, when
  ``Dataset.ready`` is true (its ``min_size`` unprotected steps and its ``min_total`` steps in
  all reached). A member that is not ready gets weight 0 and the weights of the others are
  renormalized to sum to 1 (as AMAGO's ``MixtureOfDatasets`` does): it is never served.
* **Annealing** (``anneal=N``). A member ready when the mixture starts has its full weight at
  once. A member that becomes ready later, first seen ready before batch ``b0`` (batches counted
  from 0), has at batch ``b`` the weight ``w * min(1, (b - b0 + 1) / N)``: ``w / N`` on its first
  batch, its full weight from batch ``b0 + N - 1`` on, linear in between; the weights are then
  renormalized over the ready members. ``b0`` is kept if the member stops being ready (an
  eviction below ``min_size``) and is ready again.
* **Fixed ratio** (``split="fixed"``). Each batch takes from member ``i`` exactly ``floor(w_i * B)``
  rows plus one for the members with the largest remainders ``w_i * B - floor(w_i * B)`` (ties
  go to the earlier member, members of weight 0 get none), until the counts sum to ``B``: each
  count is ``w_i * B`` rounded down or up, the largest-remainder rounding. With weights
  ``0.5, 0.5`` every batch is exactly half and half (RLPD's offline/online batches).
  ``split="random"`` (the default) draws the counts from a multinomial instead.

:class:`MixtureRefresher` is the ``refresh=N`` of a :class:`~rlds_cli.loader.MixtureLoader`:
the same hook as :class:`~rlds_cli.loader.loader.Refresher` (called by the loader under its
lock before each batch), which every ``N`` batches refreshes the growing members and, when a
view changed, rebuilds that member's rows and the sampler's sizes and readiness. Indices and
rows of one batch therefore come from one view: no index past a member's end, no evicted row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rlds_cli.loader.mixture import MixtureSampler, MixtureSource

#: ``ready_at`` of a member ready when the mixture started: full weight at once.
FROM_START = -1
#: ``ready_at`` of a member never seen ready yet.
NOT_READY = -2

SPLITS = ("random", "fixed")

#: A mixture's weights: one per member, or ``schedule(batches drawn) -> weights``.
Weights = Sequence[float] | Callable[[int], Sequence[float]]


def check_weights(weights: Any, count: int) -> np.ndarray:
    """``weights`` normalized, or a ``ValueError`` unless ``count`` finite non-negative numbers
    with a positive sum."""
    try:
        w = np.asarray(weights, np.float64)
    except (TypeError, ValueError):  # strings, None, ragged: not numbers
        w = np.full(count + 1, np.nan)
    if w.shape != (count,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(
            f"weights must be {count} finite non-negative numbers with a positive sum, got {weights!r}"
        )
    return w / w.sum()


def fixed_counts(weights: np.ndarray, batch_size: int) -> np.ndarray:
    """Rows per member for one batch of ``batch_size`` with normalized ``weights``: the
    largest-remainder rounding of ``weights * batch_size`` (see the module docstring)."""
    exact = np.asarray(weights, np.float64) * batch_size
    counts = np.floor(exact).astype(np.int64)
    short = int(batch_size - counts.sum())
    if short > 0:
        remainder = exact - counts
        remainder[np.asarray(weights) <= 0] = -1.0  # a member of weight 0 never gets a row
        order = np.argsort(-remainder, kind="stable")  # largest first, ties to the earlier member
        counts[order[:short]] += 1
    return counts


def ready_since(ready_at: np.ndarray, ready: np.ndarray, batch: int) -> np.ndarray:
    """``ready_at`` after the members ``ready`` now were seen ready before batch ``batch``."""
    return np.where((ready_at == NOT_READY) & ready, batch, ready_at).astype(np.int64)


def effective_weights(
    base: np.ndarray, ready: np.ndarray, ready_at: np.ndarray, batch: int, anneal: int | None
) -> np.ndarray:
    """The weights batch ``batch`` is drawn with: ``base`` (normalized), times each member's
    anneal ramp, zero where not ``ready``, renormalized (see the module docstring). All zero when
    no ready member has a positive weight."""
    if anneal is None:
        ramp = np.ones(len(base))
    else:
        ramp = np.clip((batch - ready_at + 1) / anneal, 0.0, 1.0)
        ramp[ready_at == FROM_START] = 1.0
    w = np.where(ready & (ready_at != NOT_READY), base * ramp, 0.0)
    total = w.sum()
    return w / total if total > 0 else w


def check_split(split: str, anneal: int | None) -> None:
    """A ``ValueError`` for a ``split`` or ``anneal`` argument that is not one of ours."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if anneal is not None and (isinstance(anneal, bool) or not isinstance(anneal, int) or anneal < 1):
        raise ValueError(f"anneal must be a number of batches >= 1 or None, got {anneal!r}")


def named_weights(weights: Weights | Mapping[str, float], names: Sequence[str]) -> Weights:
    """``{name: weight}`` as a list in ``names`` order (a missing name weighs 0); anything
    else as given."""
    if not isinstance(weights, Mapping):
        return weights
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"weights name unknown source(s) {unknown}; sources are {list(names)}")
    return [weights.get(n, 0.0) for n in names]  # checked as numbers by check_weights


class MixtureRefresher:
    """Refreshes a mixture's growing members every ``every`` batches (module docstring).

    Args:
        source: The mixture's source; ``sampler``: its sampler; ``every``: batches between
            refreshes (``1``: before every batch).
    """

    def __init__(self, source: MixtureSource, sampler: MixtureSampler, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"refresh must be a number of batches >= 1, got {every!r}")
        if not any(hasattr(ds, "refresh") for ds in source.datasets):
            raise ValueError(
                f"refresh= follows growing datasets (written with DatasetWriter); none of "
                f"{source.names} is one"
            )
        self.source = source
        self.sampler = sampler
        self.every = every
        #: Batches seen (the count ``every`` divides), kept in the loader's state.
        self.batches = 0
        #: What else follows a changed view (the windows' ``bind_source``), given the source.
        self.rebind: list[Any] = []

    def tick(self) -> None:
        """Before each batch (under the loader's lock): refresh when due, resize when changed."""
        self.batches += 1
        if self.batches % self.every:
            return
        if self.source.refresh():
            self.sampler.set_sizes(self.source.sizes, self.source.ready())
            for rebind in self.rebind:
                rebind(self.source)
