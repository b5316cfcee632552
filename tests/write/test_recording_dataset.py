"""Recording into a real dataset: ``rlds_cli.record`` in three lines, the recorded dataset equal
to the same episodes recorded by Minari's ``DataCollector`` and converted, its env spec and
recovered environment, export to Minari read back by minari's own reader (spaces, Text, env
spec, ``recover_environment``), appends, and a TorchRL collector's rollouts written whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari", reason="minari is not installed (pip install -e '.[test]')")
pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")

import rlds_cli  # noqa: E402
from rlds_cli.cache import open_dataset  # noqa: E402
from rlds_cli.export.minari import export_minari  # noqa: E402
from rlds_cli.recording.episode import decode_text, episode_seeds  # noqa: E402
from rlds_cli.recording.recorder import RecordEpisodes  # noqa: E402
from rlds_cli.sources.convert import convert  # noqa: E402
from tests.minari_fixtures import minari_path  # noqa: E402
from tests.recording_fixtures import action_plan, register  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`eval_env` is set to None:UserWarning")


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def test_record_in_three_lines() -> None:
    ds = rlds_cli.record("CartPole-v1", None, name="cartpole-random", episodes=10, seed=0)
    assert ds.num_episodes == 10
    assert ds.fields["observation"] == ((4,), "float32")
    assert ds.fields["action"] == ((), "int64")
    assert ds.env_spec.id == "CartPole-v1"
    env = ds.recover_environment()
    assert env.spec.id == "CartPole-v1"
    # seed + i per episode: the first observation of episode 3 is CartPole's reset with seed 3
    obs, _ = env.reset(seed=3)
    assert np.array_equal(ds.episode(3)["observation"][0], obs)
    assert episode_seeds(ds) == list(range(10))
    again = rlds_cli.record("CartPole-v1", None, name="cartpole-again", episodes=10, seed=0)
    for i in range(10):
        a, b = ds.episode(i), again.episode(i)
        assert all(_same(a[k], b[k]) for k in a)


def test_record_on_zarr_equals_memmap() -> None:
    register()
    kwargs = {"kind": "dict", "max_episode_steps": 6}
    a = rlds_cli.record("RecMixed-v0", None, name="z", episodes=3, seed=2, storage="zarr", env_kwargs=kwargs)
    b = rlds_cli.record("RecMixed-v0", None, name="m", episodes=3, seed=2, env_kwargs=kwargs)
    assert a.manifest.backend == "zarr" and b.manifest.backend == "memmap"
    for i in range(3):
        x, y = a.episode(i), b.episode(i)
        assert set(x) == set(y) and all(_same(x[k], y[k]) for k in x)


def test_record_steps_budget_and_append() -> None:
    ds = rlds_cli.record("Pendulum-v1", None, name="pend", steps=250, seed=1)
    assert ds.num_steps == 250 and ds.num_episodes == 2  # 200 + 50, the second cut: truncated
    last = ds.episode(1)
    assert bool(last["next/truncated"][-1, 0]) and len(last["next/reward"]) == 50
    ds = rlds_cli.record("Pendulum-v1", None, name="pend", episodes=1, seed=9, mode="append")
    assert ds.num_episodes == 3 and ds.num_steps == 450
    assert episode_seeds(ds) == [1, 2, 9]
    # several episodes a commit: the same data, fewer segments
    batched = rlds_cli.record("CartPole-v1", None, name="batched", episodes=7, seed=0, episodes_per_commit=3)
    single = rlds_cli.record("CartPole-v1", None, name="single", episodes=7, seed=0)
    assert batched.num_episodes == single.num_episodes == 7
    for i in range(7):
        a, b = batched.episode(i), single.episode(i)
        assert all(_same(a[k], b[k]) for k in a)


def _record_both(root: Path, kind: str, episodes: int) -> tuple[str, str]:
    """The same episodes recorded by Minari (then converted) and by rlds into a dataset."""
    from minari import DataCollector

    register()
    kwargs = {"kind": kind, "max_episode_steps": 5}
    seeds = [40 + i for i in range(episodes)]
    actions = action_plan(gym.make("RecMixed-v0", **kwargs).action_space, 100, seed=1)

    def drive(env: Any) -> None:
        it = iter(actions)
        for seed in seeds:
            env.reset(seed=seed)
            while True:
                _, _, term, trunc, _ = env.step(next(it))
                if term or trunc:
                    break

    dataset_id = f"rlds/mixed-{kind}/rec-v0"
    with minari_path(root):
        collector = DataCollector(gym.make("RecMixed-v0", **kwargs), record_infos=True)
        drive(collector)
        collector.create_dataset(dataset_id=dataset_id, algorithm_name="plan", description="parity")
        collector.close()
    convert(root / dataset_id, f"conv-{kind}")
    with rlds_cli.DatasetWriter(
        f"rec-{kind}", env_spec=gym.make("RecMixed-v0", **kwargs).spec.to_json()
    ) as w:
        env = RecordEpisodes(gym.make("RecMixed-v0", **kwargs), w, info_keys="all")
        drive(env)
        env.close()
    return f"conv-{kind}", f"rec-{kind}"


@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_recorded_dataset_equals_minari_converted(tmp_path: Path, kind: str) -> None:
    converted, recorded = _record_both(tmp_path, kind, 5)
    a, b = open_dataset(converted), open_dataset(recorded)
    assert a.num_episodes == b.num_episodes == 5 and a.num_steps == b.num_steps
    text = {"observation/note", "next/observation/note"} if kind == "dict" else set()
    for i in range(a.num_episodes):
        theirs, ours = a.episode(i), b.episode(i)
        assert set(ours) - text - {"reset_seed", "reset_seed_present"} == set(theirs)
        for key in theirs:
            assert _same(ours[key], theirs[key]), f"episode {i}: {key}"
    # the seeds: per step in the recording, per episode in the conversion
    assert episode_seeds(b) == a.source_arrays["minari/episode_seed"].tolist() == [40 + i for i in range(5)]


def test_export_round_trip_read_by_minari(tmp_path: Path) -> None:
    register()
    ds = rlds_cli.record(
        "RecMixed-v0", None, name="mixed", episodes=4, seed=7, info_keys="all", env_kwargs={"kind": "dict"}
    )
    out = tmp_path / "minari" / "mixed-v0"
    export_minari(ds, out)
    with minari_path(out.parent):
        mds = minari.load_dataset("mixed-v0")
        episodes = list(mds.iterate_episodes())
        env = gym.make("RecMixed-v0", kind="dict")
        assert mds.observation_space == env.observation_space
        assert mds.action_space == env.action_space
        seeds = [m.get("seed") for m in mds.storage.get_episode_metadata(range(mds.total_episodes))]
        assert seeds == episode_seeds(ds) == [7, 8, 9, 10]
        recovered = mds.recover_environment()
        assert recovered.spec.id == "RecMixed-v0" and recovered.spec.kwargs["kind"] == "dict"
    assert len(episodes) == ds.num_episodes
    for i, ep in enumerate(episodes):
        ours = ds.episode(i)
        obs = ep.observations
        assert np.array_equal(
            obs["pos"], np.concatenate([ours["observation/pos"], ours["next/observation/pos"][-1:]])
        )
        assert np.array_equal(obs["goal"]["xy"][:-1], ours["observation/goal/xy"])
        notes = decode_text(ours["observation/note"]) + decode_text(ours["next/observation/note"][-1:])
        assert list(obs["note"]) == notes
        assert np.array_equal(ep.actions["move"], ours["action/move"])
        assert np.array_equal(ep.rewards, ours["next/reward"][:, 0])
        assert np.array_equal(ep.terminations, ours["next/terminated"][:, 0])
        assert np.array_equal(ep.truncations, ours["next/truncated"][:, 0])
        assert np.array_equal(ep.infos["count"][:-1], ours["info/count"])


def test_torchrl_rollouts_written_whole() -> None:
    pytest.importorskip("torchrl")
    import torch
    from torchrl.envs import GymEnv

    from rlds_cli.recording.torchrl import RolloutEpisodes

    try:
        from torchrl.collectors import Collector
    except ImportError:
        from torchrl.collectors import SyncDataCollector as Collector
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    torch.manual_seed(0)  # the collector's random policy draws from torch's generator
    collector = Collector(env, None, frames_per_batch=32, total_frames=320)
    episodes = RolloutEpisodes()
    written: list[dict[str, np.ndarray]] = []
    with rlds_cli.DatasetWriter("torchrl-cartpole") as writer:
        for rollout in collector:
            for ep in episodes.add(rollout):
                writer.add_episode(ep)
                written.append(ep)
        for ep in episodes.flush():
            writer.add_episode(ep)
            written.append(ep)
    collector.shutdown()
    ds = open_dataset("torchrl-cartpole")
    assert ds.num_steps == 320 and ds.num_episodes == len(written)
    for i, ep in enumerate(written):
        got = ds.episode(i)
        for key in (
            "observation",
            "next/observation",
            "action",
            "next/reward",
            "next/terminated",
            "next/truncated",
        ):
            assert _same(got[key], ep[key]), key


def test_writer_extend_takes_a_collector_rollout_in_one_call() -> None:
    """``DatasetWriter.extend(rollout)`` on a real collector's ``[T]`` batches gives the same
    dataset as :class:`RolloutEpisodes` (episodes spanning batches joined, bookkeeping dropped)."""
    pytest.importorskip("torchrl")
    import torch
    from torchrl.envs import GymEnv

    from rlds_cli.recording.torchrl import RolloutEpisodes

    try:
        from torchrl.collectors import Collector
    except ImportError:
        from torchrl.collectors import SyncDataCollector as Collector
    env = GymEnv("CartPole-v1")
    env.set_seed(1)
    torch.manual_seed(1)
    batches = list(Collector(env, None, frames_per_batch=24, total_frames=240))
    with rlds_cli.DatasetWriter("by-extend") as writer:
        completed = sum(writer.extend(batch) for batch in batches)
    episodes = RolloutEpisodes()
    with rlds_cli.DatasetWriter("by-splitter") as writer:
        for batch in batches:
            for ep in episodes.add(batch):
                writer.add_episode(ep)
    a, b = open_dataset("by-extend"), open_dataset("by-splitter")
    assert a.num_episodes == b.num_episodes == completed > 3
    # the last, unfinished episode waits in both
    waiting = sum(len(ep["next/reward"]) for ep in episodes.flush())
    assert a.num_steps == b.num_steps == 240 - waiting
    for i in range(a.num_episodes):
        x, y = a.episode(i), b.episode(i)
        assert set(x) == set(y)
        assert all(_same(x[k], y[k]) for k in x)


def test_recording_writer_keeps_spec_and_spaces(tmp_path: Path) -> None:
    """RecordEpisodes into ``recording_writer``: the same manifest facts as ``record`` (env spec,
    spaces), so the environment is recovered and the export keeps a Discrete action space."""
    from rlds_cli.recording.recorder import recording_writer

    env = gym.make("CartPole-v1", max_episode_steps=30)
    with recording_writer(env, "own-loop") as writer:
        rec = RecordEpisodes(env, writer)
        rec.reset(seed=0)
        for _ in range(70):
            _, _, term, trunc, _ = rec.step(rec.action_space.sample())
            if term or trunc:
                rec.reset()
        rec.close()
    ds = open_dataset("own-loop")
    assert ds.num_steps == 70
    assert ds.recover_environment().spec.max_episode_steps == 30
    spaces = ds.manifest.source["metadata"]["spaces"]
    assert spaces["action_space"] == {"type": "Discrete", "dtype": "int64", "start": 0, "n": 2}
    export_minari(ds, tmp_path / "own-loop-v0")
    with minari_path(tmp_path):
        mds = minari.load_dataset("own-loop-v0")
        assert mds.action_space == env.action_space and mds.observation_space == env.observation_space
        assert mds.total_steps == 70


def test_env_spec_of_a_plain_writer() -> None:
    """``DatasetWriter(env_spec=...)`` without recording metadata: ``Dataset.env_spec`` finds the
    spec the writer keeps, and says where it came from."""
    env = gym.make("CartPole-v1", max_episode_steps=20)
    with rlds_cli.DatasetWriter("plain", env_spec=env.spec) as writer:
        obs, _ = env.reset(seed=0)
        done = False
        while not done:
            action = env.action_space.sample()
            nxt, reward, term, trunc, _ = env.step(action)
            writer.add_step(observation=obs, action=np.int64(action), reward=np.float32(reward),
                            terminated=term, truncated=trunc, next_observation=nxt)  # fmt: skip
            obs, done = nxt, term or trunc
    for name in ("plain", "cartpole-rec"):
        if name == "cartpole-rec":
            rlds_cli.record("CartPole-v1", None, name=name, episodes=1, seed=0)
        spec = open_dataset(name).env_spec
        assert spec is not None and spec.id == "CartPole-v1"
        assert spec.origin == "the writer's env_spec (manifest source.metadata.spaces)"
    assert open_dataset("plain").recover_environment().spec.max_episode_steps == 20


def test_a_failing_policy_keeps_the_whole_episodes_before_it() -> None:
    """The policy raises in the middle of episode 3: its error comes out as it is, the three
    episodes committed before stay, whole and exact, and the cut episode is not written."""

    def make_policy(fail_at: int | None) -> Any:
        rng = np.random.default_rng(0)
        steps = {"n": 0}

        def policy(obs: Any) -> int:
            steps["n"] += 1
            if fail_at is not None and steps["n"] > fail_at:
                raise RuntimeError("policy crashed")
            return int(rng.integers(2))

        return policy

    full = rlds_cli.record("CartPole-v1", make_policy(None), name="full", episodes=5, seed=0)
    lengths = np.asarray(full.episodes["length"])
    fail_at = int(lengths[:3].sum()) + 2
    with pytest.raises(RuntimeError, match="policy crashed"):
        rlds_cli.record("CartPole-v1", make_policy(fail_at), name="crashy", episodes=5, seed=0)
    ds = open_dataset("crashy")
    assert ds.num_episodes == 3 and ds.num_steps == int(lengths[:3].sum())
    for i in range(3):
        a, b = ds.episode(i), full.episode(i)
        assert all(_same(a[k], b[k]) for k in a)
