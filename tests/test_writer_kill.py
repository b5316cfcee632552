"""A writer or a compaction killed (as by SIGKILL) before every disk step (issue 25): no torn
episode visible, nothing committed lost, the dataset opens, ``inspect --check`` passes, and the
next writer and compaction go on."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.cache.layout import SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.validate import check_dataset
from tests import faults
from tests.test_writer import episode

LENGTHS = {0: 3, 1: 2, 2: 4, 3: 1, 4: 2}


def _uids(root: Path) -> list[int]:
    """The episodes visible, by uid, each checked whole against what was written."""
    ds = rlds_cli.open_dataset("k", root)
    report = check_dataset(ds)
    assert report.ok, [str(v) for v in report.violations]
    uids = []
    for i in range(ds.num_episodes):
        got = ds.episode(i)
        uid = int(got["info/episode_uid"][0])
        want = episode(LENGTHS[uid], 10.0 * uid, uid=uid)
        for key, value in want.items():
            assert np.array_equal(got[key].reshape(value.shape), value), (uid, key)
        uids.append(uid)
    return uids


def _base(root: Path) -> None:
    with rlds_cli.DatasetWriter("k", root=root, capacity_episodes=3, grace_seconds=0) as w:
        for uid in (0, 1):
            w.add_episode(episode(LENGTHS[uid], 10.0 * uid, uid=uid))


def _append(root: Path) -> None:
    with rlds_cli.DatasetWriter("k", root=root, mode="append") as w:
        for uid in (2, 3):  # the second commit evicts uid 0 and removes its segment
            w.add_episode(episode(LENGTHS[uid], 10.0 * uid, uid=uid))


def _leftovers(root: Path) -> tuple[int, int]:
    d = root / "datasets" / "k"
    return len(list((d / SEGMENT_BUILDS_DIR).iterdir())), len(list((d / SEGMENTS_DIR).iterdir()))


@pytest.fixture
def fsync_on(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLDS_FSYNC", "1")  # the fsyncs are steps too
    return isolated_cache


def test_writer_killed_before_every_step(fsync_on: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    _base(base)
    work = tmp_path / "full"
    shutil.copytree(base, work)
    total = faults.count_steps(lambda: _append(work))
    assert _uids(work) == [1, 2, 3]
    assert total > 20
    seen = set()
    for step in range(1, total + 1):
        root = tmp_path / f"k{step}"
        shutil.copytree(base, root)
        killed = faults.kill_at(lambda root=root: _append(root), step)
        assert killed is not None, step
        uids = _uids(root)
        # whole commits only, in order; an eviction never runs ahead of its commit
        assert uids in ([0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3]), (killed, uids)
        seen.add(tuple(uids))
        # the next writer and a compaction go on, and leave nothing behind
        with rlds_cli.DatasetWriter("k", root=root, mode="append") as w:
            w.add_episode(episode(LENGTHS[4], 40.0, uid=4))
        before = _uids(root)
        assert before == [*uids, 4][-3:], killed  # capacity_episodes=3
        rlds_cli.compact("k", root, grace_seconds=0)
        assert _uids(root) == before
        assert _leftovers(root) == (0, 1), killed
        shutil.rmtree(root)
    assert seen == {(0, 1), (0, 1, 2), (0, 1, 2, 3), (1, 2, 3)}


def test_compaction_killed_before_every_step(fsync_on: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    _base(base)
    _append(base)
    with rlds_cli.DatasetWriter("k", root=base, mode="append", protected=True) as w:
        w.add_episode(episode(LENGTHS[4], 40.0, uid=4))
    expected = _uids(base)
    work = tmp_path / "full"
    shutil.copytree(base, work)
    total = faults.count_steps(lambda: rlds_cli.compact("k", work, grace_seconds=0))
    assert _uids(work) == expected and _leftovers(work) == (0, 2)
    for step in range(1, total + 1):
        root = tmp_path / f"c{step}"
        shutil.copytree(base, root)
        killed = faults.kill_at(lambda root=root: rlds_cli.compact("k", root, grace_seconds=0), step)
        assert killed is not None, step
        assert _uids(root) == expected, killed
        rlds_cli.compact("k", root, grace_seconds=0)
        assert _uids(root) == expected and _leftovers(root) == (0, 2), killed
        shutil.rmtree(root)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_segment_commit_is_durable_before_its_record(
    fsync_on: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """The fsyncs of a commit (three waves: the files; the manifest and the folders; the log)
    leave every entry of the segment durable before the log's record commits it."""
    from tests.durability import DurabilityTrace, check_durable_segment

    schema = {k: (v.shape[1:], v.dtype) for k, v in episode(3, 0.0, uid=0).items()}
    with rlds_cli.DatasetWriter("d", storage=backend, schema=schema) as w:
        trace = DurabilityTrace(monkeypatch)
        w.add_episode(episode(3, 0.0, uid=0))
        check_durable_segment(trace, fsync_on / "datasets" / "d")
        monkeypatch.undo()


def test_the_segment_durability_check_fails_without_the_folder_fsyncs(
    fsync_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli.cache import durable
    from tests.durability import DurabilityTrace, check_durable_segment

    schema = {k: (v.shape[1:], v.dtype) for k, v in episode(3, 0.0, uid=0).items()}
    with rlds_cli.DatasetWriter("d", schema=schema) as w:
        monkeypatch.setattr(durable, "fsync_dir", lambda path: None)
        trace = DurabilityTrace(monkeypatch)
        w.add_episode(episode(3, 0.0, uid=0))
        with pytest.raises(AssertionError, match="not fsynced before the commit record"):
            check_durable_segment(trace, fsync_on / "datasets" / "d")
