"""Mixtures: one batch drawn from several datasets with weights, in a common schema.

Each batch splits its ``batch_size`` rows among the sources by a multinomial draw with the
current weights (fixed, or a schedule of the step), gathers each part from its own source,
renames keys to the common schema and concatenates. Every row says where it came from in
``source`` (int64) and ``index`` (its step in that source). :meth:`MixtureLoader.report` gives
the achieved mix next to the targets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.loader.distributed import check_shard, rank_world, run_seed, stream_seed
from rlds_cli.loader.loader import to_tensordict, to_torch
from rlds_cli.loader.samplers import positive_int, uniform_ints
from rlds_cli.loader.sources import HostSource

Weights = Sequence[float] | Callable[[int], Sequence[float]]


def _check_weights(weights: Any, count: int) -> np.ndarray:
    w = np.asarray(weights, np.float64)
    if w.shape != (count,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(
            f"weights must be {count} finite non-negative numbers with a positive sum, got {weights!r}"
        )
    return w / w.sum()


class MixtureLoader:
    """Uniform transitions from several datasets, mixed with weights.

    Args:
        sources: ``{name: dataset or dataset name}`` (a list uses the datasets' names).
        weights: One weight per source (normalized), or ``schedule(step) -> weights``, called
            with the number of batches drawn so far (e.g. to anneal from offline to new data).
        batch_size: Rows per batch.
        keys: Keys of the common schema (after renaming); ``None``: those every source has.
        rename: ``{source name: {its key: common key}}``.
        seed: The run seed (``None``: ``$RLDS_SEED``, else a fresh one, logged and kept as
            :attr:`seed`); each rank draws its own stream from it.
        rank, world_size: This process's rank (``None``: from ``torch.distributed``, else 0, 1).
        num_batches: Batches per ``for batch in mix`` pass. A mixture has no epochs, so plain
            iteration needs it; :meth:`stream` is the endless alternative.
        in_memory: Load every source's needed columns into RAM.
        device: Where batches go.
        as_tensordict: Return ``tensordict.TensorDict`` batches.
        root: Cache root for names.
    """

    def __init__(
        self,
        sources: Mapping[str, str | Dataset] | Sequence[str | Dataset],
        weights: Weights,
        batch_size: int = 256,
        *,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        rename: Mapping[str, Mapping[str, str]] | None = None,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        num_batches: int | None = None,
        in_memory: bool = False,
        device: torch.device | str | None = None,
        as_tensordict: bool = False,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(sources, Mapping):
            opened = [s if isinstance(s, Dataset) else open_dataset(s, root) for s in sources]
            sources = {ds.name: ds for ds in opened}
        if not sources:
            raise ValueError("sources must name at least one dataset")
        self.names = list(sources)
        self.datasets = [s if isinstance(s, Dataset) else open_dataset(s, root) for s in sources.values()]
        rename = dict(rename or {})
        unknown = sorted(set(rename) - set(self.names))
        if unknown:
            raise ValueError(f"rename names unknown source(s) {unknown}; sources are {self.names}")
        self._renames = [{join_key(k): join_key(v) for k, v in rename.get(n, {}).items()} for n in self.names]
        self.keys = self._common_keys(keys)
        self._sources = [
            HostSource(ds, [self._original(i, k) for k in self.keys], in_memory=in_memory)
            for i, ds in enumerate(self.datasets)
        ]
        self._check_shapes()
        self.batch_size = positive_int("batch_size", batch_size)
        self._schedule = weights if callable(weights) else None
        self._fixed = None if callable(weights) else _check_weights(weights, len(self.names))
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what="MixtureLoader")
        self._rng = np.random.default_rng(stream_seed(self.seed, self.rank, self.world_size))
        if num_batches is not None and (
            isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0
        ):
            raise ValueError(f"num_batches must be an integer >= 0 or None, got {num_batches!r}")
        self.num_batches = num_batches
        self.device = torch.device(device) if device is not None else None
        self.as_tensordict = bool(as_tensordict)
        self.batches_drawn = 0
        self._counts = np.zeros(len(self.names), np.int64)
        self._target = np.zeros(len(self.names), np.float64)

    def _original(self, source: int, key: str) -> str:
        back = {v: k for k, v in self._renames[source].items()}
        return back.get(key, key)

    def _common_keys(self, keys: Iterable[str | tuple[str, ...]] | None) -> list[str]:
        per_source = [{self._renames[i].get(k, k) for k in ds.fields} for i, ds in enumerate(self.datasets)]
        if keys is None:
            common = set.intersection(*per_source)
            return sorted(common, key=lambda k: (k.startswith("next/"), k))
        wanted = list(dict.fromkeys(join_key(k) for k in keys))
        for name, have in zip(self.names, per_source, strict=True):
            missing = [k for k in wanted if k not in have]
            if missing:
                raise KeyError(
                    f"source {name!r} has no keys {missing} (after renaming); map them with rename="
                )
        return wanted

    def _check_shapes(self) -> None:
        ref = {k: self.datasets[0].fields[self._original(0, k)] for k in self.keys}
        for i, ds in enumerate(self.datasets[1:], start=1):
            for key in self.keys:
                got = ds.fields[self._original(i, key)]
                if got != ref[key]:
                    raise ValueError(
                        f"key {key!r} is {got} in source {self.names[i]!r} but {ref[key]} in "
                        f"{self.names[0]!r}; a common schema needs equal shapes and dtypes"
                    )

    def weights(self) -> np.ndarray:
        """The normalized weights for the next batch."""
        if self._schedule is not None:
            return _check_weights(self._schedule(self.batches_drawn), len(self.names))
        assert self._fixed is not None
        return self._fixed

    def sample(self) -> Any:
        """One batch in the common schema, plus ``index`` and ``source``."""
        w = self.weights()
        counts = self._rng.multinomial(self.batch_size, w)
        parts: list[TedBatch] = []
        for i, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            idx = uniform_ints(self._rng, self.datasets[i].num_steps, n)
            got = self._sources[i].gather(idx)
            part = TedBatch({self._renames[i].get(k, k): v for k, v in got.items()})
            part["index"] = idx
            part["source"] = np.full(n, i, np.int64)
            parts.append(part)
        batch = TedBatch({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
        self._counts += counts
        self._target += w * self.batch_size
        self.batches_drawn += 1
        out = to_torch(batch, self.device)
        return to_tensordict(out, self.device) if self.as_tensordict else out

    def __iter__(self) -> Iterator[Any]:
        """``num_batches`` batches (a mixture has no epochs: without it, a ``TypeError``)."""
        if self.num_batches is None:
            raise TypeError(
                "a MixtureLoader has no epochs: pass num_batches= for finite passes, or iterate "
                "mix.stream() for an endless stream"
            )
        return (self.sample() for _ in range(self.num_batches))

    def __len__(self) -> int:
        """``num_batches`` (a ``TypeError`` without it)."""
        if self.num_batches is None:
            raise TypeError("a MixtureLoader without num_batches has no length")
        return self.num_batches

    def stream(self) -> Iterator[Any]:
        """An endless stream of batches."""
        while True:
            yield self.sample()

    def report(self) -> dict[str, dict[str, float]]:
        """Per source: rows drawn, the achieved fraction, and the target fraction (the mean of
        the weights in force over the batches drawn)."""
        total = max(int(self._counts.sum()), 1)
        return {
            name: {
                "rows": int(self._counts[i]),
                "achieved": float(self._counts[i] / total),
                "target": float(self._target[i] / total),
            }
            for i, name in enumerate(self.names)
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator, batch count and the mix so far: a restored loader continues the stream."""
        return {
            "bit_generator": self._rng.bit_generator.state,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "batches_drawn": self.batches_drawn,
            "counts": self._counts.copy(),
            "target": self._target.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another rank or world size:
        :class:`~rlds_cli.errors.LoaderStateError`)."""
        check_shard(state, self.rank, self.world_size, "MixtureLoader")
        if state.get("seed") is not None:
            self.seed = int(state["seed"])
        self._rng.bit_generator.state = state["bit_generator"]
        self.batches_drawn = int(state["batches_drawn"])
        self._counts = np.asarray(state["counts"], np.int64).copy()
        self._target = np.asarray(state["target"], np.float64).copy()
