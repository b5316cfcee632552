"""Kills around a growing dataset's creation and its compaction (issue 25): the first writer
killed before every step of making the dataset (the head published through
``CacheTransaction``, then its first commits), and a writer appending after a compaction was
killed before each of its steps. See :mod:`tests.write.test_writer_kill` for the kill points."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import DatasetNotFoundError
from tests import faults
from tests.write.test_writer import episode
from tests.write.test_writer_kill import (
    LENGTHS,
    add,
    fsync_on,
    leftovers,
    multi_run_base,
    uids_of,
)

#: The suite's heaviest disk users run one after another on one test worker (``make test`` runs
#: ``pytest -n 2 --dist loadgroup``): each fsyncs, or churns files, for tens of seconds, and two
#: of them at once starved each other's fsyncs past their hang bounds on 2 shared cores.
pytestmark = pytest.mark.xdist_group("disk-heavy")

__all__ = ["fsync_on"]  # the fixture, imported for the tests here


def _inspect_check(root: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", "k", "--check", "--root", str(root)])
    assert result.exit_code == 0 and "check passed" in result.output, result.output


def _first_writer(root: Path, storage: str) -> None:
    with rlds_cli.DatasetWriter("k", root=root, storage=storage, capacity_episodes=3, grace_seconds=0) as w:
        for uid in (0, 1):
            w.add_episode(episode(LENGTHS[uid], 10.0 * uid, uid=uid))
            w.flush()  # a commit each, whatever the commit thread's pace


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_the_first_writer_killed_before_every_step(fsync_on: Path, tmp_path: Path, storage: str) -> None:
    """Killed while it makes the dataset (the head's transaction: build in tmp/, manifest,
    fsyncs, publish) or commits its first episodes: no dataset, or an empty or whole one, and
    the next writer (mode="append") creates or appends to it and leaves nothing in tmp/."""
    work = tmp_path / "full"
    points = faults.kill_points(lambda: _first_writer(work, storage), storage)
    assert uids_of(work) == [0, 1]
    seen = set()
    for i, step in enumerate(points):
        root = tmp_path / f"f{i}"
        killed = faults.kill_at(lambda root=root: _first_writer(root, storage), step)
        assert killed is not None, step
        if CacheRoot(root).exists("k"):
            uids = uids_of(root)
            assert uids in ([], [0], [0, 1]), (killed, uids)
            _inspect_check(root)
        else:
            with pytest.raises(DatasetNotFoundError):
                rlds_cli.open_dataset("k", root)
            uids = None
        seen.add(None if uids is None else tuple(uids))
        add(root, (2,), storage=storage, capacity_episodes=3, grace_seconds=0)
        assert uids_of(root) == [*(uids or []), 2], killed
        assert rlds_cli.open_dataset("k", root).manifest.backend == storage
        tmp = root / "tmp"
        assert not tmp.is_dir() or [p.name for p in tmp.iterdir()] == [], killed
        _inspect_check(root)
        rlds_cli.compact("k", root, grace_seconds=0)
        assert uids_of(root) == [*(uids or []), 2] and leftovers(root) == (0, 1), killed
        shutil.rmtree(root)
    assert seen == {None, (), (0,), (0, 1)}


def test_a_writer_appends_after_a_compaction_killed_before_every_step(fsync_on: Path, tmp_path: Path) -> None:
    """A compaction of three runs killed before each of its steps (its build, its merged
    segment between rename and record, after one run's record but not the next, during the
    removal of retired segments), then a writer appends (evicting one episode), then a
    compaction runs to its end: every committed, live episode once, in order, as without the
    kill. memmap, and a sample of the steps (every publishing step and both sides of it, each
    fsync wave's first and middle step, every faults.ZARR_EVERY-th): every step of the same
    compaction is killed in test_writer_kill's three-run test, and each kill here costs a
    writer and a compaction more (every step took 70 s of the suite)."""
    base = tmp_path / "base"
    multi_run_base(base, "memmap")
    reference = tmp_path / "reference"
    shutil.copytree(base, reference)
    rlds_cli.compact("k", reference, grace_seconds=0)
    add(reference, (9,))
    rlds_cli.compact("k", reference, grace_seconds=0)
    expected = uids_of(reference)
    assert expected == [4, 5, 6, 7, 8, 9] and leftovers(reference) == (0, 3)
    work = tmp_path / "full"
    shutil.copytree(base, work)
    compaction = faults.trace_steps(lambda: rlds_cli.compact("k", work, grace_seconds=0))
    for i, step in enumerate(faults.sample_steps(compaction, every=faults.ZARR_EVERY)):
        root = tmp_path / f"c{i}"
        shutil.copytree(base, root)
        killed = faults.kill_at(lambda root=root: rlds_cli.compact("k", root, grace_seconds=0), step)
        assert killed is not None, step
        assert uids_of(root) == [3, 4, 5, 6, 7, 8], killed
        add(root, (9,))
        assert uids_of(root) == expected, killed
        rlds_cli.compact("k", root, grace_seconds=0)
        assert uids_of(root) == expected and leftovers(root) == (0, 3), killed
        _inspect_check(root)
        shutil.rmtree(root)
