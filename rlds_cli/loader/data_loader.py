"""A ``DataLoader`` over the cache's torch datasets that resumes exactly and hands image
batches over through a shared-memory ring.

The datasets it drives live in :mod:`rlds_cli.loader.torch_data`; the ring in
:mod:`rlds_cli.loader.ring`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.ring import BatchRing, SlotBatch
from rlds_cli.loader.run_state import check_same_dataset, dataset_fingerprint
from rlds_cli.loader.tensors import to_torch
from rlds_cli.loader.torch_data import (
    EpochBatchSampler,
    TedIterableDataset,
    TedMapDataset,
    collate_ted,
)


class TedDataLoader(DataLoader):
    """A ``torch.utils.data.DataLoader`` whose :meth:`state_dict` resumes exactly, with or
    without worker processes.

    Workers run up to ``prefetch_factor * num_workers`` batches ahead; the state counts the
    batches the loop has *taken*. Persistent workers are restarted when their start position is
    not the loader's (after a broken-off pass, :meth:`load_state_dict` or ``set_epoch``).

    With workers, keys with rows of 1 KiB or more go through a shared-memory ring
    (:mod:`rlds_cli.loader.ring`): a kept batch is never overwritten, and values, order and
    :meth:`state_dict` are the same as without it.

    Args:
        dataset: A :class:`TedIterableDataset`, or a :class:`TedMapDataset` with
            ``batch_sampler=EpochBatchSampler(...)``.
        ring_slots: Shared batch buffers per worker (``None``: ``prefetch_factor + 2``, enough
            for the batches in flight plus the ones the loop holds; ``0``: no ring, torch's own
            transfer). Not used without workers, with a ``collate_fn`` of your own, or when no
            key has rows of 1 KiB or more.
        **kwargs: ``DataLoader`` arguments; ``collate_fn`` defaults to :func:`collate_ted` and,
            for an iterable dataset, ``batch_size`` to ``None`` (the dataset makes the batches).
    """

    def __init__(self, dataset: Any, *, ring_slots: int | None = None, **kwargs: Any) -> None:
        if ring_slots is not None and (
            isinstance(ring_slots, bool) or not isinstance(ring_slots, int) or ring_slots < 0
        ):
            raise ValueError(f"ring_slots must be an integer >= 0 or None, got {ring_slots!r}")
        own_collate = kwargs.get("collate_fn", collate_ted) is not collate_ted
        kwargs.setdefault("collate_fn", collate_ted)
        if isinstance(dataset, TedIterableDataset):
            kwargs.setdefault("batch_size", None)
        super().__init__(dataset, **kwargs)
        # a user's collate_fn expects gathered batches, not slot numbers
        per_worker = ring_slots if ring_slots is not None else (self.prefetch_factor or 2) + 2
        self._ring_slots = 0 if own_collate or self.num_workers == 0 else per_worker
        self._ring: BatchRing | None = None  # the ring of the live persistent workers
        if isinstance(dataset, TedIterableDataset):
            target: Any = dataset
        elif isinstance(self.batch_sampler, EpochBatchSampler):
            target = self.batch_sampler
        else:
            raise ValueError(
                "TedDataLoader takes a TedIterableDataset, or a dataset with "
                "batch_sampler=EpochBatchSampler(...)"
            )
        self._target = target
        self._workers_at: tuple[int, int] | None = None  # where persistent workers start next

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        target = self._target
        if self._IterableDataset_len_called is not None and isinstance(self.dataset, TedIterableDataset):
            # torch warns when a pass yields more than the last len(): measure each pass by its own
            # length (an elastically resumed epoch is shorter than the next)
            self._IterableDataset_len_called = len(self.dataset)
        if self.num_workers == 0:  # no prefetching: the dataset or sampler counts by itself
            yield from super().__iter__()
            return
        cursor = (target.epoch, target.position)
        if self.persistent_workers and self._workers_at not in (None, cursor):
            # live workers would start elsewhere: start fresh ones
            self._iterator = None
        fresh = not self.persistent_workers or self._iterator is None  # workers start now
        if fresh:
            # new ring for new workers; the old one lives while its batches are held
            self._ring = self._new_ring()
        ring = self._ring
        sampler = isinstance(target, EpochBatchSampler)
        if sampler:
            target._external = True  # it runs ahead of the loop here: counted below instead
        try:
            self._workers_at = cursor
            if fresh and ring is not None:
                # on the dataset only while the workers start (fork copies it, spawn pickles it)
                data: Any = self.dataset
                data._ring = ring
                try:
                    batches = super().__iter__()
                finally:
                    data._ring = None
            else:
                batches = super().__iter__()
            for batch in batches:
                if isinstance(batch, SlotBatch):
                    assert ring is not None
                    batch = self._wrap(ring, batch)
                target._took()
                yield batch
            target._end_pass()
            self._workers_at = (target.epoch, target.position)  # the workers moved on likewise
        finally:
            if sampler:
                target._external = False

    def _new_ring(self) -> BatchRing | None:
        """A ring for workers about to start, or ``None`` where it would not help."""
        if not self._ring_slots:
            return None
        data = self.dataset
        if isinstance(data, TedIterableDataset):
            rows = data.batch_size
        elif isinstance(data, TedMapDataset) and isinstance(self.batch_sampler, EpochBatchSampler):
            rows = self.batch_sampler.batch_size
        else:
            return None
        ring = BatchRing(data.dataset, data.keys, rows, self.num_workers, self._ring_slots)
        return ring if ring.useful else None

    def _wrap(self, ring: BatchRing, batch: SlotBatch) -> TedBatch:
        out = to_torch(ring.wrap(batch))
        dtypes = getattr(self.dataset, "dtypes", None)
        if dtypes:  # a slot holds the stored dtypes: cast (a copy) here, once
            out = dtypes.cast(out)
        if self.pin_memory and torch.cuda.is_available():
            # pinned copy: the slot returns to its worker once the views are dropped
            out = TedBatch({key: value.pin_memory() for key, value in out.items()})
        return out

    def close(self) -> None:
        """Shut down persistent workers now and drop the shared ring (its memory is freed once
        the batches built from it are). Workers of a pass in progress stop with its iterator."""
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._ring = None

    def state_dict(self) -> dict[str, Any]:
        """The dataset's (or batch sampler's) state at the first batch the loop has not taken, with
        the fingerprint of the rlds dataset it reads."""
        state = self._target.state_dict()
        if self._target is not self.dataset:  # a batch sampler knows steps, not the dataset read
            state = {**state, "dataset": dataset_fingerprint(getattr(self.dataset, "dataset", None))}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`: the next pass continues where the saved run stopped
        (refused from another dataset of the same size)."""
        if self._target is not self.dataset and isinstance(state, Mapping):
            check_same_dataset(state, getattr(self.dataset, "dataset", None), "TedDataLoader")
            state = {k: v for k, v in state.items() if k != "dataset"}
        self._target.load_state_dict(state)
        self._iterator = None  # persistent workers start again from it (their copies plan an epoch)

    def resume(self, states: Sequence[dict[str, Any]]) -> None:
        """Go on from every rank's :meth:`state_dict` of a run at another world size (see
        :meth:`EpochBatchSampler.resume`; an epoch's progress only).

        Raises:
            LoaderStateError: Batches drawn with replacement, or states that are not one run's.
        """
        self._target.resume(states)
        self._iterator = None  # persistent workers start again: their copies hold the old plan
