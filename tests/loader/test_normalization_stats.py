"""``rlds_cli.NormalizationStats``: the statistics ``Normalize`` uses, as a public object that is
saved with a policy and normalizes the environment's observations at evaluation time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli import NormalizationStats
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import split_dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.loader import Loader, Normalize, compute_stats
from tests.loader_fixtures import TedFactory

pytest.importorskip("torch")


@pytest.fixture
def ds(ted_dataset: TedFactory, isolated_cache: Path) -> Dataset:
    return ted_dataset([5, 7, 4, 9], root=isolated_cache)  # in the cache root: names resolve there


def test_from_dataset_is_what_the_loaders_normalize_uses(ds: Dataset) -> None:
    norm = Normalize()
    loader = Loader("ted", 16, seed=3, transform=norm, keys=["observation"])
    batch = loader.sample()
    raw = Loader("ted", 16, seed=3, keys=["observation"]).sample()["observation"].numpy()
    stats = NormalizationStats.from_dataset("ted")
    assert isinstance(norm.statistics, NormalizationStats)
    assert norm.statistics.keys == stats.keys == ["observation"]
    for name in ("mean", "std", "min", "max"):
        ours, theirs = getattr(norm.statistics, name), getattr(stats, name)
        np.testing.assert_array_equal(ours["observation"], theirs["observation"])
    # normalizing an environment observation by hand equals what the loader fed the policy
    np.testing.assert_array_equal(stats.normalize(raw), batch["observation"].numpy())
    np.testing.assert_allclose(stats.denormalize(stats.normalize(raw)), raw, rtol=1e-5)
    expected = compute_stats(ds)["observation"]
    np.testing.assert_array_equal(stats.min["observation"], expected["min"])
    assert stats.source == "dataset 'ted'" and norm.source == "dataset 'ted'"
    # the old attribute keeps its shape: {key: (mean, std + eps)}
    _, std = norm.stats["observation"]  # type: ignore[index]
    np.testing.assert_array_equal(std, expected["std"].astype(np.float32) + np.float32(1e-6))


def test_next_keys_use_their_keys_statistics(ds: Dataset) -> None:
    stats = NormalizationStats.from_dataset(ds)
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(stats.normalize(x, "next/observation"), stats.normalize(x))
    with pytest.raises(KeyError, match="no normalization statistics for 'action'"):
        stats.normalize(x, "action")


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_save_and_load_round_trip(ds: Dataset, tmp_path: Path, suffix: str) -> None:
    stats = NormalizationStats.from_dataset(ds, ["observation", "next/reward"], eps=1e-3)
    path = stats.save(tmp_path / f"stats{suffix}")
    back = NormalizationStats.load(path)
    assert back.keys == stats.keys and back.eps == 1e-3 and back.source == stats.source
    for name in ("mean", "std", "min", "max"):
        for key in stats.keys:
            np.testing.assert_array_equal(getattr(back, name)[key], getattr(stats, name)[key])
    # a loaded file drives a loader exactly as the statistics it was saved from
    via_file = Loader("ted", 8, seed=1, transform=Normalize(stats=back), keys=["observation"]).sample()
    direct = Loader("ted", 8, seed=1, transform=Normalize(stats=stats), keys=["observation"]).sample()
    np.testing.assert_array_equal(via_file["observation"].numpy(), direct["observation"].numpy())


def test_statistics_given_as_numbers_save_strict_json(tmp_path: Path) -> None:
    """Without min and max (statistics given as numbers) the file held bare NaN tokens."""
    import json

    stats = NormalizationStats.from_mapping({"action": {"mean": np.zeros(2), "std": np.ones(2)}}, ["action"])
    path = stats.save(tmp_path / "s.json")
    json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the file"))
    back = NormalizationStats.load(path)
    assert np.isnan(back.min["action"]).all() and back.std["action"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("eps", [float("nan"), -1e-6, float("inf"), "x", True])
def test_an_eps_that_is_not_a_finite_number_from_0_is_refused(eps: object) -> None:
    """A NaN eps made every value NaN; a negative one trained silently, then the table refused it."""
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        Normalize(keys=["action"], eps=eps)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        NormalizationStats.from_mapping(
            {"action": {"mean": np.zeros(2), "std": np.ones(2)}}, ["action"], eps=eps
        )  # type: ignore[arg-type]


def test_a_path_without_suffix_is_saved_as_npz(ds: Dataset, tmp_path: Path) -> None:
    written = NormalizationStats.from_dataset(ds).save(tmp_path / "stats")
    assert written == tmp_path / "stats.npz" and written.is_file()


def test_loading_something_else_is_a_clear_error(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"mean": [1]}')
    with pytest.raises(ValueError, match=r"other\.json is not normalization statistics saved by rlds"):
        NormalizationStats.load(other)
    arrays = tmp_path / "arrays.npz"
    np.savez(arrays, mean=np.zeros(3))
    with pytest.raises(ValueError, match=r"arrays\.npz is not normalization statistics saved by rlds"):
        NormalizationStats.load(arrays)
    with pytest.raises(FileNotFoundError):
        NormalizationStats.load(tmp_path / "missing.npz")


def test_a_views_statistics_are_its_parents(ds: Dataset) -> None:
    split_dataset("ted", 0.3)
    val = open_dataset("ted-val")
    parent = NormalizationStats.from_dataset(val)
    own = NormalizationStats.from_dataset(val, of="self")
    np.testing.assert_array_equal(parent.mean["observation"], compute_stats(ds)["observation"]["mean"])
    assert not np.allclose(parent.mean["observation"], own.mean["observation"])
    assert parent.source == "dataset 'ted' (the parent of view 'ted-val')"
    with pytest.raises(ValueError, match="of must be 'parent' or 'self'"):
        NormalizationStats.from_dataset(val, of="train")


def test_a_split_of_a_trim_is_normalized_with_the_trims_statistics(ds: Dataset) -> None:
    """A split of a composed dataset (trim, merge) is a selection of it: it was normalized with
    its own statistics, and 'rlds stats' wrote them."""
    from rlds_cli.cache.compose import trim_dataset
    from rlds_cli.errors import CorruptDatasetError

    trim_dataset("ted", "cut", start=1)
    split_dataset("cut", 0.5)
    val = open_dataset("cut-val")
    got = NormalizationStats.from_dataset(val)
    np.testing.assert_array_equal(
        got.mean["observation"], compute_stats(open_dataset("cut"))["observation"]["mean"]
    )
    assert got.source == "dataset 'cut' (the parent of view 'cut-val')"
    norm = Normalize()
    Loader("cut-val", 4, seed=0, transform=norm, keys=["observation"]).sample()
    assert norm.statistics is not None and norm.statistics.source == got.source
    trim_dataset("ted", "cut", start=2, replace=True)  # the selection still reads its parts
    with pytest.raises(CorruptDatasetError, match="its parent 'cut' was replaced since it was made"):
        NormalizationStats.from_dataset("cut-val")
    assert NormalizationStats.from_dataset("cut-val", of="self").source == "dataset 'cut-val'"


def test_mismatched_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="'std' has keys"):
        NormalizationStats(mean={"a": [0.0]}, std={}, min={"a": [0.0]}, max={"a": [0.0]})
    # a negative std flipped the sign of every value normalized with it, without a word
    with pytest.raises(ValueError, match="the std of 'observation' has negative values"):
        Normalize(stats={"observation": {"mean": [0.0, 0.0], "std": [-1.0, 1.0]}})
    with pytest.raises(ValueError, match=r"Normalize\(keys=...\) takes a list of keys, not the string"):
        Normalize(keys="observation")


def test_the_front_door_exports_it() -> None:
    assert rlds_cli.NormalizationStats is NormalizationStats


def _far_from_zero(name: str, offset: float, seed: int) -> np.ndarray:
    """A dataset whose float64 ``observation`` sits near ``offset`` (timestamps, map coordinates),
    written with ``DatasetWriter``; returns every stored observation."""
    from rlds_cli import DatasetWriter

    rng = np.random.default_rng(seed)
    with DatasetWriter(name) as writer:
        for _ in range(3):
            obs = offset + rng.normal(0.0, 1.0, (11, 2))
            done = np.arange(10) == 9
            writer.add_episode({
                "observation": obs[:-1], "next/observation": obs[1:], "action": np.zeros((10, 1), np.float32),
                "next/reward": np.zeros(10, np.float32), "next/terminated": done,
                "next/truncated": np.zeros(10, bool), "next/done": done,
            })  # fmt: skip
    return np.concatenate([open_dataset(name).episode(i)["observation"] for i in range(3)])


def test_float64_values_far_from_zero_are_normalized_in_float64(isolated_cache: Path) -> None:
    # float32 statistics rounded a mean of 1.7e9 by up to 64: every normalized value was off by
    # up to 64 standard deviations, and max came out below the values' own maximum
    from rlds_cli.loader import MixtureLoader

    stored = _far_from_zero("far", 1.7e9 + 37.0, seed=0)
    mean, std = stored.mean(axis=0), stored.std(axis=0)
    stats = NormalizationStats.from_dataset("far", of="self")
    np.testing.assert_allclose(stats.mean["observation"], mean, rtol=0, atol=1e-6)
    assert (stats.max["observation"] == stored.max(axis=0)).all()
    expected = (stored - mean) / (std + 1e-6)
    np.testing.assert_allclose(stats.normalize(stored), expected, atol=1e-6)
    np.testing.assert_allclose(stats.denormalize(expected), stored, rtol=0, atol=1e-5)
    assert stats.normalize(stored.astype(np.float32)).dtype == np.float32  # float32 stays float32

    for memory in (False, "device"):  # "device": the batch is torch's when Normalize sees it
        loader = Loader("far", 8, seed=1, transform=Normalize(stats="self"), keys=["observation"],
                        in_memory=memory, device="cpu")  # fmt: skip
        batch = loader.sample()
        rows = stored[batch["index"].numpy()]
        np.testing.assert_allclose(batch["observation"].numpy(), (rows - mean) / (std + 1e-6), atol=1e-6)

    other = _far_from_zero("far-b", -3.3e9, seed=1)
    mix = MixtureLoader(
        {"a": "far", "b": "far-b"}, [0.5, 0.5], batch_size=64, keys=["observation"], pad=True, seed=2,
        transforms={"a": Normalize(stats="self"), "b": Normalize(stats="self")},
    )  # fmt: skip
    batch = mix.sample()
    for source, values in enumerate((stored, other)):
        mine = (batch["source"] == source).numpy()
        rows = values[batch["index"].numpy()[mine]]
        own = (rows - values.mean(axis=0)) / (values.std(axis=0) + 1e-6)
        np.testing.assert_allclose(batch["observation"].numpy()[mine], own, atol=1e-6)


def test_statistics_that_are_not_finite_are_refused_by_dimension(isolated_cache: Path) -> None:
    """One NaN in one step made the mean of its dimension NaN, and Normalize silently turned every
    value of that dimension, in every batch, into NaN."""
    rng = np.random.default_rng(0)
    with rlds_cli.DatasetWriter("holes", mode="append") as writer:
        for e in range(3):
            obs = rng.standard_normal((11, 3)).astype(np.float32)
            obs[4, 2] = np.nan if e == 1 else obs[4, 2]
            done = np.arange(10) == 9
            writer.add_episode({
                "observation": obs[:-1],
                "next/observation": obs[1:],
                "action": np.zeros((10, 2), np.float32),
                "next/reward": np.zeros(10, np.float32),
                "next/terminated": done,
                "next/truncated": np.zeros(10, bool),
            })  # fmt: skip
    refused = r"'observation' from dataset 'holes' are not finite in 1 of its 3 dimension\(s\) \(flat index 2"
    with pytest.raises(ValueError, match=refused + ".*rlds audit"):
        Loader("holes", 8, transform=Normalize())
    given = {"action": {"mean": [0.0, float("inf")], "std": [1.0, 1.0]}}
    with pytest.raises(ValueError, match=r"'action' from statistics given are not finite in 1 of its 2"):
        Normalize(given, keys=["action"])
    assert Normalize({"action": {"mean": [0.0, 1.0], "std": [1.0, 1.0]}}, keys=["action"]).statistics
