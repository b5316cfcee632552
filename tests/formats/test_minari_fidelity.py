"""Minari round trip: datasets written by minari's own ``DataCollector`` around small gymnasium
environments, converted by rlds, compared step by step with ``MinariDataset.iterate_episodes``.

Covers Box, Dict (nested) and Tuple observations, Discrete actions, infos (recorded at reset and
every step), JPEG-encoded image frames, and episodes ending by termination and by truncation.
Zero differences are allowed. Skipped, with the reason, where minari[create] is not installed
(``pip install -e '.[test]'`` installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

minari = pytest.importorskip("minari", reason="minari is not installed (pip install -e '.[test]')")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")
pytest.importorskip("PIL", reason="minari's JPEG frames need pillow")

from gymnasium import spaces  # noqa: E402

from rlds_cli.cache import open_dataset  # noqa: E402
from rlds_cli.sources.convert import convert  # noqa: E402
from tests.minari_fixtures import minari_path, record_random  # noqa: E402

# minari warns that no evaluation environment was given; the tests do not need one
pytestmark = pytest.mark.filterwarnings("ignore:`eval_env` is set to None:UserWarning")


class ToyEnv(gym.Env):
    """A tiny deterministic-by-seed environment with a configurable observation space.

    Terminates when its counter crosses a threshold drawn at reset, so with a short time limit
    some episodes terminate and others are truncated.
    """

    def __init__(self, kind: str = "dict") -> None:
        self.kind = kind
        vec = spaces.Box(-10, 10, (3,), np.float32)
        if kind == "dict":
            self.observation_space = spaces.Dict(
                {
                    "pos": vec,
                    "goal": spaces.Dict({"xy": spaces.Box(-1, 1, (2,), np.float64)}),
                    "mode": spaces.Discrete(4),
                }
            )
            self.action_space = spaces.Box(-1, 1, (2,), np.float32)
        elif kind == "tuple":
            self.observation_space = spaces.Tuple((vec, spaces.Discrete(3)))
            self.action_space = spaces.Discrete(3)
        elif kind == "image":
            self.observation_space = spaces.Box(0, 255, (32, 32, 3), np.uint8)
            self.action_space = spaces.Discrete(2)
        self._t = 0
        self._limit = 0

    def _obs(self) -> Any:
        r = self.np_random
        if self.kind == "dict":
            return {
                "pos": r.normal(size=3).astype(np.float32),
                "goal": {"xy": r.uniform(-1, 1, 2)},
                "mode": int(r.integers(4)),
            }
        if self.kind == "tuple":
            return (r.normal(size=3).astype(np.float32), int(r.integers(3)))
        return r.integers(0, 256, (32, 32, 3), dtype=np.uint8)

    def _info(self) -> dict[str, Any]:
        return {"count": np.int64(self._t), "noise": self.np_random.normal(size=2)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._limit = int(self.np_random.integers(2, 9))
        return self._obs(), self._info()

    def step(self, action: Any) -> Any:
        self._t += 1
        reward = float(self.np_random.normal())
        return self._obs(), reward, self._t >= self._limit, False, self._info()


def _collect(root: Path, dataset_id: str, env: Any, episodes: int, seed: int, infos: bool) -> None:
    record_random(
        env, dataset_id, episodes, seed=seed, record_infos=infos,
        code_permalink="tests/formats/test_minari_fidelity.py", description="rlds fidelity test",
    )  # fmt: skip


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four datasets, made once per module with minari's DataCollector."""
    root = tmp_path_factory.mktemp("minari")
    with minari_path(root):
        gym.register("RldsToy-v0", entry_point=f"{__name__}:ToyEnv", disable_env_checker=True)
        # Box observations, Box actions, truncation only (Pendulum never terminates)
        _collect(root, "rlds/pendulum/random-v0", gym.make("Pendulum-v1", max_episode_steps=7), 4, 0, True)
        # Box observations, Discrete actions, mostly terminations
        _collect(root, "rlds/cartpole/random-v0", gym.make("CartPole-v1", max_episode_steps=12), 6, 1, False)
        for kind, limit in (("dict", 5), ("tuple", 5), ("image", 4)):
            env = gym.make("RldsToy-v0", kind=kind, max_episode_steps=limit)
            _collect(root, f"rlds/toy-{kind}/random-v0", env, 6, 10, True)
    return root


def _flatten(value: Any, prefix: str, out: dict[str, np.ndarray]) -> None:
    """Minari's nested episode values -> rlds's flat TED keys."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}/{k}", out)
    elif isinstance(value, tuple | list) and not isinstance(value, np.ndarray):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}/{i}", out)
    else:
        out[prefix] = np.asarray(value)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _differences(root: Path, dataset_id: str, name: str) -> tuple[list[str], int, int]:
    """Every mismatch between minari's reader and the converted dataset."""
    with minari_path(root):
        mds = minari.load_dataset(dataset_id)
        episodes = list(mds.iterate_episodes())
    ds = open_dataset(name)
    diffs: list[str] = []
    if ds.num_episodes != len(episodes):
        diffs.append(f"episodes: {ds.num_episodes} vs {len(episodes)}")
    steps = 0
    for i, ep in enumerate(episodes):
        got = ds.episode(i)
        steps += len(ep)
        want: dict[str, np.ndarray] = {}
        obs: dict[str, np.ndarray] = {}
        _flatten(ep.observations, "observation", obs)
        for k, v in obs.items():
            want[k], want[f"next/{k}"] = v[:-1], v[1:]
        want["action"] = np.asarray(ep.actions)
        want["next/reward"] = np.asarray(ep.rewards)[:, None]
        want["next/terminated"] = np.asarray(ep.terminations)[:, None]
        want["next/truncated"] = np.asarray(ep.truncations)[:, None]
        want["next/done"] = want["next/terminated"] | want["next/truncated"]
        infos: dict[str, np.ndarray] = {}
        _flatten(ep.infos or {}, "info", infos)
        for k, v in infos.items():
            if len(v) == len(ep) + 1:
                want[k], want[f"next/{k}"] = v[:-1], v[1:]
            else:
                want[k] = v
        if int(ds.episodes["source_id"][i]) != ep.id:
            diffs.append(f"episode {i}: source id {ds.episodes['source_id'][i]} vs {ep.id}")
        extra = set(got) - set(want) - {"episode"}
        if extra:
            diffs.append(f"episode {i}: keys only in rlds: {sorted(extra)}")
        for k, v in want.items():
            if k not in got:
                diffs.append(f"episode {i}: {k} missing")
            elif not _same(got[k], v):
                diffs.append(
                    f"episode {i}: {k} differs ({got[k].shape} {got[k].dtype} vs {v.shape} {v.dtype})"
                )
    return diffs, steps, ds.num_steps


CASES = ["pendulum", "cartpole", "toy-dict", "toy-tuple", "toy-image"]


@pytest.mark.parametrize("env", CASES)
def test_zero_differences_against_minari_reader(minari_root: Path, env: str) -> None:
    dataset_id = f"rlds/{env}/random-v0"
    result = convert(minari_root / dataset_id, f"m-{env}")
    diffs, steps, converted = _differences(minari_root, dataset_id, f"m-{env}")
    assert diffs == []
    assert converted == steps
    assert result.manifest.source["checks"]["expected"] == {
        "num_episodes": result.manifest.num_episodes,
        "num_steps": steps,
    }


def test_both_endings_are_covered(minari_root: Path) -> None:
    """The fixtures hold terminated and truncated episodes (else the round trip proves less)."""
    ends = {"terminated": 0, "truncated": 0}
    for env in CASES:
        convert(minari_root / f"rlds/{env}/random-v0", f"e-{env}")
        ds = open_dataset(f"e-{env}")
        last = ds.episodes["start"] + ds.episodes["length"] - 1
        batch = ds.gather(last, ["next/terminated", "next/truncated"])
        ends["terminated"] += int(batch["next/terminated"].sum())
        ends["truncated"] += int(batch["next/truncated"].sum())
    assert ends["terminated"] > 0 and ends["truncated"] > 0


def test_metadata_kept(minari_root: Path) -> None:
    m = convert(minari_root / "rlds/toy-dict/random-v0", "meta").manifest
    meta = m.source["metadata"]["minari"]
    assert meta["dataset_id"] == "rlds/toy-dict/random-v0"
    assert meta["author"] == ["rlds tests"]
    # the spaces and env specs live beside it, under a name of their own
    assert "observation_space" not in meta and "env_spec" not in meta
    spaces = m.source["metadata"]["spaces"]
    assert spaces["serializer"] == "minari"
    assert spaces["observation_space"]["type"] == "Dict"
    assert spaces["env_spec"]["id"] == "RldsToy-v0"
    assert spaces["paths"]["observation/goal/xy"] == "observations/goal/xy"
    assert spaces["paths"]["action"] == "actions"
    arrays = open_dataset("meta").source_arrays
    assert arrays["minari/episode_seed"].dtype == np.uint64
    assert arrays["minari/episode_seed"].tolist() == list(range(10, 16))
    assert arrays["minari/episode_seed_present"].all()
    assert [f["path"] for f in m.source["files"]] == ["metadata.json", "main_data.hdf5"]


def test_keys_and_dtypes(minari_root: Path) -> None:
    convert(minari_root / "rlds/toy-dict/random-v0", "keys")
    fields = open_dataset("keys").fields
    assert fields["observation/pos"] == ((3,), "float32")
    assert fields["observation/goal/xy"] == ((2,), "float64")
    assert fields["observation/mode"] == ((), "int64")
    assert fields["next/info/noise"] == ((2,), "float64")
    convert(minari_root / "rlds/toy-image/random-v0", "img")
    fields = open_dataset("img").fields
    assert fields["observation"] == ((32, 32, 3), "uint8")
    assert fields["action"] == ((), "int64")


def test_deterministic_and_data_dir_or_file_accepted(minari_root: Path) -> None:
    base = minari_root / "rlds/toy-tuple/random-v0"
    a = convert(base, "a")
    b = convert(base / "data", "b")
    c = convert(base / "data" / "main_data.hdf5", "c")
    for other in (b, c):
        for rel in ("arrays/observation/0.npy", "arrays/action.npy", "episodes.npy"):
            assert (a.path / rel).read_bytes() == (other.path / rel).read_bytes()
    assert a.manifest.source["sha256"] == b.manifest.source["sha256"] == c.manifest.source["sha256"]
