"""Views of any episodes: index lists, ``--where`` predicates, ``Loader(NAME, episodes=...)``
(a view never published), splits by named episodes; a view equals its materialized copy."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import SelectedDataset, create_selection, select_episodes, selection, split_dataset
from rlds_cli.cache.episode_table import parse_episode_list, select_where
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.ted import StepBlock
from rlds_cli.cli.app import app
from rlds_cli.errors import InvalidSelectionError
from rlds_cli.inspection.summary import describe
from tests.loader_fixtures import make_ted

pytestmark = pytest.mark.usefixtures("consoles")
runner = CliRunner()
LENGTHS = [5, 6, 7, 8, 9, 10, 11, 12, 3, 4]


@pytest.fixture
def ted(isolated_cache: Path) -> Dataset:
    isolated_cache.mkdir(parents=True, exist_ok=True)
    return make_ted(isolated_cache, "ted", LENGTHS)


# ----------------------------------------------------------------------------- index lists


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("0,5,9-20", [0, 5, *range(9, 21)]), ("3", [3]), ("-1,0", [0, 29]), ("4-4, 2", [2, 4]), ("1,1,1", [1])],
)
def test_index_lists(spec: str, expected: list[int]) -> None:
    assert parse_episode_list(spec, 30).tolist() == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0,30", "episode 30 in '0,30' is outside the dataset's 30 episodes"),
        ("5-2", "runs backwards"),
        ("1,x", "'x' in --episodes '1,x' is no episode position or range"),
        (",", "selects no episode"),
        ("-31", "outside"),
    ],
)
def test_bad_index_lists(spec: str, message: str) -> None:
    with pytest.raises(InvalidSelectionError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_episode_list(spec, 30)


# ----------------------------------------------------------------------------- --where


def test_where_over_the_episode_table(ted: Dataset) -> None:
    table = ted.episodes
    lengths, returns = np.asarray(table["length"]), np.asarray(table["return"])
    cases = {
        "length >= 8": lengths >= 8,
        "length >= 8 and return > 300": (lengths >= 8) & (returns > 300),
        "length < 5 or not (return <= 100)": (lengths < 5) | ~(returns <= 100),
        "return / length > 2 * 10 + 0.5": returns / lengths > 20.5,
        "episode == 3 or episode != episode": np.arange(len(lengths)) == 3,
        "-length < -10": -lengths < -10,
        "1e1 <= length": lengths >= 10,
        # numbers divided by zero are numpy's (inf, nan), as columns are: it was ZeroDivisionError
        "1/0 > length": lengths == lengths,
        "0/0 == 0 or length / 0 < 0": lengths < 0,
    }
    for text, mask in cases.items():
        assert select_where(text, table).tolist() == np.flatnonzero(mask).tolist(), text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lenght > 3", "no column 'lenght'; the columns are"),
        ("length >", "it ends too early"),
        ("length > 3 )", "')' at token 4 does not belong there"),
        ("length ** 2 > 1", "'*' at token 3 is no number, column or '('"),
        ("(length > 3", "a '(' is not closed"),
        ("length $ 3", "cannot read '$ 3'"),
        ("length + 1", "is a number, not a condition"),
        ("1 < length < 5", "chained comparisons"),
        ("", "the predicate is empty"),
        ("__import__('os')", "cannot read"),
    ],
)
def test_bad_predicates_are_one_line_errors(ted: Dataset, text: str, message: str) -> None:
    with pytest.raises(InvalidSelectionError) as info:
        select_where(text, ted.episodes)
    assert message in str(info.value) and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- a view equals its copy


def _materialize(parent: Dataset, ids: list[int], name: str, root: Path) -> Dataset:
    """The episodes ``ids`` of ``parent`` written out as a dataset of their own."""
    with DatasetBuilder(name, root=root, replace=True) as builder:
        for i in ids:
            e = parent.episode(i)
            n = len(e["action"])
            obs = np.concatenate([e["observation"], e["next", "observation"][-1:]])
            steps = {
                k: np.asarray(e[k]) for k in ("action", "next/reward", "next/terminated", "next/truncated")
            }
            builder.append(StepBlock(steps=steps, observations={"observation": obs}, ends=np.array([n - 1])))
        builder.commit(source={"generator": "materialized"})
    return open_dataset(name, root)


def _assert_same(view: Dataset, copy: Dataset) -> None:
    assert (view.num_steps, view.num_episodes) == (copy.num_steps, copy.num_episodes)
    a, b = view[:], copy[:]
    for key in (
        "observation",
        ("next", "observation"),
        "action",
        ("next", "reward"),
        ("next", "done"),
        "episode",
    ):
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=str(key))
    np.testing.assert_array_equal(view.episodes["length"], copy.episodes["length"])
    np.testing.assert_array_equal(view.episodes["return"], copy.episodes["return"])
    da, db = describe(view), describe(copy)
    for field in (
        "num_steps",
        "episode_length",
        "episode_return",
        "episodes_terminated",
        "episodes_truncated",
    ):
        assert da[field] == db[field], field
    for key in ("observation", "action", "next/reward"):
        assert da["stored"][key]["stats"] == db["stored"][key]["stats"], key


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.sets(st.integers(0, len(LENGTHS) - 1), min_size=1))
def test_a_view_equals_its_materialized_copy(ted: Dataset, isolated_cache: Path, chosen: set[int]) -> None:
    ids = sorted(chosen)
    create_selection("ted", "chosen", ids, replace=True)
    copy = _materialize(ted, ids, "copy", isolated_cache)
    _assert_same(open_dataset("chosen"), copy)
    _assert_same(select_episodes(ted, ids), copy)  # the view a loader makes on the fly


def test_inspect_of_a_view_shows_its_own_statistics(ted: Dataset) -> None:
    runner.invoke(app, ["view", "ted", "--episodes", "1,3,8-9", "--name", "v"])
    data = json.loads(runner.invoke(app, ["inspect", "v", "--json"]).output)
    lengths = [LENGTHS[i] for i in (1, 3, 8, 9)]
    assert data["num_steps"] == sum(lengths) and data["episode_length"]["max"] == max(lengths)
    assert data["stored"]["action"]["rows"] == sum(lengths)


# ----------------------------------------------------------------------------- the loader's selection


def test_loader_samples_only_the_chosen_episodes(ted: Dataset) -> None:
    from rlds_cli.loader import Loader

    loader = Loader("ted", batch_size=128, seed=0, episodes=[7, 2], keys=["observation", "episode"])
    assert isinstance(loader.dataset, SelectedDataset) and loader.num_steps == LENGTHS[2] + LENGTHS[7]
    batch = loader.sample()
    parent_episode = np.asarray(batch["observation"])[:, 1]  # make_ted: obs[1] is the episode
    assert set(parent_episode.tolist()) == {2.0, 7.0}
    assert set(np.asarray(batch["episode"]).tolist()) == {0, 1}
    assert Loader("ted", batch_size=4, seed=0, episodes="0,8-9").num_steps == 5 + 3 + 4
    assert not (ted.directory.parent / "ted[2 episodes]").exists()  # nothing published


def test_selection_pickles_and_refuses_bad_positions(ted: Dataset) -> None:
    chosen = select_episodes(ted, [0, 4])
    again = pickle.loads(pickle.dumps(chosen))
    np.testing.assert_array_equal(again[:]["observation"], chosen[:]["observation"])
    assert chosen.size_bytes() == 0
    nested = select_episodes(open_dataset("ted"), [1, 3, 5])
    create_selection("ted", "some", [1, 3, 5, 7])
    of_view = select_episodes(open_dataset("some"), [1, 2])  # the view's episodes 1, 2: the parent's 3, 5
    np.testing.assert_array_equal(of_view[:]["observation"], nested[LENGTHS[1] :]["observation"])
    with pytest.raises(InvalidSelectionError, match="outside"):
        select_episodes(ted, [0, 10])
    with pytest.raises(InvalidSelectionError, match="given twice"):
        select_episodes(ted, [1, 1])
    with pytest.raises(InvalidSelectionError, match="integers"):
        select_episodes(ted, [0.5])


def test_selection_takes_episodes_or_a_filter_key(ted: Dataset) -> None:
    """``selection``: exactly one of ``episodes`` and ``filter_key`` (the Loader's, the views')."""
    np.testing.assert_array_equal(
        selection(ted, episodes="1,3", filter_key=None)[:]["observation"],
        select_episodes(ted, [1, 3])[:]["observation"],
    )
    with pytest.raises(ValueError, match="not both"):
        selection(ted, episodes=[1], filter_key="train")
    with pytest.raises(ValueError, match="give episodes= or filter_key="):
        selection(ted, episodes=None, filter_key=None)
    with pytest.raises(InvalidSelectionError, match="train"):  # a dataset without filter keys
        selection(ted, episodes=None, filter_key="train")


# ----------------------------------------------------------------------------- the CLI


def test_view_by_list_and_predicate(ted: Dataset) -> None:
    result = runner.invoke(app, ["view", "ted", "--episodes", "0,2,5-7", "--name", "a", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["num_episodes"] == 5
    assert open_dataset("a").episodes["length"].tolist() == [5, 7, 10, 11, 12]
    result = runner.invoke(app, ["view", "ted", "--where", "length >= 9 and length < 12", "--name", "b"])
    assert result.exit_code == 0 and open_dataset("b").episodes["length"].tolist() == [9, 10, 11]
    runner.invoke(app, ["view", "ted", "--episodes", "4:", "--where", "length > 8", "--name", "c"])
    assert open_dataset("c").episodes["length"].tolist() == [9, 10, 11, 12]
    result = runner.invoke(app, ["view", "ted", "--episodes", "2:4", "--name", "d"])  # ranges as before
    assert result.exit_code == 0 and open_dataset("d").manifest.source["episodes"] == [2, 4]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--episodes", "0,99"], "episode 99 in '0,99' is outside"),
        (["--where", "length > 100"], "holds for no episode of 'ted'"),
        (["--where", "size > 1"], "no column 'size'"),
        ([], "say which episodes"),
    ],
)
def test_view_errors(ted: Dataset, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["view", "ted", "--name", "x", *args])
    assert result.exit_code in (1, 2) and message in result.output, result.output
    assert not (ted.directory.parent / "x").exists()


def test_split_by_named_episodes(ted: Dataset) -> None:
    result = runner.invoke(app, ["split", "ted", "--val-episodes", "0,3-4", "--json"])
    assert result.exit_code == 0, result.output
    train, val = open_dataset("ted-train"), open_dataset("ted-val")
    assert val.episodes["length"].tolist() == [5, 8, 9]
    assert train.num_episodes == len(LENGTHS) - 3
    t2, v2 = split_dataset("ted", val_episodes=[1], train_name="t2", val_name="v2")
    assert (t2.num_episodes, v2.num_episodes) == (len(LENGTHS) - 1, 1)
    with pytest.raises(InvalidSelectionError, match="nothing is left for training"):
        split_dataset("ted", val_episodes="0-9", train_name="t3", val_name="v3")
    with pytest.raises(InvalidSelectionError, match="either a validation fraction or"):
        split_dataset("ted", 0.5, val_episodes=[1])
    result = runner.invoke(app, ["split", "ted", "--val", "0.2", "--val-episodes", "1", "--name", "z"])
    assert result.exit_code == 2 and "either --val FRACTION or --val-episodes" in result.output
    result = runner.invoke(app, ["split", "ted", "--val-episodes", "1", "--last", "--name", "z"])
    assert result.exit_code == 2 and "--last picks episodes for --val" in result.output


def test_loader_episodes_need_a_dataset(ted: Dataset) -> None:
    from rlds_cli.loader import Loader
    from rlds_cli.loader.mixture import MixtureSource

    source = MixtureSource({"a": ted, "b": ted})
    with pytest.raises(ValueError, match="episodes= and filter_key= select episodes of a dataset"):
        Loader(source, batch_size=4, seed=0, episodes=[0])


def test_a_where_selection_refuses_a_parent_whose_rewards_are_damaged(isolated_cache: Path) -> None:
    """A selection by the data (``return > 1000``) was made from a reward changed on disk: the view
    held the wrong episode, and verify passed on it once the file was put back."""
    from tests.dataset_fixtures import make_dataset

    make_dataset("d", [3, 5, 2, 6, 4])
    path = open_dataset("d").directory / "arrays" / "next" / "reward.npy"
    rewards = np.load(path, mmap_mode="r+")
    rewards[0] = rewards[0] + 1e6
    rewards.flush()
    del rewards
    result = runner.invoke(app, ["view", "d", "--where", "return > 1000", "--name", "w"])
    assert result.exit_code == 1
    assert "'next/reward'" in result.stderr and "content changed since it was written" in result.stderr
    assert not (isolated_cache / "datasets" / "w").exists()
    assert (
        runner.invoke(app, ["view", "d", "--episodes", "0:2", "--name", "v"]).exit_code == 0
    )  # reads no data
