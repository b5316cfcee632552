"""``float_dtype=``: float64 caches (as Minari's MuJoCo datasets store them) reach float32
models, float32 and float64 sources mix, and the stream and its resume are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.loader import Loader
from rlds_cli.loader.data_loader import TedDataLoader
from rlds_cli.loader.mixture import MixtureLoader
from rlds_cli.loader.torch_data import TedIterableDataset, TedMapDataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl
from tests.loader_fixtures import make_ted

LENGTHS = [5, 7, 4]


def _float64_dataset(root: Path) -> Dataset:
    """A D4RL file whose observations, actions and rewards are float64."""
    n = sum(LENGTHS)
    i = np.arange(n, dtype=np.float64)
    terminals = np.zeros(n, bool)
    terminals[np.cumsum(LENGTHS) - 1] = True
    obs = np.stack([i, 0.5 * i, np.sqrt(i) + 1e-9], axis=1)  # not exact in float32
    src = write_d4rl(
        root / "f64.hdf5",
        observations=obs,
        actions=np.stack([0.1 * i, -i], axis=1),
        rewards=i / 3.0,
        terminals=terminals,
        next_observations=obs + 1.0,
    )
    convert(src, "f64", format="d4rl", root=root)
    return open_dataset("f64", root)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Dataset, Dataset]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        root = tmp_path_factory.mktemp("dtype")
        yield _float64_dataset(root), make_ted(root, "f32", LENGTHS)


def test_float64_cache_keeps_its_dtype_by_default(data: tuple[Dataset, Dataset]) -> None:
    f64, _ = data
    batch = Loader(f64, 8, seed=0).sample()
    assert batch["observation"].dtype == torch.float64 and batch["next", "reward"].dtype == torch.float64
    with pytest.raises(RuntimeError, match="dtype"):  # what a float32 model says without the cast
        torch.nn.Linear(3, 2)(batch["observation"])


@pytest.mark.parametrize("in_memory", [False, True, "device"])
def test_float_dtype_reaches_a_float32_model(data: tuple[Dataset, Dataset], in_memory: bool | str) -> None:
    f64, _ = data
    loader = Loader(f64, 8, seed=0, float_dtype=torch.float32, in_memory=in_memory)
    plain = Loader(f64, 8, seed=0, in_memory=in_memory)
    batch, ref = loader.sample(), plain.sample()
    # held as float32 in RAM: nothing left to cast per batch (the plain path, on the host)
    assert loader._plain is (in_memory is True)
    if in_memory:  # float64 columns were cast once, into the packed float32 block
        assert loader._host is not None and loader._host.layout.rows is not None
        assert {"observation", "action", "next/reward"} <= set(loader._host.layout.offsets)
    for key, value in batch.items():
        want = torch.float32 if ref[key].is_floating_point() else ref[key].dtype
        assert value.dtype == want, key
        torch.testing.assert_close(value, ref[key].to(want), rtol=0, atol=0)  # the same rows, cast
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    loss = ((model(batch["observation"]) - batch["action"]) ** 2).mean() + batch["next", "reward"].mean()
    loss.backward()
    opt.step()
    assert not torch.equal(before, model.weight)


def test_float_dtype_covers_transforms_and_tensordict_extras(data: tuple[Dataset, Dataset]) -> None:
    """Keys a transform makes (n-step returns) and the prioritized weight follow float_dtype."""
    from rlds_cli.loader.transforms import NStepReturn

    f64, _ = data
    pytest.importorskip("tensordict")
    loader = Loader(
        f64,
        6,
        sampler="prioritized",
        seed=1,
        as_tensordict=True,
        float_dtype=torch.float64,
        transform=NStepReturn(3, gamma=0.9),
    )
    td = loader.sample()
    assert td["priority_weight"].dtype == torch.float64
    loader = Loader(f64, 6, seed=1, transform=NStepReturn(3, gamma=0.9), float_dtype=torch.float32)
    batch = loader.sample()
    assert {k: v.dtype for k, v in batch.items() if v.is_floating_point()} == {
        k: torch.float32 for k, v in batch.items() if v.is_floating_point()
    }
    assert batch["next", "reward"].dtype == torch.float32


@pytest.mark.parametrize("in_memory", [True, "device"])
def test_a_transform_reads_float64_values_in_every_mode(tmp_path: Path, in_memory: bool | str) -> None:
    """In RAM, float64 columns were cast to float32 when loaded, before Normalize: a float64 key
    near 1.7e9 (a timestamp) came out a 4-level staircase, where the disk mode was exact."""
    from rlds_cli.loader import Normalize
    from rlds_cli.write.writer import DatasetWriter

    with DatasetWriter("stamps", root=tmp_path, mode="create") as writer:
        for e in range(4):
            stamps = 1.7e9 + e * 100 + np.arange(51) * 0.5
            obs = np.stack([stamps, np.arange(51.0)], axis=1)
            writer.add_episode(
                {
                    "observation": obs[:-1], "next/observation": obs[1:],
                    "action": np.zeros((50, 1), np.float32), "next/reward": np.zeros(50, np.float32),
                    "next/terminated": np.arange(50) == 49, "next/truncated": np.zeros(50, bool),
                }
            )  # fmt: skip
    ds = open_dataset("stamps", tmp_path)

    def normalized(mode: bool | str) -> torch.Tensor:
        loader = Loader(ds, ds.num_steps, sampler="epoch", shuffle=False, seed=0, in_memory=mode,
                        float_dtype=torch.float32, transform=Normalize())  # fmt: skip
        return loader.sample()["observation"]

    disk = normalized(False)
    assert len(torch.unique(disk[:, 0])) == ds.num_steps
    torch.testing.assert_close(normalized(in_memory), disk, rtol=0, atol=0)


def test_the_device_mode_gathers_uint32_and_uint64_keys(tmp_path: Path) -> None:
    """torch has no index_select for uint32 or uint64: the device loader built, then every
    sample() raised NotImplementedError."""
    from rlds_cli.write.writer import DatasetWriter

    with DatasetWriter("ids", root=tmp_path, mode="create") as writer:
        for e in range(3):
            writer.add_episode(
                {
                    "observation": np.zeros((4, 2), np.float32),
                    "next/observation": np.zeros((4, 2), np.float32),
                    "action": np.zeros((4, 1), np.float32), "next/reward": np.zeros(4, np.float32),
                    "next/terminated": np.arange(4) == 3, "next/truncated": np.zeros(4, bool),
                    "info/id32": (np.arange(4, dtype=np.uint32) + 4 * e) * 1_000_000_000,
                    "info/id64": np.arange(4, dtype=np.uint64) + np.uint64(2**63) + np.uint64(4 * e),
                }
            )  # fmt: skip
    ds = open_dataset("ids", tmp_path)
    batches = [
        Loader(ds, ds.num_steps, sampler="epoch", shuffle=False, seed=0, in_memory=mode).sample()
        for mode in (False, "device")
    ]
    for key, dtype in (("info/id32", torch.uint32), ("info/id64", torch.uint64)):
        assert batches[1][key].dtype == dtype
        assert batches[1][key].tolist() == batches[0][key].tolist() == ds[:][key].tolist(), key


def test_float32_data_keeps_the_plain_path(data: tuple[Dataset, Dataset]) -> None:
    _, f32 = data
    assert Loader(f32, 4, seed=0, float_dtype=torch.float32)._plain  # nothing to cast
    assert not Loader(f32, 4, seed=0, float_dtype=torch.float64)._plain
    batch = Loader(f32, 4, seed=0, float_dtype=torch.float64).sample()
    assert batch["observation"].dtype == torch.float64


def test_per_key_float_dtype(data: tuple[Dataset, Dataset]) -> None:
    f64, _ = data
    batch = Loader(f64, 4, seed=0, float_dtype={("next", "reward"): torch.float32}).sample()
    assert batch["next", "reward"].dtype == torch.float32 and batch["observation"].dtype == torch.float64
    with pytest.raises(KeyError, match="nope"):
        Loader(f64, 4, seed=0, float_dtype={"nope": torch.float32}).sample()
    with pytest.raises(
        ValueError, match=r"float_dtype must be torch\.float16, torch\.float32 or torch\.float64"
    ):
        Loader(f64, 4, seed=0, float_dtype=torch.int32)
    with pytest.raises(ValueError, match="float_dtype must be"):
        Loader(f64, 4, seed=0, float_dtype="float32")  # type: ignore[arg-type]


def test_resume_is_exact_with_float_dtype(data: tuple[Dataset, Dataset]) -> None:
    f64, _ = data
    a = Loader(f64, 4, sampler="slice", slice_len=2, seed=5, float_dtype=torch.float32)
    a.sample()
    state = a.state_dict()
    want = [a.sample() for _ in range(3)]
    b = Loader(f64, 4, sampler="slice", slice_len=2, seed=99, float_dtype=torch.float32)
    b.load_state_dict(state)
    for w in want:
        got = b.sample()
        for key in w:
            assert got[key].dtype == w[key].dtype
            torch.testing.assert_close(got[key], w[key], rtol=0, atol=0)


def test_mixture_of_float32_and_float64(data: tuple[Dataset, Dataset]) -> None:
    f64, f32 = data
    keys = ["observation", "action", "next/reward"]
    with pytest.raises(ValueError, match=r"pass float_dtype=torch\.float32"):
        MixtureLoader({"a": f32, "b": f64}, [0.5, 0.5], 8, keys=keys, seed=0)
    mix = MixtureLoader({"a": f32, "b": f64}, [0.5, 0.5], 16, keys=keys, seed=0, float_dtype=torch.float32)
    batch = mix.sample()
    assert {batch[k].dtype for k in keys} == {torch.float32}
    for s, ds in enumerate((f32, f64)):  # each row is its source's row, cast
        rows = batch["source"] == s
        want = ds.gather(batch["index"][rows].numpy(), ["observation"])["observation"].astype(np.float32)
        np.testing.assert_array_equal(batch["observation"][rows].numpy(), want)
    state = mix.state_dict()
    again = [mix.sample() for _ in range(2)]
    mix2 = MixtureLoader({"a": f32, "b": f64}, [0.5, 0.5], 16, keys=keys, seed=1, float_dtype=torch.float32)
    mix2.load_state_dict(state)
    for w in again:
        got = mix2.sample()
        for k in keys:
            torch.testing.assert_close(got[k], w[k], rtol=0, atol=0)


def test_torch_datasets_cast(data: tuple[Dataset, Dataset]) -> None:
    f64, _ = data
    it = TedIterableDataset(f64, 4, shuffle="uniform", num_batches=2, seed=0, float_dtype=torch.float32)
    for workers in (0, 1):  # cast in this process, then in a worker
        batches = list(TedDataLoader(it, num_workers=workers))
        assert len(batches) == 2
        for batch in batches:
            assert batch["observation"].dtype == torch.float32
            assert batch["next", "reward"].dtype == torch.float32 and batch["index"].dtype == torch.int64
    mapped = TedMapDataset(f64, float_dtype=torch.float32)
    from rlds_cli.loader.torch_data import collate_ted

    batch = collate_ted(mapped.__getitems__([0, 3]))
    assert batch["observation"].dtype == torch.float32
    with pytest.raises(KeyError, match="nope"):
        TedMapDataset(f64, float_dtype={"nope": torch.float32})


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
def test_minari_float64_dataset_trains_a_float32_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a Minari dataset written by minari's DataCollector with float64
    observations (as the MuJoCo datasets store them) reaches a float32 model with float_dtype."""
    pytest.importorskip("minari")
    pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")
    import gymnasium as gym

    from tests.minari_fixtures import record_random

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("RLDS_FSYNC", "0")
    env = gym.wrappers.DtypeObservation(gym.make("Pendulum-v1", max_episode_steps=6), np.float64)
    record_random(
        env, "rlds/pendulum64/random-v0", 3, seed=0,
        code_permalink="tests/loader/test_loader_dtype.py", description="float64 observations",
    )  # fmt: skip
    convert(tmp_path / "minari" / "rlds/pendulum64/random-v0", "pendulum64", root=tmp_path / "cache")
    ds = open_dataset("pendulum64", tmp_path / "cache")
    assert ds.fields["observation"][1] == "float64"
    batch = Loader(ds, 8, seed=0, float_dtype=torch.float32).sample()
    assert batch["observation"].dtype == torch.float32 and batch["next", "reward"].dtype == torch.float32
    model = torch.nn.Linear(3, 1)
    loss = ((model(batch["observation"]) - batch["next", "reward"]) ** 2).mean()
    loss.backward()
    assert model.weight.grad is not None and torch.isfinite(model.weight.grad).all()
