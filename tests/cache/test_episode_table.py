"""``Dataset.episodes``: one row per episode (start, length, return, source id, reset seed where
recorded, env spec) for every kind of dataset: converted, a view, growing (of the view it holds)
and read at a URL; used as the episode index was (``ds.episodes["length"]``, no read), the
columns that cost a read made on first use; and the front door's names, ``push``/``pull`` and
recording."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import create_selection, create_view
from rlds_cli.cache.episode_table import EpisodeTable
from rlds_cli.cache.layout import SOURCE_ARRAYS_FILE
from rlds_cli.errors import CorruptDatasetError, DatasetReplacedError
from rlds_cli.formats.base import StepBlock
from tests.dataset_fixtures import make_dataset, uid_episode

LENGTHS = [3, 5, 1, 7, 4]


def _returns_by_episode(ds: rlds_cli.Dataset) -> list[float]:
    """The returns summed from each episode's own rows (what the table must agree with)."""
    return [float(np.asarray(ds.episode(i)["next/reward"], np.float64).sum()) for i in range(ds.num_episodes)]


def _seeded(name: str, lengths: list[int], seeds: list[int], present: list[bool]) -> None:
    """A converted dataset whose source arrays hold Minari's per-episode seeds."""
    steps = sum(lengths)
    ends = np.cumsum(lengths) - 1
    term = np.zeros(steps, bool)
    term[ends] = True
    block = StepBlock(
        steps={
            "action": np.zeros((steps, 1), np.float32),
            "next/reward": np.arange(steps, dtype=np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(steps, bool),
        },
        observations={"observation": np.zeros((steps + len(lengths), 2), np.float32)},
        ends=ends,
    )
    arrays = {
        "minari/episode_seed": np.array(seeds, np.uint64),
        "minari/episode_seed_present": np.array(present, bool),
    }
    with DatasetBuilder(name) as builder:
        builder.append(block)
        builder.commit(source_arrays=arrays)


def assert_matches_index(table: EpisodeTable, ds: rlds_cli.Dataset) -> None:
    assert len(table) == ds.num_episodes
    np.testing.assert_array_equal(table.starts, ds.episode_index["start"])
    np.testing.assert_array_equal(table.lengths, ds.episode_index["length"])
    np.testing.assert_array_equal(table.source_ids, ds.episode_index["source_id"])
    assert table.starts.dtype == table.lengths.dtype == np.int64 and table.returns.dtype == np.float64
    np.testing.assert_allclose(table.returns, _returns_by_episode(ds))


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_converted_dataset_and_a_view(backend: str) -> None:
    make_dataset("conv", LENGTHS, backend=backend)
    ds = rlds_cli.open_dataset("conv")
    table = ds.episodes
    assert_matches_index(table, ds)
    # step t has reward t + 1: episode 1 holds steps 3..7
    assert table.starts.tolist() == [0, 3, 8, 9, 16] and table.returns[1] == sum(range(4, 9))
    assert table.seeds is None and table.seed_present is None and table.env_spec is None
    assert list(table.columns()) == ["start", "length", "source_id", "final_known", "return"]
    create_view("conv", "conv-view", (1, 4))
    view = rlds_cli.open_dataset("conv-view")
    part = view.episodes
    assert_matches_index(part, view)
    assert part.starts.tolist() == [0, 5, 6] and part.returns.tolist() == table.returns[1:4].tolist()


def test_the_table_answers_as_the_episode_index_did() -> None:
    """Every field of the index by name, several at once, one episode, every episode."""
    make_dataset("idx", LENGTHS)
    ds = rlds_cli.open_dataset("idx")
    table, index = ds.episodes, ds.episode_index
    assert isinstance(table, EpisodeTable) and table is ds.episodes  # made once per view
    for name in index.dtype.names or ():
        assert table[name].tolist() == index[name].tolist() and table[name].dtype == index[name].dtype
    assert table["final_known"].all() and "final_known" in table and "nope" not in table
    assert table[["start", "length"]].tolist() == index[["start", "length"]].tolist()
    row = {"start": 3, "length": 5, "source_id": 1, "final_known": True, "return": sum(range(4, 9))}
    assert table[1] == row
    assert table[-1]["start"] == 16 and [row["length"] for row in table] == LENGTHS
    whole = np.asarray(table)
    assert whole.dtype.names == table.names and whole["return"].tolist() == table.returns.tolist()
    assert (ds.episodes["start"] + ds.episodes["length"]).tolist() == [3, 8, 9, 16, 20]
    with pytest.raises(ValueError, match="read-only"):
        table["length"][0] = 99  # a kept column, shared by every caller
    assert index["length"][0] == 3


def test_a_column_or_episode_the_table_does_not_have_is_named() -> None:
    make_dataset("few", [2, 3])
    table = rlds_cli.open_dataset("few").episodes
    with pytest.raises(KeyError, match=r"'few' have no column 'returns' \(they have start, length, "):
        table["returns"]
    with pytest.raises(IndexError, match="episode 2 out of range for dataset 'few' with 2 episodes"):
        table[2]
    with pytest.raises(TypeError, match=r"not slice; select rows of a column instead \(table\['length'\]"):
        table[0:1]


def test_the_index_columns_read_nothing_and_the_others_are_read_once(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dataset("lazy", LENGTHS)
    read: list[str] = []
    column = Dataset.column
    monkeypatch.setattr(Dataset, "column", lambda self, key: read.append(key) or column(self, key))
    ds = rlds_cli.open_dataset("lazy")
    table = ds.episodes
    assert len(table) == 5 and table["length"].tolist() == LENGTHS and table.starts[-1] == 16
    assert table["source_id"].tolist() == list(range(5)) and table["final_known"].all()
    assert read == []  # opening and the index's columns: no column opened
    assert table.returns.tolist() == table["return"].tolist() == _returns_by_episode(ds)
    assert table.seeds is None and table.seed_present is None and "seed" not in table
    read.clear()
    table.returns, table.seeds, table.columns()  # kept: asked again, nothing is read
    assert read == []
    # no rewards to read: the index's columns still answer, the return names the damage
    (isolated_cache / "datasets" / "lazy" / "arrays" / "next" / "reward.npy").unlink()
    fresh = rlds_cli.open_dataset("lazy").episodes
    assert fresh["length"].tolist() == LENGTHS
    with pytest.raises(OSError):
        fresh["return"]


def test_a_table_taken_before_a_refresh_refuses_columns_of_the_new_view() -> None:
    with rlds_cli.DatasetWriter("moving") as w:
        w.add_episode(uid_episode(0, 3))
    ds = rlds_cli.open_dataset("moving")
    old = ds.episodes
    with rlds_cli.DatasetWriter("moving", mode="append") as w:
        w.add_episode(uid_episode(1, 4))
    assert ds.refresh() and ds.episodes is not old
    assert old.lengths.tolist() == [3] and ds.episodes.lengths.tolist() == [3, 4]  # the index: its own
    with pytest.raises(DatasetReplacedError, match="'moving' was refreshed to a new view") as info:
        old.column("return")  # would be summed over the new view's rows
    assert info.value.hint == "take ds.episodes again after refresh()"
    assert ds.episodes.returns.tolist() == [3.0, 4.0]


def test_the_seeds_of_a_view_whose_parent_is_gone(isolated_cache: Path) -> None:
    _seeded("gone", [2, 3], seeds=[1, 2], present=[True, True])
    create_view("gone", "gone-view", (1, 2))
    view = rlds_cli.open_dataset("gone-view")
    assert view.view_parent() is not None and rlds_cli.open_dataset("gone").view_parent() is None
    shutil.rmtree(isolated_cache / "datasets" / "gone")
    assert view.episodes["length"].tolist() == [3]  # the view's own index
    with pytest.raises(CorruptDatasetError, match="its parent dataset 'gone' is gone"):
        view.episodes.columns()


def test_minari_seeds_of_a_conversion_and_of_its_view() -> None:
    _seeded("mseed", [2, 3, 4, 1], seeds=[11, 0, 13, 14], present=[True, False, True, True])
    table = rlds_cli.open_dataset("mseed").episodes
    assert table.seeds is not None and table.seed_present is not None
    assert table.seeds.dtype == np.uint64 and table.seeds.tolist() == [11, 0, 13, 14]
    assert table.seed_present.tolist() == [True, False, True, True]
    assert set(table.columns()) >= {"seed", "seed_present"} and "seed" in table
    assert table["seed"] is table.seeds and table["seed_present"] is table.seed_present
    create_view("mseed", "mseed-tail", (1, 3))  # a view has no source arrays: its parent's rows
    part = rlds_cli.open_dataset("mseed-tail").episodes
    assert part.seeds is not None and part.seed_present is not None
    assert part.seeds.tolist() == [0, 13] and part.seed_present.tolist() == [False, True]
    create_selection("mseed", "mseed-pick", [3, 0])  # rlds split's random sets: the parent's order
    picked = rlds_cli.open_dataset("mseed-pick").episodes
    assert picked.seeds is not None and picked.seed_present is not None
    assert picked.seeds.tolist() == [11, 14] and picked.lengths.tolist() == [2, 1]


def test_seed_arrays_of_another_length_are_damage(isolated_cache: Path) -> None:
    _seeded("bad", [2, 3], seeds=[1, 2], present=[True, True])
    path = isolated_cache / "datasets" / "bad" / SOURCE_ARRAYS_FILE
    np.savez(path, minari__episode_seed=np.array([1, 2, 3], np.uint64),
             minari__episode_seed_present=np.ones(3, bool))  # fmt: skip
    ds = rlds_cli.Dataset(isolated_cache / "datasets" / "bad")  # the digest is not checked here
    with pytest.raises(
        CorruptDatasetError, match=r"'minari/episode_seed'.* 3 and 3 rows for 2 episodes"
    ) as info:
        ds.episodes.columns()
    assert ds.episodes["length"].tolist() == [2, 3]  # the index's columns read no source array
    assert "rlds verify bad" in (info.value.hint or "")


def test_a_growing_dataset_is_of_the_view_it_holds() -> None:
    with rlds_cli.DatasetWriter("grow", capacity=12, protected=True) as demo:
        demo.add_episode(uid_episode(100, 6))
    with rlds_cli.DatasetWriter("grow", mode="append") as w:
        for uid in range(3):
            w.add_episode(uid_episode(uid, 5))
    ds = rlds_cli.open_dataset("grow")
    table = ds.episodes
    # the demonstration, then the newest online episodes within 12 unprotected steps
    assert table.lengths.tolist() == [6, 5, 5] and table.starts.tolist() == [0, 6, 11]
    assert table.returns.tolist() == [6.0, 5.0, 5.0]  # uid_episode's reward is 1 a step
    # the episodes' numbers in the dataset (each segment's own places were 0, 1, 2 here)
    assert table.source_ids.tolist() == ds.episode_ids.tolist() == [0, 2, 3]
    assert_matches_index(table, ds)
    with rlds_cli.DatasetWriter("grow", mode="append") as w:
        w.add_episode(uid_episode(7, 2))
    again = ds.episodes  # no refresh: the same view, the same table
    assert again is table and again.lengths.tolist() == [6, 5, 5]
    ds.refresh()
    latest = ds.episodes
    assert latest is not table and table.returns.tolist() == [6.0, 5.0, 5.0]  # made: kept
    assert latest.lengths.tolist() == [6, 5, 5, 2] and latest.starts.tolist() == [0, 6, 11, 16]
    assert latest.source_ids.tolist() == [0, 2, 3, 4]
    assert_matches_index(latest, ds)


def test_an_empty_growing_dataset_has_an_empty_table() -> None:
    make_dataset("shape", [2])
    rlds_cli.DatasetWriter("empty", schema=rlds_cli.open_dataset("shape").fields).close()
    table = rlds_cli.open_dataset("empty").episodes
    assert len(table) == 0 and table.returns.shape == (0,) and table.seeds is None


def test_a_dataset_read_at_a_url() -> None:
    pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    make_dataset("z", LENGTHS, backend="zarr")
    url = "memory://bucket/tables/z"
    try:
        rlds_cli.push("z", url)
        remote = rlds_cli.open_dataset(url)
        table = remote.episodes
        local = rlds_cli.open_dataset("z").episodes
        for name, column in local.columns().items():
            np.testing.assert_array_equal(table.columns()[name], column, err_msg=name)
        assert_matches_index(table, remote)
        # and back into a cache under another name, with the same table
        assert rlds_cli.pull(url, "z-copy").downloaded > 0
        copy = rlds_cli.open_dataset("z-copy").episodes
        np.testing.assert_array_equal(copy.returns, local.returns)
    finally:
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]


def test_a_recording_has_its_seeds_and_env_spec() -> None:
    pytest.importorskip("gymnasium")
    ds = rlds_cli.record("CartPole-v1", None, name="cp", episodes=3, seed=5)
    table = ds.episodes
    assert table.seeds is not None and table.seed_present is not None
    assert table.seeds.tolist() == [5, 6, 7] and table.seed_present.all()
    assert table.env_spec is not None and table.env_spec.id == "CartPole-v1"
    assert table.returns.tolist() == table.lengths.astype(float).tolist()  # CartPole: 1 a step
    assert_matches_index(table, ds)


def test_the_front_door_names() -> None:
    from rlds_cli.recording.recorder import recording_writer
    from rlds_cli.remote.pull import pull
    from rlds_cli.remote.push import push

    assert rlds_cli.push is push and rlds_cli.pull is pull
    assert rlds_cli.recording_writer is recording_writer
    assert rlds_cli.EpisodeTable is EpisodeTable
    assert {"push", "pull", "recording_writer", "EpisodeTable"} <= set(rlds_cli.__all__)


def test_record_into_a_buffer_with_capacity_and_protected_demonstrations(isolated_cache: Path) -> None:
    pytest.importorskip("gymnasium")
    demos = rlds_cli.record(
        "CartPole-v1", None, name="buf", episodes=2, seed=0, capacity=100, min_size=30, protected=True
    )
    assert demos.num_steps > 0 and not demos.ready  # min_size counts unprotected steps: none yet
    ds = rlds_cli.record("CartPole-v1", None, name="buf", steps=300, seed=100, mode="append")
    growth = ds.growth()
    assert growth["protected_episodes"] == 2 and growth["evicted_episodes"] > 0
    assert (growth["capacity"], growth["min_size"], growth["min_total"]) == (100, 30, 0)
    table = ds.episodes
    assert table.seeds is not None and table.seeds[:2].tolist() == [0, 1]  # the demonstrations stay
    online = ds.num_steps - int(table.lengths[:2].sum())
    assert 30 <= online <= 100 and ds.ready
    head = json.loads((isolated_cache / "datasets" / "buf" / "manifest.json").read_text())
    assert head["source"]["growing"]["min_total"] == 0


def test_record_refuses_a_bad_capacity_before_writing(isolated_cache: Path) -> None:
    pytest.importorskip("gymnasium")
    with pytest.raises(ValueError, match="capacity must be a whole number above 0"):
        rlds_cli.record("CartPole-v1", None, name="nope", episodes=1, capacity=0)
    assert not (isolated_cache / "datasets" / "nope").exists()


def test_returns_of_infinite_rewards_are_nan_without_a_warning(tmp_path: Path) -> None:
    """inf + -inf in one episode printed numpy's 'invalid value encountered in reduceat' under
    'rlds inspect' (the library never prints); the return is NaN, as the data say."""
    import warnings

    from rlds_cli.cache.episode_table import episode_returns
    from tests.loader_fixtures import make_ted

    ds = make_ted(tmp_path, "x", [3, 4])
    path = ds.directory / "arrays" / "next" / "reward.npy"
    rewards = np.load(path)
    rewards[0], rewards[1], rewards[3] = np.inf, -np.inf, 2.0
    np.save(path, rewards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        returns = episode_returns(Dataset(ds.directory))
    assert np.isnan(returns[0]) and returns[1] == rewards[3:].sum()
