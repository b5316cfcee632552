"""The episode rules (rlds_cli/cache/ted.py), each found and each passed, and the
conversion's wording of each (the writer's and ``inspect --check``'s are held by
test_writer_input.py and test_validate.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache import DatasetBuilder
from rlds_cli.cache import ted as rules
from rlds_cli.cache.ted import StepBlock
from rlds_cli.errors import ConversionError, EpisodeFormatError
from rlds_cli.write.validate import schema_fields


def _flags(n: int, *done: int) -> np.ndarray:
    out = np.zeros(n, bool)
    out[list(done)] = True
    return out


# ------------------------------------------------------------------ required keys


def test_required_keys_present_pass_and_a_group_counts() -> None:
    assert rules.missing_step_keys(["action", "next/reward", "next/terminated", "next/truncated"]) is None
    assert rules.missing_step_keys({"action/0", "action/goal/x", "next/reward", "next/terminated",
                                    "next/truncated"}) is None  # fmt: skip


def test_missing_required_keys_are_named_in_order() -> None:
    problem = rules.missing_step_keys(["next/truncated", "actions", "observation"])
    assert problem == rules.Problem(rules.MISSING_KEYS, keys=("action", "next/reward", "next/terminated"))


# ------------------------------------------------------------------ rows


def test_rows_of_every_key_pass() -> None:
    assert rules.rows_problem({"a": np.zeros((3, 2)), "b": [1, 2, 3]}, 3) is None
    assert rules.rows_problem({}, 3) is None


def test_the_first_key_with_other_rows_is_named() -> None:
    cols = {"a": np.zeros(3), "b": np.zeros((2, 4)), "c": np.zeros(5)}
    assert rules.rows_problem(cols, 3) == rules.Problem(rules.ROWS, key="b", rows=2, expected=3)


def test_a_0d_value_has_no_rows() -> None:
    assert rules.rows_problem({"a": np.zeros(3), "s": np.float32(1)}, 3) == rules.Problem(
        rules.ROWS, key="s", rows=None, expected=3
    )


# ------------------------------------------------------------------ ends


@pytest.mark.parametrize("ends", [[], [0], [1, 3], [3]])
def test_sorted_unique_ends_inside_pass(ends: list[int]) -> None:
    assert rules.ends_problem(np.asarray(ends, np.int64), 4) is None


@pytest.mark.parametrize(
    "ends", [[3, 1], [1, 1], [4], [-1, 2]], ids=["unsorted", "twice", "outside", "negative"]
)
def test_bad_ends_are_found(ends: list[int]) -> None:
    assert rules.ends_problem(np.asarray(ends, np.int64), 4) == rules.Problem(rules.ENDS, expected=4)


def test_last_steps_of_a_window_of_a_longer_range() -> None:
    ends = np.array([2, 5, 6, 9])  # episodes [0, 2], [3, 5], [6], [7, 9]
    assert rules.last_steps(ends, 0, 10).tolist() == _flags(10, 2, 5, 6, 9).tolist()
    assert rules.last_steps(ends, 3, 7).tolist() == [False, False, True, True]
    assert rules.last_steps(ends, 7, 9).tolist() == [False, False]
    assert rules.last_steps(ends, 4, 4).tolist() == []


# ------------------------------------------------------------------ done


def test_done_exactly_at_the_last_steps_passes() -> None:
    last = rules.last_steps(np.array([1, 4]), 0, 6)  # the third episode goes on
    assert rules.done_problem(_flags(6, 1, 4), last) is None
    early, unended = rules.done_mismatches(_flags(6, 1, 4), last)
    assert early.size == unended.size == 0


def test_done_before_the_end_is_found_at_its_step_and_episode() -> None:
    last = _flags(6, 1, 4)
    problem = rules.done_problem(_flags(6, 1, 2, 4), last)
    assert problem == rules.Problem(rules.DONE_BEFORE_END, step=2, episode=1)


def test_an_end_without_done_is_found_at_its_step_and_episode() -> None:
    last = _flags(6, 1, 4)
    assert rules.done_problem(_flags(6, 1), last) == rules.Problem(rules.END_NOT_DONE, step=4, episode=1)


def test_the_first_break_is_the_one_named_and_every_one_is_listed() -> None:
    last = _flags(8, 1, 4, 7)
    done = _flags(8, 3, 6, 7)  # episode 0 unended at 1, episode 1 done early at 3 and unended at 4
    assert rules.done_problem(done, last) == rules.Problem(rules.END_NOT_DONE, step=1, episode=0)
    early, unended = rules.done_mismatches(done, last)
    assert early.tolist() == [3, 6] and unended.tolist() == [1, 4]


def test_a_whole_episode_ends_at_its_last_step_only() -> None:
    assert rules.episode_done_problem(_flags(4, 3)) is None
    assert rules.episode_done_problem(_flags(1, 0)) is None


def test_a_whole_episode_cut_short_is_named_before_an_early_end() -> None:
    assert rules.episode_done_problem(_flags(4)) == rules.Problem(rules.END_NOT_DONE, step=3, episode=0)
    assert rules.episode_done_problem(_flags(4, 1)) == rules.Problem(rules.END_NOT_DONE, step=3, episode=0)
    assert rules.episode_done_problem(_flags(4, 1, 2, 3)) == rules.Problem(
        rules.DONE_BEFORE_END, step=1, episode=0
    )


def test_an_episode_without_steps() -> None:
    assert rules.episode_done_problem(np.zeros(0, bool)) == rules.Problem(rules.NO_STEPS)


# ------------------------------------------------------------------ the conversion's wording


def _block(
    n: int, ends: list[int], *, done: list[int] | None = None, obs_rows: int | None = None
) -> StepBlock:
    return StepBlock(
        steps={
            "action": np.zeros((n, 1), np.float32),
            "next/reward": np.zeros(n, np.float32),
            "next/terminated": _flags(n, *(ends if done is None else done)),
            "next/truncated": np.zeros(n, bool),
        },
        observations={"observation": np.zeros((n + len(ends) if obs_rows is None else obs_rows, 2))},
        ends=np.asarray(ends, np.int64),
    )


def _dropped(block: StepBlock, *keys: str) -> StepBlock:
    block.steps = {k: v for k, v in block.steps.items() if k not in keys}
    return block


def _resized(block: StepBlock, key: str, rows: int) -> StepBlock:
    block.steps = {**block.steps, key: np.zeros((rows, 1), np.float32)}
    return block


def _scalar(block: StepBlock, key: str) -> StepBlock:
    block.steps = {**block.steps, key: np.float32(0)}
    return block


BUILDER_MESSAGES = {
    "missing keys": (
        [_dropped(_block(4, [3]), "next/reward", "next/truncated")],
        "block lacks required keys ['next/reward', 'next/truncated']",
    ),
    "step rows": (
        [_resized(_block(4, [3]), "next/reward", 3)],
        "step column 'next/reward' has 3 rows, expected 4",
    ),
    "a 0-d step column": (  # a traceback (IndexError) before the rule was written once
        [_scalar(_block(4, [3]), "next/reward")],
        "step column 'next/reward' has no row axis (0-d), expected 4",
    ),
    "observation rows": (
        [_block(4, [3], obs_rows=4)],
        "observation column 'observation' has 4 rows, expected 4 steps + 1 final observations",
    ),
    "ends": ([_block(4, [3, 1])], "episode ends must be sorted, unique and inside the block"),
    # the step is counted from the dataset's first: 3 steps came before this block
    "done early": (
        [_block(3, [2]), _block(4, [3], done=[1, 3])],
        "step 4: next/done must be True exactly at episode ends "
        "(terminated or truncated marks the last step of an episode)",
    ),
    "end not done": ([_block(4, [1, 3], done=[3])], "step 1: next/done must be True exactly at episode ends"),
}


@pytest.mark.parametrize("case", list(BUILDER_MESSAGES))
def test_the_conversion_names_each_break(isolated_cache: Path, case: str) -> None:
    blocks, message = BUILDER_MESSAGES[case]
    with pytest.raises(ConversionError, match=re.escape(message)), DatasetBuilder("bad") as builder:
        for block in blocks:
            builder.append(block)


def test_a_schema_without_a_required_key_names_the_first(isolated_cache: Path) -> None:
    schema = {
        "observation": ((2,), np.float32),
        "next/observation": ((2,), np.float32),
        "action": ((1,), np.float32),
        "next/terminated": ((), bool),
    }
    with pytest.raises(EpisodeFormatError, match=re.escape("schema: missing key 'next/reward'")):
        schema_fields(schema)
    assert "next/truncated" in schema_fields({**schema, "next/reward": ((), np.float32),
                                              "next/truncated": ((), bool)})  # fmt: skip
