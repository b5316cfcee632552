"""The mixture's sampler: each batch's rows split among the sources with the weights in force.

Apart from :mod:`rlds_cli.loader.mixture` (the source and the one-line loader) because it needs
only the sizes of the sources, never their data: any index space laid end to end takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlds_cli.loader.distributed import check_shard, rank_world, run_seed, stream_seed
from rlds_cli.loader.mixture_growth import (
    FROM_START,
    NOT_READY,
    Weights,
    check_split,
    check_weights,
    effective_weights,
    fixed_counts,
    ready_since,
)
from rlds_cli.loader.samplers import positive_int
from rlds_cli.loader.state_checks import (
    check_array,
    check_bit_generator,
    check_int,
    check_shard_fields,
    check_state,
)


class MixtureSampler:
    """Mixture indices: each batch's rows split among the sources with the weights in force,
    each part uniform in its source (rows grouped by source, in source order).

    The weights in force are the given ones with the rules of
    :mod:`rlds_cli.loader.mixture_growth`: a source that is not ready weighs 0 (the others are
    renormalized), a source that becomes ready mid-run is annealed in over ``anneal`` batches.

    Args:
        sizes: Steps of each source (:attr:`MixtureSource.sizes`; 0 for a source not ready).
        weights: One weight per source (normalized), or ``schedule(step) -> weights``, called
            with the number of batches drawn so far.
        batch_size: Rows per batch.
        seed: The run seed (``None``: ``$RLDS_SEED``, else a fresh one, logged).
        rank, world_size: This process's rank: each rank draws its own stream from the seed.
        split: ``"random"``: the rows per source are a multinomial draw with the weights;
            ``"fixed"``: exactly the weights times ``batch_size``, rounded by largest remainder.
        anneal: Batches over which a source that becomes ready mid-run ramps up to its weight
            (``None``: its full weight at once).
        ready: Per source, whether it is ready now (``None``: all are).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Weights,
        batch_size: int,
        seed: int | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        split: str = "random",
        anneal: int | None = None,
        ready: Sequence[bool] | None = None,
    ) -> None:
        check_split(split, anneal)
        self.split, self.anneal = split, anneal
        self.batch_size = positive_int("batch_size", batch_size)
        self._schedule = weights if callable(weights) else None
        self._count = len(sizes)
        self._fixed = None if callable(weights) else check_weights(weights, len(sizes))
        self._steady: np.ndarray | None = None  # the weights while nothing changes (_weights)
        self._marked = False  # ready_at holds every source ready under the steady weights
        self.set_sizes(sizes, [True] * len(sizes) if ready is None else ready)
        #: Per source: the batch it was first seen ready before (FROM_START, NOT_READY).
        self.ready_at = np.where(self._ready, FROM_START, NOT_READY).astype(np.int64)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what="MixtureSampler")
        self._rng = np.random.default_rng(stream_seed(self.seed, self.rank, self.world_size))
        self.batches_drawn = 0
        self.counts = np.zeros(len(self.sizes), np.int64)  # rows drawn per source
        self.target = np.zeros(len(self.sizes), np.float64)  # rows the weights asked for

    def set_sizes(self, sizes: Sequence[int], ready: Sequence[bool]) -> None:
        """New sizes and readiness of the sources (their views changed: a refresh)."""
        sizes = [int(n) for n in sizes]
        if len(sizes) != len(ready) or len(sizes) != self._count or any(n < 0 for n in sizes):
            raise ValueError(f"sizes must be one non-negative count per source, got {sizes}")
        self.sizes = sizes
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._sizes_u64 = np.asarray(self.sizes, np.uint64)
        # a source without steps is never ready, whatever it says
        self._ready = np.asarray(ready, bool) & (np.asarray(self.sizes) > 0)
        self._steady, self._marked = None, False

    def _base(self) -> np.ndarray:
        if self._schedule is not None:
            return check_weights(self._schedule(self.batches_drawn), len(self.sizes))
        assert self._fixed is not None
        return self._fixed

    def weights(self) -> np.ndarray:
        """The normalized weights for the next batch (all zero when no source is ready)."""
        return self._weights().copy()

    def _weights(self) -> np.ndarray:
        if self._steady is not None:
            return self._steady
        since = ready_since(self.ready_at, self._ready, self.batches_drawn)
        w = effective_weights(self._base(), self._ready, since, self.batches_drawn, self.anneal)
        if self._schedule is None and self.anneal is None:
            # fixed weights without a ramp: the same for every batch until readiness changes
            # (set_sizes) or a state is loaded, so they are worked out once (~15 us a batch)
            self._steady = w
        return w

    def sample(self) -> np.ndarray:
        """One batch of mixture indices, int64, grouped by source."""
        w = self._weights()
        if not w.any():
            raise ValueError(
                "no dataset of the mixture is ready (none has steps and its min_size, or the ready "
                "ones weigh 0): sample once one is (Dataset.ready)"
            )
        if not self._marked:  # steady weights: the ready sources were marked at the first batch
            self.ready_at = ready_since(self.ready_at, self._ready, self.batches_drawn)
            self._marked = self._steady is not None
        if self.split == "fixed":
            counts = fixed_counts(w, self.batch_size)
        else:
            counts = self._rng.multinomial(self.batch_size, w)
        # one draw of raw words for the whole batch, each row modulo its source's size: the
        # same words, hence the same indices, as one uniform_ints per source in turn
        words = self._rng.bit_generator.random_raw(self.batch_size)
        words %= self._sizes_u64.repeat(counts)
        self.counts += counts
        self.target += w * self.batch_size
        self.batches_drawn += 1
        return words.view(np.int64) + self.offsets[:-1].repeat(counts)

    def report(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        """Per source (by ``names``): rows drawn, the achieved fraction, the target fraction
        (the mean of the weights in force over the batches drawn), the ``weight`` in force for
        the next batch (after readiness, annealing and renormalization), ``ready`` (1 or 0), its
        ``size`` (steps in the view in force) and ``epochs`` (rows drawn over its size)."""
        total = max(int(self.counts.sum()), 1)
        now = self.weights()
        return {
            name: {
                "rows": int(self.counts[i]),
                "achieved": float(self.counts[i] / total),
                "target": float(self.target[i] / total),
                "weight": float(now[i]),
                "ready": float(self._ready[i]),
                "size": float(self.sizes[i]),
                "epochs": float(self.counts[i] / self.sizes[i]) if self.sizes[i] else 0.0,
            }
            for i, name in enumerate(names)
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator, batch count, when each source became ready, and the mix so far: a restored
        sampler continues the stream (given the same views of the sources)."""
        return {
            "bit_generator": self._rng.bit_generator.state,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "batches_drawn": self.batches_drawn,
            "counts": self.counts.copy(),
            "target": self.target.copy(),
            "ready_at": self.ready_at.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another rank or world size:
        :class:`~rlds_cli.errors.LoaderStateError`)."""
        what, k = "MixtureLoader", len(self.sizes)
        check_shard_fields(check_state(state, what), what, num_steps=False)
        check_bit_generator(state, "bit_generator", what, self._rng)
        check_int(state, "batches_drawn", what)
        check_array(state, "counts", what, kind="iu", length=k)
        check_array(state, "target", what, kind="iuf", length=k)
        check_array(state, "ready_at", what, kind="iu", length=k, low=NOT_READY, required=False)
        check_shard(state, self.rank, self.world_size, what)
        if state.get("seed") is not None:
            self.seed = int(state["seed"])
        self._rng.bit_generator.state = state["bit_generator"]
        self.batches_drawn = int(state["batches_drawn"])
        self.counts = np.asarray(state["counts"], np.int64).copy()
        self.target = np.asarray(state["target"], np.float64).copy()
        if "ready_at" in state:  # states saved before growing mixtures have none
            self.ready_at = np.asarray(state["ready_at"], np.int64).copy()
        self._steady, self._marked = None, False
