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
from tests.write.test_writer import episode


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
    # found by a hostile-input hunt: each got past the checks and failed on the commit thread,
    # leaving an empty dataset whose manifest failed 'rlds inspect --check'
    "a key no file may be named": (_with("info/my key", np.zeros(4, np.float32)), "'info/my key'"),
    "a '..' key part": (_with("info/..", np.zeros(4, np.float32)), "'info/..'"),
    "a non-ASCII key": (_with("info/é", np.zeros(4, np.float32)), "'info/é'"),
    "a key of 300 characters": (_with("info/" + "k" * 300, np.zeros(4, np.float32)), "characters long"),
    "dates": (_with("info/t", np.array(["2020-01-01"] * 4, "datetime64[D]")), "'info/t'.*dates"),
    "structured records": (_with("info/s", np.zeros(4, [("x", "f4"), ("y", "i4")])), "'info/s'.*structured"),
    "a ragged list": (_with("info/r", [[1.0], [1.0, 2.0], [1.0], [1.0]]), "'info/r'"),
    # committed as a (0, 0) file: every read of the dataset then called it damaged
    "rows that hold no value": (
        _with("info/e", np.zeros((4, 0), np.float32)),
        r"'info/e' has rows of shape \(0,\)",
    ),
    # stored, it was hidden by the step position every batch writes itself
    "a key named index": (_with("index", np.zeros(4, np.int64)), "'index' is a name every batch gives"),
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


def test_add_step_takes_one_reward_and_a_numpy_bool_as_a_python_one(isolated_cache: Path) -> None:
    """A vector reward raised numpy's 'cannot reshape array of size 2'; np.bool_(True) was refused
    where True is stored as 1.0."""
    zeros = np.zeros(2, np.float32)
    step = {"observation": zeros, "action": zeros, "terminated": False, "truncated": False}
    with rlds_cli.DatasetWriter("rw") as w:
        for reward in (np.array([1.0, 2.0]), np.zeros(0)):
            with pytest.raises(EpisodeFormatError, match=r"'next/reward' must be one number, got shape"):
                w.add_step(**step, reward=reward, next_observation=zeros)  # type: ignore[arg-type]
        w.add_step(**step, reward=np.bool_(True), next_observation=zeros)  # type: ignore[arg-type]
        w.add_step(**{**step, "terminated": True}, reward=True, next_observation=zeros)  # type: ignore[arg-type]
    assert rlds_cli.open_dataset("rw")[:]["next/reward"].reshape(-1).tolist() == [1.0, 1.0]


def test_protected_must_be_a_bool(isolated_cache: Path) -> None:
    """protected="no" is true: every episode was kept past the capacity, without a word."""
    for given in ("no", 0, None):
        with pytest.raises(ValueError, match=r"protected must be True or False"):
            rlds_cli.DatasetWriter("p", protected=given)  # type: ignore[arg-type]
    assert not CacheRoot().exists("p")


def test_a_number_reward_that_overflows_float32_is_refused(isolated_cache: Path) -> None:
    """1e40 was stored as inf (numpy's overflow warning the only sign); inf itself is a reward."""
    with rlds_cli.DatasetWriter("ov") as w:
        zeros = np.zeros(2, np.float32)
        step = {"observation": zeros, "action": zeros, "terminated": False, "truncated": False,
                "next_observation": zeros}  # fmt: skip
        with pytest.raises(EpisodeFormatError, match=r"the reward 1e\+40 overflows float32"):
            w.add_step(reward=1e40, **step)
        w.add_step(reward=float("inf"), **{**step, "terminated": True})
    assert rlds_cli.open_dataset("ov").column("next/reward")[:].tolist() == [[float("inf")]]


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


def _torch_case(make: str) -> Any:
    torch = pytest.importorskip("torch")
    return torch.zeros(4, dtype=torch.bfloat16) if make == "bfloat16" else torch.zeros(4, device="meta")


@pytest.mark.parametrize("make", ["bfloat16", "meta"])
def test_a_tensor_numpy_cannot_take_is_one_clear_error(isolated_cache: Path, make: str) -> None:
    ep: dict[str, Any] = {**episode(4), "info/t": _torch_case(make)}
    with rlds_cli.DatasetWriter("t") as w, pytest.raises(EpisodeFormatError, match="'info/t'"):
        w.add_episode(ep)
    assert not CacheRoot().exists("t")


def _step(obs: np.ndarray, done: bool = False) -> dict[str, Any]:
    return {
        "observation": obs,
        "next_observation": obs + 1,
        "action": np.zeros(2, np.float32),
        "reward": 1.0,
        "terminated": done,
        "truncated": False,
    }


def test_add_step_refuses_a_step_unlike_the_episodes_first_and_keeps_the_others(isolated_cache: Path) -> None:
    """A step of another shape or dtype is refused on its own (np.stack raised at the episode's
    end and every buffered step was lost, or the rows were cast to the wider dtype)."""
    with rlds_cli.DatasetWriter("st", commit_interval=0) as w:
        w.add_step(**_step(np.zeros(3, np.float32)))
        with pytest.raises(EpisodeFormatError, match=r"'observation' is \(4,\) float32"):
            w.add_step(**_step(np.zeros(4, np.float32)))
        with pytest.raises(EpisodeFormatError, match=r"'observation' is \(3,\) float64"):
            w.add_step(**_step(np.zeros(3, np.float64)))
        w.add_step(**_step(np.ones(3, np.float32), done=True))  # follows the first
    ds = rlds_cli.open_dataset("st")
    assert (ds.num_episodes, ds.num_steps) == (1, 2) and ds.episode(0)["observation"].dtype == np.float32


def _steps(n: int, dtype: Any = np.float32, dim: int = 2, done_at: int | None = None) -> dict[str, Any]:
    obs = np.arange(n + 1, dtype=dtype)[:, None] * np.ones(dim, dtype)
    flags = np.zeros((n, 1), bool)
    if done_at is not None:
        flags[done_at] = True
    return {
        "observation": obs[:-1],
        "next/observation": obs[1:],
        "action": np.zeros((n, 2), np.float32),
        "next/reward": np.ones((n, 1), np.float32),
        "next/terminated": flags,
        "next/truncated": np.zeros_like(flags),
    }


@pytest.mark.parametrize("change", ["dtype", "shape", "scalar"])
def test_extend_refuses_a_batch_unlike_the_open_episode(isolated_cache: Path, change: str) -> None:
    """The steps after a batch's last end wait for the next batch: one of another dtype was
    joined to them by a cast (the episode stored as float64), one of another shape raised
    numpy's error."""
    with rlds_cli.DatasetWriter("ex", commit_interval=0) as w:
        assert w.extend(_steps(3)) == 0
        other = _steps(2, np.float64) if change == "dtype" else _steps(2, dim=3)
        if change == "scalar":  # a 0-d value: a bare IndexError while an episode was open
            other = {**_steps(2), "observation": np.float32(1)}
        with pytest.raises(EpisodeFormatError, match="'observation'"):
            w.extend(other)
    assert not CacheRoot().exists("ex")


@pytest.mark.parametrize(
    ("schema_edit", "match"),
    [
        ({"info/x": ((), object)}, "'info/x'"),
        ({"info/a b": ((), "float32")}, "'info/a b'"),
        ({"info/x": ((-1,), "float32")}, "'info/x'"),
        ({"next/reward": ((2,), "float32")}, "'next/reward'"),
        ({"next/terminated": ((1,), "int64")}, "'next/terminated'"),
    ],
)
def test_a_bad_schema_is_refused_before_the_dataset_is_made(
    isolated_cache: Path, schema_edit: dict[str, Any], match: str
) -> None:
    schema = {**_SCHEMA, **schema_edit}
    with pytest.raises(EpisodeFormatError, match=match):
        rlds_cli.DatasetWriter("sc", schema=schema)
    assert not CacheRoot().exists("sc")


_SCHEMA: dict[str, Any] = {
    "observation": ((2,), "float32"),
    "next/observation": ((2,), "float32"),
    "action": ((2,), "float32"),
    "next/reward": ((), "float32"),
    "next/terminated": ((), "bool"),
    "next/truncated": ((), "bool"),
    "info/episode_uid": ((), "int64"),
}


def test_a_schema_with_one_value_rewards_and_flags_takes_episodes(isolated_cache: Path) -> None:
    """Rewards and flags given as () in a schema are stored as episodes store them, (1,): the
    dataset it made took no episode before."""
    with rlds_cli.DatasetWriter("sc", schema=_SCHEMA, commit_interval=0) as w:
        w.add_episode(episode(3))
    assert rlds_cli.open_dataset("sc").num_episodes == 1


def test_threads_sharing_a_writer_add_every_episode(isolated_cache: Path) -> None:
    """Four threads adding to one writer: each episode once, none lost (two threads both made
    the dataset, and the loser dropped every waiting episode)."""
    import threading

    with rlds_cli.DatasetWriter("th", commit_interval=0) as w:

        def add(t: int) -> None:
            for i in range(10):
                w.add_episode(episode(2, float(t), uid=10 * t + i))

        threads = [threading.Thread(target=add, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    ds = rlds_cli.open_dataset("th")
    uids = sorted(int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes))
    assert uids == list(range(40))
