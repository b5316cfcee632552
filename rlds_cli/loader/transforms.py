"""Sample-time transforms: callables on a numpy :class:`~rlds_cli.cache.ted.TedBatch`.

A transform is any ``f(batch) -> batch``, applied by the :class:`~rlds_cli.loader.Loader` to the
numpy batch before tensor conversion (in the background thread with ``prefetch``). One that needs
more of the dataset (n-step returns, frame stacks) has ``bind(dataset)``, called once by the
loader; it then reads from the cache, vectorized, at the batch's ``index``.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch, join_key, join_keys
from rlds_cli.loader.normalization import (
    DEFAULT_EPS,
    NormalizationStats,
    checked_eps,
    compute_stats,
    statistics_dataset,
)
from rlds_cli.loader.samplers import Episodes, positive_int
from rlds_cli.loader.sources import HostSource

logger = logging.getLogger("rlds_cli.loader")


StatsSource = str | Dataset | NormalizationStats | Mapping[str, Any] | None


def twins(key: str, normalized: Mapping[str, Any]) -> tuple[str, ...]:
    """The batch keys a ``Normalize`` of ``key`` changes: ``key`` and its ``next/`` twin, unless
    the twin has statistics of its own in ``normalized`` (normalized once, with those)."""
    twin = f"next/{key}"
    return (key,) if twin in normalized else (key, twin)


class Normalize:
    """``(x - mean) / (std + eps)`` on the given keys (``next/`` twins use the same statistics,
    unless listed themselves: then their own; each key is normalized once).

    Args:
        stats: Where the statistics come from:

            * ``None`` or ``"parent"`` (default): the dataset the loader reads, or, for a view
              (``rlds view`` / ``rlds split``), its parent: a validation view is normalized like
              the training data, never with its own statistics;
            * ``"self"``: the dataset the loader reads, even a view;
            * a :class:`~rlds_cli.cache.dataset.Dataset`: that dataset's (e.g. a training view's);
            * a :class:`~rlds_cli.NormalizationStats` (e.g. loaded from a file: its ``eps`` too,
              unless ``eps`` is given);
            * a mapping ``{key: stats}``, each ``stats`` a mapping with ``"mean"`` and ``"std"``
              (:func:`compute_stats`) or an object with ``mean`` and ``std`` attributes (what
              ``rlds_cli.preprocess.load_stats`` returns).

            Statistics of a dataset are those stored by ``rlds preprocess --stats`` when
            present, else computed (:func:`compute_stats`) when the loader binds the transform.
        keys: Keys to normalize (default ``["observation"]``, or every key of a given
            ``NormalizationStats``).
        eps: Added to the standard deviation (default ``1e-6``).

    Attributes:
        statistics: The :class:`~rlds_cli.NormalizationStats` in use (after binding): save it with
            the policy and normalize the environment's observations with it at evaluation time.
        stats: The same as ``{key: (mean, std + eps)}`` in float32 (legacy form; float64 values
            are normalized with the float64 statistics, :meth:`pair`).
        source: Which statistics are in use, in words (after binding), e.g.
            ``"dataset 'hopper' (the parent of view 'hopper-val')"``.
    """

    def __init__(self, stats: StatsSource = None, keys: Iterable[str | tuple[str, ...]] | None = None,
                 eps: float | None = None) -> None:  # fmt: skip
        if isinstance(stats, NormalizationStats) and keys is None:
            keys = stats.keys
        self.keys = join_keys(keys, "Normalize(keys=...)") if keys is not None else ["observation"]
        if eps is None:
            eps = stats.eps if isinstance(stats, NormalizationStats) else DEFAULT_EPS
        self.eps = checked_eps(eps)
        self.statistics: NormalizationStats | None = None
        self.stats: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._pairs: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.source = ""
        #: The dataset the statistics were computed from (after binding; ``None`` when given).
        self.origin: Dataset | None = None
        #: Per key, the name the origin stores it under (a mixture's renamed keys; after binding).
        self.stored_keys: dict[str, str] = {}
        #: Which rows the origin held when the statistics were taken (:func:`_rows_held`).
        self._origin_rows: tuple[int, ...] | None = None
        if stats is None:
            stats = "parent"
        if isinstance(stats, str):
            if stats not in ("parent", "self"):
                raise ValueError(
                    f"stats must be 'parent', 'self', a Dataset or a mapping of statistics; got {stats!r}"
                )
            self._from: str | Dataset = stats
        elif isinstance(stats, Dataset):
            self._from = stats
        elif isinstance(stats, NormalizationStats):
            self._from = "given"
            self._use(stats.to_dict()["keys"], stats.source or "statistics given")
        elif isinstance(stats, Mapping):
            self._from = "given"
            self._use(stats, "statistics given")
        else:
            raise ValueError(
                f"stats must be 'parent', 'self', a Dataset or a mapping of statistics; "
                f"got {type(stats).__name__}"
            )

    def _use(self, stats: Mapping[str, Any], source: str) -> None:
        statistics = NormalizationStats.from_mapping(stats, self.keys, eps=self.eps, source=source)
        for key in self.keys:  # a NaN statistic made every value of its dimension NaN, silently
            unknown = np.flatnonzero(~(np.isfinite(statistics.mean[key]) & np.isfinite(statistics.std[key])))
            if len(unknown):
                shown = ", ".join(map(str, unknown[:8])) + (", ..." if len(unknown) > 8 else "")
                raise ValueError(
                    f"Normalize: the statistics of {key!r} from {source} are not finite in "
                    f"{len(unknown)} of its {statistics.mean[key].size} dimension(s) (flat index "
                    f"{shown}): the data holds NaN or infinite values there, and every normalized "
                    "value of them would be NaN; 'rlds audit NAME' flags the episodes (nonfinite) "
                    "and 'rlds audit NAME --keep NAME-clean' makes a view without them, or pass "
                    "Normalize(stats=...) with finite statistics"
                )
        self.statistics = statistics
        self.source = source
        self._pairs = {}
        self.stats = {k: self.pair(k, np.float32) for k in self.keys}

    def changes(self) -> set[str]:
        """The batch keys this transform changes (its keys and their ``next/`` twins)."""
        return {name for key in self.keys for name in twins(key, dict.fromkeys(self.keys))}

    def pair(self, key: str, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std + eps)`` by which values of ``dtype`` under ``key`` (one of :attr:`keys`)
        are normalized: :meth:`NormalizationStats.pair`."""
        assert self.statistics is not None
        at = (key, dtype)
        found = self._pairs.get(at)
        if found is None:
            found = self._pairs[at] = self.statistics.pair(key, dtype)
        return found

    def origin_unchanged(self) -> bool:
        """Whether the origin holds the rows its statistics were taken from (a growing origin
        may have grown, or evicted and refilled to the same size, since)."""
        return self.origin is not None and _rows_held(self.origin) == self._origin_rows

    def bind(self, dataset: Dataset, rename: Mapping[str, str] | None = None) -> None:
        """Find the statistics for ``dataset`` (called by the loader); given ones are kept.

        Args:
            dataset: The dataset whose batches this transform normalizes.
            rename: ``{stored key: key in the batch}`` when the batches carry ``dataset``'s keys
                under other names (a :class:`~rlds_cli.loader.MixtureSource`'s ``rename=``):
                :attr:`keys` are the batch's names, the statistics those of the stored keys.
        """
        back = {join_key(v): join_key(k) for k, v in (rename or {}).items()}
        self.stored_keys = {k: back.get(k, k) for k in self.keys}
        if self.stats is None:
            if isinstance(self._from, Dataset):
                origin, source = self._from, f"dataset {self._from.name!r}"
            elif self._from == "self":
                origin, source = dataset, f"dataset {dataset.name!r} itself"
            else:
                origin = statistics_dataset(dataset)
                source = f"dataset {origin.name!r}" + (
                    f" (the parent of view {dataset.name!r})" if origin is not dataset else ""
                )
            stored = compute_stats(origin, [self.stored_keys[k] for k in self.keys])
            self._use({k: stored[self.stored_keys[k]] for k in self.keys}, source)
            self.origin, self._origin_rows = origin, _rows_held(origin)
            logger.info("Normalize %s with the statistics of %s", self.keys, self.source)
        assert self.stats is not None
        for key, (mean, _) in self.stats.items():
            name = self.stored_keys.get(key, key)
            base = name[5:] if name.startswith("next/") else name
            field = dataset.fields.get(base) or dataset.fields.get(name)
            if field is not None and mean.shape and tuple(mean.shape) != tuple(field[0]):
                raise ValueError(
                    f"statistics of {key!r} have shape {tuple(mean.shape)}, but dataset "
                    f"{dataset.name!r} stores it as {tuple(field[0])}"
                )

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self.stats is None:
            raise RuntimeError("Normalize has no statistics: pass stats= or use it in a Loader")
        for key in self.stats:
            for name in twins(key, self.stats):
                if name in batch:
                    value = batch[name]
                    mean, std = self.pair(key, value.dtype)
                    if not isinstance(value, np.ndarray):  # a torch tensor (in_memory="device")
                        mean, std = self._on_device(key, value, mean, std)
                    batch[name] = (value - mean) / std
        return batch

    def _on_device(self, key: str, value: Any, mean: np.ndarray, std: np.ndarray) -> tuple[Any, Any]:
        """``mean`` and ``std`` as tensors on ``value``'s device, made once per key, dtype, device."""
        import torch

        at = (key, value.dtype, str(value.device))
        found = self._pairs.get(at)
        if found is None:
            found = self._pairs[at] = (
                torch.as_tensor(mean, device=value.device),
                torch.as_tensor(std, device=value.device),
            )
        return found


class NStepReturn:
    """n-step targets: ``next/reward`` becomes the discounted sum of up to ``n`` rewards inside the
    episode (per column of a ``[..., k]`` reward), ``next/observation`` and the done flags those of
    the last step summed, ``next/discount`` (float32, ``[..., 1]``) ``gamma ** k`` for the ``k``
    steps summed (``target = reward + discount * (1 - terminated) * V(next_observation)``), and
    ``steps_to_next_obs`` (int64, the batch shape) ``k``, as TorchRL's ``MultiStep`` writes it.

    Args:
        n: Steps to sum.
        gamma: Discount.
    """

    needs_host = True

    @staticmethod
    def rewrites_raw(key: str) -> bool:
        """Whether ``key`` is written anew from the cache's (raw) values: the ``next/`` keys."""
        return key.startswith("next/")

    def __init__(self, n: int, gamma: float = 0.99) -> None:
        self.n = positive_int("n", n)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        self._source: HostSource | None = None
        self._episodes: Episodes | None = None

    def bind(self, dataset: Dataset) -> None:
        """Open what the transform reads: rewards, flags and next observations."""
        keys = ["next/reward", "next/terminated", "next/truncated", "next/done"]
        keys += [f"next/{k}" for k, s in dataset.manifest.fields.items() if s.storage == "flat"]
        self._source = HostSource(dataset, keys)
        self._episodes = Episodes.of(dataset)

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._source is None or self._episodes is None:
            raise RuntimeError("NStepReturn must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(batch["index"], np.int64)
        last = self._episodes.ends[self._episodes.episode_of(idx)] - 1
        steps = np.minimum(idx[..., None] + np.arange(self.n), last[..., None])  # [..., n]
        valid = idx[..., None] + np.arange(self.n) <= last[..., None]
        rewards = self._source.gather(steps)
        reward = rewards["next/reward"].astype(np.float64)  # [..., n, columns]
        discounts = (self.gamma ** np.arange(self.n))[:, None]
        batch_reward = (reward * discounts * valid[..., None]).sum(axis=-2)  # [..., columns]
        k = valid.sum(axis=-1)
        final = idx + k - 1
        tail = self._source.gather(final)
        for key, value in tail.items():
            if key in batch and key != "next/reward":
                batch[key] = value
        if "next/reward" in batch:
            batch["next/reward"] = batch_reward.astype(batch["next/reward"].dtype)
        else:
            batch["next/reward"] = batch_reward.astype(np.float32)
        batch["next/discount"] = (self.gamma**k)[..., None].astype(np.float32)
        # TorchRL's estimators bootstrap with gamma ** steps_to_next_obs (gamma without it)
        batch["steps_to_next_obs"] = k.astype(np.int64)
        return batch


class _BlockPool:
    """Output arrays reused once nothing but the pool refers to them any more.

    Anything made from a block without a copy (tensors, views, a TensorDict) references it, so
    a block is reused only when the pool alone holds it. Fresh memory costs more than the gather
    (the kernel faults in and zeroes every page: thousands of faults for a batch of pixel stacks).

    Args:
        size: Blocks kept (more in use at once are allocated, and dropped when released).
    """

    def __init__(self, size: int = 8) -> None:
        self._blocks: list[np.ndarray] = []
        self._size = size
        self._lock = threading.Lock()  # one prefetch thread, but a transform may be shared
        # refcount of a block only the pool holds: measured, since the interpreter may borrow refs
        self._free_refs = self._refs([np.empty(0)], 0)

    @staticmethod
    def _refs(blocks: list[np.ndarray], i: int) -> int:
        return sys.getrefcount(blocks[i])

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` that nothing else refers to."""
        with self._lock:
            for i in range(len(self._blocks)):
                if self._refs(self._blocks, i) <= self._free_refs:
                    if self._blocks[i].shape != shape or self._blocks[i].dtype != dtype:
                        self._blocks[i] = np.empty(shape, dtype)  # e.g. an epoch's last, smaller batch
                    return self._blocks[i]
            block = np.empty(shape, dtype)
            if len(self._blocks) < self._size:
                self._blocks.append(block)
            return block


class FrameStack:
    """Stacks the last ``k`` observations (from flat storage; no stacked copy is ever stored).

    ``observation`` becomes ``[..., k, *shape]`` holding steps ``t-k+1 .. t`` of the episode
    (the first frame repeated before the episode's start) and ``next/observation`` the frames
    ``t-k+2 .. t+1`` (``t+1`` being the step's next observation: the episode's final observation
    at its last step).

    A batch costs one gather of frames ``t-k+1 .. t+1`` (clamped at the episode's first row) into
    one ``[..., k + 1, *shape]`` array; ``observation`` and ``next/observation`` are views of its
    first and last ``k`` frames, so they share ``k - 1`` frames: ``.clone()`` one before writing
    in place. The array is reused once nothing refers to a batch made from it. As the first
    transform of a :class:`~rlds_cli.loader.Loader`, the loader does not read the stacked keys
    (:meth:`claim`); further down a chain, ``next/observation``'s newest frame is the batch's own.
    :meth:`bind` and :meth:`claim` set it up for one loader: use one per loader.

    Args:
        k: Frames per stack.
        keys: Flat keys to stack (default ``observation``).
    """

    needs_host = True

    def rewrites_raw(self, key: str) -> bool:
        """Whether ``key`` is written anew from the cache's (raw) frames: a stacked key, or its twin."""
        return key.removeprefix("next/") in self.keys

    def __init__(self, k: int, keys: Iterable[str] = ("observation",)) -> None:
        self.k = positive_int("k", k)
        self.keys = [join_key(key) for key in keys]
        self._dataset: Dataset | None = None
        self._source: HostSource | None = None
        self._first_row: np.ndarray | None = None
        # row offsets of frames t-k+1 .. t+1 from step t's own row
        self._offsets = np.arange(1 - self.k, 2, dtype=np.int64)
        self._claimed: frozenset[str] = frozenset()
        self._rows: dict[str, tuple[tuple[int, ...], np.dtype]] = {}  # each key's row shape, dtype
        self._pools: dict[str, _BlockPool] = {}

    def bind(self, dataset: Dataset) -> None:
        """Open the stacked keys' flat arrays."""
        fields = dataset.manifest.fields
        bad = [k for k in self.keys if k not in fields or fields[k].storage != "flat"]
        if bad:
            raise ValueError(
                f"FrameStack keys must be observation-like (flat) keys of the dataset; not {bad}"
            )
        self._dataset = dataset
        self._source = HostSource(dataset, self.keys)
        lengths = np.asarray(dataset.episode_index["length"], np.int64)
        # flat row of each episode's first observation (one final-observation row per earlier episode)
        self._first_row = np.cumsum(lengths) - lengths + np.arange(len(lengths), dtype=np.int64)
        self._claimed = frozenset()
        self._rows = {k: (tuple(fields[k].shape), np.dtype(fields[k].dtype)) for k in self.keys}
        self._pools = {k: _BlockPool() for k in self.keys}

    def claim(self, keys: Sequence[str], *, in_memory: bool = False) -> list[str]:
        """Of the TED ``keys`` a loader is about to read, those this transform produces (the stacked
        keys and their ``next/`` twins); called after :meth:`bind` when it is first in the chain.

        Args:
            keys: The keys the loader would read.
            in_memory: The loader holds the dataset in RAM; the stacked keys (which it then does
                not hold) are copied into RAM here.
        """
        if self._dataset is None:
            raise RuntimeError("FrameStack must be bound to a dataset before claim()")
        mine = [k for k in keys if k in self.keys or (k.startswith("next/") and k[5:] in self.keys)]
        self._claimed = frozenset(mine)
        if in_memory and mine:
            self._source = HostSource(self._dataset, self.keys, in_memory=True, pack=False)
        return mine

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._source is None or self._first_row is None:
            raise RuntimeError("FrameStack must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(batch["index"], np.int64)
        window: np.ndarray | None = None
        axis = idx.ndim  # the new frame axis, right after the batch dimensions
        k = self.k
        lead = (slice(None),) * axis
        first_k, last_k = (*lead, slice(0, k)), (*lead, slice(1, k + 1))  # the two stacks of a block
        newest_at: tuple[slice | int, ...] = (*lead, k)
        for key in self.keys:
            nxt = f"next/{key}"
            want_obs = key in self._claimed or key in batch
            want_next = nxt in self._claimed or nxt in batch
            if not (want_obs or want_next):
                continue
            if window is None:
                episode = self._source.episode_of(idx)
                # flat rows of frames t-k+1 .. t+1, none before the episode's first row
                window = np.maximum(
                    (idx + episode)[..., None] + self._offsets, self._first_row.take(episode)[..., None]
                )
            if not want_next:
                batch[key] = self._take(key, window[..., :k])
                continue
            if not want_obs and nxt in self._claimed:
                batch[nxt] = self._take(key, window[..., 1:])
                continue
            block = self._take(key, window)  # [..., k + 1, *shape]
            stack = block[first_k]
            if nxt in self._claimed:
                batch[nxt] = block[last_k]
            else:  # the batch's own next observation is the newest frame
                newest = np.asarray(batch[nxt])
                frame_shape = block.shape[:axis] + block.shape[axis + 1 :]
                if newest.dtype == block.dtype and newest.shape == frame_shape:
                    block[newest_at] = newest
                    batch[nxt] = block[last_k]
                else:  # other dtype or shape: frames t-k+2 .. t, then that observation
                    older = block[(*lead, slice(1, k))]
                    batch[nxt] = np.concatenate([older, np.expand_dims(newest, axis)], axis=axis)
            if want_obs:
                batch[key] = stack
        return batch

    def _take(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Flat rows ``rows`` of ``key`` gathered into a free block of the key's pool."""
        assert self._source is not None
        shape, dtype = self._rows[key]
        return self._source.take_rows(key, rows, self._pools[key].get(rows.shape + shape, dtype))


def _rows_held(ds: Dataset) -> tuple[int, ...]:
    """What tells which rows ``ds`` holds: its size and, for a growing dataset, the numbers of its
    first and last episodes (eviction moves the first, appends the last)."""
    ids = getattr(ds, "episode_ids", None)
    ends = (int(ids[0]), int(ids[-1])) if ids is not None and len(ids) else ()
    return (ds.num_steps, ds.num_episodes, *ends)
