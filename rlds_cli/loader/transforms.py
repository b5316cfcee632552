"""Sample-time transforms: callables on a numpy :class:`~rlds_cli.cache.ted.TedBatch`.

A transform is any ``f(batch) -> batch``. The :class:`~rlds_cli.loader.Loader` applies them to
the numpy batch before converting it to tensors (so with ``prefetch`` they run in the background
thread). A transform that needs more of the dataset than the batch holds (n-step returns, frame
stacks) has ``bind(dataset)``, which the loader calls once; it reads what it needs from the
cache, vectorized, at the batch's ``index``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.loader.samplers import Episodes, positive_int
from rlds_cli.loader.sources import HostSource

#: Rows read at a time when computing statistics (bounded memory on any dataset size).
_STATS_CHUNK = 1 << 18


def _shipped_stats(dataset: Dataset) -> dict[str, Any]:
    """Statistics stored in the manifest by ``rlds preprocess --stats`` (empty when none)."""
    try:
        from rlds_cli.preprocess.stats import load
    except ImportError:  # pragma: no cover - the preprocess package ships with rlds
        return {}
    try:
        return load(dataset)
    except (KeyError, TypeError, ValueError):  # malformed statistics: compute them instead
        return {}


def compute_stats(
    dataset: Dataset, keys: Iterable[str | tuple[str, ...]] = ("observation",)
) -> dict[str, dict[str, np.ndarray]]:
    """Per-dimension ``mean``, ``std``, ``min`` and ``max`` of stored keys, over every step.

    Statistics stored in the manifest (``rlds preprocess --stats``) are used when present;
    otherwise they are computed in one streaming pass (float64 accumulators, chunks of rows, so
    memory stays bounded). Observation-like keys are summarized over the steps (their final
    observations left out), like the stored statistics; ``next/<key>`` uses ``<key>``'s.

    Returns:
        ``{key: {"mean": ..., "std": ..., "min": ..., "max": ...}}`` as float32 arrays of the
        key's per-step shape.
    """
    out: dict[str, dict[str, np.ndarray]] = {}
    shipped = _shipped_stats(dataset)
    for key in (join_key(k) for k in keys):
        base = key[5:] if key.startswith("next/") and key[5:] in dataset.manifest.fields else key
        if base not in dataset.manifest.fields:
            raise KeyError(f"dataset {dataset.name!r} stores no key {base!r} to compute statistics of")
        known = shipped.get(base)
        if known is not None:
            out[key] = {s: np.asarray(getattr(known, s), np.float32) for s in ("mean", "std", "min", "max")}
        else:
            out[key] = _stream_stats(dataset, base)
    return out


def _stream_stats(dataset: Dataset, key: str) -> dict[str, np.ndarray]:
    column = dataset.column(key)
    spec = dataset.manifest.fields[key]
    keep = None
    if spec.storage == "flat":  # leave out each episode's final row: statistics over steps
        ends = np.cumsum(np.asarray(dataset.episodes["length"], np.int64))
        keep = np.ones(len(column), bool)
        keep[ends + np.arange(len(ends))] = False
    total = np.zeros(spec.shape, np.float64)
    squares = np.zeros(spec.shape, np.float64)
    low = np.full(spec.shape, np.inf)
    high = np.full(spec.shape, -np.inf)
    for start in range(0, len(column), _STATS_CHUNK):
        chunk = np.asarray(column[start : start + _STATS_CHUNK], np.float64)
        if keep is not None:
            chunk = chunk[keep[start : start + _STATS_CHUNK]]
        if not len(chunk):
            continue
        total += chunk.sum(axis=0)
        squares += np.square(chunk).sum(axis=0)
        low = np.minimum(low, chunk.min(axis=0))
        high = np.maximum(high, chunk.max(axis=0))
    rows = dataset.num_steps
    mean = total / rows
    std = np.sqrt(np.maximum(squares / rows - np.square(mean), 0.0))
    return {
        "mean": mean.astype(np.float32),
        "std": std.astype(np.float32),
        "min": low.astype(np.float32),
        "max": high.astype(np.float32),
    }


class Normalize:
    """``(x - mean) / (std + eps)`` on the given keys (``next/`` twins use the same statistics).

    Args:
        stats: ``{key: {"mean": ..., "std": ...}}`` (e.g. from :func:`compute_stats`); ``None``:
            computed from the dataset when the loader binds the transform.
        keys: Keys to normalize (default: the keys of ``stats``, or ``observation``).
        eps: Added to the standard deviation.
    """

    def __init__(
        self,
        stats: dict[str, dict[str, Any]] | None = None,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        eps: float = 1e-6,
    ) -> None:
        self.keys = [join_key(k) for k in keys] if keys is not None else list(stats or ["observation"])
        self.eps = float(eps)
        self.stats = self._prepare(stats) if stats is not None else None

    def _prepare(self, stats: dict[str, dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        missing = [k for k in self.keys if k not in stats]
        if missing:
            raise ValueError(f"stats has no entry for {missing}")
        return {
            k: (np.asarray(stats[k]["mean"], np.float32), np.asarray(stats[k]["std"], np.float32) + self.eps)
            for k in self.keys
        }

    def bind(self, dataset: Dataset) -> None:
        """Compute missing statistics from ``dataset`` (called by the loader)."""
        if self.stats is None:
            self.stats = self._prepare(compute_stats(dataset, self.keys))

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self.stats is None:
            raise RuntimeError("Normalize has no statistics: pass stats= or use it in a Loader")
        for key, (mean, std) in self.stats.items():
            for name in (key, f"next/{key}"):
                if name in batch:
                    batch[name] = (batch[name] - mean) / std
        return batch


class NStepReturn:
    """n-step targets: ``next/reward`` becomes the discounted sum of up to ``n`` rewards inside the
    episode, ``next/observation`` and the done flags become those of the last step summed, and
    ``next/discount`` (float32, ``[..., 1]``) is ``gamma ** k`` for the ``k`` steps summed (use
    ``target = reward + discount * (1 - terminated) * V(next_observation)``).

    Args:
        n: Steps to sum.
        gamma: Discount.
    """

    needs_host = True

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
        reward = rewards["next/reward"][..., 0].astype(np.float64)  # [..., n]
        discounts = self.gamma ** np.arange(self.n)
        batch_reward = (reward * discounts * valid).sum(axis=-1, keepdims=True)
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
        return batch


class FrameStack:
    """Stacks the last ``k`` observations (from flat storage; no stacked copy is ever stored).

    ``observation`` becomes ``[..., k, *shape]`` holding steps ``t-k+1 .. t`` of the episode
    (the first frame repeated before the episode's start) and ``next/observation`` the frames
    ``t-k+2 .. t+1``.

    Args:
        k: Frames per stack.
        keys: Flat keys to stack (default ``observation``).
    """

    needs_host = True

    def __init__(self, k: int, keys: Iterable[str] = ("observation",)) -> None:
        self.k = positive_int("k", k)
        self.keys = [join_key(key) for key in keys]
        self._source: HostSource | None = None
        self._episodes: Episodes | None = None

    def bind(self, dataset: Dataset) -> None:
        """Open the stacked keys' flat arrays."""
        fields = dataset.manifest.fields
        bad = [k for k in self.keys if k not in fields or fields[k].storage != "flat"]
        if bad:
            raise ValueError(
                f"FrameStack keys must be observation-like (flat) keys of the dataset; not {bad}"
            )
        self._source = HostSource(dataset, self.keys)
        self._episodes = Episodes.of(dataset)

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._source is None or self._episodes is None:
            raise RuntimeError("FrameStack must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(batch["index"], np.int64)
        first = self._episodes.starts[self._episodes.episode_of(idx)]
        steps = np.maximum(idx[..., None] - np.arange(self.k - 1, -1, -1), first[..., None])  # [..., k]
        frames = self._source.gather(steps)
        axis = idx.ndim  # the new frame axis, right after the batch dimensions
        for key in self.keys:
            stack = frames[key]
            nxt = f"next/{key}"
            if nxt in batch:  # frames t-k+2 .. t, then the step's own next observation
                newest = np.expand_dims(np.asarray(batch[nxt]), axis)
                batch[nxt] = np.concatenate([np.take(stack, range(1, self.k), axis=axis), newest], axis=axis)
            if key in batch:
                batch[key] = stack
        return batch
