"""Minari data as users make it: minari's ``DataCollector`` with its defaults (unseeded
``reset()``, so 64-bit random seeds; JPEG frames; ``data_format`` hdf5, arrow and parquet), every
space type (Dict and Tuple observations *and actions*, Discrete with a start, MultiDiscrete,
MultiBinary, images), nested infos, and namespaced ids. Every conversion is compared with
``minari.load_dataset(...).iterate_episodes()`` key by key and dtype by dtype; exports are loaded
back with minari and compared with the source's spaces, env spec and episodes.

Skipped, with the reason, where minari[create] is not installed (``pip install -e '.[test]'``);
the arrow/parquet cases also need pyarrow (the ``arrow`` extra, in ``[test]`` too).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

minari = pytest.importorskip("minari", reason="minari is not installed (pip install -e '.[test]')")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")
pytest.importorskip("PIL", reason="minari's JPEG frames need pillow")

from gymnasium import spaces  # noqa: E402

from rlds_cli.cache import open_dataset  # noqa: E402
from rlds_cli.cache.derive import create_view  # noqa: E402
from rlds_cli.cli.app import app  # noqa: E402
from rlds_cli.errors import SourceFormatError  # noqa: E402
from rlds_cli.export import export_dataset  # noqa: E402
from rlds_cli.sources.convert import convert  # noqa: E402
from tests.minari_fixtures import minari_path  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`eval_env` is set to None:UserWarning")

HAS_ARROW = importlib.util.find_spec("pyarrow") is not None
needs_arrow = pytest.mark.skipif(
    not HAS_ARROW, reason="pyarrow is not installed (pip install 'rlds-cli[arrow]')"
)
#: The reset arguments of the mixed datasets: minari's default (a 64-bit random seed), the largest
#: seed, one >= 2**63 (uint64 in HDF5), no seed at all, a small one (int64 in HDF5).
RESETS: list[dict[str, Any]] = [
    {},
    {"seed": 2**64 - 1},
    {"seed": 2**63},
    {"options": {"minari_autoseed": False}},
    {"seed": 7},
]
#: Dataset ids by (env, data_format).
IDS = {
    ("cartpole", "hdf5"): "cartpole/random-v0",
    ("cartpole", "arrow"): "cartpole/random-arrow-v0",
    ("mixed", "hdf5"): "mixed/random-v0",
    ("mixed", "arrow"): "mixed/random-arrow-v0",
    ("mixed", "parquet"): "mixed/random-parquet-v0",
    ("pendulum", "hdf5"): "pendulum/random-v0",
}
runner = CliRunner()


class MixedEnv(gym.Env):
    """Every space type minari stores, observations and actions alike.

    Observations: a Dict holding a float32 Box, a 32x32 RGB image (JPEG-encoded by minari) and a
    Tuple of a Discrete and a float64 Box. Actions: a Tuple of a Discrete starting at -2 and a Dict
    of MultiDiscrete, MultiBinary and float32 Box. Infos: an int, a vector and a nested dict.
    Terminates at a threshold drawn at reset, so with a time limit of 5 some episodes are
    truncated instead.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-5, 5, (3,), np.float32),
                "img": spaces.Box(0, 255, (32, 32, 3), np.uint8),
                "pair": spaces.Tuple((spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float64))),
            }
        )
        self.action_space = spaces.Tuple(
            (
                spaces.Discrete(5, start=-2),
                spaces.Dict(
                    {
                        "m": spaces.MultiDiscrete([2, 3]),
                        "b": spaces.MultiBinary(3),
                        "c": spaces.Box(-1, 1, (2,), np.float32),
                    }
                ),
            )
        )
        self._t = 0
        self._limit = 0

    def _obs(self) -> dict[str, Any]:
        r = self.np_random
        return {
            "pos": r.uniform(-5, 5, 3).astype(np.float32),
            "img": r.integers(0, 256, (32, 32, 3), dtype=np.uint8),
            "pair": (int(r.integers(4)), r.uniform(-1, 1, 2)),
        }

    def _info(self) -> dict[str, Any]:
        return {
            "count": np.int64(self._t),
            "noise": self.np_random.normal(size=2),
            "nested": {"half": np.float32(self._t / 2)},
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._limit = int(self.np_random.integers(2, 7))
        return self._obs(), self._info()

    def step(self, action: Any) -> Any:
        self._t += 1
        return self._obs(), float(self.np_random.normal()), self._t >= self._limit, False, self._info()


def _collect(dataset_id: str, env: Any, data_format: str, *, action: Any = None, infos: bool = True) -> None:
    """Record ``len(RESETS)`` episodes with minari's DataCollector, its defaults otherwise."""
    from minari import DataCollector

    collector = DataCollector(env, record_infos=infos, data_format=data_format)
    collector.action_space.seed(3)  # the actions only; every reset follows RESETS
    for kwargs in RESETS:
        collector.reset(**kwargs)
        while True:
            step = collector.step(collector.action_space.sample() if action is None else action)
            if step[2] or step[3]:
                break
    collector.create_dataset(
        dataset_id=dataset_id,
        algorithm_name="random",
        author="rlds tests",
        author_email="tests@example.invalid",
        code_permalink="tests/formats/test_minari_real.py",
        description="rlds real-data test",
    )
    collector.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every dataset of :data:`IDS`, made once per module with minari's DataCollector."""
    path = tmp_path_factory.mktemp("minari-real")
    gym.register("RldsMixed-v0", entry_point=f"{__name__}:MixedEnv", disable_env_checker=True)
    with minari_path(path):
        for (env, fmt), dataset_id in IDS.items():
            if fmt != "hdf5" and not HAS_ARROW:
                continue
            if env == "cartpole":
                # a policy that only ever pushes left: the space says Discrete(2), the data shows 0
                _collect(dataset_id, gym.make("CartPole-v1", max_episode_steps=6), fmt, action=0, infos=False)
            elif env == "pendulum":
                _collect(dataset_id, gym.make("Pendulum-v1", max_episode_steps=3), fmt)
            else:
                _collect(dataset_id, gym.make("RldsMixed-v0", max_episode_steps=5), fmt)
    return path


# ------------------------------------------------------------------------ comparing with minari


def _flatten(value: Any, prefix: str, out: dict[str, np.ndarray]) -> None:
    """Minari's nested episode values -> rlds's flat TED keys."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}/{k}", out)
    elif isinstance(value, tuple | list) and not isinstance(value, np.ndarray):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}/{i}", out)
    elif (
        isinstance(value, np.ndarray) and value.dtype == object and len(value) and isinstance(value[0], dict)
    ):
        # minari's arrow reader returns a nested info dict as an object array of dicts (losing
        # the dtypes); stack it back per key, marked so only the values are compared
        for k in value[0]:
            out[f"~{prefix}/{k}"] = np.asarray([row[k] for row in value])
    else:
        out[prefix] = np.asarray(value)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _expected(ep: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One minari episode as TED keys: exact values, and values minari lost the dtype of."""
    flat: dict[str, np.ndarray] = {}
    _flatten(ep.observations, "observation", flat)
    _flatten(ep.infos or {}, "info", flat)
    want: dict[str, np.ndarray] = {}
    for k, v in flat.items():
        if len(v) == len(ep) + 1:
            want[k], want[f"next/{k.lstrip('~')}" if k.startswith("~") else f"next/{k}"] = v[:-1], v[1:]
        else:
            want[k] = v
    actions: dict[str, np.ndarray] = {}
    _flatten(ep.actions, "action", actions)
    want.update(actions)
    want["next/reward"] = np.asarray(ep.rewards)[:, None]
    want["next/terminated"] = np.asarray(ep.terminations)[:, None]
    want["next/truncated"] = np.asarray(ep.truncations)[:, None]
    want["next/done"] = want["next/terminated"] | want["next/truncated"]
    loose = {k.lstrip("~"): v for k, v in want.items() if k.startswith("~")}
    loose.update({k: v for k, v in want.items() if k.startswith("next/") and f"~{k[5:]}" in want})
    exact = {k: v for k, v in want.items() if not k.startswith("~") and k not in loose}
    return exact, loose


def _differences(root: Path, dataset_id: str, name: str) -> tuple[list[str], int]:
    """Every mismatch between minari's reader and the converted dataset; and the steps compared."""
    with minari_path(root):
        episodes = list(minari.load_dataset(dataset_id).iterate_episodes())
    ds = open_dataset(name)
    diffs: list[str] = []
    if ds.num_episodes != len(episodes):
        diffs.append(f"episodes: {ds.num_episodes} vs {len(episodes)}")
    steps = 0
    for i, ep in enumerate(episodes):
        got = ds.episode(i)
        steps += len(ep)
        exact, loose = _expected(ep)
        if int(ds.episodes["source_id"][i]) != ep.id:
            diffs.append(f"episode {i}: source id {ds.episodes['source_id'][i]} vs {ep.id}")
        extra = set(got) - set(exact) - set(loose) - {"episode"}
        if extra:
            diffs.append(f"episode {i}: keys only in rlds: {sorted(extra)}")
        for k, v in exact.items():
            if k not in got:
                diffs.append(f"episode {i}: {k} missing")
            elif not _same(got[k], v):
                diffs.append(
                    f"episode {i}: {k} differs ({got[k].shape} {got[k].dtype} vs {v.shape} {v.dtype})"
                )
        for k, v in loose.items():
            if k not in got or not np.array_equal(got[k], v.astype(got[k].dtype)):
                diffs.append(f"episode {i}: {k} differs")
    return diffs, steps


def _seeds(root: Path, dataset_id: str) -> list[int | None]:
    """The seed of every episode as minari reports it (``None``: no seed)."""
    with minari_path(root):
        mds = minari.load_dataset(dataset_id)
        return [m.get("seed") for m in mds.storage.get_episode_metadata(range(mds.total_episodes))]


CASES = [
    pytest.param("cartpole", "hdf5"),
    pytest.param("mixed", "hdf5"),
    pytest.param("cartpole", "arrow", marks=needs_arrow),
    pytest.param("mixed", "arrow", marks=needs_arrow),
    pytest.param("mixed", "parquet", marks=needs_arrow),
]


@pytest.mark.parametrize(("env", "fmt"), CASES)
def test_zero_differences_against_minari(root: Path, env: str, fmt: str) -> None:
    dataset_id = IDS[(env, fmt)]
    result = convert(root / dataset_id, "m")
    diffs, steps = _differences(root, dataset_id, "m")
    assert diffs == []
    assert result.manifest.num_steps == steps
    assert result.manifest.source["checks"]["expected"] == {"num_episodes": len(RESETS), "num_steps": steps}
    fields = open_dataset("m").fields
    if env == "mixed":  # Tuple(Discrete, Dict(...)) actions: nested keys, dtypes of the spaces
        assert fields["action/0"] == ((), "int64")
        assert fields["action/1/m"] == ((2,), "int64")
        assert fields["action/1/b"] == ((3,), "int8")
        assert fields["action/1/c"] == ((2,), "float32")
        assert fields["observation/img"] == ((32, 32, 3), "uint8")
        # minari's JPEG frames kept as it wrote them, and decoded as its own loader decodes them
        # (the comparison above)
        assert open_dataset("m").stored_fields["observation/img"].codec == "jpeg"
        assert result.manifest.conversion["frames"]["columns"]["observation/img"]["encoded"] == 0
        assert fields["info/nested/half"] == ((), "float32")
        assert "action" not in fields


@pytest.mark.parametrize(("env", "fmt"), CASES)
def test_every_seed_kept_exactly(root: Path, env: str, fmt: str) -> None:
    """Absent, small (int64) and >= 2**63 (uint64) seeds, as minari itself reports them."""
    dataset_id = IDS[(env, fmt)]
    convert(root / dataset_id, "s")
    arrays = open_dataset("s").source_arrays
    seeds, present = arrays["minari/episode_seed"], arrays["minari/episode_seed_present"]
    assert seeds.dtype == np.uint64 and present.dtype == np.bool_
    truth = _seeds(root, dataset_id)
    assert [int(s) if p else None for s, p in zip(seeds, present, strict=True)] == truth
    assert truth[1:] == [2**64 - 1, 2**63, None, 7]  # the collector's own default seed comes first
    assert truth[0] is not None


@needs_arrow
def test_arrow_is_read_one_episode_at_a_time(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pyarrow read covers one episode's directory: memory holds one episode, not the dataset."""
    import pyarrow.dataset as pads

    opened: list[set[str]] = []
    real = pads.dataset

    def spy(source: Any, **kwargs: Any) -> Any:
        opened.append({Path(p).parent.name for p in source})
        return real(source, **kwargs)

    monkeypatch.setattr(pads, "dataset", spy)
    convert(root / IDS[("mixed", "arrow")], "one")
    assert opened and all(len(dirs) == 1 for dirs in opened)
    assert {d for dirs in opened for d in dirs} == {str(i) for i in range(len(RESETS))}


@needs_arrow
def test_damaged_arrow_episode_names_its_directory(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "copy"
    shutil.copytree(root / IDS[("mixed", "arrow")], src)
    part = src / "data" / "2" / "part-0.arrow"
    part.write_bytes(part.read_bytes()[:200])
    with pytest.raises(SourceFormatError, match=r"data/2: not a readable arrow episode"):
        convert(src, "bad")
    meta = json.loads((src / "data" / "metadata.json").read_text())
    meta["observation_space"] = None
    (src / "data" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SourceFormatError, match=r"metadata.json: no readable observation_space"):
        convert(src, "bad")


@needs_arrow
@pytest.mark.parametrize(
    ("damage", "needle"), [(b"{not json", "is not readable JSON"), (b"[1, 2]", "a JSON object")]
)
def test_damaged_episode_metadata_names_its_file(
    root: Path, tmp_path: Path, damage: bytes, needle: str
) -> None:
    """An arrow episode's own metadata.json (its reset seed) read with the formats' bounded JSON
    reader: a damaged one is one line naming it, nothing converted."""
    src = tmp_path / "copy"
    shutil.copytree(root / IDS[("mixed", "arrow")], src)
    (src / "data" / "1" / "metadata.json").write_bytes(damage)
    with pytest.raises(SourceFormatError, match=needle) as info:
        convert(src, "bad")
    assert "data/1/metadata.json" in str(info.value) and "\n" not in str(info.value)


def test_nested_actions_survive_key_selection(root: Path) -> None:
    """``--keys`` keeps the required action: a Tuple action's keys all come along."""
    convert(root / IDS[("mixed", "hdf5")], "k", options={"keys": ["observation/pos"]})
    fields = open_dataset("k").fields
    assert {k for k in fields if k.startswith("action")} == {
        "action/0",
        "action/1/m",
        "action/1/b",
        "action/1/c",
    }
    assert {k for k in fields if k.startswith("observation")} == {"observation/pos"}


# ------------------------------------------------------------------------ namespaces and archives


def test_namespaced_ids_keep_their_namespace(root: Path) -> None:
    """``pendulum/random-v0`` and ``cartpole/random-v0`` never collide on ``random-v0``."""
    from rlds_cli.sources.download import download

    a = download(str(root / "pendulum" / "random-v0"))
    b = download(str(root / "cartpole" / "random-v0" / "data"))
    assert (a.manifest.name, b.manifest.name) == ("pendulum/random-v0", "cartpole/random-v0")
    # end to end from the CLI, arrow storage included: converted, named, and checked
    dataset_id = IDS[("mixed", "arrow")] if HAS_ARROW else IDS[("mixed", "hdf5")]
    result = runner.invoke(app, ["download", str(root / dataset_id)])
    assert result.exit_code == 0, result.output
    assert open_dataset(dataset_id).num_episodes == len(RESETS)
    check = runner.invoke(app, ["inspect", dataset_id, "--check"])
    assert check.exit_code == 0, check.output


def test_archives_of_namespace_directories(root: Path, tmp_path: Path) -> None:
    tgz = tmp_path / "pendulum.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(root / "pendulum", arcname="pendulum")
    assert convert(tgz, "p").manifest.num_episodes == len(RESETS)
    # a zip of one dataset, its namespace folder around it (arrow: no .hdf5 file to spot)
    source = root / IDS[("mixed", "arrow")] if HAS_ARROW else root / IDS[("mixed", "hdf5")]
    zipped = tmp_path / "mixed.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        for f in sorted(source.rglob("*")):
            z.write(f, f.relative_to(root).as_posix())
    assert convert(zipped, "z").manifest.num_episodes == len(RESETS)
    # several datasets in one namespace: refused, naming them
    both = tmp_path / "cartpole.tar"
    with tarfile.open(both, "w") as tar:
        tar.add(root / "cartpole", arcname="cartpole")
    if HAS_ARROW:
        with pytest.raises(
            SourceFormatError, match=r"holds 2 Minari datasets \(random-arrow-v0, random-v0\)"
        ):
            convert(both, "c")


# ------------------------------------------------------------------------ export round trip


@pytest.mark.parametrize(("env", "fmt"), CASES)
def test_export_round_trips_spaces_env_spec_and_data(root: Path, tmp_path: Path, env: str, fmt: str) -> None:
    dataset_id = IDS[(env, fmt)]
    convert(root / dataset_id, "src")
    export_dataset(open_dataset("src"), tmp_path / "out" / "back-v0", "minari")
    meta = json.loads((tmp_path / "out" / "back-v0" / "data" / "metadata.json").read_text())
    # the mixed env's image: minari's JPEG files, kept at conversion, written back as they were
    assert meta["jpeg_encoding"] is (env == "mixed")
    with minari_path(root):
        source = minari.load_dataset(dataset_id)
        source_episodes = list(source.iterate_episodes())
    with minari_path(tmp_path / "out"):
        back = minari.load_dataset("back-v0")
        # Discrete n/start, Box bounds, MultiDiscrete, MultiBinary, Tuple and Dict as the source had them
        assert back.action_space == source.action_space
        assert back.observation_space == source.observation_space
        assert back.spec.env_spec == source.spec.env_spec
        recovered = back.recover_environment()
        assert recovered.action_space == source.action_space
        recovered.close()
        episodes = list(back.iterate_episodes())
    assert len(episodes) == len(source_episodes)
    for mine, theirs in zip(episodes, source_episodes, strict=True):
        got, loose_m = _expected(mine)
        exact, loose = _expected(theirs)
        assert not loose_m  # the export is hdf5, which minari reads with every dtype
        assert sorted(got) == sorted({**exact, **loose})
        for k, v in exact.items():
            assert _same(got[k], v), k
        for k, v in loose.items():  # nested infos that minari's arrow reader returns as dicts
            assert np.array_equal(got[k], v.astype(got[k].dtype)), k


def test_export_of_a_view_restores_the_source_spaces(root: Path, tmp_path: Path) -> None:
    convert(root / IDS[("cartpole", "hdf5")], "full")
    create_view("full", "part", (1, 3))
    result = runner.invoke(app, ["export", "part", str(tmp_path / "out" / "part-v0"), "--to", "minari"])
    assert result.exit_code == 0, result.output
    with minari_path(tmp_path / "out"):
        back = minari.load_dataset("part-v0")
    assert back.total_episodes == 2
    assert back.action_space == spaces.Discrete(2)  # the data only holds action 0
