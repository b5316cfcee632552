"""Hostile ``--episodes`` lists and ``--where`` predicates: each is refused in one line
(:class:`InvalidSelectionError`, never a RecursionError, TypeError or ValueError) or selects what
it says, and a list's memory is bounded by the dataset's episodes, not by what the user typed."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.episode_table import parse_episode_list, select_where
from rlds_cli.cli.app import app
from rlds_cli.errors import InvalidSelectionError
from tests.formats_fixtures import refused
from tests.loader_fixtures import make_ted


class _Table:
    """The columns select_where reads, as an EpisodeTable gives them."""

    names = ("length", "return")

    def __init__(self, lengths: list[int]) -> None:
        self.columns = {"length": np.array(lengths, np.int64), "return": np.zeros(len(lengths))}

    def __len__(self) -> int:
        return len(self.columns["length"])

    def __getitem__(self, name: str) -> Any:
        return self.columns[name]


TABLE = _Table([3, 4, 5])


def test_repeated_full_ranges_stay_bounded_by_the_episodes() -> None:
    tracemalloc.start()
    try:
        ids = parse_episode_list(",".join(["0-99999"] * 300), 100_000)  # 30M positions typed
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(ids, np.arange(100_000))
    assert peak < 20_000_000  # one flag and one id per episode (was a Python int per position typed)


def test_a_position_of_thousands_of_digits_is_outside_the_dataset() -> None:
    huge = "9" * 5000  # past Python's int() limit of 4,300 digits
    for spec in (huge, f"0-{huge}", f"-{huge}"):
        with pytest.raises(InvalidSelectionError, match=r"5000 digits.*outside the dataset"):
            parse_episode_list(spec, 3)


@pytest.mark.parametrize("spec", ["\uff11", "\u0663", "0-\uff12", "\u0661,2"])
def test_positions_are_ascii_digits(spec: str) -> None:
    """Python's \\d and int() take any script's digits: '\uff11' (fullwidth 1) chose episode 1."""
    with pytest.raises(InvalidSelectionError, match="is no episode position or range"):
        parse_episode_list(spec, 5)


@pytest.mark.parametrize(
    "text",
    [
        "(" * 3000 + "length" + ")" * 3000 + " > 1",
        "not " * 3000 + "length > 1",
        "-" * 3000 + "length > 1",
        " + ".join(["length"] * 5000) + " > 1",
        " and ".join(["length > 1"] * 5000),
    ],
)
def test_deep_or_long_predicates_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(InvalidSelectionError, match="nested or chained too deeply"):
        select_where(text, TABLE)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("-(length > 3) < 0", [1, 2]),
        ("(length > 3) - (length > 4) > 0", [1]),
        ("(length > 3) * 2 + 1 == 3", [1, 2]),
        ("length / 0 > 1", [0, 1, 2]),  # inf, as numpy divides
        ("length > 1e999", []),
        ("length < " + "9" * 5000, [0, 1, 2]),
    ],
)
def test_conditions_count_as_numbers_in_arithmetic(text: str, want: list[int]) -> None:
    assert select_where(text, TABLE).tolist() == want


@pytest.mark.usefixtures("consoles")
@pytest.mark.console_widths(250, 250)
def test_hostile_input_from_the_cli(isolated_cache: Any) -> None:
    isolated_cache.mkdir(parents=True)
    make_ted(isolated_cache, "a", [3, 4, 5])
    runner = CliRunner()
    deep = "(" * 3000 + "length" + ")" * 3000 + " > 1"
    result = runner.invoke(app, ["view", "a", "--where", deep, "--name", "v"])
    refused(result, "nested or chained too deeply", hint=True, published=("a",))
    result = runner.invoke(app, ["view", "a", "--episodes", "9" * 5000, "--name", "v"])
    refused(result, "outside the dataset", hint=True, published=("a",))
    where = "(length > 3) - (length > 4) > 0"
    result = runner.invoke(app, ["view", "a", "--where", where, "-n", "v", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_episodes"] == 1


def test_a_huge_range_object_is_checked_at_its_ends_never_listed() -> None:
    with pytest.raises(InvalidSelectionError, match=r"episode 999999999999 .* outside the dataset.s 3"):
        parse_episode_list(range(0, 10**12), 3)  # was a MemoryError
    assert parse_episode_list(range(-1, -4, -1), 3).tolist() == [0, 1, 2]
    assert parse_episode_list(range(0, 3, 2), 3).tolist() == [0, 2]


def test_a_ragged_list_is_refused() -> None:
    with pytest.raises(InvalidSelectionError, match="flat list of integers"):
        parse_episode_list([[0, 1], [2]], 3)  # type: ignore[list-item]
