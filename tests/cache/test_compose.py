"""Merge, drop, trim and downsample (cache/compose.py, composed.py, drop.py, downsample.py): the
results read as their parents' episodes, pass the TED checks, and every refusal is one clear error."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlds_cli.cache import CacheRoot, DatasetBuilder, open_dataset
from rlds_cli.cache.compose import downsample_dataset, merge_datasets, trim_dataset
from rlds_cli.cache.composed import ComposedDataset
from rlds_cli.cache.derive import create_selection, create_view, drop_episodes, split_dataset
from rlds_cli.cache.episode_table import parse_episode_list
from rlds_cli.cache.layout import COMPOSED_LAYOUT
from rlds_cli.cache.manage import remove_dataset
from rlds_cli.cache.ted import StepBlock
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetExistsError,
    DatasetInUseError,
    InvalidSelectionError,
    SchemaMismatchError,
)
from rlds_cli.inspection.validate import check_dataset
from tests.loader_fixtures import make_ted


def root() -> Path:
    """The test's cache root (made: the source files are written there first)."""
    home = Path(os.environ["RLDS_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    return home


def everything(ds: object, episode: int) -> dict[str, np.ndarray]:
    """Every TED key of one episode, but ``episode`` (its position differs by design)."""
    return {k: np.asarray(v) for k, v in ds.episode(episode).items() if k != "episode"}  # type: ignore[attr-defined]


def assert_same_episodes(ds: object, pairs: list[tuple[object, int]]) -> None:
    assert ds.num_episodes == len(pairs)  # type: ignore[attr-defined]
    for i, (parent, e) in enumerate(pairs):
        got, want = everything(ds, i), everything(parent, e)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"episode {i} key {key}")


def write_block(
    name: str,
    obs_dtype: str = "float32",
    obs_dim: int = 3,
    lengths: tuple[int, ...] = (2, 3),
    replace: bool = False,
) -> None:
    """A dataset of ``lengths`` with observations of that dtype and width."""
    n = sum(lengths)
    ends = np.cumsum(lengths) - 1
    term = np.zeros(n, bool)
    term[ends] = True
    rows = n + len(lengths)
    block = StepBlock(
        steps={
            "action": np.zeros((n, 2), np.float32),
            "next/reward": np.ones(n, np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(n, bool),
        },
        observations={"observation": np.zeros((rows, obs_dim), obs_dtype)},
        ends=ends,
    )
    with DatasetBuilder(name, replace=replace) as builder:
        builder.append(block)
        builder.commit()


@pytest.fixture
def ab() -> tuple[object, object]:
    return make_ted(root(), "a", [3, 4, 5]), make_ted(root(), "b", [2, 6])


def test_merge_reads_the_parents_episodes_in_order_and_copies_nothing(ab: tuple[object, object]) -> None:
    a, b = ab
    manifest = merge_datasets(["a", "b"], "c")
    c = open_dataset("c")
    assert isinstance(c, ComposedDataset) and manifest.layout == COMPOSED_LAYOUT
    assert (c.num_steps, c.num_episodes) == (20, 5)
    assert_same_episodes(c, [(a, 0), (a, 1), (a, 2), (b, 0), (b, 1)])
    assert sorted(p.name for p in (CacheRoot().dataset_dir("c")).iterdir()) == [
        "episodes.npy",
        "manifest.json",
    ]
    assert check_dataset(c).ok
    assert [p["name"] for p in manifest.lineage] == ["a", "b"]
    # random gathers across the parents' boundary read the right rows
    idx = np.array([19, 0, 12, 11, 3])
    whole = c[:]
    got = c.gather(idx)
    for key in ("observation", "next/observation", "next/reward", "next/done", "episode"):
        np.testing.assert_array_equal(got[key], np.asarray(whole[key])[idx])


def test_a_merged_dataset_pins_its_parents(ab: tuple[object, object]) -> None:
    merge_datasets(["a", "b"], "c")
    with pytest.raises(DatasetInUseError, match="parent of c"):
        remove_dataset(CacheRoot(), "a")
    write_block("a", replace=True)  # 'a' replaced by another dataset
    with pytest.raises(CorruptDatasetError, match="'a' was replaced"):
        open_dataset("c")


def test_merge_refusals(ab: tuple[object, object]) -> None:
    with pytest.raises(InvalidSelectionError, match="two datasets or more"):
        merge_datasets(["a"], "c")
    with pytest.raises(InvalidSelectionError, match="'a' is named twice"):
        merge_datasets(["a", "a"], "c")
    write_block("wide", obs_dim=4)
    with pytest.raises(
        SchemaMismatchError, match=r"key 'observation' has shape \(3,\) in 'a' and \(4,\) in 'wide'"
    ):
        merge_datasets(["a", "wide"], "c")
    write_block("f64", obs_dtype="float64")
    with pytest.raises(
        SchemaMismatchError, match="key 'observation' has dtype float32 in 'a' and float64 in 'f64'"
    ):
        merge_datasets(["a", "f64"], "c")
    merge_datasets(["a", "b"], "c")
    with pytest.raises(DatasetExistsError):
        merge_datasets(["a", "b"], "c")
    assert merge_datasets(["b", "a"], "c", replace=True).num_episodes == 5
    assert not CacheRoot().exists("x")


def test_merge_verifies_the_parents_digests(ab: tuple[object, object]) -> None:
    path = CacheRoot().dataset_dir("b") / "arrays" / "action.npy"
    data = np.load(path)
    data[1] += 1
    np.save(path, data)
    with pytest.raises(CorruptDatasetError, match=r"dataset 'b' is damaged: 'action'"):
        merge_datasets(["a", "b"], "c")
    assert not CacheRoot().exists("c")
    merge_datasets(["a", "b"], "c", verify=False)  # asked not to read them: made
    assert not check_dataset(open_dataset("c")).ok  # and --check finds the damage
    # a missing or short file is found without reading any: refused even so (it was published)
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 4)
    with pytest.raises(CorruptDatasetError, match=r"dataset 'b' cannot be read: array file .*action.npy"):
        merge_datasets(["a", "b"], "d", verify=False)
    path.unlink()
    with pytest.raises(CorruptDatasetError, match=r"dataset 'b' cannot be read: .*action.npy is missing"):
        merge_datasets(["a", "b"], "d", verify=False)
    assert not CacheRoot().exists("d")


def test_merge_of_a_growing_dataset_is_refused(ab: tuple[object, object]) -> None:
    from rlds_cli import DatasetWriter

    with DatasetWriter("g") as writer:
        writer.add_episode(
            {
                "observation": np.arange(6, dtype=np.float32).reshape(2, 3),
                "next/observation": np.arange(3, 9, dtype=np.float32).reshape(2, 3),
                "action": np.zeros((2, 2), np.float32),
                "next/reward": np.zeros(2, np.float32),
                "next/terminated": np.array([False, True]),
                "next/truncated": np.zeros(2, bool),
            }
        )
    with pytest.raises(InvalidSelectionError, match="'g' is a growing dataset"):
        merge_datasets(["a", "g"], "c")


def test_views_and_merges_merge_and_views_of_merges_read_through(ab: tuple[object, object]) -> None:
    a, b = ab
    create_view("a", "a12", (1, 3))
    merge_datasets(["a12", "b"], "c")
    merge_datasets(["c", "a"], "cc")  # a merge of a merge
    cc = open_dataset("cc")
    assert_same_episodes(cc, [(a, 1), (a, 2), (b, 0), (b, 1), (a, 0), (a, 1), (a, 2)])
    create_view("cc", "v", (2, 5))  # a view of a composed dataset is a composed selection
    v = open_dataset("v")
    assert v.manifest.layout == COMPOSED_LAYOUT
    assert_same_episodes(v, [(b, 0), (b, 1), (a, 0)])
    assert check_dataset(v).ok and check_dataset(cc).ok


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
)
def test_merge_then_split_back_is_the_identity(first: list[int], second: list[int]) -> None:
    cache = CacheRoot()
    for name in ("p", "q", "m", "back-p", "back-q"):
        if cache.exists(name):
            remove_dataset(cache, name, force=True)
    p, q = make_ted(root(), "p", first), make_ted(root(), "q", second)
    merge_datasets(["p", "q"], "m")
    n = len(first)
    create_selection("m", "back-p", np.arange(n))
    drop_episodes("m", np.arange(n), "back-q")
    for back, parent in (("back-p", p), ("back-q", q)):
        ds = open_dataset(back)
        assert ds.num_steps == parent.num_steps  # type: ignore[attr-defined]
        np.testing.assert_array_equal(ds.episode_index, parent.episode_index)  # type: ignore[attr-defined]
        got, want = ds[:], parent[:]  # type: ignore[index]
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_drop_makes_a_selection_view(ab: tuple[object, object]) -> None:
    a, _ = ab
    manifest = drop_episodes("a", parse_episode_list("0,2", 3), "a1")
    assert manifest.layout == "view" and "without 2 of 3 episodes (0,2)" in manifest.source["selection"]
    assert_same_episodes(open_dataset("a1"), [(a, 1)])
    with pytest.raises(InvalidSelectionError, match="would leave dataset 'a' with none"):
        drop_episodes("a", [0, 1, 2], "x")
    with pytest.raises(InvalidSelectionError, match="episode 3 is outside dataset 'a'"):
        drop_episodes("a", [3], "x")
    with pytest.raises(InvalidSelectionError, match="no episode to drop"):
        drop_episodes("a", [], "x")


@pytest.mark.usefixtures("ab")
def test_a_boolean_mask_selects_its_true_episodes_and_floats_are_refused() -> None:
    """A mask (``ds.episodes["length"] < 4``) was read as positions 0 and 1 (dropping the wrong
    episodes, exit 0), and a position 1.7 was cut to 1; numpy ints broke trim's manifest."""
    short = open_dataset("a").episodes["length"] < 4  # [True, False, False]
    drop_episodes("a", short, "long")
    assert open_dataset("long").episodes["length"].tolist() == [4, 5]
    create_selection("a", "short", short)
    assert open_dataset("short").episodes["length"].tolist() == [3]
    with pytest.raises(InvalidSelectionError, match=r"one value per episode \(3\), got shape \(2,\)"):
        drop_episodes("a", [True, False], "x")
    with pytest.raises(InvalidSelectionError, match="must be integers, got float64"):
        drop_episodes("a", [1.7], "x")
    with pytest.raises(InvalidSelectionError, match="must be integers"):
        create_selection("a", "x", [0.0, 2.0])
    with pytest.raises(InvalidSelectionError, match=r"--start must be a whole number of steps, got 1\.5"):
        trim_dataset("a", "x", start=1.5)  # type: ignore[arg-type]
    trim_dataset("a", "t1", start=np.int64(1))  # type: ignore[arg-type]
    downsample_dataset("a", "d2", np.int64(2))  # type: ignore[arg-type]
    assert open_dataset("t1").num_steps == 9 and open_dataset("d2").num_episodes == 3


def test_nothing_is_made_of_a_dataset_whose_chain_is_broken(ab: tuple[object, object]) -> None:
    """A trim of a merge of a view, the view's parent replaced: selections, drops, splits and
    merges without --verify of the trim were published (exit 0), and could never be read."""
    create_view("a", "va", (0, 2))
    merge_datasets(["va", "b"], "m")
    trim_dataset("m", "t", start=1)
    write_block("a", lengths=(5, 5), replace=True)
    made = [
        lambda: create_selection("t", "x1", [0]),
        lambda: drop_episodes("t", [0], "x2"),
        lambda: split_dataset("t", 0.5, train_name="x3", val_name="x4"),
        lambda: merge_datasets(["t", "b"], "x5", verify=False),
    ]
    for make in made:
        with pytest.raises(CorruptDatasetError, match="view 'va': its parent 'a' was replaced"):
            make()
    assert not any(CacheRoot(root()).exists(name) for name in ("x1", "x2", "x3", "x4", "x5"))


def test_trim_cuts_both_ends_and_the_cut_episode_ends_truncated(ab: tuple[object, object]) -> None:
    a, _ = ab
    manifest = trim_dataset("a", "t", start=1, end=2)
    t = open_dataset("t")
    assert manifest.source["dropped_short"] == 1  # the 3-step episode is left out
    assert list(t.episodes["length"]) == [1, 2]
    for i, e in enumerate((1, 2)):
        got, whole = t.episode(i), a.episode(e)  # type: ignore[attr-defined]
        length = int(t.episodes["length"][i])
        for key in ("observation", "action", "next/reward", "next/observation", "next/terminated"):
            np.testing.assert_array_equal(got[key], np.asarray(whole[key])[1 : 1 + length], err_msg=key)
        # truncated where it was cut: the last step kept, whatever the parent said there
        assert np.asarray(got["next/truncated"]).reshape(-1).tolist() == [False] * (length - 1) + [True]
        assert np.asarray(got["next/terminated"]).reshape(-1).tolist() == [False] * length
    assert check_dataset(t).ok
    start_only = trim_dataset("a", "s", start=2)  # nothing cut at the end: the parent's flags
    assert start_only.num_episodes == 3
    np.testing.assert_array_equal(open_dataset("s").episode(2)["next/done"], a.episode(2)["next/done"][2:])  # type: ignore[attr-defined]
    assert check_dataset(open_dataset("s")).ok


def test_trim_refusals(ab: tuple[object, object]) -> None:
    with pytest.raises(InvalidSelectionError, match="--start 0 --end 0"):
        trim_dataset("a", "t")
    with pytest.raises(InvalidSelectionError, match="--start -1"):
        trim_dataset("a", "t", start=-1, end=2)
    with pytest.raises(InvalidSelectionError, match=r"longer than 5 steps .* longest has 5"):
        trim_dataset("a", "t", start=2, end=3)


def test_downsample_sums_rewards_and_keeps_flags_and_next_observations(ab: tuple[object, object]) -> None:
    a, _ = ab
    downsample_dataset("a", "d", 2)
    d = open_dataset("d")
    assert list(d.episodes["length"]) == [2, 2, 3]
    for e in range(3):
        got, src = d.episode(e), a.episode(e)  # type: ignore[attr-defined]
        length = len(src["next/reward"])
        windows = np.arange(0, length, 2)
        np.testing.assert_array_equal(got["observation"], np.asarray(src["observation"])[windows])
        np.testing.assert_array_equal(got["action"], np.asarray(src["action"])[windows])
        rewards = np.add.reduceat(np.asarray(src["next/reward"]).reshape(-1), windows)
        np.testing.assert_allclose(np.asarray(got["next/reward"]).reshape(-1), rewards)
        last = np.minimum(windows + 2, length) - 1
        np.testing.assert_array_equal(got["next/observation"], np.asarray(src["next/observation"])[last])
        for flag in ("next/terminated", "next/truncated"):
            np.testing.assert_array_equal(got[flag], np.asarray(src[flag])[last])
    assert check_dataset(d).ok
    assert d.manifest.lineage[0]["op"] == "downsample" and d.manifest.content_digest.get("columns")
    with pytest.raises(InvalidSelectionError, match="--every must be 2 or more"):
        downsample_dataset("a", "x", 1)


def write_pixels(name: str, lengths: list[int], backend: str, frames: str | None) -> object:
    """A dataset with 64x64 RGB frames (a few colours: PNG keeps them exactly) and a state key."""
    rng = np.random.default_rng(len(name) + sum(lengths))
    n, rows = sum(lengths), sum(lengths) + len(lengths)
    ends = np.cumsum(lengths) - 1
    truncated = np.zeros(n, bool)
    truncated[ends] = True
    pixels = np.zeros((rows, 64, 64, 3), np.uint8)
    pixels[:] = rng.integers(0, 4, (rows, 1, 1, 3), dtype=np.uint8) * 60
    block = StepBlock(
        steps={
            "action": rng.standard_normal((n, 2)).astype(np.float32),
            "next/reward": np.ones(n, np.float32),
            "next/terminated": np.zeros(n, bool),
            "next/truncated": truncated,
        },
        observations={
            "observation/pixels": pixels,
            "observation/state": rng.standard_normal((rows, 3)).astype(np.float32),
        },
        ends=ends,
    )
    with DatasetBuilder(name, backend=backend, frames=frames) as builder:
        builder.append(block)
        builder.commit()
    return open_dataset(name)


@pytest.mark.parametrize(
    ("backend", "frames"), [("memmap", "png"), ("zarr", None), ("zarr", "png"), ("memmap", "jpeg:98")]
)
def test_frame_columns_and_zarr_merge_trim_and_downsample(backend: str, frames: str | None) -> None:
    a = write_pixels("a", [5, 7], backend, frames)
    b = write_pixels("b", [4, 3, 6], backend, frames)
    merge_datasets(["a", "b"], "m")
    m = open_dataset("m")
    assert m.manifest.fields["observation/pixels"].codec == (frames or "raw").partition(":")[0]
    assert_same_episodes(m, [(a, 0), (a, 1), (b, 0), (b, 1), (b, 2)])
    trim_dataset("m", "t", start=1, end=1)
    downsample_dataset("m", "d", 2)
    for name in ("m", "t", "d"):
        assert check_dataset(open_dataset(name)).ok, name
    d = open_dataset("d")
    assert d.manifest.fields["observation/pixels"].codec == (frames or "raw").partition(":")[0]
    # the kept frames are the parent's as stored (JPEG frames were encoded again: up to 27 levels off)
    for e in range(m.num_episodes):
        kept, parent = d.episode(e), m.episode(e)
        np.testing.assert_array_equal(kept["observation/pixels"], parent["observation/pixels"][::2])
        final = "next/observation/pixels"
        np.testing.assert_array_equal(kept[final][-1], parent[final][-1])


def test_an_unpublished_selection_of_a_merged_dataset_says_to_publish_one(ab: tuple[object, object]) -> None:
    from rlds_cli.cache.derive import select_episodes

    merge_datasets(["a", "b"], "ab")
    with pytest.raises(InvalidSelectionError, match=r"'ab' is composed \(merged or trimmed\)"):
        select_episodes(open_dataset("ab"), [0])
    create_selection("ab", "ab-first", [0])  # the published one is a composed dataset
    assert open_dataset("ab-first").manifest.layout == COMPOSED_LAYOUT


def test_downsample_keeps_what_follows_each_window_from_its_last_step(tmp_path: Path) -> None:
    """LeRobot's ``next.success`` (and robomimic's ``dones``) describe what follows a step: a
    window took its first step's, so every successful episode of the upstream fixture read
    all-False after ``--every 2`` while its last step was terminated."""
    pytest.importorskip("pyarrow")
    from rlds_cli.sources.convert import convert
    from tests.lerobot_fixtures import FIXTURE

    convert(FIXTURE, "lr")
    parent = open_dataset("lr")
    assert "info/next.success" in parent.stored_fields
    downsample_dataset("lr", "half", 2)
    half = open_dataset("half")
    for ds in (parent, half):
        last = ds.episodes["start"] + ds.episodes["length"] - 1
        success = np.asarray(ds.column("info/next.success")[:]).reshape(
            len(ds.column("info/next.success")), -1
        )
        if ds is parent:
            want = success[last].any(axis=1)
            assert want.any()  # the fixture has successful episodes
        else:
            assert success[last].any(axis=1).tolist() == want.tolist()
            done = np.asarray(ds.column("next/terminated")[:]).reshape(-1)
            assert done[last].tolist() == want.tolist()
