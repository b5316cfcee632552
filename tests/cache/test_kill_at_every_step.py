"""Kill at every step of publish, replacement, removal, views and preprocess jobs.

Each test counts the steps of an operation (renames, exchanges, unlinks, fsyncs, ...; see
``tests/faults.py``), then for every step ``k`` runs it again in a forked child killed just
before step ``k``, and checks the promise of docs/reliability.md: a dataset is always either
its old version or its new one, complete, never missing and never mixed; whatever the kill
left behind is cleaned up by the next writer or ``rlds gc``; a resumed job gives exactly the
output of an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli.cache.root as cache_root
from rlds_cli.cache import CacheRoot, DatasetBuilder, open_dataset
from rlds_cli.cache.derive import create_view, split_dataset
from rlds_cli.cache.manage import collect_garbage, remove_dataset
from rlds_cli.formats.base import StepBlock
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.preprocess import job as preprocess_job
from tests import faults
from tests.faults import count_steps, kill_at

#: The suite's heaviest disk users run one after another on one test worker (``make test`` runs
#: ``pytest -n 2 --dist loadgroup``): each fsyncs, or churns files, for tens of seconds, and two
#: of them at once starved each other's fsyncs past their hang bounds on 2 shared cores.
pytestmark = pytest.mark.xdist_group("disk-heavy")

FNS = "tests.preprocess_fns"


@pytest.fixture(autouse=True)
def durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real thing: fsync on, so the fsync steps are part of what is killed."""
    monkeypatch.setenv("RLDS_FSYNC", "1")


def _write(
    name: str, version: float, *, backend: str = "memmap", lengths: tuple[int, ...] = (3, 4, 2)
) -> None:
    """A small dataset whose every reward is ``version`` (tells the versions apart)."""
    n = sum(lengths)
    ends = np.cumsum(lengths) - 1
    term = np.zeros(n, bool)
    term[ends] = True
    block = StepBlock(
        steps={
            "action": np.arange(n, dtype=np.float32)[:, None],
            "next/reward": np.full(n, version, np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(n, bool),
        },
        observations={"observation": np.arange((n + len(lengths)) * 2, dtype=np.float32).reshape(-1, 2)},
        ends=ends,
    )
    with DatasetBuilder(name, backend=backend, replace=True) as builder:
        builder.append(block)
        builder.commit()


def _version(name: str) -> float | None:
    """The version a reader sees now (``None``: no dataset), after checking it whole."""
    root = CacheRoot()
    try:
        root.manifest(name)  # finishes a journalled replacement, like any reader
    except FileNotFoundError:
        return None
    ds = open_dataset(name)
    data = ds[:]
    rewards = np.unique(data["next", "reward"])
    assert len(rewards) == 1, f"{name} mixes versions: {rewards}"
    assert check_dataset(ds).ok
    return float(rewards[0])


def _tmp_leftovers() -> list[str]:
    tmp = CacheRoot().tmp_dir
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


def _every_kill(
    operation: Callable[[], Any],
    check: Callable[[int, str], None],
    reset: Callable[[], None],
    storage: str = "memmap",
) -> int:
    """Kill ``operation`` before each of its steps (a zarr build: a sample of them, see
    ``faults.ZARR_EVERY``), ``check`` what each kill left, ``reset`` before the next."""
    reset()
    if storage == "zarr":
        points = faults.sample_steps(faults.trace_steps(operation), every=faults.ZARR_EVERY)
        for k, point in enumerate(points, start=1):
            reset()
            where = kill_at(operation, point)
            assert where is not None, f"the operation outlived its kill point {point}"
            check(k, where)
        reset()
        print(f"[{len(points)} kills, each at a different step, all checked]")
        return len(points)
    assert count_steps(operation) > 3, "the operation has too few steps to be worth enumerating"
    reset()
    k = 1
    while (where := kill_at(operation, k)) is not None:  # until a child outlives its steps
        check(k, where)
        reset()
        k += 1
    print(f"[{k - 1} kills, each at a different step, all checked]")  # counts for docs/reliability.md
    return k - 1


# ----------------------------------------------------------------------------- replace


@pytest.mark.parametrize(
    ("backend", "exchange"),
    [("memmap", True), ("memmap", False), pytest.param("zarr", True, marks=pytest.mark.slow)],
    ids=["memmap-atomic-exchange", "memmap-journal", "zarr-atomic-exchange"],
)
def test_replacing_a_dataset_never_loses_it(
    backend: str, exchange: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not exchange:  # a filesystem (or OS) without renameat2(RENAME_EXCHANGE)
        monkeypatch.setattr(cache_root, "exchange_paths", lambda a, b: False)
    seen: set[float] = set()

    def reset() -> None:
        remove_dataset(CacheRoot(), "d", force=True) if CacheRoot().exists("d") else None
        collect_garbage(CacheRoot())
        _write("d", 1.0, backend=backend)

    def check(k: int, where: str) -> None:
        version = _version("d")
        assert version in (1.0, 2.0), f"kill {where}: the dataset is gone (saw {version})"
        seen.add(version)
        collect_garbage(CacheRoot())
        assert _version("d") == version, f"kill {where}: gc changed what readers see"
        assert _tmp_leftovers() == [], f"kill {where}: gc left {_tmp_leftovers()}"
        _write("d", 3.0, backend=backend)  # the next writer works
        assert _version("d") == 3.0

    reset()
    _every_kill(lambda: _write("d", 2.0, backend=backend), check, reset, backend)
    assert seen == {1.0, 2.0}, "the kills never hit both sides of the publish"


def test_next_writer_recovers_a_journalled_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between the two renames of a journalled replacement, the next writer of the
    name rolls it forward before doing anything else: the finished build is never deleted."""
    monkeypatch.setattr(cache_root, "exchange_paths", lambda a, b: False)
    _write("d", 1.0)
    steps = count_steps(lambda: _write("d", 2.0))
    _write("d", 1.0)
    for k in range(1, steps + 1):
        where = kill_at(lambda: _write("d", 2.0), k)
        assert where is not None
        if not CacheRoot().dataset_dir("d").exists():  # the moment between the two renames
            with DatasetBuilder("d", replace=True):
                pass  # entering takes the lock and cleans up: it must finish the replacement
            assert (CacheRoot().dataset_dir("d") / "manifest.json").is_file(), where
            assert _version("d") == 2.0, where
            return
        _write("d", 1.0)
    raise AssertionError("no kill fell between the two renames")


def test_fresh_publish_is_all_or_nothing() -> None:
    def reset() -> None:
        if CacheRoot().exists("f"):
            remove_dataset(CacheRoot(), "f", force=True)
        collect_garbage(CacheRoot())

    def check(k: int, where: str) -> None:
        assert _version("f") in (None, 2.0), where
        collect_garbage(CacheRoot())
        assert _tmp_leftovers() == [], where

    _every_kill(lambda: _write("f", 2.0), check, reset)


# ----------------------------------------------------------------------------- remove, views


def test_removal_is_all_or_nothing() -> None:
    def reset() -> None:
        if not CacheRoot().exists("r"):
            _write("r", 1.0)

    def check(k: int, where: str) -> None:
        assert _version("r") in (None, 1.0), where
        collect_garbage(CacheRoot())
        assert _tmp_leftovers() == [], where

    reset()
    _every_kill(lambda: remove_dataset(CacheRoot(), "r"), check, reset)


def test_view_creation_is_all_or_nothing() -> None:
    _write("parent", 1.0)

    def reset() -> None:
        if CacheRoot().exists("v"):
            remove_dataset(CacheRoot(), "v", force=True)

    def check(k: int, where: str) -> None:
        version = _version("v")
        assert version in (None, 1.0), where
        if version is not None:
            assert open_dataset("v").num_episodes == 2, where
        collect_garbage(CacheRoot())
        assert _tmp_leftovers() == [], where

    _every_kill(lambda: create_view("parent", "v", (1, 3)), check, reset)


def test_a_split_replacing_another_never_leaves_the_two_mixed() -> None:
    """A kill between the two views' publishes left seed 1's train beside seed 0's validation:
    16 episodes in both. Now the old pair, or new views with the others missing, never a mix."""
    _write("parent", 1.0, lengths=(2, 3, 2, 4, 3, 2, 3, 2))

    def episodes(name: str) -> set[int]:
        return set(open_dataset(name).view_parent()[1].tolist())  # type: ignore[index]

    def reset() -> None:
        split_dataset("parent", 0.5, train_name="t", val_name="v", replace=True, seed=0)

    seen = set()

    def check(k: int, where: str) -> None:
        have = [n for n in ("t", "v") if CacheRoot().exists(n)]
        if len(have) == 2:
            pair = (frozenset(episodes("t")), frozenset(episodes("v")))
            assert not pair[0] & pair[1] and len(pair[0] | pair[1]) == 8, where
            seen.add(pair)
        collect_garbage(CacheRoot())
        assert _tmp_leftovers() == [], where

    _every_kill(
        lambda: split_dataset("parent", 0.5, train_name="t", val_name="v", replace=True, seed=1), check, reset
    )
    assert len(seen) == 2  # the old pair, and the new one (killed after both were published)


# ----------------------------------------------------------------------------- preprocess


def _everything(name: str) -> dict[str, np.ndarray]:
    ds = open_dataset(name)
    return {str(k): np.asarray(v) for k, v in ds[:].items()} | {"_episodes": ds.episode_index}


@pytest.mark.parametrize(
    ("fn", "by", "storage"),
    [
        ("add_features", "step", "memmap"),  # preallocated output written in place
        ("add_features", "step", "zarr"),  # chunk files assembled in order
        ("drop_short_episodes", "episode", "memmap"),  # chunk files, some chunks write no rows
    ],
)
def test_preprocess_killed_at_any_step_resumes_exactly(fn: str, by: str, storage: str) -> None:
    _write("src", 1.0, lengths=(3, 4, 2, 5, 1, 6, 3))
    kwargs: dict[str, Any] = {"by": by, "chunk_steps": 5, "workers": 1, "storage": storage, "stats": True}
    preprocess_job.run("src", f"{FNS}:{fn}", "reference", **kwargs)
    expected = _everything("reference")

    def operation() -> None:
        preprocess_job.run("src", f"{FNS}:{fn}", "out", **kwargs)

    def reset() -> None:
        if CacheRoot().exists("out"):
            remove_dataset(CacheRoot(), "out", force=True)
        collect_garbage(CacheRoot(), jobs=True)

    def check(k: int, where: str) -> None:
        # odd kills resume plainly; even ones with --force too (the case that lost chunks)
        result = preprocess_job.run("src", f"{FNS}:{fn}", "out", resume=True, force=k % 2 == 0, **kwargs)
        got = _everything("out")
        assert sorted(got) == sorted(expected), where
        for key in expected:
            assert got[key].dtype == expected[key].dtype, (where, key)
            assert np.array_equal(got[key], expected[key]), f"kill {where}: {key} differs after resume"
        assert check_dataset(open_dataset("out")).ok, where
        assert result.manifest.num_steps == len(expected["action"]), where
        collect_garbage(CacheRoot())
        assert not any(".job-" in p for p in _tmp_leftovers()), f"kill {where}: {_tmp_leftovers()}"

    _every_kill(operation, check, reset, storage)


def test_resume_never_takes_a_half_deleted_job_for_a_finished_one(tmp_path: Path) -> None:
    """The original defect: killed while deleting its finished job directory, a resumed job
    published a dataset missing whole chunks. Here the chunk files of a finished job are
    deleted by hand, as a kill inside that deletion leaves them."""
    _write("src", 1.0, lengths=(3, 4, 2, 5, 1, 6, 3))
    kwargs: dict[str, Any] = {"by": "episode", "chunk_steps": 5, "workers": 1}
    preprocess_job.run("src", f"{FNS}:identity", "reference", **kwargs)
    cache = CacheRoot()
    original = preprocess_job.discard_job_dir
    preprocess_job.discard_job_dir = lambda job, out: None  # type: ignore[assignment]
    try:
        with pytest.raises(RuntimeError):
            # stop after every chunk ran, before assembling: the job directory stays complete
            def stop(*args: Any, **kw: Any) -> Any:
                raise RuntimeError("stop")

            saved_finish = preprocess_job.finish
            preprocess_job.finish = stop  # type: ignore[assignment]
            try:
                preprocess_job.run("src", f"{FNS}:identity", "out", **kwargs)
            finally:
                preprocess_job.finish = saved_finish  # type: ignore[assignment]
    finally:
        preprocess_job.discard_job_dir = original  # type: ignore[assignment]
    (job_dir,) = cache.tmp_dir.glob("out.job-*")
    data_files = sorted((job_dir / "chunks").glob("*.data.npz"))
    assert len(data_files) > 2
    for path in data_files[1:3]:
        path.unlink()
    preprocess_job.run("src", f"{FNS}:identity", "out", resume=True, **kwargs)
    assert open_dataset("out").num_steps == open_dataset("reference").num_steps
    assert np.array_equal(_everything("out")["action"], _everything("reference")["action"])
