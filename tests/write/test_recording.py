"""``RecordEpisodes`` and the episode assembler on real gymnasium environments: seeds given and
drawn (and replayed), episodes cut by the user, info selection, Text encoding, and every error
path of the wrapper and of ``record``'s arguments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import rlds_cli  # noqa: E402
from rlds_cli.errors import RecordingError  # noqa: E402
from rlds_cli.recording.episode import (  # noqa: E402
    EpisodeAssembler,
    decode_text,
    encode_text,
    space_leaves,
)
from rlds_cli.recording.recorder import RecordEpisodes  # noqa: E402
from tests.recording_fixtures import MemorySink, MixedEnv, register  # noqa: E402

spaces = gym.spaces


def _play(env: Any, episodes: int, seed: int | None = None) -> None:
    env.action_space.seed(0)
    for i in range(episodes):
        env.reset(seed=None if seed is None else seed + i)
        while True:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                break


def test_drawn_seeds_are_stored_and_replay_the_episode() -> None:
    sink = MemorySink()
    env = RecordEpisodes(gym.make("Pendulum-v1", max_episode_steps=5), sink)
    _play(env, 3)
    assert len(sink.seeds) == 3 and all(isinstance(s, int) and 0 <= s < 2**64 for s in sink.seeds)
    assert len(set(sink.seeds)) == 3
    # the stored seed gives the same first observation back
    plain = gym.make("Pendulum-v1")
    for seed, ep in zip(sink.seeds, sink.episodes, strict=True):
        obs, _ = plain.reset(seed=seed)
        assert np.array_equal(obs, ep["observation"][0])


def test_autoseed_off() -> None:
    sink = MemorySink()
    env = RecordEpisodes(gym.make("CartPole-v1"), sink, autoseed=False)
    _play(env, 1)
    env.reset(options={"minari_autoseed": False})
    env.step(0)
    env.close()
    assert sink.seeds == [None, None]
    sink2 = MemorySink()
    env2 = RecordEpisodes(gym.make("CartPole-v1"), sink2)
    env2.reset(options={"minari_autoseed": False})
    env2.step(0)
    env2.close()
    assert sink2.seeds == [None]


def test_cut_episodes_are_kept_truncated_and_empty_ones_dropped() -> None:
    sink = MemorySink()
    env = RecordEpisodes(gym.make("Pendulum-v1"), sink)  # 200-step episodes
    env.reset(seed=1)
    for _ in range(3):
        env.step(env.action_space.sample())
    env.reset(seed=2)  # cuts the first episode
    env.reset(seed=3)  # an episode without a step: dropped
    env.step(env.action_space.sample())
    assert env.finish_episode() is True
    assert env.finish_episode() is False
    env.reset(seed=4)
    env.step(env.action_space.sample())
    env.close()  # commits the running one
    lengths = [len(ep["next/reward"]) for ep in sink.episodes]
    assert lengths == [3, 1, 1]
    assert sink.seeds == [1, 3, 4]
    for ep in sink.episodes:
        assert ep["next/truncated"][-1, 0] and not ep["next/terminated"].any()
        assert ep["next/done"].sum() == 1
        assert np.array_equal(ep["observation"][1:], ep["next/observation"][:-1])
    assert env.steps == 5


def test_step_order_errors() -> None:
    env = RecordEpisodes(gym.make("CartPole-v1", max_episode_steps=2), MemorySink())
    with pytest.raises(RecordingError, match="step\\(\\) before reset\\(\\)"):
        env.step(0)
    env.reset(seed=0)
    env.step(0)
    env.step(0)  # truncated by the time limit
    with pytest.raises(RecordingError, match="step\\(\\) after the episode ended; call reset\\(\\) first"):
        env.step(0)


def test_info_selection() -> None:
    register()
    sink = MemorySink()
    env = RecordEpisodes(gym.make("RecMixed-v0", kind="tuple", step_only_info=True), sink, info_keys="all")
    _play(env, 2, seed=5)
    ep = sink.episodes[0]
    t = len(ep["next/reward"])
    # at reset and every step: observation-like; only at steps: one row per step
    assert ep["info/count"].shape == (t,) and ep["next/info/count"].shape == (t,)
    assert ep["next/info/count"].tolist() == list(range(1, t + 1))
    assert ep["info/step_only"].tolist() == [k / 2 for k in range(1, t + 1)]
    assert "next/info/step_only" not in ep
    sink = MemorySink()
    env = RecordEpisodes(gym.make("RecMixed-v0", kind="tuple"), sink, info_keys=["noise"])
    _play(env, 1, seed=5)
    assert {k for k in sink.episodes[0] if "info" in k} == {"info/noise", "next/info/noise"}


def test_nested_and_text_infos() -> None:
    class InfoEnv(MixedEnv):
        def _info(self, at_reset: bool) -> dict[str, Any]:
            return {"deep": {"a": np.int32(self._t), "b b": np.ones(2)}, "label": "x", "count": self._t}

    sink = MemorySink()
    env = RecordEpisodes(InfoEnv("tuple"), sink, info_keys="all")
    _play(env, 1, seed=1)
    keys = {k for k in sink.episodes[0] if k.startswith("info/")}
    assert keys == {"info/deep/a", "info/deep/b_b", "info/count"}  # names cleaned as the reader does
    assert env.assembler.skipped_info == ["label"]
    with pytest.raises(RecordingError, match="info/label: the values are not numbers"):
        bad = RecordEpisodes(InfoEnv("tuple"), MemorySink(), info_keys=["label"])
        _play(bad, 1, seed=1)


def test_info_errors() -> None:
    register()
    env = RecordEpisodes(gym.make("RecMixed-v0", kind="tuple"), MemorySink(), info_keys=["nope"])
    env.reset(seed=0)
    with pytest.raises(RecordingError, match="info 'nope' is not in the info step\\(\\) returned"):
        env.step(env.action_space.sample())
    with pytest.raises(RecordingError, match="info_keys='count': pass a list of names"):
        RecordEpisodes(gym.make("RecMixed-v0"), MemorySink(), info_keys="count")

    class Flaky(MixedEnv):
        def _info(self, at_reset: bool) -> dict[str, Any]:
            return {"count": self._t} if self._t < 2 else {}

    env = RecordEpisodes(Flaky("tuple"), MemorySink(), info_keys="all")
    env.reset(seed=0)
    env.step(env.action_space.sample())
    with pytest.raises(RecordingError, match="info 'count' is missing at step 1 of episode 0"):
        env.step(env.action_space.sample())


def test_unsupported_space_and_values_outside_the_space() -> None:
    graph = spaces.Graph(spaces.Box(0, 1, (2,)), None)
    with pytest.raises(RecordingError, match="observation space: Graph spaces cannot be recorded"):
        EpisodeAssembler(spaces.Dict({"g": graph}), spaces.Discrete(2))
    a = EpisodeAssembler(spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32)}), spaces.Discrete(2))
    a.start({"pos": np.zeros(3, np.float32)}, {}, 0)
    a.step(1, {"pos": np.zeros(2, np.float32)}, 0.0, True, False, {})
    with pytest.raises(
        RecordingError,
        match=r"observation/pos: values do not fit the Box space of shape \(3,\) \(row 1 has shape \(2,\)\)",
    ):
        a.finish()


def test_text_codes_round_trip_and_errors() -> None:
    codes = encode_text(["ab", "", "h\u00e9llo"], 6, "observation/note")
    assert codes.dtype == np.uint32 and codes.shape == (3, 6)
    assert decode_text(codes) == ["ab", "", "h\u00e9llo"]
    with pytest.raises(
        RecordingError, match="observation/note: step 0 holds 7 characters, the Text space allows 6"
    ):
        encode_text(["abcdefg"], 6, "observation/note")
    with pytest.raises(RecordingError, match="step 1 holds a int, the Text space needs a str"):
        encode_text(["a", 3], 6, "observation/note")
    with pytest.raises(RecordingError, match="NUL character"):
        encode_text(["a\x00"], 6, "observation/note")


def test_leaf_keys_follow_the_minari_reader() -> None:
    space = spaces.Dict(
        {"pos x": spaces.Box(0, 1, (1,)), "t": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(2)))}
    )
    leaves = {leaf.key: leaf.minari_path for leaf in space_leaves(space, "observation")}
    assert leaves == {
        "observation/pos_x": "observations/pos x",
        "observation/t/0": "observations/t/_index_0",
        "observation/t/1": "observations/t/_index_1",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of episodes= and steps="),
        ({"episodes": 2, "steps": 5}, "exactly one of episodes= and steps="),
        ({"episodes": 0}, "episodes=0 is not a positive integer"),
        ({"steps": 2.5}, "steps=2.5 is not a positive integer"),
        ({"episodes": 1, "seed": -1}, "seed=-1 is not a non-negative integer"),
        ({"episodes": 1, "policy": "greedy"}, "policy is a str, not a callable"),
        ({"episodes": 1, "episodes_per_commit": 0}, "episodes_per_commit=0 is not a positive integer"),
    ],
)
def test_record_argument_errors(kwargs: dict[str, Any], message: str) -> None:
    policy = kwargs.pop("policy", None)
    with pytest.raises(RecordingError, match=message):
        rlds_cli.record("CartPole-v1", policy, name="x", **kwargs)


def test_record_environment_errors() -> None:
    with pytest.raises(RecordingError, match="gymnasium cannot make 'NoSuchEnv-v0'"):
        rlds_cli.record("NoSuchEnv-v0", None, name="x", episodes=1)
    with pytest.raises(RecordingError, match="env_kwargs= applies only when env is an id"):
        rlds_cli.record(gym.make("CartPole-v1"), None, name="x", episodes=1, env_kwargs={"a": 1})


def test_vector_envs_are_refused() -> None:
    vec = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(RecordingError, match="wraps one gymnasium environment, not a SyncVectorEnv"):
        RecordEpisodes(vec, MemorySink())
    vec.close()


def test_env_spec_that_json_cannot_hold() -> None:
    register()
    env = gym.make("RecMixed-v0", kind=("tuple", object()))
    with pytest.raises(RecordingError, match="the env spec of 'RecMixed-v0' cannot be saved as JSON"):
        rlds_cli.record(env, None, name="x", episodes=1)
    assert not rlds_cli.CacheRoot().exists("x")  # nothing was created


def test_without_gymnasium_the_error_names_the_record_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message itself (what a Python traceback shows; the hint is the CLI's) names the exact
    install line: the README's recording block failed after `make demo` with no command to run."""
    import importlib
    import sys

    from rlds_cli.errors import GYMNASIUM_INSTALL, MissingExtraError

    monkeypatch.setitem(sys.modules, "gymnasium", None)
    monkeypatch.delitem(sys.modules, "rlds_cli.recording.recorder")
    with pytest.raises(MissingExtraError) as caught:
        importlib.import_module("rlds_cli.recording.recorder")
    assert str(caught.value) == (
        "recording from an environment needs gymnasium, which is not installed: "
        "pip install 'rlds-cli[record]' (from a checkout: pip install -e '.[record]')"
    )
    assert caught.value.hint == GYMNASIUM_INSTALL


# ------------------------------------------------------------- environments that surprise (hunt)


class _BufferEnv(gym.Env):  # type: ignore[misc]
    """Refills one observation array in place at every step, and puts it in its info too (as a
    simulator's state array is)."""

    observation_space = gym.spaces.Box(-100, 100, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self) -> None:
        self.buf = np.zeros(2, np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.buf[:] = 0
        info = {"goal": 3.0} if (options or {}).get("report") else {}  # at reset only when asked
        return self.buf, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[Any, Any]]:
        self.t += 1
        self.buf[:] = (self.t, self.t * 10)
        info = {"state": self.buf, "goal": 3.0 - self.t, 7: self.t, "ragged": [[1, 2], [3]]}
        return self.buf, 1.0, self.t == 4, False, info


def test_buffers_refilled_in_place_are_recorded_as_they_were_at_each_step(isolated_cache: Any) -> None:
    """Every stored row was the last value of the env's (and the policy's) one buffer."""
    act = np.zeros(1, np.float32)

    def policy(obs: np.ndarray) -> np.ndarray:
        act[:] = obs[0] / 10
        return act

    ds = rlds_cli.record(_BufferEnv(), policy, name="inplace", episodes=1, seed=0, info_keys=["state", 7])
    ep = ds.episode(0)
    steps = np.array([[t, 10 * t] for t in range(5)], np.float32)
    assert np.array_equal(ep["observation"], steps[:4]) and np.array_equal(ep["next/observation"], steps[1:])
    assert np.allclose(ep["action"].ravel(), [0.0, 0.1, 0.2, 0.3])
    assert np.array_equal(ep["info/state"], steps[1:])
    assert ep["info/7"].tolist() == [1, 2, 3, 4]  # an int key, found as it is


def test_info_all_skips_ragged_values_and_keeps_int_keys(isolated_cache: Any) -> None:
    ds = rlds_cli.record(_BufferEnv(), None, name="all", episodes=1, seed=0, info_keys="all")
    assert {"info/state", "info/goal", "info/7"} <= set(ds.fields) and "info/ragged" not in ds.fields


def test_where_an_info_key_is_stored_is_fixed_by_the_first_episode(isolated_cache: Any) -> None:
    """The second episode's reset info held 'goal' where the first's did not: it was stored like
    an observation for that episode alone, and the schema clash lost the episode."""
    with rlds_cli.DatasetWriter("resets") as writer:
        env = RecordEpisodes(_BufferEnv(), writer, info_keys=["goal"])
        for seed, options in enumerate([None, {"report": True}]):
            env.reset(seed=seed, options=options)
            while not env.step(np.zeros(1, np.float32))[2]:
                pass
    ds = rlds_cli.open_dataset("resets")
    assert ds.num_episodes == 2 and "next/info/goal" not in ds.fields
    assert ds.episode(1)["info/goal"].tolist() == [2.0, 1.0, 0.0, -1.0]
    with rlds_cli.DatasetWriter("resets-2") as writer:
        env = RecordEpisodes(_BufferEnv(), writer, info_keys=["goal"])
        env.reset(seed=0, options={"report": True})
        while not env.step(np.zeros(1, np.float32))[2]:
            pass
        with pytest.raises(RecordingError, match="info 'goal' is missing from the reset info of episode 1"):
            env.reset(seed=1)


def test_an_environment_in_a_wrapper_gymnasium_cannot_remake_is_named(isolated_cache: Any) -> None:
    from rlds_cli.errors import EnvironmentUnavailableError

    class Halve(gym.RewardWrapper):  # type: ignore[misc]
        def reward(self, reward: float) -> float:
            return reward / 2

    ds = rlds_cli.record(Halve(gym.make("CartPole-v1")), None, name="wrapped", episodes=1, seed=0)
    with pytest.raises(EnvironmentUnavailableError, match="recorded inside the wrapper 'Halve'"):
        ds.recover_environment()


def test_appending_episodes_of_another_environment_is_refused(isolated_cache: Any) -> None:
    """The dataset kept claiming the first environment (g=10, 20 steps) for episodes of g=2."""
    from rlds_cli.errors import SchemaMismatchError

    def pendulum(**kwargs: Any) -> Any:
        return gym.make("Pendulum-v1", max_episode_steps=5, **kwargs)

    rlds_cli.record(pendulum(g=10.0), None, name="pend", episodes=1, seed=0)
    with pytest.raises(
        SchemaMismatchError, match=r"records environment 'Pendulum-v1' with kwargs \{'g': 10.0\}"
    ):
        rlds_cli.record(pendulum(g=2.0), None, name="pend", episodes=1, seed=1, mode="append")
    rlds_cli.record(
        pendulum(g=10.0, render_mode="rgb_array"), None, name="pend", episodes=1, seed=1, mode="append"
    )
    assert rlds_cli.open_dataset("pend").num_episodes == 2


def test_add_step_appends_to_a_recording_in_its_reward_dtype(isolated_cache: Any) -> None:
    """A number reward was always float32: add_step episodes could not join a record()'s float64."""
    env = gym.make("Pendulum-v1", max_episode_steps=3)
    rlds_cli.record(env, None, name="pend", episodes=1, seed=0)
    with rlds_cli.DatasetWriter("pend", mode="append") as writer:
        obs, _ = env.reset(seed=1)
        for t in range(3):
            nxt, reward, _, _, _ = env.step(np.zeros(1, np.float32))
            writer.add_step(observation=obs, action=np.zeros(1, np.float32), reward=reward, terminated=False,
                            truncated=t == 2, next_observation=nxt, reset_seed=np.uint64(1),
                            reset_seed_present=np.bool_(True))  # fmt: skip
            obs = nxt
    ds = rlds_cli.open_dataset("pend")
    assert ds.num_episodes == 2 and ds.manifest.fields["next/reward"].dtype == "float64"
