"""``rlds gc`` on growing datasets: the segments retired longer ago than the dataset's grace
period and the builds of writers that no longer run go, whatever wrote them; nothing a reader
of a younger view may still read, and nothing while a compaction runs.

Writers remove at most a few retired segments after each commit (``COLLECT_PER_COMMIT``), so
the retired segments of writers that have stopped wait for the next writer, ``rlds compact``,
or this."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from filelock import FileLock
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.commit_log import (
    seg_name,
)
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    COMMITTED_FILE,
    COMPACT_LOCK_SUFFIX,
    MANIFEST_FILE,
    SEGMENT_BUILDS_DIR,
    SEGMENTS_DIR,
)
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError, SchemaMismatchError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.write import segments
from rlds_cli.write.compact import remove_retired
from tests.dataset_fixtures import rewrite_manifest
from tests.write.test_writer import episode

runner = CliRunner()
#: Above Linux's largest pid (4,194,304): a writer that cannot be running.
DEAD_PID = 4_194_305


def _grow(name: str, episodes: int) -> Path:
    """A growing dataset of ``episodes`` commits, only the newest live: the others retired,
    each with an hour of grace."""
    options: dict[str, Any] = {"capacity_episodes": 1, "grace_seconds": 3600, "commit_interval": 0}
    with rlds_cli.DatasetWriter(name, mode="append", **options) as w:
        for uid in range(episodes):
            w.add_episode(episode(2, float(uid), uid=uid))
            w.flush()
    return CacheRoot().dataset_dir(name)


def _later(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hours on, for the collection: every retired segment is past its hour of grace."""
    real_time = segments.time.time
    monkeypatch.setattr(segments, "time", SimpleNamespace(time=lambda: real_time() + 7200))


def _uids(name: str) -> list[int]:
    ds = rlds_cli.open_dataset(name)
    assert check_dataset(ds).ok
    return [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)]


def test_gc_removes_retired_segments_past_their_grace(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _grow("g", 9)
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 9  # 8 retired, each within its grace
    result = runner.invoke(app, ["gc"])
    assert result.exit_code == 0, result.output
    assert "nothing to remove" in result.output  # an hour of grace: readers may still read them
    _later(monkeypatch)
    dry = runner.invoke(app, ["gc", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    listed = json.loads(dry.output)["removed"]
    assert len(listed) == 8 and all(Path(p).parent == directory / SEGMENTS_DIR for p in listed)
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 9  # a dry run removes nothing
    result = runner.invoke(app, ["gc"])
    assert result.exit_code == 0, result.output
    assert result.output.count("removed ") == 8 and "freed" in result.output
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 1
    assert list((directory / SEGMENT_BUILDS_DIR).iterdir()) == []  # the trash went too
    assert _uids("g") == [8]
    again = runner.invoke(app, ["gc"])
    assert "nothing to remove" in again.output


def test_gc_leaves_builds_to_compact(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build is named by its writer's pid alone, which a writer in another container can
    share: gc leaves builds alone; compact removes a dead writer's and keeps a live one's."""
    directory = _grow("g", 2)
    dead = directory / SEGMENT_BUILDS_DIR / f"{'ab' * 16}.{DEAD_PID}"
    live = directory / SEGMENT_BUILDS_DIR / f"{'cd' * 16}.{os.getpid()}"
    for build in (dead, live):
        build.mkdir()
        (build / "action.npy").write_bytes(b"\0" * 1000)
    _later(monkeypatch)
    retired = [directory / SEGMENTS_DIR / seg for seg in _retired_names("g")]
    assert len(retired) == 1 and remove_retired("g") == retired  # the segment, not the builds
    assert dead.is_dir() and live.is_dir()
    monkeypatch.setattr(segments, "time", time)
    removed = rlds_cli.compact("g", grace_seconds=0).removed
    assert f"{SEGMENT_BUILDS_DIR}/{dead.name}" in removed
    assert not dead.exists() and live.is_dir()  # a build in progress is never a leftover
    assert _uids("g") == [1]


def _retired_names(name: str) -> set[str]:
    """The segments on disk that the dataset's view no longer reads."""
    ds = rlds_cli.open_dataset(name)
    live = {seg_name(entry.seg) for entry, _ in ds.live_segments()}
    return {p.name for p in (ds.directory / SEGMENTS_DIR).iterdir()} - live


def test_a_dry_run_lists_only_what_is_still_on_disk(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log names every segment it ever retired; those a writer already removed are not
    listed (a long-lived dataset would list thousands, each of 0 B)."""
    directory = _grow("g", 9)
    _later(monkeypatch)
    with rlds_cli.DatasetWriter("g", mode="append", commit_interval=0) as w:
        w.add_episode(episode(2, 9.0, uid=9))  # its commit removes the 4 oldest of the 8 due
    on_disk = _retired_names("g")
    assert len(on_disk) == 5  # the 4 left, and the one this commit retired
    listed = json.loads(runner.invoke(app, ["gc", "--dry-run", "--json"]).output)["removed"]
    assert sorted(Path(p).name for p in listed) == sorted(on_disk)
    assert all(Path(p).parent == directory / SEGMENTS_DIR for p in listed)
    assert "freed" in runner.invoke(app, ["gc"]).output
    assert "nothing to remove" in runner.invoke(app, ["gc", "--dry-run"]).output
    assert _retired_names("g") == set() and _uids("g") == [9]


def test_gc_leaves_a_dataset_alone_while_it_is_compacted(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _grow("g", 4)
    _later(monkeypatch)
    cache = CacheRoot()
    cache.locks_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache.layout.lock_file("g" + COMPACT_LOCK_SUFFIX))):
        assert remove_retired("g", dry_run=True) == []  # the dry run says what gc would do
        assert remove_retired("g") == []
        assert len(list((directory / SEGMENTS_DIR).iterdir())) == 4
    assert len(remove_retired("g")) == 3


def test_gc_skips_an_unreadable_growing_dataset_with_one_line(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _grow("bad", 3)
    good = _grow("good", 3)
    (CacheRoot().dataset_dir("bad") / COMMIT_LOG_FILE).unlink()
    _later(monkeypatch)
    result = runner.invoke(app, ["gc"])
    assert result.exit_code == 0, result.output
    lines = [
        line
        for line in result.output.splitlines()
        if line.startswith("warning: skipped growing dataset bad: ")
    ]
    assert len(lines) == 1 and "has no commit log" in lines[0], result.output
    assert "Traceback" not in result.output
    assert len(list((CacheRoot().dataset_dir("bad") / SEGMENTS_DIR).iterdir())) == 3  # left alone
    assert len(list((good / SEGMENTS_DIR).iterdir())) == 1  # the other dataset was collected
    quiet = runner.invoke(app, ["gc", "-q"])  # stdout: the removed paths alone
    assert "skipped growing dataset bad" in quiet.stderr and "skipped" not in quiet.stdout
    as_json = runner.invoke(app, ["gc", "--json"])
    assert json.loads(as_json.output)["skipped"][0]["name"] == "bad"


def test_remove_retired_refuses_a_converted_dataset(isolated_cache: Path) -> None:
    runner.invoke(app, ["demo", "--quiet"])
    names = [m.name for m in CacheRoot().iter_manifests()]
    assert names
    with pytest.raises(SchemaMismatchError, match="not a growing dataset"):
        remove_retired(names[0])


def test_gc_leaves_segments_the_log_does_not_name_to_compact(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment the log does not name (a writer killed between its rename and its record) is
    a leftover only if the log is whole, which gc cannot know: a damaged log names nothing.
    ``rlds compact`` removes it; gc leaves it."""
    directory = _grow("g", 2)
    live = next((directory / SEGMENTS_DIR).iterdir())
    orphan = directory / SEGMENTS_DIR / ("ef" * 16)
    shutil.copytree(live, orphan)
    (orphan / COMMITTED_FILE).unlink()  # made after the record: a killed writer's has none
    manifest = json.loads((orphan / MANIFEST_FILE).read_text())
    manifest["source"]["writer"]["pid"] = DEAD_PID
    (orphan / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(orphan / MANIFEST_FILE)
    _later(monkeypatch)
    assert orphan not in remove_retired("g", dry_run=True)
    assert orphan not in remove_retired("g") and orphan.is_dir()
    monkeypatch.setattr(segments, "time", time)  # compact with no grace, now
    assert orphan.name in rlds_cli.compact("g", grace_seconds=0).removed
    assert not orphan.exists() and _uids("g") == [1]


def test_compact_keeps_every_segment_of_a_log_overwritten_outside_rlds(isolated_cache: Path) -> None:
    """A log overwritten outside rlds is damage: it names no segment, and compact would have
    taken every one for a dead writer's leftover. Compact, gc and the check report it and
    remove nothing (more cases: tests/cache/test_log_damage.py)."""
    directory = _grow("g", 6)
    for segment in (directory / SEGMENTS_DIR).iterdir():  # their writer is gone
        manifest = json.loads((segment / MANIFEST_FILE).read_text())
        manifest["source"]["writer"]["pid"] = DEAD_PID
        (segment / MANIFEST_FILE).write_text(json.dumps(manifest))
        rewrite_manifest(segment / MANIFEST_FILE)
    log = directory / COMMIT_LOG_FILE
    log.write_bytes(b"\xff" * log.stat().st_size)
    with pytest.raises(CorruptDatasetError, match=r"commits\.log is damaged: record 0"):
        rlds_cli.compact("g", grace_seconds=0)
    with pytest.raises(CorruptDatasetError, match=r"commits\.log is damaged"):
        remove_retired("g")
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 6
    result = runner.invoke(app, ["inspect", "g", "--check"])  # the check says so
    assert result.exit_code == 1 and "commits.log is damaged" in result.output, result.output


def test_gc_names_a_dataset_it_cannot_clean_and_goes_on(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OS error on one growing dataset (its lock, a folder) is one line; the others are
    cleaned and ``--json`` stays one document."""
    import errno

    from rlds_cli.write import compact as compact_module

    _grow("a", 3)
    _grow("b", 3)
    _later(monkeypatch)
    real = compact_module.remove_retired

    def remove(name: str, *args: Any, **kwargs: Any) -> list[Path]:
        if name == "a":
            raise OSError(errno.EROFS, "Read-only file system", str(CacheRoot().locks_dir))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(compact_module, "remove_retired", remove)
    result = runner.invoke(app, ["gc", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [s["name"] for s in doc["skipped"]] == ["a"] and "read-only" in doc["skipped"][0]["error"].lower()
    assert len(doc["removed"]) == 2 and all("/b/" in p for p in doc["removed"])


def test_gc_collects_beside_a_damaged_live_segment(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc reads the log, not the segments: a live segment missing a file (the check's to
    report) does not keep the retired ones on disk."""
    directory = _grow("g", 4)
    retired = {directory / SEGMENTS_DIR / seg for seg in _retired_names("g")}
    (damaged,) = set((directory / SEGMENTS_DIR).iterdir()) - retired  # the live one
    next(p for p in damaged.rglob("*.npy") if p.name != "episodes.npy").unlink()
    _later(monkeypatch)
    assert set(remove_retired("g")) == retired
    assert [p.name for p in (directory / SEGMENTS_DIR).iterdir()] == [damaged.name]


def test_the_walk_for_due_segments_stops_at_the_first_one_not_due(tmp_path: Path) -> None:
    """Retirement order is time order: the first segment still within its grace ends the walk
    (a commit costs the segments due, not every one retired within the grace). A stamp out of
    order (another host's clock) delays the segments after it, never collects one early."""
    from rlds_cli.cache.commit_log import LogState, RetiredSegments
    from rlds_cli.write.segments import leftovers, seg_name

    now = time.time()
    ids = [bytes([k]) * 16 for k in range(1, 6)]
    state = LogState()
    # retired 100, 90 s ago; then one stamped 10 s ago by a clock ahead; then 80, 5 s ago
    state.retired = RetiredSegments(zip(ids, [now - 100, now - 90, now - 10, now - 80, now - 5], strict=True))
    assert leftovers(tmp_path, state, 60.0).segments == [seg_name(s) for s in ids[:2]]
    assert leftovers(tmp_path, state, 8.0).segments == [seg_name(s) for s in ids[:4]]
    assert leftovers(tmp_path, state, 0.0).segments == [seg_name(s) for s in ids]
    assert leftovers(tmp_path, state, 1000.0).segments == []
