"""The loader's plug points: what a sampler, source or transform must have, and optional capabilities.

A sampler needs only :class:`Sampler` (``sample``). Each capability is its own protocol, checked
with ``isinstance`` once, when the :class:`~rlds_cli.loader.Loader` is made:

* :class:`Checkpointable`: ``state_dict`` / ``load_state_dict``, so a run can resume exactly;
* :class:`Epochal`: the sampler knows its epoch (``batches_per_epoch``, ``epoch_done``); without
  it, an epoch is enough batches to draw the rank's share of the steps;
* :class:`Prioritized`: ``update_priority``, forwarded by ``Loader.update_priority``;
* :class:`Streamable`: a state for rewinding a prefetch queue, cheaper than ``state_dict``
  (priorities are not copied per batch).

A source (:class:`RowSource`) turns step indices into a batch; a :class:`~rlds_cli.loader.Loader`
takes a dataset (and makes its source) or an :class:`IndexedSource` such as a mixture.

A transform is any ``TedBatch -> TedBatch`` callable; :class:`Bindable` ones are bound to the
dataset first, and a first transform that is :class:`Claiming` produces some keys itself (the
loader then never reads them). Every sampler here passes the contract suite in
``tests/contracts/``, which a custom sampler can subclass.

Imports neither torch nor the samplers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset
    from rlds_cli.cache.ted import TedBatch
    from rlds_cli.loader.samplers import Draw, Episodes


@runtime_checkable
class Sampler(Protocol):
    """Draws step indices: an int64 array of any shape (a tensor on the device, for a device
    sampler), or a :class:`~rlds_cli.loader.Draw` (indices plus per-index extras such as ``mask``
    or ``weight``)."""

    def sample(self) -> np.ndarray | Draw | Any:
        """The next draw of the sampler's batch size."""
        ...


@runtime_checkable
class Checkpointable(Protocol):
    """A sampler whose stream can be saved and continued exactly."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream from the next draw."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (refused for another dataset, rank or world size)."""
        ...


@runtime_checkable
class Epochal(Protocol):
    """A sampler that walks epochs itself (without replacement)."""

    @property
    def batches_per_epoch(self) -> int:
        """Draws in one epoch of this rank's shard."""
        ...

    def epoch_done(self) -> bool:
        """Whether the last draw ended an epoch."""
        ...


@runtime_checkable
class Elastic(Protocol):
    """An epoch sampler that resumes from every rank's state at another world size
    (:mod:`rlds_cli.loader.epoch`)."""

    #: Steps of the current epoch no rank has been served, over every rank, as of its last plan
    #: (a :meth:`resume` plans; 0: the states had finished it: the next pass is the next epoch).
    unserved: int

    def resume(self, states: Sequence[dict[str, Any]]) -> None:
        """Go on with the steps of the epoch that none of ``states`` (one per rank) consumed."""
        ...


@runtime_checkable
class Prioritized(Protocol):
    """A sampler whose draw probabilities the learner updates."""

    def update_priority(self, indices: Any, priority: Any) -> None:
        """Set new priorities for the drawn ``indices`` (numpy or torch)."""
        ...


@runtime_checkable
class Streamable(Protocol):
    """A sampler with a light state to rewind a prefetch queue (not a checkpoint)."""

    def stream_state(self) -> dict[str, Any]:
        """The generator state only."""
        ...

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Rewind to a :meth:`stream_state`."""
        ...


@runtime_checkable
class Bindable(Protocol):
    """A transform that needs the dataset (statistics, episode bounds) before its first batch."""

    def bind(self, dataset: Dataset) -> None:
        """Called once by the loader, before any batch."""
        ...


@runtime_checkable
class Claiming(Protocol):
    """A first transform that reads some keys itself (e.g. ``FrameStack``'s stacked frames)."""

    def claim(self, keys: Sequence[str], *, in_memory: bool = False) -> list[str]:
        """Which of ``keys`` it produces; the loader does not read those."""
        ...


@runtime_checkable
class RowSource(Protocol):
    """Where a batch's rows come from: the cache on disk or in RAM
    (:class:`~rlds_cli.loader.sources.HostSource`), a device
    (:class:`~rlds_cli.loader.device.DeviceSource`), several datasets
    (:class:`~rlds_cli.loader.mixture.MixtureSource`)."""

    def gather(self, indices: Any) -> TedBatch:
        """The rows at step ``indices`` (any shape)."""
        ...


@runtime_checkable
class IndexedSource(RowSource, Protocol):
    """A source a :class:`~rlds_cli.loader.Loader` takes in place of a dataset: it also says how
    many steps it has and their episodes, for the sampler. One with ``owns_index = True`` writes
    the batch's ``index`` itself (else the loader writes the sampled indices)."""

    num_steps: int
    episodes: Episodes
