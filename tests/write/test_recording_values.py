"""Values a recording cannot keep as the environment gave them are refused, not changed (found
by a hostile-input hunt): numpy's cast wrapped 300 into a uint8 44 and cut a Discrete 1.7 to 1
without a word; a Dict observation without one of its keys raised a bare KeyError; a seed past
64 bits overflowed after the first episodes were written; rewards that are np.float32 in one
episode and Python floats in the next stopped the recording with a schema error. And a NaN
reward, which a writer keeps, no longer breaks ``rlds inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import RecordingError
from tests.write.test_writer import episode


class ValuesEnv(gym.Env):  # type: ignore[type-arg]
    """Two-step episodes whose observations are ``values[i]`` in the given space, rewards
    ``rewards(episode)``."""

    def __init__(self, space: gym.Space, values: list[Any], rewards: Any = None) -> None:  # type: ignore[type-arg]
        self.observation_space = space
        self.action_space = gym.spaces.Discrete(2)
        self.values = values
        self.rewards = rewards or (lambda ep: 1.0)
        self.t = 0
        self.episode = -1

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return self.values[0], {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        self.t += 1
        return (
            self.values[min(self.t, len(self.values) - 1)],
            self.rewards(self.episode),
            self.t == 2,
            False,
            {},
        )


CASES = {
    "uint8 Box given 300": (
        gym.spaces.Box(0, 255, (1,), np.uint8),
        [np.array([1], np.uint16), np.array([300])],
    ),
    "int Box given 2.9": (gym.spaces.Box(0, 9, (1,), np.int64), [np.array([1]), np.array([2.9])]),
    "Discrete given 1.7": (gym.spaces.Discrete(5), [1, 1.7]),
    "MultiBinary given 300": (gym.spaces.MultiBinary(2), [np.array([0, 1]), np.array([1, 300])]),
    # stored as inf with only numpy's RuntimeWarning
    "float32 Box given 1e40": (
        gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        [np.zeros(2, np.float32), np.array([1.0, 1e40])],
    ),
    "Dict without one of its keys": (
        gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Discrete(3)}),
        [{"a": 1, "b": 2}, {"a": 1}],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_value_the_space_cannot_hold_is_refused_and_nothing_is_written(
    isolated_cache: Path, case: str
) -> None:
    space, values = CASES[case]
    with pytest.raises(RecordingError, match=r"cannot hold|has no part"):
        rlds_cli.record(ValuesEnv(space, values), None, name="v", episodes=1, seed=0)
    assert not CacheRoot().exists("v")


def test_values_the_space_holds_exactly_are_kept(isolated_cache: Path) -> None:
    space = gym.spaces.Box(0, 255, (1,), np.uint8)
    ds = rlds_cli.record(
        ValuesEnv(space, [np.array([255]), np.array([7.0])]), None, name="ok", episodes=1, seed=0
    )
    assert ds.episode(0)["next/observation"][:, 0].tolist() == [7, 7]


def test_a_seed_past_64_bits_is_refused_before_any_episode(isolated_cache: Path) -> None:
    with pytest.raises(RecordingError, match="2\\*\\*64"):
        rlds_cli.record("CartPole-v1", None, name="s", episodes=2, seed=2**64 - 1)
    with pytest.raises(RecordingError, match="steps=5 may make 5 episodes"):  # one a step at most
        rlds_cli.record("CartPole-v1", None, name="s", steps=5, seed=2**64 - 4)
    assert not CacheRoot().exists("s")
    assert rlds_cli.record("CartPole-v1", None, name="s", episodes=1, seed=2**64 - 1).num_episodes == 1


def test_rewards_of_changing_python_types_keep_the_first_episodes_dtype(isolated_cache: Path) -> None:
    def rewards(ep: int) -> Any:
        return np.float32(0.5) if ep % 2 == 0 else 0.25

    env = ValuesEnv(gym.spaces.Discrete(3), [0, 1, 2], rewards)
    ds = rlds_cli.record(env, None, name="r", episodes=4, seed=0)
    assert ds.num_episodes == 4
    got = [ds.episode(i)["next/reward"] for i in range(4)]
    assert {r.dtype for r in got} == {np.dtype(np.float32)}
    assert [float(r[0, 0]) for r in got] == [0.5, 0.25, 0.5, 0.25]


def test_a_nan_reward_does_not_break_inspect(isolated_cache: Path) -> None:
    ep = episode(4)
    ep["next/reward"] = ep["next/reward"].copy()
    ep["next/reward"][0] = np.nan
    with rlds_cli.DatasetWriter("n") as w:
        w.add_episode(ep)
        w.add_episode(episode(3, 1.0))
    for args in (["inspect", "n"], ["inspect", "n", "--check"], ["inspect", "n", "--json"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "unexpected" not in result.output
