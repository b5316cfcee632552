"""Recording parity with Minari's ``DataCollector``: the same environment, reset seeds and
actions recorded by minari (then converted by rlds) and by :class:`RecordEpisodes`; every episode
compared key by key, values exact. Text leaves, which the Minari reader drops, are compared with
minari's own reader through :func:`decode_text`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

minari = pytest.importorskip("minari", reason="minari is not installed (pip install -e '.[test]')")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")

from rlds_cli.cache import open_dataset  # noqa: E402
from rlds_cli.recording.episode import decode_text, serialize_space, space_leaves  # noqa: E402
from rlds_cli.recording.recorder import RecordEpisodes  # noqa: E402
from rlds_cli.sources.convert import convert  # noqa: E402
from tests.minari_fixtures import minari_path  # noqa: E402
from tests.recording_fixtures import MemorySink, action_plan, register  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`eval_env` is set to None:UserWarning")

#: (env id, make kwargs, episodes, info keys)
CASES = {
    "pendulum": ("Pendulum-v1", {"max_episode_steps": 7}, 4, None),
    "cartpole": ("CartPole-v1", {"max_episode_steps": 12}, 5, None),
    "mixed-dict": ("RecMixed-v0", {"kind": "dict", "max_episode_steps": 5}, 6, "all"),
    "mixed-tuple": ("RecMixed-v0", {"kind": "tuple", "max_episode_steps": 6}, 5, "all"),
}


def _drive(env: Any, seeds: list[int], actions: list[Any]) -> None:
    """Reset with each seed and step with the planned actions until the episode ends."""
    it = iter(actions)
    for seed in seeds:
        env.reset(seed=seed)
        while True:
            _, _, term, trunc, _ = env.step(next(it))
            if term or trunc:
                break


def _record_both(root: Path, case: str) -> tuple[str, MemorySink, list[int]]:
    from minari import DataCollector

    register()
    env_id, kwargs, episodes, info_keys = CASES[case]
    seeds = [1000 + 7 * i for i in range(episodes)]
    actions = action_plan(gym.make(env_id, **kwargs).action_space, 200, seed=3)
    dataset_id = f"rlds/{case}/parity-v0"
    with minari_path(root):
        collector = DataCollector(gym.make(env_id, **kwargs), record_infos=info_keys is not None)
        _drive(collector, seeds, actions)
        collector.create_dataset(
            dataset_id=dataset_id,
            algorithm_name="plan",
            author="rlds tests",
            author_email="t@example.invalid",
            code_permalink="tests",
            description="parity",
        )
        collector.close()
    sink = MemorySink()
    ours = RecordEpisodes(gym.make(env_id, **kwargs), sink, info_keys=info_keys)
    _drive(ours, seeds, actions)
    ours.close()
    return dataset_id, sink, seeds


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_episodes_equal_minari_converted(tmp_path: Path, case: str) -> None:
    dataset_id, sink, seeds = _record_both(tmp_path, case)
    convert(tmp_path / dataset_id, f"m-{case}")
    ds = open_dataset(f"m-{case}")
    env = gym.make(CASES[case][0], **CASES[case][1])
    text_keys = {
        leaf.key for leaf in space_leaves(env.observation_space, "observation") if leaf.kind == "Text"
    }
    assert ds.num_episodes == len(sink.episodes) == len(seeds)
    for i, ours in enumerate(sink.episodes):
        theirs = dict(ds.episode(i))
        theirs.pop("episode")
        ours_keys = (
            set(ours) - text_keys - {f"next/{k}" for k in text_keys} - {"reset_seed", "reset_seed_present"}
        )
        assert ours_keys == set(theirs), case
        for key in sorted(theirs):
            assert _same(ours[key], theirs[key]), f"{case} episode {i}: {key}"
    # the seed of every episode, as the converter keeps minari's
    arrays = ds.source_arrays
    assert arrays["minari/episode_seed"].tolist() == sink.seeds == seeds
    # text: minari's own reader against the decoded code points
    if text_keys:
        with minari_path(tmp_path):
            episodes = list(minari.load_dataset(dataset_id).iterate_episodes())
        for ep, ours in zip(episodes, sink.episodes, strict=True):
            for key in text_keys:
                name = key.split("/", 1)[1]
                want = list(ep.observations[name])
                got = decode_text(ours[key]) + decode_text(ours[f"next/{key}"][-1:])
                assert got == want


@pytest.mark.parametrize("case", sorted(CASES))
def test_spaces_serialized_as_minari_does(case: str) -> None:
    import json

    from minari.serialization import serialize_space as minari_serialize

    register()
    env = gym.make(CASES[case][0], **CASES[case][1])
    for space in (env.observation_space, env.action_space):
        assert serialize_space(space) == json.loads(minari_serialize(space))
