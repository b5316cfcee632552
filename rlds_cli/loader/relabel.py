"""Goal relabeling at sample time: OGBench's ``GCDataset`` rules and HER's "future" strategy.

Goals are drawn per batch, so a step sees many goals over training (unlike a ``preprocess``
relabeling). OGBench's ``GCDataset.sample_goals`` (``impls/utils/datasets.py``) rules, for a step
``t`` whose episode's last step is ``T`` (OGBench's ``final_state_idxs``), over ``N`` steps:

* random goal: a step drawn uniformly from all ``N`` steps (``get_random_idxs``);
* trajectory goal, geometric (``geom_sample=True``): ``min(t + k, T)`` with ``k`` drawn from a
  geometric distribution with success probability ``1 - discount`` (``k >= 1``);
* trajectory goal, uniform (``geom_sample=False``): with ``d`` uniform in ``[0, 1)``,
  ``round(min(t + 1, T) * d + T * (1 - d))``;
* the choice: with ``u1, u2`` uniform in ``[0, 1)``, the goal is the trajectory goal when
  ``u1 < p_trajgoal / (1 - p_curgoal)``, else the random goal; then the current step ``t`` when
  ``u2 < p_curgoal``. With ``p_curgoal == 1`` it is ``t`` always.

Value goals and actor goals are drawn apart, each with its own probabilities. The reward and
mask follow the value goal (OGBench's rule): ``success = (t == value_goal)``,
``mask = 1 - success``, ``reward = success - (1 if gc_negative else 0)``; a user function
``reward_fn(batch, value_goal_observation) -> (reward, mask)`` replaces the rule.

HER's "future" strategy (TorchRL's ``HERReplayBuffer``, cpprb's HER) draws the goal uniformly
among the steps ``t .. T`` of the same episode: ``t + floor(u * (T - t + 1))``.

Randomness: each batch's uniforms come from a generator seeded by the transform's ``seed`` and
the bytes of the batch's ``index``; the rules are pure functions of them
(:func:`ogbench_goal_indices`, :func:`her_future_indices`). Goals are thus a function of the
sampled steps: a restored loader draws the same goals, and the same indices twice get the same
goals.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.loader.mixture_schema import PadSchema
from rlds_cli.loader.run_state import check_seed
from rlds_cli.loader.samplers import Episodes
from rlds_cli.loader.sources import HostSource

_OUTPUT_KEYS = ("value_goal", "actor_goal", "value_goal_index", "actor_goal_index", "next/reward", "mask")
RewardFn = Callable[[TedBatch, np.ndarray], tuple[np.ndarray, np.ndarray]]
#: Where the relabeled mask goes when the batch already carries a ``mask`` (a slice sampler's
#: padding, which TorchRL losses read as ``("collector", "mask")``): never over it.
GOAL_MASK_KEY = "goal_mask"


def _mask_key(batch: TedBatch) -> str:
    """``"mask"``, or :data:`GOAL_MASK_KEY` where ``batch`` already holds a sampler's mask."""
    return GOAL_MASK_KEY if "mask" in batch else "mask"


@dataclass(frozen=True)
class GoalRule:
    """One of OGBench's goal distributions (``value_*`` or ``actor_*`` config keys).

    Args:
        p_curgoal: Probability of the current step as the goal.
        p_trajgoal: Probability of a later step of the same episode.
        p_randomgoal: Probability of a step drawn from the whole dataset.
        geom_sample: Trajectory goals at a geometric offset (else uniform up to the episode end).
        discount: The geometric distribution's ``1 - p``.
    """

    p_curgoal: float = 0.2
    p_trajgoal: float = 0.5
    p_randomgoal: float = 0.3
    geom_sample: bool = True
    discount: float = 0.99

    def __post_init__(self) -> None:
        probs = (self.p_curgoal, self.p_trajgoal, self.p_randomgoal)
        if any(p < 0 for p in probs) or not np.isclose(sum(probs), 1.0):
            raise ValueError(f"goal probabilities must be >= 0 and sum to 1, got {probs}")
        if not 0.0 <= self.discount < 1.0:
            raise ValueError(f"discount must be in [0, 1), got {self.discount!r}")


def ogbench_goal_indices(
    idx: np.ndarray,
    last: np.ndarray,
    rule: GoalRule,
    random_idx: np.ndarray,
    offsets: np.ndarray,
    distances: np.ndarray,
    u_traj: np.ndarray,
    u_cur: np.ndarray,
) -> np.ndarray:
    """OGBench's goal choice as a pure function of its random numbers (see the module docstring).

    Args:
        idx: Steps ``t``.
        last: Each step's episode's last step ``T``.
        rule: Probabilities and the trajectory-goal distribution.
        random_idx: Random goal steps (uniform over the dataset).
        offsets: Geometric offsets ``k >= 1`` (used when ``rule.geom_sample``).
        distances: Uniforms ``d`` (used otherwise).
        u_traj: Uniforms choosing trajectory against random goals.
        u_cur: Uniforms choosing the current step.
    """
    if rule.geom_sample:
        traj = np.minimum(idx + offsets, last)
    else:
        traj = np.round(np.minimum(idx + 1, last) * distances + last * (1 - distances)).astype(np.int64)
    if rule.p_curgoal == 1.0:
        return idx.copy()
    goal = np.where(u_traj < rule.p_trajgoal / (1.0 - rule.p_curgoal), traj, random_idx)
    return np.where(u_cur < rule.p_curgoal, idx, goal)


def her_future_indices(idx: np.ndarray, last: np.ndarray, u: np.ndarray) -> np.ndarray:
    """HER's "future" goal: a step drawn uniformly among ``t .. T`` of the same episode."""
    return idx + np.floor(u * (last - idx + 1)).astype(np.int64)


def batch_generator(seed: int, idx: np.ndarray) -> np.random.Generator:
    """The generator of one batch: seeded by ``seed`` and the bytes of its step indices."""
    digest = hashlib.blake2b(np.ascontiguousarray(idx, np.int64).tobytes(), digest_size=16).digest()
    words = np.frombuffer(digest, np.uint32).tolist()
    high = [int(seed) >> 32] if seed >> 32 else []  # a seed of more than 32 bits: all of it
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, *words, *high])


class GoalRelabel:
    """Goals chosen at sample time from the dataset's own steps (OGBench's or HER's rules).

    Adds ``value_goal`` and ``actor_goal`` (the observation-like ``goal_key`` at the chosen
    steps; with ``strategy="her_future"`` both are the one HER goal), ``value_goal_index`` and
    ``actor_goal_index``, ``mask`` (float32) and replaces ``next/reward`` (float32, the batch
    shape plus one column) by the goal-reaching reward (see the module docstring for the rules).

    Args:
        strategy: ``"ogbench"`` or ``"her_future"``.
        value: The value goals' rule (OGBench's ``value_*`` keys).
        actor: The actor goals' rule (OGBench's ``actor_*`` keys).
        gc_negative: Rewards ``0 / -1`` instead of ``1 / 0`` (OGBench's ``gc_negative``).
        goal_key: The key the goals are taken from (default ``observation``).
        reward_fn: ``f(batch, value_goal) -> (reward, mask)`` in place of OGBench's rule.
        seed: Seed of the goal draws (together with each batch's indices).
    """

    needs_host = True

    def __init__(
        self,
        strategy: str = "ogbench",
        value: GoalRule | None = None,
        actor: GoalRule | None = None,
        gc_negative: bool = True,
        goal_key: str = "observation",
        reward_fn: RewardFn | None = None,
        seed: int = 0,
    ) -> None:
        if strategy not in ("ogbench", "her_future"):
            raise ValueError(f"strategy must be 'ogbench' or 'her_future', got {strategy!r}")
        self.strategy = strategy
        for name, rule in (("value", value), ("actor", actor)):
            if rule is not None and not isinstance(rule, GoalRule):
                raise ValueError(
                    f"{name} must be a GoalRule (GoalRule(p_curgoal, ...)), got {type(rule).__name__}"
                )
        self.value = value or GoalRule(0.2, 0.5, 0.3, True)
        self.actor = actor or GoalRule(0.0, 1.0, 0.0, True)
        self.gc_negative = bool(gc_negative)
        self.goal_key = join_key(goal_key)
        self.reward_fn = reward_fn
        self.seed = check_seed(seed)
        self._source: HostSource | None = None
        self._episodes: Episodes | None = None

    def bind(self, dataset: Dataset) -> None:
        """Open the goal key and the episode bounds."""
        if self.goal_key not in dataset.manifest.fields:
            raise ValueError(
                f"GoalRelabel goal_key {self.goal_key!r} is not a key of dataset {dataset.name!r}"
            )
        self._source = HostSource(dataset, [self.goal_key])
        self._episodes = Episodes.of(dataset)

    def for_mixture(self, datasets: Sequence[Dataset] | Any) -> Callable[[TedBatch], TedBatch]:
        """A plain transform (nothing to bind) for a mixture's batches: each row's goals are chosen
        in its own dataset (by ``source`` and ``index``); the goal indices are steps of it.
        ``goal_key`` must have the same name and number of axes in every dataset; the goals take
        its padded common schema (:class:`~rlds_cli.loader.mixture_schema.PadSchema`: the widest
        shape, zero-padded, and the promoted dtype).

        Args:
            datasets: The mixture's datasets in source order, or a
                :class:`~rlds_cli.loader.mixture.MixtureSource` (its ``datasets``).
        """
        parts, datasets = [], list(getattr(datasets, "datasets", datasets))
        for dataset in datasets:
            part = copy.copy(self)
            part.reward_fn = None  # the user's rule runs once, on the whole batch
            part.bind(dataset)
            parts.append(part)
        # the goals take goal_key's padded common schema (as pad=True pads the key)
        specs = [d.manifest.fields[self.goal_key] for d in datasets]
        own = [{self.goal_key: (spec.shape, spec.dtype)} for spec in specs]
        goal = PadSchema([d.name for d in datasets], own, [self.goal_key], pad=True).keys[self.goal_key]
        goal_shape, goal_dtype = goal.shape, goal.dtype

        def relabel(batch: TedBatch) -> TedBatch:
            shape = np.shape(batch["index"])  # slices: [B, L]; rows are relabeled one by one
            source = np.asarray(batch["source"], np.int64).reshape(-1)
            idx = np.asarray(batch["index"], np.int64).reshape(-1)
            mask_key = _mask_key(batch)
            pieces = []
            for s, part in enumerate(parts):
                rows = np.flatnonzero(source == s)
                if len(rows):
                    pieces.append((rows, part(TedBatch(index=idx[rows]))))
            for key in _OUTPUT_KEYS:
                first = pieces[0][1][key]
                if key in ("value_goal", "actor_goal"):  # each source's goals at the start of each axis
                    full = np.zeros((len(idx), *goal_shape), goal_dtype)
                    for rows, piece in pieces:
                        where: tuple[Any, ...] = (rows, *(slice(0, n) for n in piece[key].shape[1:]))
                        full[where] = piece[key]
                else:
                    full = np.empty((len(idx), *first.shape[1:]), first.dtype)
                    for rows, piece in pieces:
                        full[rows] = piece[key]
                batch[mask_key if key == "mask" else key] = full.reshape(*shape, *full.shape[1:])
            if self.reward_fn is not None:  # the user's rule sees the whole batch
                reward, mask = self.reward_fn(batch, batch["value_goal"])
                batch["next/reward"] = np.asarray(reward, np.float32).reshape(*shape, -1)
                batch[mask_key] = np.asarray(mask, np.float32).reshape(shape)
            return batch

        return relabel

    def goal_indices(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The value and actor goal steps of the steps ``idx`` (one vectorized draw)."""
        if self._episodes is None:
            raise RuntimeError("GoalRelabel must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(idx, np.int64)
        last = self._episodes.ends[self._episodes.episode_of(idx)] - 1
        rng = batch_generator(self.seed, idx)
        if self.strategy == "her_future":
            goal = her_future_indices(idx, last, rng.random(idx.shape))
            return goal, goal
        n = self._episodes.num_steps
        out = []
        for rule in (self.value, self.actor):
            u = rng.random((4, *idx.shape))  # random goal, distance, trajectory choice, current
            offsets = rng.geometric(1.0 - rule.discount, idx.shape)
            random_idx = np.minimum((u[0] * n).astype(np.int64), n - 1)
            out.append(ogbench_goal_indices(idx, last, rule, random_idx, offsets, u[1], u[2], u[3]))
        return out[0], out[1]

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._source is None:
            raise RuntimeError("GoalRelabel must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(batch["index"], np.int64)
        value_idx, actor_idx = self.goal_indices(idx)
        value_goal = self._source.gather(value_idx)[self.goal_key]
        actor_goal = value_goal if actor_idx is value_idx else self._source.gather(actor_idx)[self.goal_key]
        batch["value_goal"], batch["actor_goal"] = value_goal, actor_goal
        batch["value_goal_index"], batch["actor_goal_index"] = value_idx, actor_idx
        if self.reward_fn is not None:
            reward, mask = self.reward_fn(batch, value_goal)
        else:
            success = (idx == value_idx).astype(np.float32)
            mask = 1.0 - success
            reward = success - (1.0 if self.gc_negative else 0.0)
        batch["next/reward"] = np.asarray(reward, np.float32).reshape(*idx.shape, -1)
        batch[_mask_key(batch)] = np.asarray(mask, np.float32).reshape(idx.shape)
        return batch
