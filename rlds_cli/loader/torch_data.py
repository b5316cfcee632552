"""``torch.utils.data`` adapters: map-style and iterable datasets over the cache.

Both pickle only the dataset's path and their settings: each DataLoader worker (fork, spawn or
forkserver) reopens the dataset lazily, inheriting no file handle or data copy. Shuffling and
sharding derive from ``(seed, epoch, rank)``: each rank sees a disjoint shard of each epoch's
permutation, without communication or the global RNG. Worker ``w`` of ``W`` makes batches
``w, w + W, ...``: the stream is the same whatever the number of workers.

:class:`~rlds_cli.loader.data_loader.TedDataLoader` drives them with exact resume and a
shared-memory ring.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.epoch import EpochSampler, history_field, next_batch_size
from rlds_cli.loader.factory import SAMPLERS, make_sampler
from rlds_cli.loader.opening import open_dataset
from rlds_cli.loader.protocols import Checkpointable, Streamable
from rlds_cli.loader.protocols import Sampler as IndexSampler
from rlds_cli.loader.ring import BatchRing, SlotBatch
from rlds_cli.loader.run_state import (
    check_cursor_state,
    check_int,
    check_same_dataset,
    check_shard,
    check_steps,
    dataset_fingerprint,
    rank_world,
    run_seed,
)
from rlds_cli.loader.samplers import Episodes, positive_int, split_draw
from rlds_cli.loader.sources import HostSource, resolve_keys
from rlds_cli.loader.tensors import DtypePolicy, FloatDtype, to_torch


def _check_cursor_state(state: dict[str, Any], owner: Any, what: str) -> None:
    """Refuse a state from another dataset, rank, world size or batch size (the position counts
    batches, so it means nothing with another batch size)."""
    check_steps(state, owner.num_steps)
    check_shard(state, owner.rank, owner.world_size, what)
    if int(state.get("batch_size", owner.batch_size)) != owner.batch_size:
        raise LoaderStateError(
            f"{what} state was saved with batch_size={state['batch_size']}, not {owner.batch_size}",
            hint="restore it with the batch size it was saved with",
        )


def _open(dataset: str | Dataset, root: str | os.PathLike[str] | None) -> Dataset:
    return dataset if isinstance(dataset, Dataset) else open_dataset(dataset, root)


def _epoch_order(epochs: EpochSampler, seed: int, epoch: int) -> np.ndarray:
    """This shard's order of ``epoch``, from ``epochs`` (which caches the current epoch's)."""
    if epochs.epoch != epoch or epochs.seed != seed:
        epochs.seed = seed
        epochs.set_epoch(epoch)
    return epochs.order()


def _restart(sampler: IndexSampler, bit_generator: Mapping[str, Any]) -> None:
    """Set ``sampler``'s generator to ``bit_generator`` (other state kept), so a batch's draw
    depends on the batch alone, not on the worker."""
    if isinstance(sampler, Streamable):
        sampler.load_stream_state({"bit_generator": bit_generator})
        return
    assert isinstance(sampler, Checkpointable)
    state = sampler.state_dict()
    state["bit_generator"] = bit_generator
    sampler.load_state_dict(state)


def collate_ted(items: Any) -> Any:
    """``collate_fn`` for these datasets: a gathered batch passes through (as tensors), a list of
    single steps is stacked, a ring slot (:class:`TedDataLoader`) passes through unchanged."""
    if isinstance(items, SlotBatch):
        return items
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
        float_dtype: As :class:`TedIterableDataset`'s.
    """

    def __init__(
        self,
        dataset: str | Dataset,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        root: str | os.PathLike[str] | None = None,
        *,
        float_dtype: FloatDtype = None,
    ) -> None:
        self.dataset = _open(dataset, root)
        self.keys = resolve_keys(self.dataset, keys)
        self.dtypes = DtypePolicy(float_dtype, keys=[*self.keys, "index"])
        self._source: HostSource | None = None
        self._ring: BatchRing | None = None  # set by a TedDataLoader for its workers

    def __getstate__(self) -> dict[str, Any]:
        # the Dataset pickles by path; a ring (set only while workers start) by file descriptor
        keep = {"dataset": self.dataset, "keys": self.keys, "dtypes": self.dtypes}
        return {**keep, "_source": None, "_ring": self._ring}

    def _reader(self) -> HostSource:
        if self._source is None:  # opened lazily, in the process (worker) that reads
            self._source = HostSource(self.dataset, self.keys)
        return self._source

    def __len__(self) -> int:
        return self.dataset.num_steps

    def __getitem__(self, index: int) -> TedBatch:
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"a step index is an integer, not {type(index).__name__}")
        if not -len(self) <= index < len(self):
            raise IndexError(f"step {index} out of range for {len(self)} steps")
        batch = self._gather(np.asarray([index % len(self)], np.int64))
        return TedBatch({k: v[0] for k, v in batch.items()})

    def __getitems__(self, indices: Sequence[int]) -> TedBatch | SlotBatch:
        """The steps at ``indices`` (negative ones from the end, as ``ds[i]``), in one gather."""
        given = np.asarray(indices)
        if given.size and given.dtype.kind not in "iu":
            raise TypeError(f"step indices must be integers, not {given.dtype}")
        n = len(self)
        if given.size and (given.min() < -n or given.max() >= n):
            raise IndexError(f"steps {given.min()} to {given.max()}: out of range for {n} steps")
        idx = np.where(given < 0, given + n, given).astype(np.int64, copy=False)
        info = get_worker_info() if self._ring is not None else None
        if info is not None:  # in a TedDataLoader worker: into a shared slot when one is free
            assert self._ring is not None
            slot = self._ring.gather(info.id, self.dataset, idx)
            if slot is not None:
                return slot
        return self._gather(idx)

    def _gather(self, idx: np.ndarray) -> TedBatch:
        batch = self._reader().gather(idx)
        batch["index"] = idx
        return self.dtypes.cast(batch) if self.dtypes else batch


class _EpochCursor:
    """The epoch cursor shared by :class:`EpochBatchSampler` and :class:`TedIterableDataset`:
    batches of the current epoch taken (``position``) over an
    :class:`~rlds_cli.loader.epoch.EpochSampler`'s order, including elastically resumed epochs."""

    seed: int
    epoch: int
    position: int
    num_steps: int
    batch_size: int
    rank: int
    world_size: int
    #: The epoch order's mode (``EpochBatchSampler``: a bool; ``TedIterableDataset``: a name).
    shuffle: bool | str
    #: The resumed epoch's sampler state (``None``: none), to replan it where the sampler is
    #: rebuilt (a worker's copy).
    _resumed_epoch: dict[str, Any] | None = None

    def _epoch_sampler(self) -> EpochSampler | None:
        """The sampler of the epochs' order (``None``: batches drawn with replacement)."""
        raise NotImplementedError

    def _plain_batches(self) -> int | None:
        """Batches of a pass over an epoch drawn from its start (``None``: endless)."""
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        """The settings besides ``shuffle`` that make the stream (``drop_last``, a sampler's
        options): a state restores only where they are the same."""
        raise NotImplementedError

    def _check_shuffle(self, state: Any) -> None:
        """Refuse a state saved in another shuffle mode (its epoch order is another one) or with
        other :meth:`_config` settings (a slice length, ``drop_last``: another stream); a state
        without the field (saved before it was kept) is taken."""
        if isinstance(state, Mapping) and state.get("shuffle", self.shuffle) != self.shuffle:
            raise LoaderStateError(
                f"{type(self).__name__} state was saved with shuffle={state['shuffle']!r}, "
                f"not {self.shuffle!r}",
                hint="restore it with the shuffle mode it was saved with",
            )
        saved, mine = (state.get("config") if isinstance(state, Mapping) else None), self._config()
        if isinstance(saved, Mapping):
            for key in sorted(set(saved) | set(mine)):
                if saved.get(key) != mine.get(key):
                    raise LoaderStateError(
                        f"{type(self).__name__} state was saved with {key}={saved.get(key)!r}, not "
                        f"{mine.get(key)!r}",
                        hint="restore it with the settings it was saved with",
                    )

    def _planned(self) -> int | None:
        """The batches of the current epoch when it was resumed at another world size."""
        epochs = self._epoch_sampler()
        if epochs is None or (epochs.epoch, epochs.seed) != (self.epoch, self.seed):
            return None
        return epochs.planned_batches

    def _batches(self) -> int | None:
        planned = self._planned()
        return planned if planned is not None else self._plain_batches()

    def _bounds(self, steps: int) -> np.ndarray:
        """Where each batch of the current epoch starts in this rank's order of ``steps`` steps,
        and where the last one ends."""
        planned = self._planned()
        if planned is None:
            batches = self._plain_batches()
            assert batches is not None, "an epoch order has a length"
            return np.minimum(np.arange(batches + 1) * self.batch_size, steps)
        sizes = []
        for b in range(planned):
            sizes.append(next_batch_size(steps, planned - b, self.batch_size))
            steps -= sizes[-1]
        return np.r_[0, np.cumsum(sizes, dtype=np.int64)]

    def _resumed_fields(self) -> dict[str, Any]:
        """A resumed epoch's fields of the state: its history and the steps of it taken."""
        epochs = self._epoch_sampler()
        if epochs is None or self._planned() is None:
            return {}
        steps = int(self._bounds(len(epochs.order()))[self.position])
        return {"history": history_field(epochs.history), "steps": steps}

    def _load_cursor(self, state: Mapping[str, Any], what: str) -> None:
        """Take the epoch, seed and position of a checked state (with its history, when resumed);
        a state refused here leaves the cursor unchanged."""
        epochs = self._epoch_sampler()
        if "history" in state and epochs is None:
            raise LoaderStateError(
                f"{what} state has an epoch's history, but this one draws with replacement",
                hint="restore a state saved by state_dict() of the same shuffle mode",
            )
        kept = (self.seed, self.epoch, self.position, self._resumed_epoch)
        kept_epochs = epochs.state_dict() if epochs is not None else None
        try:
            self._take_cursor(state, what, epochs)
        except BaseException:
            self.seed, self.epoch, self.position, self._resumed_epoch = kept
            if epochs is not None and kept_epochs is not None:
                epochs.load_state_dict(kept_epochs)
            raise

    def _take_cursor(self, state: Mapping[str, Any], what: str, epochs: EpochSampler | None) -> None:
        self.seed = int(state["seed"])
        self.epoch, self.position = int(state["epoch"]), 0
        self._resumed_epoch = None
        if epochs is None:
            self.position = int(state["position"])
            return
        if "history" not in state:
            epochs.seed = self.seed
            epochs.set_epoch(self.epoch)  # leaves any resumed epoch
            self.position = int(state["position"])
            return
        check_int(state, "steps", what)
        # history first (its plan gives the epoch's batches), then the position
        epochs.load_state_dict(self._as_epoch_state({**state, "position": 0, "steps": 0}, what))
        planned = self._planned()
        if planned is None:
            raise LoaderStateError(
                f"{what} state field 'history' is empty", hint="restore a state saved by state_dict()"
            )
        self._resumed_epoch = epochs.state_dict()
        check_int(state, "position", what, high=planned)
        steps = int(self._bounds(len(epochs.order()))[int(state["position"])])
        if int(state["steps"]) != steps:
            raise LoaderStateError(
                f"{what} state says {state['steps']} steps were taken in {state['position']} "
                f"batches, where its epoch's plan has {steps}",
                hint="restore a state saved by state_dict()",
            )
        self.position = int(state["position"])

    def _resume(
        self, states: Sequence[Mapping[str, Any]], what: str, check: Callable[[Any], None] | None = None
    ) -> None:
        epochs = self._epoch_sampler()
        if epochs is None:
            raise LoaderStateError(
                f"{what} draws with replacement: only an epoch's progress resumes at another world size",
                hint="restore each rank's own state with load_state_dict() at the same world size",
            )
        if not isinstance(states, (list, tuple)):
            raise LoaderStateError(
                f"{what}.resume takes the list of every rank's state_dict(), got {type(states).__name__}"
            )
        for state in states:
            check_cursor_state(state, what, None)
            if check is not None:
                check(state)
            check_steps(dict(state), self.num_steps)
            if int(state.get("batch_size", self.batch_size)) != self.batch_size:
                raise LoaderStateError(
                    f"{what} state was saved with batch_size={state['batch_size']}, not {self.batch_size}",
                    hint="resume with the batch size the states were saved with",
                )
        epochs.resume([self._as_epoch_state(s, what) for s in states])
        self.seed, self.epoch, self.position = epochs.seed, epochs.epoch, 0
        self._resumed_epoch = epochs.state_dict()

    def _as_epoch_state(self, state: Mapping[str, Any], what: str) -> dict[str, Any]:
        """``state`` as the :class:`EpochSampler` state of the same progress (its position in
        steps of the rank's order, where the cursor counts batches)."""
        position, world = int(state["position"]), int(state.get("world_size", 1))
        out = {"rank": 0, "world_size": 1}  # a state without rank fields: rank 0 of 1
        out |= {k: state[k] for k in ("seed", "epoch", "num_steps", "rank", "world_size") if k in state}
        if "history" in state:
            check_int(state, "steps", what)
            out.update(history=state["history"], batch=position, position=int(state["steps"]))
        else:
            out["position"] = min(position * self.batch_size, -(-self.num_steps // world))
        return out


class EpochBatchSampler(_EpochCursor, Sampler[list[int]]):
    """Batches of a seeded permutation per epoch, sharded over data-parallel ranks.

    A finished pass moves on to the next epoch; :meth:`set_epoch` selects one (selecting the
    current epoch keeps the position, so a restored state survives the usual ``set_epoch`` at the
    top of the loop). With DataLoader workers, use :class:`TedDataLoader` for an exact
    :meth:`state_dict`. Every rank's states resume at another world size (:meth:`resume`).

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per batch.
        seed: Seed of the permutations, the same on every rank (``None``: ``$RLDS_SEED``, else a
            fresh one broadcast from rank 0 under ``torch.distributed``, logged).
        rank, world_size: This process's shard (default: from ``torch.distributed`` if set up).
        drop_last: Drop a short last batch.
        shuffle: ``False``: in order.
    """

    def __init__(
        self,
        num_steps: int,
        batch_size: int,
        *,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        self.num_steps = positive_int("num_steps", num_steps)
        self.batch_size = positive_int("batch_size", batch_size)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, shared=True, what="EpochBatchSampler")
        self.drop_last, self.shuffle = bool(drop_last), bool(shuffle)
        # EpochSampler owns the permutations and shard; this class keeps the batches-taken cursor
        self._epochs = EpochSampler(
            self.num_steps,
            self.batch_size,
            self.seed,
            shuffle=self.shuffle,
            rank=self.rank,
            world_size=self.world_size,
        )
        # elastic resume gives whole batches only (set after the constructor, which refuses a
        # drop_last epoch shorter than a batch: an empty pass here)
        self._epochs.drop_last = self.drop_last
        self.epoch = 0
        self.position = 0  # batches of the epoch the training loop has taken
        self._external = False  # a TedDataLoader with workers counts the batches taken

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass (the current one: its position is kept)."""
        if int(epoch) != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def __iter__(self) -> Iterator[list[int]]:
        epoch, start = self.epoch, self.position
        idx = _epoch_order(self._epochs, self.seed, epoch)
        bounds = self._bounds(len(idx))
        for b in range(start, len(bounds) - 1):
            if not self._external:  # in-process, the loop has the batch once it is yielded
                self.position = b + 1
            yield idx[bounds[b] : bounds[b + 1]].tolist()
        if not self._external and self.epoch == epoch:
            self._end_pass()

    def __len__(self) -> int:
        batches = self._batches()
        assert batches is not None
        return batches

    def _epoch_sampler(self) -> EpochSampler:
        return self._epochs

    def _plain_batches(self) -> int:
        # a drop_last pass shorter than a batch is empty here, not an error
        if self.drop_last:
            return self._epochs.steps_per_epoch // self.batch_size
        return self._epochs.batches_per_epoch

    def _took(self) -> None:
        self.position += 1

    def _end_pass(self) -> None:
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """The epoch and its batches taken, whose state it is, and (elastic resume) the history and
        steps taken."""
        state: dict[str, Any] = {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_steps": self.num_steps,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "rank": self.rank,
            "world_size": self.world_size,
            "config": self._config(),
        }
        state.update(self._resumed_fields())
        return state

    def _config(self) -> dict[str, Any]:
        return {"drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass yields the rest of its epoch.

        Raises:
            LoaderStateError: The state is from another dataset, rank, world size, batch size
                or shuffle mode.
        """
        what = "EpochBatchSampler"
        resumed = isinstance(state, Mapping) and "history" in state
        check_cursor_state(state, what, None if resumed else self._plain_batches())
        _check_cursor_state(state, self, what)
        self._check_shuffle(state)
        self._load_cursor(state, what)

    def resume(self, states: Sequence[dict[str, Any]]) -> None:
        """Go on from every rank's state of a run (any world size; a dead rank counts with its last
        state) with this rank's share of the epoch's untaken steps, in batches of at most
        ``batch_size``, the same count on every rank (see :mod:`rlds_cli.loader.epoch`; with
        ``drop_last``, whole batches only).

        Raises:
            LoaderStateError: States of different runs, epochs, batch sizes or shuffle modes, or
                a rank missing.
        """
        self._resume(states, "EpochBatchSampler", check=self._check_shuffle)


class TedIterableDataset(_EpochCursor, IterableDataset):
    """Iterable: yields whole batches (numpy arrays; use :class:`TedDataLoader`, or
    ``DataLoader(ds, batch_size=None, collate_fn=collate_ted)``), sharded over ranks.

    ``shuffle="epoch"``: each pass is one epoch without replacement, its permutation split across
    ranks (padded to equal length, as ``DistributedSampler``). Any other sampler name of
    :func:`~rlds_cli.loader.factory.make_sampler` (``"uniform"``, ``"slice"``, ``"prioritized"``,
    with its options) draws ``num_batches`` batches per pass with replacement, its generator set
    for batch ``b`` from ``(seed, epoch, rank, b)`` (a prioritized sampler keeps its initial
    priorities: a worker's cannot be updated). A pass has ``len(ds)`` batches and the same stream
    whatever the number of workers.

    A finished pass moves on to the next epoch; :meth:`set_epoch` selects one. :meth:`state_dict`
    is exact in-process, or through a :class:`TedDataLoader` with workers.

    Args:
        dataset: A dataset or its name.
        batch_size: Rows per batch.
        keys: TED keys to read (``None``: all).
        shuffle: ``"epoch"``, or a sampler with replacement by name (``"uniform"``, ...).
        seed: Base seed, the same on every rank (``None``: ``$RLDS_SEED``, else a fresh one,
            broadcast from rank 0 under ``torch.distributed``, logged).
        rank, world_size: Data-parallel shard (default: from ``torch.distributed`` if set up).
        drop_last: Drop each rank's short last batch (epoch mode).
        num_batches: Batches per pass in uniform mode (``None``: endless).
        root: Cache root for a name.
        float_dtype: Cast floating keys to this torch dtype (or ``{key: dtype}``; see
            :mod:`rlds_cli.loader.tensors`): in the worker, on the gathered numpy rows.
        **sampler_options: Options of the named sampler, e.g. ``slice_len=32`` (not for
            ``"epoch"``, whose one option is ``drop_last``).
    """

    shuffle: str

    def __init__(
        self,
        dataset: str | Dataset,
        batch_size: int = 256,
        *,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        shuffle: str = "epoch",
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        num_batches: int | None = None,
        root: str | os.PathLike[str] | None = None,
        float_dtype: FloatDtype = None,
        **sampler_options: Any,
    ) -> None:
        if shuffle not in SAMPLERS or shuffle == "blocks":
            names = ", ".join(repr(n) for n in SAMPLERS if n != "blocks")
            raise ValueError(
                f"shuffle must be one of {names}, got {shuffle!r}"
                + (
                    " (the block order is the Loader's: Loader(..., sampler='blocks'))"
                    if shuffle == "blocks"
                    else ""
                )
            )
        if shuffle == "epoch" and sampler_options:
            raise ValueError(f"shuffle='epoch' has no option(s) {', '.join(sorted(sampler_options))}")
        if num_batches is not None:
            if shuffle == "epoch":
                raise ValueError(
                    "num_batches applies to shuffle='uniform' (or another sampler with replacement); "
                    "an epoch pass has len(ds) batches"
                )
            if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
                raise ValueError(f"num_batches must be an integer >= 0 or None, got {num_batches!r}")
        self.dataset = _open(dataset, root)
        self.num_steps = self.dataset.num_steps
        self.keys = resolve_keys(self.dataset, keys)
        self.dtypes = DtypePolicy(float_dtype, keys=[*self.keys, "index"])
        self.batch_size = positive_int("batch_size", batch_size)
        self.shuffle = shuffle
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(
            seed, world_size=self.world_size, shared=shuffle == "epoch", what="TedIterableDataset"
        )
        self.drop_last = bool(drop_last)
        self.num_batches = num_batches
        self.sampler_options = sampler_options
        # made here to check the options; not pickled (its order or episode table would travel to
        # every worker), rebuilt in the worker
        self._sampler: IndexSampler | None = self._make_sampler()
        self.epoch = 0
        self.position = 0  # batches of the current pass the training loop has taken
        self._source: HostSource | None = None
        self._ring: BatchRing | None = None  # set by a TedDataLoader for its workers

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"] = None  # reopened in the worker; the Dataset itself pickles by path
        state["_sampler"] = None
        return state

    def _make_sampler(self) -> IndexSampler:
        """The sampler of the epochs' order (epoch mode) or of the draws (the others)."""
        rank, world_size = self.rank, self.world_size
        if self.shuffle == "epoch":
            epochs = EpochSampler(
                self.num_steps, self.batch_size, self.seed, rank=rank, world_size=world_size
            )
            epochs.drop_last = self.drop_last  # elastic resume: whole batches, as EpochBatchSampler
            return epochs
        episodes = Episodes.of(self.dataset)
        return make_sampler(
            self.shuffle,
            episodes,
            self.batch_size,
            self.seed,
            rank=rank,
            world_size=world_size,
            **self.sampler_options,
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass (the current one: its position is kept)."""
        if int(epoch) != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def _worker(self) -> tuple[int, int]:
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def _epoch_sampler(self) -> EpochSampler | None:
        if self.shuffle != "epoch":
            return None
        if self._sampler is None:  # rebuilt (in a worker): a resumed epoch is planned again
            self._sampler = self._make_sampler()
            resumed = self._resumed_epoch
            if resumed is not None and (resumed["epoch"], resumed["seed"]) == (self.epoch, self.seed):
                assert isinstance(self._sampler, EpochSampler)
                self._sampler.load_state_dict(resumed)
        assert isinstance(self._sampler, EpochSampler)
        return self._sampler

    def _plain_batches(self) -> int | None:
        if self.shuffle != "epoch":
            return self.num_batches
        per = -(-self.num_steps // self.world_size)
        return per // self.batch_size if self.drop_last else -(-per // self.batch_size)

    def _pass_length(self) -> int | None:
        return self._batches()

    def __len__(self) -> int:
        """Batches of one pass on this rank (all workers together)."""
        n = self._pass_length()
        if n is None:
            raise TypeError(
                "an endless TedIterableDataset (a sampler with replacement, no num_batches) has no length"
            )
        return n

    def __iter__(self) -> Iterator[TedBatch | SlotBatch]:
        epoch, start = self.epoch, self.position
        if self._source is None:
            self._source = HostSource(self.dataset, self.keys)
        worker, workers = self._worker()
        in_worker = get_worker_info() is not None
        epochs = self._epoch_sampler()
        if self._sampler is None:
            self._sampler = self._make_sampler()
        sampler = self._sampler
        # equal (padded) shards: DDP ranks run the same number of batches
        order = _epoch_order(epochs, self.seed, epoch) if epochs is not None else None
        bounds = self._bounds(len(order)) if order is not None else None
        total = len(bounds) - 1 if bounds is not None else self._pass_length()
        b = start + worker
        while total is None or b < total:
            extras: dict[str, np.ndarray] = {}
            if order is not None and bounds is not None:
                idx = order[bounds[b] : bounds[b + 1]]
            else:
                _restart(sampler, np.random.default_rng([self.seed, epoch, self.rank, b]).bit_generator.state)
                idx, extras = split_draw(sampler.sample())
            if not in_worker:  # in-process, the loop has the batch once it is yielded
                self.position = b + 1
            if extras:  # a draw with extras (mask, weight) never goes through the ring
                batch = self._batch(idx)  # no worker: never a slot
                assert isinstance(batch, TedBatch)
                batch.update(extras)
                yield self.dtypes.cast(batch) if self.dtypes else batch
            else:
                yield self._batch(idx, worker if in_worker else -1)
            b += workers
        if in_worker or self.epoch == epoch:  # finished pass: the next is the next epoch
            self._end_pass()

    def _took(self) -> None:
        self.position += 1

    def _end_pass(self) -> None:
        self.epoch, self.position = self.epoch + 1, 0

    def _batch(self, idx: np.ndarray, worker: int = -1) -> TedBatch | SlotBatch:
        if worker >= 0 and self._ring is not None:  # into a shared slot when one is free
            slot = self._ring.gather(worker, self.dataset, idx)
            if slot is not None:
                return slot
        assert self._source is not None
        batch = self._source.gather(idx)
        batch["index"] = np.array(idx)
        return self.dtypes.cast(batch) if self.dtypes else batch

    def state_dict(self) -> dict[str, Any]:
        """The epoch, its batches taken, and whose state it is."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_steps": self.num_steps,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "rank": self.rank,
            "world_size": self.world_size,
            "dataset": dataset_fingerprint(self.dataset),
            "config": self._config(),
            **self._resumed_fields(),
        }

    def _config(self) -> dict[str, Any]:
        options = {f"option {k}": repr(v) for k, v in sorted(self.sampler_options.items())}
        return {"drop_last": self.drop_last, "num_batches": self.num_batches, **options}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass yields the rest of its epoch.

        Raises:
            LoaderStateError: The state is from another dataset, rank, world size, batch size
                or shuffle mode.
        """
        what = "TedIterableDataset"
        resumed = isinstance(state, Mapping) and "history" in state and self.shuffle == "epoch"
        check_cursor_state(state, what, None if resumed else self._plain_batches())
        _check_cursor_state(state, self, what)
        check_same_dataset(state, self.dataset, what)
        self._check_shuffle(state)
        self._load_cursor(state, what)

    def resume(self, states: Sequence[dict[str, Any]]) -> None:
        """Go on from every rank's state of a run at any world size, as
        :meth:`EpochBatchSampler.resume` (``shuffle="epoch"`` only).

        Raises:
            LoaderStateError: Draws with replacement, or states of different runs, epochs, batch
                sizes or shuffle modes, or a rank missing.
        """
        self._resume(states, "TedIterableDataset", check=self._check_shuffle)
