"""Environments and helpers for the recording tests (``tests/test_recording*.py``).

``MixedEnv`` has the spaces Minari's own tests use for ``DataCollector``: a nested Dict
observation with Box, Discrete, MultiBinary and Text leaves, or a Tuple observation with a
MultiDiscrete leaf, and a Dict or Tuple action. It is deterministic by its reset seed, ends by
termination at a step drawn at reset (a time limit truncates the others), and returns infos at
reset and at every step, one of them (``step_only``) only at steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

CHARSET = "abcdefgh"


class MixedEnv(gym.Env):  # type: ignore[type-arg]
    """A tiny environment with Dict/Tuple/Text/MultiBinary/MultiDiscrete spaces."""

    def __init__(self, kind: str = "dict", step_only_info: bool = False) -> None:
        self.kind = kind
        self.step_only_info = step_only_info
        box = spaces.Box(-10, 10, (3,), np.float32)
        if kind == "dict":
            self.observation_space = spaces.Dict(
                {
                    "pos": box,
                    "goal": spaces.Dict({"xy": spaces.Box(-1, 1, (2,), np.float64)}),
                    "mode": spaces.Discrete(4),
                    "bits": spaces.MultiBinary(3),
                    "note": spaces.Text(6, min_length=1, charset=CHARSET),
                }
            )
            self.action_space = spaces.Dict(
                {"move": spaces.Box(-1, 1, (2,), np.float32), "grip": spaces.Discrete(2)}
            )
        else:
            self.observation_space = spaces.Tuple((box, spaces.MultiDiscrete([3, 5]), spaces.Discrete(3)))
            self.action_space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (1,), np.float32)))
        self._t = 0
        self._limit = 0

    def _obs(self) -> Any:
        r = self.np_random
        if self.kind == "dict":
            n = int(r.integers(1, 7))
            return {
                "pos": r.normal(size=3).astype(np.float32),
                "goal": {"xy": r.uniform(-1, 1, 2)},
                "mode": int(r.integers(4)),
                "bits": r.integers(0, 2, 3).astype(np.int8),
                "note": "".join(CHARSET[int(i)] for i in r.integers(0, len(CHARSET), n)),
            }
        return (
            r.normal(size=3).astype(np.float32),
            np.array([r.integers(3), r.integers(5)], np.int64),
            int(r.integers(3)),
        )

    def _info(self, at_reset: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"count": np.int64(self._t), "noise": self.np_random.normal(size=2)}
        if self.step_only_info and not at_reset:
            info["step_only"] = float(self._t) / 2
        return info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._limit = int(self.np_random.integers(2, 9))
        return self._obs(), self._info(True)

    def step(self, action: Any) -> Any:
        self._t += 1
        reward = float(self.np_random.normal())
        return self._obs(), reward, self._t >= self._limit, False, self._info(False)


def register() -> None:
    """Register ``RecMixed-v0`` (idempotent), so environments have an env spec."""
    if "RecMixed-v0" not in gym.registry:
        gym.register("RecMixed-v0", entry_point=f"{__name__}:MixedEnv", disable_env_checker=True)


class MemorySink:
    """Collects committed episodes in memory (what ``DatasetWriter.add_episode`` would get)."""

    def __init__(self) -> None:
        self.episodes: list[dict[str, np.ndarray]] = []
        self.seeds: list[int | None] = []

    def add_episode(self, episode: Any) -> None:
        self.episodes.append(episode)
        present = "reset_seed" in episode and bool(episode["reset_seed_present"][0])
        self.seeds.append(int(episode["reset_seed"][0]) if present else None)


def action_plan(space: gym.Space, n: int, seed: int) -> list[Any]:  # type: ignore[type-arg]
    """``n`` actions drawn from ``space`` seeded with ``seed`` (the same list for both recorders)."""
    space.seed(seed)
    return [space.sample() for _ in range(n)]
