"""Views (``rlds view``, ``rlds split``) and conversion-time subsets (``--episodes``, ``--keys``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import create_view, split_dataset
from rlds_cli.cache.manage import remove_dataset
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.views import ViewSpec, parse_episode_range
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError, DatasetExistsError, DatasetInUseError, InvalidSelectionError
from rlds_cli.loader import Loader
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


def _ten_episodes(path: Path) -> Path:
    """10 episodes of lengths 3..12 (timeouts), with next_observations; obs row i = [i, -i]."""
    lengths = np.arange(3, 13)
    n = int(lengths.sum())
    obs = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32)
    timeouts = np.zeros(n, bool)
    timeouts[np.cumsum(lengths) - 1] = True
    nxt = obs + 0.5
    nxt[:-1][~timeouts[:-1]] = obs[1:][~timeouts[:-1]]
    return write_d4rl(
        path,
        observations=obs,
        actions=np.arange(n, dtype=np.float32)[:, None],
        rewards=np.ones(n, np.float32),
        terminals=np.zeros(n, bool),
        timeouts=timeouts,
        next_observations=nxt,
        infos={"t": np.arange(n, dtype=np.int64)},
    )


@pytest.fixture(params=["memmap", "zarr"])
def parent(request: pytest.FixtureRequest, tmp_path: Path) -> Dataset:
    convert(_ten_episodes(tmp_path / "ten.hdf5"), "ten", backend=request.param)
    return open_dataset("ten")


def _expect_same(view: Dataset, parent: Dataset, first: int | list[int]) -> None:
    """Each episode of ``view`` is the parent's ``first + i`` (or, for a list, its ``i``-th)."""
    ids = first if isinstance(first, list) else [first + i for i in range(view.num_episodes)]
    assert len(ids) == view.num_episodes
    for i in range(view.num_episodes):
        mine, theirs = view.episode(i), parent.episode(ids[i])
        assert sorted(mine) == sorted(theirs)
        for key in mine:
            if key != "episode":
                np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


def test_view_reads_the_parents_episodes(parent: Dataset) -> None:
    manifest = create_view("ten", "mid", (2, 5))
    assert (manifest.num_episodes, manifest.num_steps) == (3, 5 + 6 + 7)
    view = open_dataset("mid")
    assert view.episodes["start"].tolist() == [0, 5, 11]
    assert view.episodes["source_id"].tolist() == [2, 3, 4]
    _expect_same(view, parent, 2)
    batch = view.gather(np.array([0, 4, 5, 17, -1]))
    assert batch["episode"].tolist() == [0, 0, 1, 2, 2]
    assert batch["info/t"].tolist() == [7, 11, 12, 24, 24]
    np.testing.assert_array_equal(batch["next/observation"][1], [11.5, -10.5])  # final obs of episode 2
    assert list(CacheRoot().dataset_dir("mid").iterdir()) != []
    assert not (CacheRoot().dataset_dir("mid") / "arrays").exists()  # nothing copied


def test_view_works_with_every_loader_mode(parent: Dataset) -> None:
    create_view("ten", "tail", (7, 10))
    view = open_dataset("tail")
    for kwargs in ({}, {"in_memory": True}, {"sampler": "slice", "slice_len": 4, "num_slices": 2}):
        batch = Loader(view, batch_size=8, seed=1, **kwargs).sample()
        index = batch["index"].numpy().reshape(-1)
        expected = view.gather(index)
        np.testing.assert_array_equal(
            batch["next/observation"].numpy().reshape(len(index), -1), expected["next/observation"]
        )


def test_view_of_a_view_points_at_the_stored_arrays(parent: Dataset) -> None:
    create_view("ten", "outer", (1, 9))
    manifest = create_view("outer", "inner", (2, 4))
    assert manifest.source["parent"] == "ten" and manifest.source["episodes"] == [3, 5]
    _expect_same(open_dataset("inner"), parent, 3)


def test_a_selection_of_a_view_says_which_view_its_words_count_in(parent: Dataset) -> None:
    from rlds_cli.cache.derive import create_selection

    create_selection("ten", "v1", [0, 2, 4], how="episodes 0,2,4")
    manifest = create_selection("v1", "vv", [0, 2], how="episodes 0,2")
    assert manifest.source["parent"] == "ten" and manifest.source["episode_ids"] == [0, 4]
    assert manifest.source["selection"] == manifest.lineage[0]["selection"] == "episodes 0,2 of view 'v1'"
    _expect_same(open_dataset("vv"), parent, [0, 4])


def test_split_last(parent: Dataset) -> None:
    train, val = split_dataset("ten", 0.2, last=True)
    assert (train.name, val.name) == ("ten-train", "ten-val")
    assert (train.num_episodes, val.num_episodes) == (8, 2)
    assert train.num_steps + val.num_steps == parent.num_steps
    _expect_same(open_dataset("ten-val"), parent, 8)


def _ids(manifest: Manifest) -> list[int]:
    """The parent's episodes a view holds (a range's or a selection's)."""
    return ViewSpec.from_manifest(manifest).parent_episodes().tolist()


def test_split_draws_the_validation_episodes_at_random(parent: Dataset) -> None:
    """The default split is a seeded random set (it took the last episodes: a dataset ordered by
    time or policy was split unevenly); each view holds its episodes in the parent's order and
    reads exactly the parent's rows, next observations at episode ends included."""
    train, val = split_dataset("ten", 0.3)
    val_ids, train_ids = _ids(val), _ids(train)
    assert len(val_ids) == 3 and sorted(val_ids + train_ids) == list(range(10))
    assert val_ids != [7, 8, 9] and val_ids == sorted(val_ids)
    assert "drawn at random (seed 0)" in val.source["selection"]
    _expect_same(open_dataset("ten-val"), parent, val_ids)
    _expect_same(open_dataset("ten-train"), parent, train_ids)
    assert train.num_steps + val.num_steps == parent.num_steps
    batch = Loader("ten-val", batch_size=15, seed=0, sampler="slice", slice_len=3).sample()
    assert batch["observation"].shape == (5, 3, 2) and batch["mask"].all()  # no episode under 3 steps
    # a slice never crosses an episode: observation rows are consecutive steps of the parent
    obs = batch["observation"][..., 0]
    assert ((obs[:, 1:] - obs[:, :-1]) == 1).all()
    # the same seed, the same split; another seed, another
    assert _ids(split_dataset("ten", 0.3, replace=True)[1]) == val_ids
    assert _ids(split_dataset("ten", 0.3, seed=1, replace=True)[1]) != val_ids
    # a view of a selection points at the parent's episodes
    inner = create_view("ten-train", "inner", (1, 3))
    assert inner.source["parent"] == "ten"
    _expect_same(open_dataset("inner"), parent, train_ids[1:3])


def test_split_on_the_command_line_takes_seed_and_last(parent: Dataset) -> None:
    drawn = runner.invoke(app, ["split", "ten", "--val", "0.2", "--seed", "3", "--json"])
    assert drawn.exit_code == 0, drawn.output
    rows = json.loads(drawn.stdout)
    assert rows[1]["selection"] == "2 of 10 episodes, drawn at random (seed 3)"
    assert (
        open_dataset("ten-val").manifest.source["episode_ids"]
        == split_dataset("ten", 0.2, seed=3, replace=True)[1].source["episode_ids"]
    )
    last = runner.invoke(app, ["split", "ten", "--val", "0.2", "--last", "--force", "--json"])
    assert last.exit_code == 0, last.output
    assert [r["episodes"] for r in json.loads(last.stdout)] == [[0, 8], [8, 10]]
    text = runner.invoke(app, ["split", "ten", "--val", "0.2", "--force"]).stdout
    assert "ten-val: 2 of 10 episodes, drawn at random (seed 0) of ten (2 episodes" in " ".join(text.split())


def test_a_selection_must_name_distinct_episodes_of_the_parent(parent: Dataset) -> None:
    from rlds_cli.cache.derive import create_selection

    for ids, got in (
        ([], "none"),
        ([10, 0], "2 from 0 to 10"),
        ([-3, -1], "2 from -3 to -1"),
        ([2, 2], "2 from 2 to 2"),
    ):
        with pytest.raises(
            InvalidSelectionError, match=f"(?m)needs distinct episode positions from 0 to 9, got {got}$"
        ):
            create_selection("ten", "bad", ids)
    assert not CacheRoot().exists("bad")
    assert _ids(create_selection("ten", "two", [7, 2])) == [2, 7]  # the parent's order
    _expect_same(open_dataset("two"), parent, [2, 7])


def test_parent_is_protected_and_changes_are_detected(parent: Dataset, tmp_path: Path) -> None:
    create_view("ten", "v", (0, 2))
    with pytest.raises(DatasetInUseError):
        remove_dataset(CacheRoot(), "ten")
    # a forced rebuild of the parent (different content) invalidates the view
    convert(_ten_episodes(tmp_path / "again.hdf5"), "ten", force=True, options={"block_rows": 7})
    with pytest.raises(CorruptDatasetError, match="was replaced since it was made"):
        open_dataset("v")[:]
    remove_dataset(CacheRoot(), "ten", force=True)
    with pytest.raises(CorruptDatasetError, match="parent dataset 'ten' is gone"):
        open_dataset("v")[:]


def test_bad_selections(parent: Dataset) -> None:
    with pytest.raises(InvalidSelectionError, match="outside dataset 'ten' with 10 episodes"):
        create_view("ten", "x", (5, 11))
    with pytest.raises(InvalidSelectionError, match="selects no episode"):
        parse_episode_range("4:4", 10)
    with pytest.raises(InvalidSelectionError, match="not of the form A:B"):
        parse_episode_range("4", 10)
    assert parse_episode_range("-3:", 10) == (7, 10)
    with pytest.raises(InvalidSelectionError, match="between 0 and 1"):
        split_dataset("ten", 1.5)
    create_view("ten", "taken", (0, 1))
    with pytest.raises(DatasetExistsError):
        create_view("ten", "taken", (1, 2))
    create_view("ten", "taken", (1, 2), replace=True)
    assert open_dataset("taken").episodes["source_id"].tolist() == [1]


def test_cli_view_and_split(parent: Dataset) -> None:
    result = runner.invoke(app, ["view", "ten", "--name", "last3", "--episodes", "-3:", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["episodes"] == [7, 10]
    result = runner.invoke(app, ["split", "ten", "--val", "0.3"])
    assert result.exit_code == 0, result.output
    assert "ten-train" in result.stdout and "ten-val" in result.stdout
    one = runner.invoke(app, ["view", "ten", "--name", "y", "--episodes", "3", "--json"])
    assert one.exit_code == 0 and json.loads(one.stdout)["num_episodes"] == 1  # a list of one
    bad = runner.invoke(app, ["view", "ten", "--name", "z", "--episodes", "3x"])
    assert bad.exit_code == 1
    assert bad.stderr.splitlines()[0] == "error: '3x' in --episodes '3x' is no episode position or range"


def test_download_subset(tmp_path: Path) -> None:
    src = _ten_episodes(tmp_path / "ten.hdf5")
    convert(src, "all")
    convert(src, "some", options={"episodes": "2:4", "keys": ["observation"], "block_rows": 5})
    some, everything = open_dataset("some"), open_dataset("all")
    assert some.num_episodes == 2
    assert some.episodes["source_id"].tolist() == [2, 3]
    assert sorted(some.stored_fields) == [
        "action",
        "next/reward",
        "next/terminated",
        "next/truncated",
        "observation",
    ]
    _expect_same_keys = ["observation", "next/observation", "action", "next/reward", "next/done"]
    for i in range(2):
        for key in _expect_same_keys:
            np.testing.assert_array_equal(some.episode(i)[key], everything.episode(2 + i)[key], err_msg=key)
    assert some.manifest.source["options"]["episodes"] == "2:4"


def test_cli_download_subset_errors(tmp_path: Path) -> None:
    src = str(_ten_episodes(tmp_path / "ten.hdf5"))
    ok = runner.invoke(
        app, ["download", src, "--name", "s", "--episodes", "8:", "--keys", "info/t", "--json"]
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["num_steps"] == 11 + 12
    assert sorted(open_dataset("s").stored_fields) == [
        "action",
        "info/t",
        "next/reward",
        "next/terminated",
        "next/truncated",
        "observation",
    ]
    for args, first in (
        (
            ["--episodes", "4:2"],
            "error: episode range '4:2' must be A:B with 0 <= A < B (B empty: to the end)",
        ),
        (["--keys", "nope"], "error: --keys names nope, which the source does not have"),
    ):
        result = runner.invoke(app, ["download", src, "--name", "bad", *args])
        assert result.exit_code == 1
        assert result.stderr.splitlines()[0] == first
        assert not CacheRoot().exists("bad")
