"""Proportional prioritized sampling (Schaul et al., 2016) over steps or slices.

Item ``i`` is drawn with probability ``P(i) = p_i^alpha / sum_j p_j^alpha``; its importance
weight is ``(N * P(i))^-beta`` divided by the largest possible weight, i.e.
``(p_i^alpha / min_j p_j^alpha)^-beta``, so weights are in ``(0, 1]``. New items start at the
largest priority seen so far. Priorities live in a :class:`~rlds_cli.loader.sumtree.SumTree`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlds_cli.loader.distributed import check_steps, rank_world, run_seed, stream_seed
from rlds_cli.loader.samplers import (
    Draw,
    ShortPolicy,
    SliceSampler,
    generator_state,
    load_shard_state,
    positive_int,
    shard_state,
)
from rlds_cli.loader.state_checks import (
    check_array,
    check_bit_generator,
    check_number,
    check_shard_fields,
    check_state,
)
from rlds_cli.loader.sumtree import SumTree

if TYPE_CHECKING:
    from rlds_cli.loader.samplers import ViewChange


def _nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class PrioritizedSampler:
    """Steps drawn in proportion to their priority, with importance weights.

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per batch.
        alpha: How much priorities matter (0: uniform).
        beta: Importance-weight correction (1: full); may be changed between batches.
        eps: Added to ``|priority|`` so that no item becomes impossible to draw.
        seed: The run seed (``None``: ``$RLDS_SEED`` or a fresh one, logged).
        rank, world_size: This process's rank: each rank draws its own stream from the seed.
        fanout: Fan-out of the sum tree.
        compiled: Run the sum tree's compiled kernels (numba): None (default)
            when installed; True requires them; False never. The stream is the same either way.

    ``sample()`` returns a :class:`Draw` with ``weight`` (float32) per index; feed the new
    priorities (e.g. TD errors) back with :meth:`update_priority`.
    """

    def __init__(
        self,
        num_steps: int,
        batch_size: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        fanout: int = 32,
        compiled: bool | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if num_steps <= 0:
            raise ValueError(f"cannot sample from an empty dataset (num_steps={num_steps})")
        self.num_steps = int(num_steps)
        self.batch_size = positive_int("batch_size", batch_size)
        self.alpha = _nonneg("alpha", alpha)
        self.beta = _nonneg("beta", beta)
        self.eps = _nonneg("eps", eps)
        self.max_priority = 1.0
        self._tree = SumTree(self.num_steps, fanout, compiled=compiled)
        self._tree.set_all(np.full(self.num_steps, self.max_priority**self.alpha))
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what=type(self).__name__)
        self._rng = np.random.default_rng(stream_seed(self.seed, self.rank, self.world_size))

    @property
    def priorities(self) -> np.ndarray:
        """``p_i^alpha`` of every step (read-only)."""
        return self._tree.leaves

    def follow(self, change: ViewChange) -> None:
        """Draw from a refreshed view of a growing dataset: a surviving row keeps its priority
        (mapped by episode id), a new row starts at the largest priority seen (as in TorchRL and
        Schaul et al.). The tree is rebuilt (linear in the rows); the generator goes on."""
        leaves = change.carry(self._tree.leaves, self.max_priority**self.alpha)
        self.num_steps = change.num_steps
        self._tree = SumTree(self.num_steps, self._tree.fanout, compiled=self._tree.compiled)
        self._tree.set_all(leaves)

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx, weight = self._tree.sample_with_priority(self._rng, n)  # a new array: in place is safe
        weight /= self._tree.min
        weight **= -self.beta  # (p_i / min p)^-beta, as `**` computes it
        return idx, weight.astype(np.float32)

    def sample(self, n: int | None = None) -> Draw:
        """``n`` (default ``batch_size``) indices and their importance ``weight``."""
        idx, weight = self._draw(self.batch_size if n is None else n)
        return Draw(idx, {"weight": weight})

    def update_priority(self, indices: Any, priority: Any) -> None:
        """Set the priority of ``indices`` (any shape, e.g. a batch's ``index``) to ``priority``
        (broadcast to the same shape; e.g. absolute TD errors). Tensors are accepted."""
        given = _as_numpy(indices)
        if given.size and given.dtype.kind not in "iu":  # 2.7 would land on row 2 without a word
            raise ValueError(
                f"update_priority: indices must be integers (a batch's index), not {given.dtype}"
            )
        idx = given.astype(np.int64, copy=False)
        raw = _as_numpy(priority)
        if raw.shape != idx.shape:
            try:
                raw = np.broadcast_to(raw, idx.shape)
            except ValueError:
                raise ValueError(
                    f"update_priority: {raw.shape} priorities for indices of shape {idx.shape}; give "
                    "one priority per index (or one for all)"
                ) from None
        pri, top = self._magnitudes(raw)  # a new array: the in-place power is safe
        pri **= self.alpha  # as `**` (numpy's fast paths for 0, 0.5, 1, 2 included), in place
        self._tree.set(idx, pri)  # checks: finite, >= 0, in range
        self.max_priority = max(self.max_priority, top)

    def _magnitudes(self, raw: np.ndarray) -> tuple[np.ndarray, float]:
        """``|raw| + eps`` as a new float64 array, and the largest ``|raw|`` (0 when empty); compiled
        when the tree has its kernels (same values)."""
        kernels = self._tree.kernels
        if kernels is not None and raw.size and raw.dtype.kind in "biuf":  # (complex: its modulus)
            flat = np.ascontiguousarray(raw, np.float64).reshape(-1)
            out = np.empty(raw.shape, np.float64)
            top = kernels.magnitudes(flat, self.eps, out.reshape(-1))
            return out, float(top)
        pri = np.abs(raw, dtype=np.float64)
        top = float(pri.max()) if pri.size else 0.0
        pri += self.eps
        return pri, top

    def stream_state(self) -> dict[str, Any]:
        """Only the generator's state (cheap): what a prefetching loader records per batch."""
        return {"bit_generator": generator_state(self._rng)}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Rewind the generator to a :meth:`stream_state` (priorities stay as they are)."""
        self._rng.bit_generator.state = state["bit_generator"]

    def state_dict(self) -> dict[str, Any]:
        """Generator state and every priority: a resumed run draws the same stream."""
        return {
            "bit_generator": generator_state(self._rng),
            **shard_state(self, self.num_steps),
            "priorities": np.array(self._tree.leaves),
            "max_priority": self.max_priority,
            "alpha": self.alpha,
            "beta": self.beta,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another dataset, rank or world
        size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        what = type(self).__name__
        check_shard_fields(check_state(state, what), what)
        check_bit_generator(state, "bit_generator", what, self._rng)
        check_steps(state, self.num_steps)  # another dataset: say so before the priorities' length
        check_array(state, "priorities", what, kind="iuf", length=self.num_steps)
        for key in ("max_priority", "alpha", "beta"):
            check_number(state, key, what)
        load_shard_state(self, state, self.num_steps)
        self._tree.set_all(np.asarray(state["priorities"], np.float64))
        self.max_priority = float(state["max_priority"])
        self.alpha, self.beta = float(state["alpha"]), float(state["beta"])
        self._rng.bit_generator.state = state["bit_generator"]


class PrioritizedSliceSampler(PrioritizedSampler):
    """Slices anchored at prioritized steps: a step is drawn by priority and the slice of
    ``slice_len`` steps starting there (moved back to fit inside its episode) is returned.

    Steps of episodes that ``short="skip"`` excludes get priority 0. ``weight`` is the anchor's
    importance weight, repeated along the slice; ``update_priority`` takes per-step priorities
    (e.g. a ``[num_slices, slice_len]`` array with the batch's ``index``).

    Args:
        episode_lengths: Steps per episode, in dataset order.
        num_slices: Slices per batch.
        slice_len: Steps per slice.
        short: Policy for episodes shorter than ``slice_len`` (see :class:`SliceSampler`).
        alpha, beta, eps, seed, fanout, compiled, rank, world_size: As for
            :class:`PrioritizedSampler`.
    """

    def __init__(
        self,
        episode_lengths: np.ndarray,
        num_slices: int,
        slice_len: int,
        *,
        short: ShortPolicy = "pad",
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        fanout: int = 32,
        compiled: bool | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        # only its windows are used, never its generator: fixed seed (no fresh one logged)
        self._slices = SliceSampler(episode_lengths, num_slices, slice_len, short=short, seed=0)
        ep = self._slices.episodes
        super().__init__(
            ep.num_steps,
            num_slices * positive_int("slice_len", slice_len),
            alpha=alpha,
            beta=beta,
            eps=eps,
            seed=seed,
            fanout=fanout,
            compiled=compiled,
            rank=rank,
            world_size=world_size,
        )
        self.num_slices, self.slice_len = self._slices.num_slices, self._slices.slice_len
        self._zero_skipped()

    def follow(self, change: ViewChange) -> None:
        """As :meth:`PrioritizedSampler.follow`, with the slice windows of the new episodes
        (steps of episodes ``short="skip"`` excludes get priority 0)."""
        self._slices.follow(change)
        super().follow(change)
        self._zero_skipped()

    def _zero_skipped(self) -> None:
        if self._slices.skipped_episodes:
            ep = self._slices.episodes
            excluded = np.flatnonzero(self._slices._windows == 0)
            steps = np.concatenate([np.arange(ep.starts[e], ep.ends[e]) for e in excluded])
            self._tree.set(steps, 0.0)

    @property
    def skipped_episodes(self) -> int:
        """Episodes never sampled because they are shorter than ``slice_len``."""
        return self._slices.skipped_episodes

    def sample(self, n: int | None = None) -> Draw:
        """``n`` (default ``num_slices``) slices: indices, ``mask`` and ``weight``."""
        anchor, weight = self._draw(self.num_slices if n is None else n)
        ep = self._slices.episodes
        e = ep.episode_of(anchor)
        start = np.maximum(np.minimum(anchor, ep.ends[e] - self.slice_len), ep.starts[e])
        draw = self._slices.windows(start, e)
        draw.extras["weight"] = np.repeat(weight[:, None], self.slice_len, axis=1)
        return draw

    def update_priority(self, indices: Any, priority: Any) -> None:
        """Per-step priorities; padded positions (repeated last steps) may be passed as is."""
        super().update_priority(indices, priority)
        if self._slices.skipped_episodes:  # keep skipped episodes impossible to draw
            idx = _as_numpy(indices).astype(np.int64).ravel()
            e = self._slices.episodes.episode_of(idx)
            dead = self._slices._windows[e] == 0
            if dead.any():
                self._tree.set(idx[dead], 0.0)


def _as_numpy(value: Any) -> np.ndarray:
    """A numpy view of an array-like or a (CPU or device) torch tensor."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and not value.requires_grad:
            return value.numpy()  # a view: .detach().cpu() would make two more tensor objects
        return value.detach().cpu().numpy()
    if hasattr(value, "detach"):  # another tensor type
        value = value.detach().cpu().numpy()
    return np.asarray(value)
