"""Sequence-model inputs per step: the previous action and reward (AMAGO's ``rl2s``) and the
step's time index within its episode.

AMAGO feeds its sequence models, at every step ``t``, the action taken at ``t - 1`` and the
reward received after it, next to the observation, with zeros at an episode's first step (where
there is no previous step), and ``time_idxs``, the step's position ``t - start`` in its episode.
:class:`PrevActionReward` adds them to any batch from the batch's ``index`` alone, vectorized,
so it works with every sampler (a slice's ``[B, L]`` indices included), mixtures' single
datasets, prefetch and exact resume (it draws nothing at random).
"""

from __future__ import annotations

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.samplers import Episodes
from rlds_cli.loader.sources import HostSource


class PrevActionReward:
    """Adds ``prev_action`` (the action of step ``t - 1``), ``prev_reward`` (its reward,
    float32, ``[..., columns]``), ``rl2s`` (the two concatenated, float32, AMAGO's layout:
    reward then flattened action) and ``time_idx`` (int64, ``t`` minus its episode's first step).
    At an episode's first step the previous action and reward are zeros.
    """

    needs_host = True

    def __init__(self) -> None:
        self._source: HostSource | None = None
        self._episodes: Episodes | None = None

    def bind(self, dataset: Dataset) -> None:
        """Open the actions, rewards and episode bounds."""
        self._source = HostSource(dataset, ["action", "next/reward"])
        self._episodes = Episodes.of(dataset)

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._source is None or self._episodes is None:
            raise RuntimeError("PrevActionReward must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(batch["index"], np.int64)
        start = self._episodes.starts[self._episodes.episode_of(idx)]
        first = idx == start
        prev = self._source.gather(np.where(first, idx, idx - 1))  # a valid row; zeroed below
        action = np.where(first.reshape(*first.shape, *([1] * (prev["action"].ndim - idx.ndim))),
                          0, prev["action"]).astype(prev["action"].dtype)  # fmt: skip
        reward = prev["next/reward"].astype(np.float32).reshape(*idx.shape, -1)
        reward = np.where(first[..., None], np.float32(0), reward)
        batch["prev_action"] = action
        batch["prev_reward"] = reward
        flat_action = action.reshape(*idx.shape, -1).astype(np.float32)
        batch["rl2s"] = np.concatenate([reward, flat_action], axis=-1)
        batch["time_idx"] = idx - start
        return batch
