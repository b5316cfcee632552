"""The one TED read path (rlds_cli/cache/reader.py): the flat-row rule against a row-at-a-time
statement of it, and the replaced-dataset check on every path that reads through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache.manifest import FieldSpec
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.reader import Episodes, TedReader, VersionedColumn, ted_fields
from rlds_cli.errors import DatasetReplacedError
from rlds_cli.loader.sources import HostSource
from rlds_cli.preprocess.plan import read_chunk
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import golden_three_episodes

LENGTHS = [3, 1, 4, 2]  # 10 steps, 4 episodes: 14 flat rows
FIELDS = {
    "observation": FieldSpec("observation", (2,), "float32", "flat"),
    "action": FieldSpec("action", (), "int64", "step"),
    "next/terminated": FieldSpec("next/terminated", (1,), "bool", "step"),
    "next/truncated": FieldSpec("next/truncated", (1,), "bool", "step"),
}


def _columns() -> dict[str, np.ndarray]:
    n, e = sum(LENGTHS), len(LENGTHS)
    ends = np.cumsum(LENGTHS) - 1
    term = np.zeros((n, 1), bool)
    term[ends[::2]] = True
    trunc = np.zeros((n, 1), bool)
    trunc[ends[1::2]] = True
    return {
        "observation": np.arange(2 * (n + e), dtype=np.float32).reshape(n + e, 2),
        "action": np.arange(n, dtype=np.int64) * 10,
        "next/terminated": term,
        "next/truncated": trunc,
    }


def _expected(columns: dict[str, np.ndarray], t: int) -> dict[str, Any]:
    """Step ``t``'s TED values, one at a time: observation[t] = flat[t + e], next one row after."""
    e = next(i for i in range(len(LENGTHS)) if t < sum(LENGTHS[: i + 1]))
    done = columns["next/terminated"][t] | columns["next/truncated"][t]
    return {
        "observation": columns["observation"][t + e],
        "next/observation": columns["observation"][t + e + 1],
        "action": columns["action"][t],
        "next/terminated": columns["next/terminated"][t],
        "next/truncated": columns["next/truncated"][t],
        "next/done": done,
        "episode": e,
    }


@pytest.mark.parametrize("table", [None, np.int64, np.int32])
def test_the_step_to_episode_lookup_is_one_rule_with_or_without_a_table(table: Any) -> None:
    episodes = Episodes(np.array(LENGTHS), table=table)
    steps = np.arange(sum(LENGTHS))
    expected = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    got = episodes.episode_of(steps)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(episodes.flat_rows(steps), steps + expected)
    with pytest.raises(ValueError, match="positive lengths"):
        Episodes(np.array([2, 0]))


def test_final_rows_and_the_step_of_every_flat_row() -> None:
    """Written out by hand for LENGTHS = [3, 1, 4, 2]: flat rows 0-2 are steps 0-2 and row 3 is
    episode 0's final observation (its last step's next one), and so on."""
    episodes = Episodes(np.array(LENGTHS))
    np.testing.assert_array_equal(episodes.final_rows(), [3, 5, 10, 13])
    by_hand = [0, 1, 2, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9, 9]
    np.testing.assert_array_equal(episodes.steps_of_flat_rows(np.arange(14)), by_hand)
    # the forward rule and its inverse agree on every step
    steps = np.arange(sum(LENGTHS))
    np.testing.assert_array_equal(episodes.steps_of_flat_rows(episodes.flat_rows(steps)), steps)


@pytest.mark.parametrize(
    "keys",
    [
        list(ted_fields(FIELDS)),  # every key
        ["next/done", "next/observation"],  # next/done reads the flags itself
        ["action"],  # no key needs the episode
    ],
)
def test_gather_range_and_episode_follow_the_flat_row_rule(keys: list[str]) -> None:
    columns = _columns()
    reader = TedReader(FIELDS, Episodes(np.array(LENGTHS)), columns.__getitem__, keys)
    n = sum(LENGTHS)
    idx = np.array([[9, 0], [3, 4]])
    batch = reader.gather(idx)
    assert list(batch) == sorted(keys, key=lambda k: k == "next/done")
    for key in keys:
        want = np.array([[_expected(columns, int(t))[key] for t in row] for row in idx])
        np.testing.assert_array_equal(batch[key], want, err_msg=key)
    for start, stop in [(0, n), (2, 3), (3, 8), (4, 8)]:
        part = reader.range(start, stop)
        for key in keys:
            want = np.array([_expected(columns, t)[key] for t in range(start, stop)])
            np.testing.assert_array_equal(part[key], want, err_msg=f"{key} [{start}, {stop})")
    ep = reader.episode(2)
    for key in keys:
        np.testing.assert_array_equal(ep[key], reader.range(4, 8)[key])


def test_a_versioned_column_checks_after_every_read_and_on_a_failed_one() -> None:
    calls: list[str] = []

    class Failing:
        shape, dtype, chunk_rows = (4, 2), np.dtype(np.float32), 2

        def __getitem__(self, index: Any) -> np.ndarray:
            if isinstance(index, int):
                raise OSError("file gone")
            return np.zeros((4, 2), np.float32)[index]

    def check() -> None:
        calls.append("check")
        if len(calls) > 2:
            raise DatasetReplacedError("replaced")

    column = VersionedColumn(Failing(), check)
    assert (len(column), column.dtype, column.chunk_rows) == (4, np.float32, 2)
    assert column[np.array([0, 3])].shape == (2, 2)
    assert np.asarray(column).shape == (4, 2)
    assert calls == ["check", "check"]
    with pytest.raises(DatasetReplacedError):  # the check explains the failed read
        column[0]


def test_every_read_path_refuses_a_replaced_zarr_dataset(tmp_path: Path) -> None:
    """HostSource (disk and loading into RAM), take_rows, read_chunk and Dataset.episode all read
    through the versioned columns: none of them may return the new version's rows."""
    a = golden_three_episodes(tmp_path / "a.hdf5", with_next=True)
    b = golden_three_episodes(tmp_path / "b.hdf5", with_next=False)
    convert(a, "swap", backend="zarr")
    old = open_dataset("swap")
    disk = HostSource(old, ["observation", "next/observation", "action"])
    disk.gather(np.array([0, 1]))
    convert(b, "swap", backend="zarr", force=True)
    reads = [
        lambda: disk.gather(np.array([0, 1])),
        lambda: disk.take_rows("observation", np.array([0, 1])),
        lambda: read_chunk(old, 0, 3, None, old.num_steps),
        lambda: old.episode(1, keys=["observation"]),
        lambda: HostSource(old, ["observation"], in_memory=True),
    ]
    for read in reads:
        with pytest.raises(DatasetReplacedError):
            read()


def test_a_replaced_memmap_dataset_keeps_reading_its_own_version(tmp_path: Path) -> None:
    a = golden_three_episodes(tmp_path / "a.hdf5", with_next=True)
    b = golden_three_episodes(tmp_path / "b.hdf5", with_next=False)
    convert(a, "swap")
    old = open_dataset("swap")
    disk = HostSource(old, ["observation", "next/observation"])
    before = disk.gather(np.arange(8))
    # rows gathered from a memory map are plain arrays, not np.memmap objects
    assert {type(v) for v in old.gather(np.arange(8)).values()} == {np.ndarray}
    convert(b, "swap", force=True)
    after = disk.gather(np.arange(8))
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value)
