"""Following a growing dataset: a :class:`~rlds_cli.loader.Loader`'s ``refresh=N``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlds_cli.loader.protocols import Epochal
from rlds_cli.loader.samplers import ViewChange


class Refresher:
    """``Loader(name, refresh=N)``: refreshes the loader's growing dataset every ``N`` batches
    (``1``: every batch), under the loader's lock, before the next draw, so a batch is drawn and
    gathered from one view (no index past its end, no evicted row, slices inside one episode).
    A changed view moves the loader (``follow``, the loader's):

    * the source is made again over the new view (``in_memory="device"``: copied to the device);
    * the sampler follows in place, its generator going on (reproducible for a given sequence of
      views): ``"uniform"`` takes the new size; ``"slice"`` remakes its episode tables;
      ``"prioritized"`` keeps each remaining row's priority (mapped by episode id, never by
      position: :mod:`rlds_cli.loader.samplers`), gives new rows the largest priority seen and
      drops evicted rows'; ``"epoch"``: the current epoch keeps its order less the evicted rows,
      rows added during it come in the next (one shard only). ``"epoch"`` and ``"prioritized"``
      need ``prefetch=0``;
    * transforms bound to the dataset (``FrameStack``, ``windows=``, ``NStepReturn``,
      ``GoalRelabel``...) are bound again; a ``Normalize`` keeps its first statistics.

    Cost: nothing new is one ``stat`` of the commit log; new commits read the new segments'
    indexes and remake the source and the sampler's tables (linear in the episodes; in the rows
    for ``"prioritized"`` and an ``in_memory`` copy).

    Args:
        dataset: The loader's dataset (growing).
        drawing: The loader's sampler.
        every: Batches between refreshes.
        sampler: The sampler as the loader was given it (a name follows; an object cannot).
        world_size, prefetch: The loader's.
        follow: Moves the loader to a new view: ``follow(dataset, change)``.
    """

    def __init__(
        self, dataset: Any, drawing: Any, every: int, sampler: Any, *, world_size: int, prefetch: int,
        follow: Callable[[Any, ViewChange], None],
    ) -> None:  # fmt: skip
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"refresh must be a number of batches >= 1, got {every!r}")
        if dataset is None or not hasattr(dataset, "refresh"):
            raise ValueError(
                f"refresh= follows a growing dataset (written with DatasetWriter); "
                f"{getattr(dataset, 'name', 'this dataset')!r} never changes: drop refresh="
            )
        if sampler == "blocks" or getattr(drawing, "resident", None) is not None:
            raise ValueError(
                "refresh= cannot follow a growing dataset with sampler='blocks' or resident_window=: "
                "they walk the blocks of one view of it; drop refresh=, or use 'epoch' or 'uniform'"
            )
        if not isinstance(sampler, str) or not hasattr(drawing, "follow"):
            raise ValueError(
                "refresh= needs a sampler given by name ('uniform', 'slice', 'prioritized', 'epoch'): "
                "a sampler object of your own cannot follow the dataset's new rows"
            )
        if isinstance(drawing, Epochal) and world_size != 1:
            raise ValueError(
                "refresh= with the 'epoch' sampler needs world_size=1: ranks refresh at different "
                "moments and could not agree on an epoch's rows; use 'uniform' across ranks"
            )
        if sampler in ("epoch", "prioritized") and prefetch:
            why = {
                "epoch": "could not be put back into an epoch carried over it",
                "prioritized": "holds rows of the old view: its priorities would land on other rows",
            }[sampler]
            raise ValueError(
                f"refresh= with the {sampler!r} sampler needs prefetch=0: a batch prefetched "
                f"before a refresh {why}"
            )
        self.dataset, self._move = dataset, follow
        self.every = every
        self.batches = 0
        #: Refreshes that found a changed view.
        self.rebuilds = 0
        self._ids = dataset.episode_ids
        self._lengths = dataset.episode_index["length"]
        self._position = dataset.log_position  # the view followed last
        self._failed: BaseException | None = None

    def tick(self) -> None:
        """Before each batch (under the loader's lock): refresh when due, follow when changed."""
        if self._failed is not None:  # a view the sampler could not follow: never half of it
            raise self._failed
        self.batches += 1
        if self.batches % self.every:
            return
        ds = self.dataset
        ds.refresh()
        # compared with the view followed last, not refresh()'s answer: the dataset's holder
        # (e.g. the user reading ds.ready) may have refreshed it in between
        if ds.log_position == self._position:
            return
        self._position = ds.log_position
        try:
            self._follow(ds)
        except BaseException as exc:
            self._failed = exc
            raise

    def _follow(self, ds: Any) -> None:
        self.rebuilds += 1
        change = ViewChange(self._ids, self._lengths, ds.episode_ids, ds.episode_index["length"])
        self._ids, self._lengths = ds.episode_ids, ds.episode_index["length"]
        self._move(ds, change)
