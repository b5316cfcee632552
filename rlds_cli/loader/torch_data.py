"""``torch.utils.data`` adapters: map-style and iterable datasets over the cache.

Both pickle only the dataset's path and their settings: each DataLoader worker (fork, spawn or
forkserver) reopens the dataset and its memory maps lazily on first use, so no worker inherits a
file handle or a copy of the data. Shuffling and sharding derive from ``(seed, epoch, rank,
worker)``: every data-parallel rank and every worker sees a disjoint part of each epoch's
permutation, without communication and without the global RNG.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from rlds_cli.cache.dataset import Dataset, open_dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.epoch import epoch_permutation, seed_entropy, shard
from rlds_cli.loader.loader import to_torch
from rlds_cli.loader.samplers import positive_int, uniform_ints
from rlds_cli.loader.sources import HostSource, resolve_keys


def _dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: given, else from ``torch.distributed`` when initialized, else (0, 1)."""
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    world_size = positive_int("world_size", world_size if world_size is not None else 1)
    rank = 0 if rank is None else int(rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def _open(dataset: str | Dataset, root: str | os.PathLike[str] | None) -> Dataset:
    return dataset if isinstance(dataset, Dataset) else open_dataset(dataset, root)


def collate_ted(items: Any) -> TedBatch:
    """``collate_fn`` for these datasets: a batch already gathered passes through (as tensors); a
    list of single steps is stacked."""
    if isinstance(items, dict):
        return to_torch(TedBatch(items))
    keys = list(items[0])
    return to_torch(TedBatch({k: np.stack([np.asarray(it[k]) for it in items]) for k in keys}))


class TedMapDataset(torch.utils.data.Dataset):
    """Map-style: ``ds[i]`` is step ``i`` (numpy arrays); ``ds.__getitems__(indices)`` gathers a
    whole batch in one vectorized read, which ``DataLoader`` uses with a batch sampler.

    Use with ``DataLoader(ds, batch_sampler=EpochBatchSampler(...), collate_fn=collate_ted)``
    (or a plain ``batch_size`` and ``shuffle``; ``DistributedSampler`` works too).

    Args:
        dataset: A dataset or its name.
        keys: TED keys to read (``None``: all).
        root: Cache root for a name.
    """

    def __init__(
        self,
        dataset: str | Dataset,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.dataset = _open(dataset, root)
        self.keys = resolve_keys(self.dataset, keys)
        self._source: HostSource | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "keys": self.keys, "_source": None}  # Dataset pickles by path

    def _reader(self) -> HostSource:
        if self._source is None:  # opened lazily, in the process (worker) that reads
            self._source = HostSource(self.dataset, self.keys)
        return self._source

    def __len__(self) -> int:
        return self.dataset.num_steps

    def __getitem__(self, index: int) -> TedBatch:
        if not -len(self) <= index < len(self):
            raise IndexError(f"step {index} out of range for {len(self)} steps")
        batch = self.__getitems__([index % len(self)])
        return TedBatch({k: v[0] for k, v in batch.items()})

    def __getitems__(self, indices: Sequence[int]) -> TedBatch:
        idx = np.asarray(indices, np.int64)
        batch = self._reader().gather(idx)
        batch["index"] = idx
        return batch


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of a seeded permutation per epoch, sharded over data-parallel ranks.

    Call :meth:`set_epoch` at the start of every epoch (as with ``DistributedSampler``).

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per batch.
        seed: Seed of the permutations (the same on every rank).
        rank, world_size: This process's shard (default: from ``torch.distributed`` if set up).
        drop_last: Drop a short last batch.
        shuffle: ``False``: in order.
    """

    def __init__(
        self,
        num_steps: int,
        batch_size: int,
        *,
        seed: int | None = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        self.num_steps = positive_int("num_steps", num_steps)
        self.batch_size = positive_int("batch_size", batch_size)
        self.seed = seed_entropy(seed)
        self.rank, self.world_size = _dist_rank_world(rank, world_size)
        self.drop_last, self.shuffle = bool(drop_last), bool(shuffle)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next pass uses."""
        self.epoch = int(epoch)

    def _indices(self) -> np.ndarray:
        order = epoch_permutation(self.num_steps, self.seed, self.epoch, self.shuffle)
        return shard(order, self.rank, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        idx = self._indices()
        for start in range(0, len(idx), self.batch_size):
            batch = idx[start : start + self.batch_size]
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch.tolist()

    def __len__(self) -> int:
        per = -(-self.num_steps // self.world_size)
        return per // self.batch_size if self.drop_last else -(-per // self.batch_size)


class TedIterableDataset(IterableDataset):
    """Iterable: yields whole batches (numpy arrays; use ``DataLoader(ds, batch_size=None,
    collate_fn=collate_ted)``), sharded over ranks and workers.

    ``shuffle="epoch"``: each pass is one epoch without replacement; the epoch's permutation is
    split across ranks (padded to equal length, as ``DistributedSampler`` does) and each rank's
    part across its workers exactly, so within an epoch no step is repeated or missed.
    ``shuffle="uniform"``: an endless stream (or ``num_batches`` per pass) with replacement,
    seeded by ``(seed, epoch, rank, worker)``.

    With persistent workers each worker counts its own epochs; otherwise call
    :meth:`set_epoch` before every pass (as with ``DistributedSampler``).

    Args:
        dataset: A dataset or its name.
        batch_size: Rows per batch.
        keys: TED keys to read (``None``: all).
        shuffle: ``"epoch"`` or ``"uniform"``.
        seed: Base seed.
        rank, world_size: Data-parallel shard (default: from ``torch.distributed`` if set up).
        drop_last: Drop each shard's short last batch (epoch mode).
        num_batches: Batches per pass in uniform mode (``None``: endless).
        root: Cache root for a name.
    """

    def __init__(
        self,
        dataset: str | Dataset,
        batch_size: int = 256,
        *,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        shuffle: str = "epoch",
        seed: int | None = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        num_batches: int | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        if shuffle not in ("epoch", "uniform"):
            raise ValueError(f"shuffle must be 'epoch' or 'uniform', got {shuffle!r}")
        self.dataset = _open(dataset, root)
        self.keys = resolve_keys(self.dataset, keys)
        self.batch_size = positive_int("batch_size", batch_size)
        self.shuffle = shuffle
        self.seed = seed_entropy(seed)
        self.rank, self.world_size = _dist_rank_world(rank, world_size)
        self.drop_last = bool(drop_last)
        self.num_batches = num_batches
        self._next_epoch = 0
        self._source: HostSource | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"] = None  # reopened in the worker; the Dataset itself pickles by path
        return state

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass."""
        self._next_epoch = int(epoch)

    def _worker(self) -> tuple[int, int]:
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def __iter__(self) -> Iterator[TedBatch]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        if self._source is None:
            self._source = HostSource(self.dataset, self.keys)
        worker, workers = self._worker()
        if self.shuffle == "epoch":
            # Ranks get equal shards (padded, so DDP ranks run the same number of batches); the
            # workers of a rank split its shard exactly, without padding.
            order = shard(
                epoch_permutation(self.dataset.num_steps, self.seed, epoch), self.rank, self.world_size
            )
            order = order[worker::workers]
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                if self.drop_last and len(idx) < self.batch_size:
                    return
                yield self._batch(idx)
            return
        rng = np.random.default_rng([self.seed, epoch, self.rank, worker])
        produced = 0
        while self.num_batches is None or produced < self.num_batches:
            yield self._batch(uniform_ints(rng, self.dataset.num_steps, self.batch_size))
            produced += 1

    def _batch(self, idx: np.ndarray) -> TedBatch:
        assert self._source is not None
        batch = self._source.gather(idx)
        batch["index"] = np.array(idx)
        return batch
