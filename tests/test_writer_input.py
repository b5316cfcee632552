"""Bad input to DatasetWriter: one EpisodeFormatError naming the key, nothing written (issue 25)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import EpisodeFormatError
from tests.test_writer import episode


def _with(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(ep: dict[str, Any]) -> None:
        ep[key] = value

    return edit


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(ep: dict[str, Any]) -> None:
        del ep[key]

    return edit


def _nan_flag(ep: dict[str, Any]) -> None:
    flags = ep["next/terminated"].astype(np.float32)
    flags[0] = np.nan
    ep["next/terminated"] = flags


def _no_steps(ep: dict[str, Any]) -> None:
    for key in list(ep):
        ep[key] = ep[key][:0]


def _tuple_twice(ep: dict[str, Any]) -> None:
    ep["next", "reward"] = ep["next/reward"]


def _group_and_leaf(ep: dict[str, Any]) -> None:
    ep["observation/x"] = ep["observation"]


def _jump(ep: dict[str, Any]) -> None:
    ep["next/observation"] = ep["next/observation"].copy()
    ep["next/observation"][0] += 1


def _two_ends(ep: dict[str, Any]) -> None:
    ep["next/truncated"] = ep["next/truncated"].copy()
    ep["next/truncated"][1] = True


CASES = {
    "wrong row shape of a step key": (_with("action", np.zeros((4, 2, 1), np.float32)), None),
    "mismatched lengths": (_with("action", np.zeros((3, 2), np.float32)), "'action'"),
    "float flags": (_with("next/truncated", np.zeros((4, 1), np.float32)), "'next/truncated'"),
    "int flags": (_with("next/terminated", np.array([0, 0, 0, 1])), "'next/terminated'"),
    "NaN in a flag": (_nan_flag, "'next/terminated'"),
    "no steps": (_no_steps, "no steps"),
    "missing final observation": (_drop("next/observation"), "'observation'"),
    "missing reward": (_drop("next/reward"), "'next/reward'"),
    "missing action": (_drop("action"), "'action'"),
    "reward of strings": (_with("next/reward", np.array(["a"] * 4)), "'next/reward'"),
    "next/observation of another dtype": (
        _with("next/observation", np.zeros((4, 2), np.float64)),
        "'next/observation'",
    ),
    "next/observation that does not follow observation": (_jump, "'next/observation'"),
    "not ended": (_with("next/terminated", np.zeros((4, 1), bool)), "last step"),
    "ends twice": (_two_ends, "goes on"),
    "a key given twice": (_tuple_twice, "'next/reward' is given twice"),
    "a key both array and group": (_group_and_leaf, "'observation' is both"),
    "objects": (_with("info/x", [object()] * 4), "'info/x'"),
    "next/done that disagrees": (_with("next/done", np.zeros((4, 1), bool)), "'next/done'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_episode_is_one_clear_error_and_nothing_is_written(isolated_cache: Path, case: str) -> None:
    edit, match = CASES[case]
    with rlds_cli.DatasetWriter("good") as w:
        w.add_episode(episode(4))
    ep: dict[str, Any] = episode(4)
    edit(ep)
    with rlds_cli.DatasetWriter("good", mode="append") as w:
        if match is None:  # a wrong row shape is a schema difference of the dataset
            with pytest.raises(rlds_cli.errors.SchemaMismatchError, match="'action'"):
                w.add_episode(ep)
        else:
            with pytest.raises(EpisodeFormatError, match=match):
                w.add_episode(ep)
    ds = rlds_cli.open_dataset("good")
    assert (ds.num_episodes, ds.num_steps) == (1, 4)
    if match is not None:  # a first episode that is bad creates nothing
        with rlds_cli.DatasetWriter("fresh") as w, pytest.raises(EpisodeFormatError, match=match):
            w.add_episode(ep)
        assert not CacheRoot().exists("fresh")


def test_add_step_flags_must_be_bool(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("st") as w, pytest.raises(EpisodeFormatError, match="'next/terminated'"):
        w.add_step(
            observation=np.zeros(2, np.float32),
            action=np.zeros(2, np.float32),
            reward=0.0,
            terminated=float("nan"),
            truncated=False,
            next_observation=np.zeros(2, np.float32),
        )
    assert not CacheRoot().exists("st")


def test_not_a_mapping(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("nm") as w, pytest.raises(EpisodeFormatError, match="not a mapping"):
        w.add_episode([1, 2, 3])


def test_a_writer_closed_or_left_by_an_error_writes_nothing_more(isolated_cache: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), rlds_cli.DatasetWriter("err", episodes_per_commit=5) as w:
        w.add_episode(episode(2))
        raise RuntimeError("boom")
    assert not CacheRoot().exists("err")
    w = rlds_cli.DatasetWriter("err2")
    w.add_step(
        observation=np.zeros(2, np.float32),
        action=np.zeros(2, np.float32),
        reward=0.0,
        terminated=False,
        truncated=False,
        next_observation=np.zeros(2, np.float32),
    )
    w.close()  # an unfinished episode is not written
    assert not CacheRoot().exists("err2")
    with pytest.raises(RuntimeError, match="closed"):
        w.add_episode(episode(2))
