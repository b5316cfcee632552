"""A :class:`~rlds_cli.loader.Loader` over a growing dataset that follows its commits.

``Loader(name, refresh=N)`` refreshes the dataset's view every ``N`` batches (``1``: every
batch): when new episodes were committed, or old ones evicted, it rebuilds its source and its
sampler over the new view, under the loader's lock, before drawing the next batch. A batch is
therefore always drawn and gathered from one view: no index past its end, no evicted row, slices
inside one episode. A refresh that finds nothing new costs one ``open`` + ``fstat`` of the
commit log; one that finds commits rebuilds the episode index (linear in the episodes) and the
sampler. The sampler's generator after the ``k``-th rebuild is seeded from ``(seed, k)``, so a
run is reproducible for a given sequence of views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlds_cli.loader.protocols import Bindable, Epochal
from rlds_cli.loader.sources import HostSource

if TYPE_CHECKING:
    from rlds_cli.loader.loader import Loader


class Refresher:
    """Refreshes ``loader``'s growing dataset every ``every`` batches (see the module docstring).

    Args:
        loader: The loader (its source must be a host source over a growing dataset).
        every: Batches between refreshes.
        sampler: The sampler's name; ``options``: its options; ``pack``: the loader's ``pack``.
    """

    def __init__(self, loader: Loader, every: int, sampler: Any, options: dict[str, Any], pack: bool) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"refresh must be a number of batches >= 1, got {every!r}")
        if loader.dataset is None or not hasattr(loader.dataset, "refresh"):
            raise ValueError("refresh= follows a growing dataset (written with DatasetWriter)")
        if not isinstance(sampler, str) or sampler == "prioritized" or isinstance(loader.sampler, Epochal):
            raise ValueError(
                "refresh= needs a sampler given by name that draws with replacement ('uniform', 'slice')"
            )
        if loader._device_source is not None or any(isinstance(t, Bindable) for t in loader.transforms):
            raise ValueError("refresh= works with host batches and transforms not bound to the dataset")
        self.loader = loader
        self.every = every
        self.sampler = sampler
        self.options = options
        self.pack = pack
        self.batches = 0
        #: Rebuilds so far (views that changed).
        self.rebuilds = 0

    def tick(self) -> None:
        """Before each batch (under the loader's lock): refresh when due, rebuild when changed."""
        self.batches += 1
        if self.batches % self.every:
            return
        loader = self.loader
        assert loader.dataset is not None
        if not loader.dataset.refresh():  # type: ignore[attr-defined]
            return
        self.rebuilds += 1
        keys = loader._unclaimed(loader.keys)
        f32 = loader._dtypes.all == torch.float32  # as the loader's own source: cast once, when loaded
        host = HostSource(loader.dataset, keys, in_memory=bool(loader.in_memory), pack=self.pack, float32=f32)
        seed = loader.seed
        derived = int(np.random.SeedSequence([seed or 0, self.rebuilds]).generate_state(1)[0])
        loader._host = host
        loader.source = host
        loader._gather = host.gather_function()
        loader.num_steps = loader.dataset.num_steps
        loader.sampler = loader._make_sampler(self.sampler, derived, dict(self.options))
        loader.seed = seed  # the run seed stays the one the loader was made with
        loader._batches_per_epoch = loader._epoch_length()
