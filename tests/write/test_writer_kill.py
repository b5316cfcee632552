"""A writer or a compaction killed (as by SIGKILL) before every disk step (issue 25): no torn
episode visible, nothing committed lost, the dataset opens, ``inspect --check`` passes, and the
next writer and compaction go on."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.cache.layout import SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.errors import CommitFailedError
from rlds_cli.inspection.validate import check_dataset
from tests import faults
from tests.write.test_writer import episode

#: The suite's heaviest disk users run one after another on one test worker (``make test`` runs
#: ``pytest -n 2 --dist loadgroup``): each fsyncs, or churns files, for tens of seconds, and two
#: of them at once starved each other's fsyncs past their hang bounds on 2 shared cores.
pytestmark = pytest.mark.xdist_group("disk-heavy")

LENGTHS = {0: 3, 1: 2, 2: 4, 3: 1, 4: 2, 5: 3, 6: 1, 7: 2, 8: 3, 9: 2}


def uids_of(root: Path) -> list[int]:
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


def add(root: Path, uids: tuple[int, ...], *, protected: bool = False, **options: Any) -> None:
    """A writer that appends ``uids`` (one commit each), creating the dataset if need be."""
    with rlds_cli.DatasetWriter("k", root=root, mode="append", protected=protected, **options) as w:
        for uid in uids:
            w.add_episode(episode(LENGTHS[uid], 10.0 * uid, uid=uid))
            w.flush()  # a commit each, whatever the commit thread's pace


def _base(root: Path, storage: str = "memmap") -> None:
    with rlds_cli.DatasetWriter("k", root=root, storage=storage, capacity_episodes=3, grace_seconds=0) as w:
        for uid in (0, 1):
            w.add_episode(episode(LENGTHS[uid], 10.0 * uid, uid=uid))
            w.flush()  # a commit each, whatever the commit thread's pace


def _append(root: Path) -> None:
    add(root, (2, 3))  # the second commit evicts uid 0 and removes its segment


def leftovers(root: Path) -> tuple[int, int]:
    d = root / "datasets" / "k"
    return len(list((d / SEGMENT_BUILDS_DIR).iterdir())), len(list((d / SEGMENTS_DIR).iterdir()))


@pytest.fixture
def fsync_on(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLDS_FSYNC", "1")  # the fsyncs are steps too
    return isolated_cache


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_writer_killed_before_every_step(fsync_on: Path, tmp_path: Path, storage: str) -> None:
    base = tmp_path / "base"
    _base(base, storage)
    work = tmp_path / "full"
    shutil.copytree(base, work)
    points = faults.kill_points(lambda: _append(work), storage)
    assert uids_of(work) == [1, 2, 3]
    assert len(points) > 20
    seen = set()
    for i, step in enumerate(points):
        root = tmp_path / f"k{i}"
        shutil.copytree(base, root)
        killed = faults.kill_at(lambda root=root: _append(root), step)
        assert killed is not None, step
        uids = uids_of(root)
        # whole commits only, in order; an eviction never runs ahead of its commit
        assert uids in ([0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3]), (killed, uids)
        seen.add(tuple(uids))
        # the next writer and a compaction go on, and leave nothing behind
        add(root, (4,))
        before = uids_of(root)
        assert before == [*uids, 4][-3:], killed  # capacity_episodes=3
        rlds_cli.compact("k", root, grace_seconds=0)
        assert uids_of(root) == before
        assert leftovers(root) == (0, 1), killed
        shutil.rmtree(root)
    assert seen == {(0, 1), (0, 1, 2), (0, 1, 2, 3), (1, 2, 3)}


def multi_run_base(root: Path, storage: str) -> None:
    """Segments (one episode each) of three runs for a compaction: unprotected 3, 4 (after 0,
    1, 2, evicted whole), protected 5, 6, unprotected 7, 8 (capacity: 4 unprotected)."""
    add(root, (0, 1, 2, 3, 4), storage=storage, capacity_episodes=4, grace_seconds=0)
    add(root, (5, 6), protected=True)
    add(root, (7, 8))


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_compaction_of_three_runs_killed_before_every_step(
    fsync_on: Path, tmp_path: Path, storage: str
) -> None:
    base = tmp_path / "base"
    multi_run_base(base, storage)
    expected = uids_of(base)
    assert expected == [3, 4, 5, 6, 7, 8]
    once = tmp_path / "once"
    shutil.copytree(base, once)
    assert rlds_cli.compact("k", once, grace_seconds=0).merged_runs == 3
    assert uids_of(once) == expected and leftovers(once) == (0, 3)
    work = tmp_path / "full"
    shutil.copytree(base, work)
    points = faults.kill_points(lambda: rlds_cli.compact("k", work, grace_seconds=0), storage)
    assert uids_of(work) == expected and leftovers(work) == (0, 3)
    for i, step in enumerate(points):
        root = tmp_path / f"c{i}"
        shutil.copytree(base, root)
        killed = faults.kill_at(lambda root=root: rlds_cli.compact("k", root, grace_seconds=0), step)
        assert killed is not None, step
        assert uids_of(root) == expected, killed
        rlds_cli.compact("k", root, grace_seconds=0)
        assert uids_of(root) == expected and leftovers(root) == (0, 3), killed
        shutil.rmtree(root)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_segment_commit_is_durable_before_its_record(
    fsync_on: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """The fsyncs of a commit (two waves: the files and the folders; the log)
    leave every entry of the segment durable before the log's record commits it."""
    from tests.durability import DurabilityTrace, check_durable_segment

    schema = {k: (v.shape[1:], v.dtype) for k, v in episode(3, 0.0, uid=0).items()}
    with rlds_cli.DatasetWriter("d", storage=backend, schema=schema) as w:
        trace = DurabilityTrace(monkeypatch)
        w.add_episode(episode(3, 0.0, uid=0))
        w.flush()
        check_durable_segment(trace, fsync_on / "datasets" / "d")
        monkeypatch.undo()


def test_the_segment_durability_check_fails_without_the_folder_fsyncs(
    fsync_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli._util import io as durable
    from tests.durability import DurabilityTrace, check_durable_segment

    schema = {k: (v.shape[1:], v.dtype) for k, v in episode(3, 0.0, uid=0).items()}
    with rlds_cli.DatasetWriter("d", schema=schema) as w:
        monkeypatch.setattr(durable, "fsync_dir", lambda path: None)
        trace = DurabilityTrace(monkeypatch)
        w.add_episode(episode(3, 0.0, uid=0))
        w.flush()
        with pytest.raises(AssertionError, match="not fsynced before the commit record"):
            check_durable_segment(trace, fsync_on / "datasets" / "d")


def test_a_commit_whose_folders_fail_to_sync_commits_nothing_and_the_next_one_does(
    fsync_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO on the segment's folder fsync: the episode is not committed (no record names a
    segment whose entries may be lost), the error reaches the caller, and once the disk is
    back the same writer's next episode commits."""
    import errno
    import os

    real = os.fsync
    failing = {"on": True}

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if failing["on"] and os.path.isdir(path) and "/segments/" in path:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    schema = {k: (v.shape[1:], v.dtype) for k, v in episode(3, 0.0, uid=0).items()}
    with rlds_cli.DatasetWriter("d", schema=schema) as w:
        monkeypatch.setattr(os, "fsync", fsync)
        w.add_episode(episode(3, 0.0, uid=0))
        with pytest.raises(CommitFailedError, match=r"not written: .*Input/output error"):
            w.flush()  # the commit thread's failure, told by the writer's next call
        assert rlds_cli.open_dataset("d").num_episodes == 0
        failing["on"] = False
        w.add_episode(episode(4, 10.0, uid=1))
    ds = rlds_cli.open_dataset("d")
    assert ds.num_episodes == 1 and int(ds.episode(0)["info/episode_uid"][0]) == 1
    assert check_dataset(ds).ok


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _append_one(root: Path, uid: int) -> None:
    with rlds_cli.DatasetWriter("k", root=root, mode="append") as w:
        w.add_episode(episode(LENGTHS[uid], 10.0 * uid, uid=uid))


def test_a_scan_leaves_what_live_writers_and_the_log_still_need(isolated_cache: Path) -> None:
    """``compact`` with no grace removes a dead writer's build and unreferenced segment, and
    keeps those of a live writer (a build in progress, a segment between its rename and its
    record), whatever their age, and a segment committed after the view it started from."""
    import json
    import os
    import socket
    import time

    from rlds_cli.cache.growing import GrowingDataset
    from rlds_cli.write.segments import collect
    from tests.faults import assert_finishes_forked

    root = isolated_cache
    _base(root)
    d = root / "datasets" / "k"
    dead = _dead_pid()
    old = time.time() - 3600

    def leftover(folder: Path, pid: int, *, manifest: bool) -> Path:
        folder.mkdir()
        (folder / "x.npy").write_bytes(b"x")
        if manifest:
            writer = {"host": socket.gethostname(), "pid": pid, "created_by": "test"}
            (folder / "manifest.json").write_text(json.dumps({"source": {"writer": writer}}))
        os.utime(folder, (old, old))
        return folder

    live_build = leftover(d / SEGMENT_BUILDS_DIR / f"{'a' * 32}.{os.getpid()}", 0, manifest=False)
    dead_build = leftover(d / SEGMENT_BUILDS_DIR / f"{'b' * 32}.{dead}", 0, manifest=False)
    live_seg = leftover(d / SEGMENTS_DIR / ("c" * 32), os.getpid(), manifest=True)
    dead_seg = leftover(d / SEGMENTS_DIR / ("d" * 32), dead, manifest=True)
    rlds_cli.compact("k", root, grace_seconds=0)
    assert live_build.exists() and live_seg.exists()
    assert not dead_build.exists() and not dead_seg.exists()

    view = rlds_cli.open_dataset("k", root)
    assert isinstance(view, GrowingDataset)
    assert_finishes_forked(_append_one, root, 2)  # committed after the view, by a writer now gone
    for path in (d / SEGMENTS_DIR).iterdir():
        os.utime(path, (old, old))
    collect(d, view.state, 0, builds=True, unreferenced=True)
    assert uids_of(root)[-1] == 2


def test_a_segment_missing_at_open_is_one_clear_error(isolated_cache: Path) -> None:
    """A segment the log names, removed by hand: opening the dataset says which, not an
    AttributeError from a half-made view."""
    import shutil as sh

    from rlds_cli.errors import RldsError

    _base(isolated_cache)
    segments = sorted((isolated_cache / "datasets" / "k" / SEGMENTS_DIR).iterdir())
    sh.rmtree(segments[-1])
    with pytest.raises(RldsError, match=f"segment {segments[-1].name}") as info:
        rlds_cli.open_dataset("k", isolated_cache)
    # the log is whole: the hint is the segment's, not "restore commits.log from a backup"
    assert "commits.log" not in str(info.value.hint) and "rlds rm k" in str(info.value.hint)
