"""What a recording could not keep as the environment gave it is refused before anything is
written (issue 37, "nothing lost, nothing laundered"): a Dict space with a key ``'a/b'`` beside a
Dict ``'a'`` holding ``'b'`` stored its three leaves as two arrays without a word (both flatten to
one path), and info values did the same; a vector reward and a two-element ``terminated`` were
numpy's own errors ("cannot reshape", "truth value ... is ambiguous"), and ``terminated=2`` was
kept as True. The writer's nested-dict input names both places a key was given."""

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
from rlds_cli.errors import EpisodeFormatError, RecordingError
from tests.write.test_writer import episode

BOX = gym.spaces.Box(0.0, 1.0, (2,), np.float32)


class StepsEnv(gym.Env):  # type: ignore[type-arg]
    """Two-step episodes with the given spaces; ``step_out(episode, t)`` returns what the step
    gives besides the observation: ``(reward, terminated, truncated, info)``."""

    def __init__(self, observation_space: Any, observation: Any, step_out: Any) -> None:
        self.observation_space = observation_space
        self.action_space = gym.spaces.Discrete(2)
        self.observation, self.step_out = observation, step_out
        self.episode, self.t = -1, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self.observation, {}

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self.t += 1
        return (self.observation, *self.step_out(self.episode, self.t))


def _plain(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    return 1.0, t == 2, False, {}


def _box_env(step_out: Any = _plain) -> StepsEnv:
    return StepsEnv(BOX, np.zeros(2, np.float32), step_out)


def test_dict_keys_that_flatten_to_one_path_are_refused_naming_both(isolated_cache: Path) -> None:
    space = gym.spaces.Dict({"a/b": BOX, "a": gym.spaces.Dict({"b": BOX}), "c": BOX})
    value = {"a/b": np.zeros(2, np.float32), "a": {"b": np.ones(2, np.float32)}, "c": np.zeros(2, np.float32)}
    with pytest.raises(RecordingError) as caught:
        rlds_cli.record(StepsEnv(space, value, _plain), None, name="d", episodes=1, seed=0)
    message = str(caught.value)
    assert "observation['a/b']" in message and "observation['a']['b']" in message, message
    assert "'observations/a/b'" in message, message
    assert not CacheRoot().exists("d")


def test_info_values_that_flatten_to_one_key_are_refused_naming_both(isolated_cache: Path) -> None:
    def step_out(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
        return 1.0, t == 2, False, {"a/b": 1.0, "a": {"b": 2.0}}

    with pytest.raises(RecordingError) as caught:
        rlds_cli.record(_box_env(step_out), None, name="i", episodes=1, seed=0, info_keys="all")
    message = str(caught.value)
    assert "info['a/b']" in message and "info['a']['b']" in message, message
    assert not CacheRoot().exists("i")


def test_dict_keys_with_distinct_paths_are_all_kept(isolated_cache: Path) -> None:
    """A key holding '/' alone (or beside a clean twin) has a path of its own: recorded, renamed."""
    space = gym.spaces.Dict({"a/b": BOX, "a_b": BOX})
    value = {"a/b": np.zeros(2, np.float32), "a_b": np.ones(2, np.float32)}
    ds = rlds_cli.record(StepsEnv(space, value, _plain), None, name="k", episodes=1, seed=0)
    ep = ds.episode(0)
    assert ep["observation/a_b"].tolist() == [[1.0, 1.0]] * 2
    assert ep["observation/a_b_2"].tolist() == [[0.0, 0.0]] * 2


def test_writer_input_that_flattens_to_one_key_names_both_places(isolated_cache: Path) -> None:
    ep: dict[str, Any] = episode(4)
    obs, final = ep.pop("observation"), ep.pop("next/observation")
    ep["observation"] = {"a/b": obs, "a": {"b": obs}}
    ep["next"] = {"observation": {"a/b": final, "a": {"b": final}}}
    with pytest.raises(EpisodeFormatError) as caught, rlds_cli.DatasetWriter("w") as w:
        w.add_episode(ep)
    message = str(caught.value)
    assert "'observation/a/b' is given twice" in message, message
    assert "episode['observation']['a/b']" in message, message
    assert "episode['observation']['a']['b']" in message, message
    assert not CacheRoot().exists("w")


def _vector_reward(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    return np.ones(3), t == 2, False, {}


def _two_terminated(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    return 1.0, np.array([t == 2, False]), False, {}


def _two_truncated(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    return 1.0, t == 2, np.array([False, False]), {}


def _terminated_two(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    return 1.0, 2 if t == 2 else 0, False, {}


def _text_reward(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    return "1.0", t == 2, False, {}


BAD_STEPS = {
    "a vector reward": (_vector_reward, r"next/reward: step 0 .*shape \(3,\).*one number \(a scalar\)"),
    "a text reward": (_text_reward, r"next/reward: step 0 .*'1\.0'.*one number"),
    "a two-element terminated": (_two_terminated, r"next/terminated: step 0 .*shape \(2,\).*one bool"),
    "a two-element truncated": (_two_truncated, r"next/truncated: step 0 .*shape \(2,\).*one bool"),
    "terminated=2": (_terminated_two, r"next/terminated: step 1 of episode 0 returned 2 as terminated"),
}


@pytest.mark.parametrize("case", list(BAD_STEPS))
def test_a_step_value_of_the_wrong_shape_is_one_error_and_nothing_is_written(
    isolated_cache: Path, case: str
) -> None:
    step_out, match = BAD_STEPS[case]
    with pytest.raises(RecordingError, match=match):
        rlds_cli.record(_box_env(step_out), None, name="s", episodes=1, seed=0)
    assert not CacheRoot().exists("s")


def test_a_bad_step_later_keeps_the_episodes_before_it_whole(isolated_cache: Path) -> None:
    def step_out(episode: int, t: int) -> tuple[Any, Any, Any, dict[str, Any]]:
        return (np.ones(3) if episode == 1 else 1.0), t == 2, False, {}

    with pytest.raises(RecordingError, match="next/reward: step 0 of episode 1"):
        rlds_cli.record(_box_env(step_out), None, name="p", episodes=3, seed=0)
    assert rlds_cli.open_dataset("p").num_episodes == 1
    result = CliRunner().invoke(app, ["inspect", "p", "--check"])
    assert result.exit_code == 0, result.output


def test_the_wrapper_refuses_before_adding_the_step(isolated_cache: Path) -> None:
    class Sink:
        def __init__(self) -> None:
            self.episodes: list[dict[str, np.ndarray]] = []

        def add_episode(self, ep: dict[str, np.ndarray]) -> None:
            self.episodes.append(ep)

    rewards, sink = iter([1.0, np.ones(3), 0.5]), Sink()
    env = rlds_cli.RecordEpisodes(_box_env(lambda e, t: (next(rewards), t == 2, False, {})), sink)
    env.reset(seed=0)
    env.step(0)
    with pytest.raises(RecordingError, match="next/reward: step 1"):
        env.step(0)
    assert env.assembler.length == 1  # the refused step left nothing behind
    env.close()
    (kept,) = sink.episodes
    assert kept["next/reward"].tolist() == [[1.0]] and kept["next/truncated"].tolist() == [[True]]


def test_one_value_a_step_in_any_form_is_kept(isolated_cache: Path) -> None:
    """Numpy scalars, 0-d and one-element arrays, and 0/1 flags are one value each: kept as before."""
    outs = {
        1: (np.array([0.5], np.float32), np.array(False), np.int64(0), {}),
        2: (np.float32(0.25), np.array([1]), np.bool_(False), {}),
    }
    ds = rlds_cli.record(_box_env(lambda e, t: outs[t]), None, name="f", episodes=1, seed=0)
    ep = ds.episode(0)
    assert ep["next/reward"].dtype == np.float32
    assert ep["next/reward"].tolist() == [[0.5], [0.25]]
    assert ep["next/terminated"].tolist() == [[False], [True]]
    assert ep["next/truncated"].tolist() == [[False], [False]]
