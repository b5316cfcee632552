"""A :class:`~rlds_cli.loader.Loader` over a growing dataset that follows its commits.

``Loader(name, refresh=N)`` refreshes the dataset's view every ``N`` batches (``1``: every
batch), under the loader's lock, before drawing the next batch. A batch is therefore always
drawn and gathered from one view: no index past its end, no evicted row, slices inside one
episode. What follows the view:

* **the source**: made again over the new view, on the host (a loader with
  ``in_memory="device"`` then copies the new view's rows to its device: the refresh happens on
  the host side, before the transfer);
* **the sampler**, in place (its generator goes on, so a run is reproducible for a given
  sequence of views): ``"uniform"`` takes the new size; ``"slice"`` makes its episode tables
  again; ``"prioritized"`` keeps the priority of every row still in the view (mapped by its
  episode's id, never by position: see :mod:`rlds_cli.loader.view_change`), gives new rows the
  largest priority seen so far and drops evicted rows'; ``"epoch"``: the epoch in progress keeps
  its order less the evicted rows, and rows added during it come in the next epoch (see
  :meth:`~rlds_cli.loader.epoch.EpochSampler.follow`; one shard only). ``"epoch"`` and
  ``"prioritized"`` need ``prefetch=0`` (a batch prefetched before a refresh belongs to the old
  view: it could not be put back into an epoch, and its priorities would land on other rows);
* **transforms bound to the dataset** (:class:`~rlds_cli.loader.transforms.FrameStack`,
  ``windows=``, ``NStepReturn``, ``GoalRelabel``...) are bound again to the new view (and the
  first one claims its keys again); a ``Normalize`` keeps the statistics of its first binding.

Cost: a refresh that finds nothing new is one ``stat`` of the commit log (a few microseconds);
one that finds commits reads the new segments' indexes and extends the view (linear in the
episodes), then makes the source and the sampler's tables again (linear in the episodes;
``"prioritized"`` and an ``in_memory`` copy: in the rows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlds_cli.loader.device import DeviceSource
from rlds_cli.loader.protocols import Bindable, Epochal
from rlds_cli.loader.sources import HostSource
from rlds_cli.loader.view_change import ViewChange

if TYPE_CHECKING:
    from rlds_cli.loader.loader import Loader


class Refresher:
    """Refreshes ``loader``'s growing dataset every ``every`` batches (see the module docstring).

    Args:
        loader: The loader (its source must be made from a growing dataset).
        every: Batches between refreshes.
        sampler: The sampler's name; ``options``: its options; ``pack``: the loader's ``pack``.
    """

    def __init__(self, loader: Loader, every: int, sampler: Any, options: dict[str, Any], pack: bool) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"refresh must be a number of batches >= 1, got {every!r}")
        dataset = loader.dataset
        if dataset is None or not hasattr(dataset, "refresh"):
            raise ValueError(
                f"refresh= follows a growing dataset (written with DatasetWriter); "
                f"{getattr(dataset, 'name', 'this dataset')!r} never changes: drop refresh="
            )
        if not isinstance(sampler, str) or not hasattr(loader.sampler, "follow"):
            raise ValueError(
                "refresh= needs a sampler given by name ('uniform', 'slice', 'prioritized', 'epoch'): "
                "a sampler object of your own cannot follow the dataset's new rows"
            )
        if isinstance(loader.sampler, Epochal) and loader.world_size != 1:
            raise ValueError(
                "refresh= with the 'epoch' sampler needs world_size=1: ranks refresh at different "
                "moments and could not agree on an epoch's rows; use 'uniform' across ranks"
            )
        if sampler in ("epoch", "prioritized") and loader.prefetch:
            why = {
                "epoch": "could not be put back into an epoch carried over it",
                "prioritized": "holds rows of the old view: its priorities would land on other rows",
            }[sampler]
            raise ValueError(
                f"refresh= with the {sampler!r} sampler needs prefetch=0: a batch prefetched "
                f"before a refresh {why}"
            )
        self.loader = loader
        self.every = every
        self.sampler = sampler
        self.options = options
        self.pack = pack
        self.batches = 0
        #: Refreshes that found a changed view.
        self.rebuilds = 0
        self._ids = dataset.episode_ids  # type: ignore[attr-defined]
        self._lengths = dataset.episode_index["length"]
        self._position = dataset.log_position  # type: ignore[attr-defined]  # the view followed last
        self._failed: BaseException | None = None

    def tick(self) -> None:
        """Before each batch (under the loader's lock): refresh when due, follow when changed."""
        if self._failed is not None:  # a view the sampler could not follow: never half of it
            raise self._failed
        self.batches += 1
        if self.batches % self.every:
            return
        loader = self.loader
        ds: Any = loader.dataset
        ds.refresh()
        # the view against the one followed last, not refresh()'s answer: whoever holds the
        # dataset object (the user reading ds.ready) may have refreshed it in between
        if ds.log_position == self._position:
            return
        self._position = ds.log_position
        try:
            self._follow(loader, ds)
        except BaseException as exc:
            self._failed = exc
            raise

    def _follow(self, loader: Any, ds: Any) -> None:
        self.rebuilds += 1
        change = ViewChange(self._ids, self._lengths, ds.episode_ids, ds.episode_index["length"])
        self._ids, self._lengths = ds.episode_ids, ds.episode_index["length"]
        for t in loader.transforms:
            if isinstance(t, Bindable):
                t.bind(ds)
        keys = loader._unclaimed(loader.keys)  # the first transform claims its keys again
        f32 = loader._dtypes.all == torch.float32  # as the loader's own source: cast once, when loaded
        host = HostSource(ds, keys, in_memory=bool(loader.in_memory), pack=self.pack, float32=f32)
        loader._host = host
        loader.source = host
        loader._gather = host.gather_function()
        if loader._device_source is not None:
            device = DeviceSource(host, loader._device_source.device)  # the new rows, copied over
            loader.source = loader._device_source = device
            loader._gather = device.gather
        loader.num_steps = ds.num_steps
        loader.sampler.follow(change)
        loader._batches_per_epoch = loader._epoch_length()
