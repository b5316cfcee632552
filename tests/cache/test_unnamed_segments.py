"""Segments the commit log does not name, and the other edges a review of ``rlds gc`` and
``rlds compact`` found: a killed writer leaves at most one such segment, so several of one
writer, or several beside a log with no record, are records the log lost (emptied, cut short)
and are kept; a dataset's bad settings are one clear line; a segment a writer removes while gc
measures it, and a ``building/`` folder removed by hand, change nothing of what gc does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli._util.io import tree_bytes
from rlds_cli.cache import commit_log
from rlds_cli.cache.commit_log import RECORD_SIZE, LogState
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    COMMITTED_FILE,
    MANIFEST_FILE,
    SEGMENT_BUILDS_DIR,
    SEGMENTS_DIR,
)
from rlds_cli.cli.app import app
from rlds_cli.errors import CommitFailedError, CorruptDatasetError
from rlds_cli.write.compact import remove_retired
from tests.cache.test_gc_growing import DEAD_PID, _grow, _later
from tests.dataset_fixtures import rewrite_manifest
from tests.faults import assert_finishes_forked
from tests.write.test_writer import episode

runner = CliRunner()


def _append(name: str, episodes: int) -> Path:
    """``episodes`` commits of one episode each, every one live (no capacity)."""
    with rlds_cli.DatasetWriter(name, mode="append", commit_interval=0) as w:
        for uid in range(episodes):
            w.add_episode(episode(2, float(uid), uid=uid))
            w.flush()
    return rlds_cli.open_dataset(name).directory


def _as_dead_writers(directory: Path, pids: list[int]) -> list[Path]:
    """Say in each segment's manifest that it was written by the matching pid of ``pids``
    (numbers no running process has), in the segments' name order."""
    found = sorted((directory / SEGMENTS_DIR).iterdir())
    for segment, pid in zip(found, pids, strict=True):
        manifest = json.loads((segment / MANIFEST_FILE).read_text())
        manifest["source"]["writer"]["pid"] = pid
        (segment / MANIFEST_FILE).write_text(json.dumps(manifest))
        rewrite_manifest(segment / MANIFEST_FILE)
    return found


@pytest.mark.parametrize("writers", ["one", "several"])
def test_an_emptied_log_keeps_every_segment(
    isolated_cache: Path, caplog: pytest.LogCaptureFixture, writers: str
) -> None:
    """A log emptied outside rlds names nothing: every segment looks like a killed writer's
    leftover. One writer leaves at most one, and a log with no record beside several segments
    lost them: compact keeps them all, and the check says so."""
    directory = _append("g", 6)
    pids = [DEAD_PID] * 6 if writers == "one" else [DEAD_PID + i for i in range(6)]
    _as_dead_writers(directory, pids)
    (directory / COMMIT_LOG_FILE).write_bytes(b"")
    why = "does not name 6 segments" if writers == "one" else "holds no record, and 6 segments are on disk"
    with pytest.raises(CorruptDatasetError, match=why):
        rlds_cli.compact("g", grace_seconds=0)
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 6
    with pytest.raises(CorruptDatasetError, match=why):  # never served as an empty dataset
        rlds_cli.open_dataset("g")
    result = runner.invoke(app, ["inspect", "g", "--check"])
    assert result.exit_code == 1, result.output
    assert "commits.log" in result.output and why in result.output


def test_an_emptied_log_beside_a_compacted_dataset_keeps_its_one_segment(
    isolated_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After ``rlds compact`` a dataset is one merged segment: its log emptied (or restored from a
    copy older than the first commit), every check passed and compact deleted the data as a
    killed writer's leftover. A merge is made of segments a log named: it is lost records."""
    directory = _append("g", 5)
    rlds_cli.compact("g", grace_seconds=0)
    (merged,) = _as_dead_writers(directory, [DEAD_PID])
    (directory / COMMIT_LOG_FILE).write_bytes(b"")
    for _ in range(2):
        with pytest.raises(CorruptDatasetError, match="merges others"):
            rlds_cli.compact("g", grace_seconds=0)
        assert merged.is_dir()
    with pytest.raises(CorruptDatasetError, match="merges others"):  # it served no episode, exit 0
        rlds_cli.open_dataset("g")
    with (
        pytest.raises(CommitFailedError, match="merges others"),
        rlds_cli.DatasetWriter("g", mode="append") as w,
    ):
        w.add_episode(episode(3))  # committed into, the lost episodes would stay unseen
    assert [p.name for p in (directory / SEGMENTS_DIR).iterdir()] == [merged.name]
    result = runner.invoke(app, ["inspect", "g", "--check"])
    assert result.exit_code == 1 and "merges others" in result.output, result.output
    assert runner.invoke(app, ["verify", "g"]).exit_code == 1


def test_a_log_cut_short_keeps_the_segments_of_its_lost_records(
    isolated_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last three records of one writer lost (the log cut short): three segments of that
    writer are not named, more than a kill leaves; compact keeps them, the check fails."""
    directory = _append("g", 6)
    _as_dead_writers(directory, [DEAD_PID] * 6)
    log = directory / COMMIT_LOG_FILE
    with open(log, "r+b") as fh:  # the records of the last three commits: the log's end
        fh.truncate(log.stat().st_size - 3 * RECORD_SIZE)
    state = LogState()
    state.follow(log)
    lost = {p.name for p in (directory / SEGMENTS_DIR).iterdir() if not state.names(bytes.fromhex(p.name))}
    assert len(lost) == 3
    before = sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir())
    # it merged the three the log names and removed them: restored, the whole log named
    # segments that were gone. Now nothing is merged or removed, nothing served as all
    with pytest.raises(CorruptDatasetError, match="does not name 3 segments"):
        rlds_cli.compact("g", grace_seconds=0)
    assert sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir()) == before
    with pytest.raises(CorruptDatasetError, match="does not name 3 segments"):
        rlds_cli.open_dataset("g")
    assert runner.invoke(app, ["inspect", "g", "--check"]).exit_code == 1


@pytest.mark.parametrize(
    ("cut", "writer"),
    [
        ("whole record", "gone"),
        ("inside the record", "gone"),
        ("zeroed after its magic", "gone"),
        ("whole record", "running"),
    ],
)
def test_a_log_that_lost_its_last_record_keeps_that_segment(
    isolated_cache: Path, caplog: pytest.LogCaptureFixture, cut: str, writer: str
) -> None:
    """The log's last record lost (cut at a record's edge, cut inside it, or its bytes zeroed as
    a crash tears): its segment, the one the log does not name, has the file its writer makes
    after the record, so it is no writer's leftover killed before its record. Both checks passed
    and compact deleted the committed episode. A writer process still running (this one) is past
    that record too: the checks passed while it ran."""
    directory = _append("g", 3)
    if writer == "gone":
        _as_dead_writers(directory, [DEAD_PID] * 3)
    log = directory / COMMIT_LOG_FILE
    size = log.stat().st_size
    with open(log, "r+b") as fh:
        if cut == "whole record":
            fh.truncate(size - RECORD_SIZE)
        elif cut == "inside the record":
            fh.truncate(size - RECORD_SIZE // 2)
        else:
            fh.seek(size - RECORD_SIZE + 4)
            fh.write(b"\0" * (RECORD_SIZE - 4))
    state = LogState()
    state.follow(log)
    (lost,) = [p for p in (directory / SEGMENTS_DIR).iterdir() if not state.names(bytes.fromhex(p.name))]
    before = sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir())
    why = f"does not name segment {lost.name}, whose record was appended"
    with pytest.raises(CorruptDatasetError, match=why):
        rlds_cli.compact("g", grace_seconds=0)
    assert runner.invoke(app, ["gc"]).exit_code == 0
    assert sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir()) == before
    with pytest.raises(CorruptDatasetError, match=why):  # never served as the dataset's episodes
        rlds_cli.open_dataset("g")
    with pytest.raises(CommitFailedError, match=why), rlds_cli.DatasetWriter("g", mode="append") as w:
        w.add_episode(episode(3))
    for args in (["inspect", "g", "--check"], ["verify", "g"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and "whose record was appended" in result.output, (args, result.output)
    assert sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir()) == before


def _commit_one_in_a_process(directory: Path, *, killed_after_its_record: bool) -> None:
    """A writer process that commits one episode and is gone; ``killed_after_its_record``: as
    killed between its record and its committed file."""
    before = set((directory / SEGMENTS_DIR).iterdir())
    assert_finishes_forked(_append, "g", 1)
    (new,) = set((directory / SEGMENTS_DIR).iterdir()) - before
    if killed_after_its_record:
        (new / COMMITTED_FILE).unlink()


@pytest.mark.parametrize("killed_after_its_record", [False, True], ids=["whole", "killed"])
def test_a_commit_between_the_log_read_and_the_listing_is_no_lost_record_nor_leftover(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, killed_after_its_record: bool
) -> None:
    """A writer process commits and ends while a check has read the log and not yet listed
    ``segments/``: the new segment is on disk, named by no record the check read, and its
    writer gone. Its committed file made it a lost record (every open refused the dataset);
    without it (the writer killed after its record), compact removed it as a leftover and the
    log then named a missing segment. The log is read again after the listing."""
    _append("g", 2)
    real = commit_log.segment_folders
    commits: list[Path] = []

    def listing(folder: Path) -> list[Path]:
        if not commits:
            commits.append(folder)
            _commit_one_in_a_process(folder, killed_after_its_record=killed_after_its_record)
        return real(folder)

    monkeypatch.setattr(commit_log, "segment_folders", listing)
    if killed_after_its_record:
        rlds_cli.compact("g", grace_seconds=0)  # merges the three, removes none unmerged
    else:
        assert rlds_cli.open_dataset("g").num_episodes == 2  # its view: the log as it first read it
    assert commits
    monkeypatch.setattr(commit_log, "segment_folders", real)
    assert rlds_cli.open_dataset("g").num_episodes == 3
    assert runner.invoke(app, ["inspect", "g", "--check"]).exit_code == 0


def test_a_reader_that_opened_a_segment_before_its_mark_reads_it(isolated_cache: Path) -> None:
    """A reader opens a segment as soon as the log names it; its writer makes the segment's
    commit mark right after. The mark was a file in the segment's folder, whose ctime is the
    version a reader pins: the reader's next column open said the segment "was replaced while it
    was open" (a concurrent compaction failed so, once in 12 runs)."""
    from rlds_cli.cache.dataset import Dataset

    directory = _append("g", 1)
    (segment,) = (directory / SEGMENTS_DIR).iterdir()
    (segment / COMMITTED_FILE).unlink()  # as it is between the record and the mark
    part = Dataset(segment)
    commit_log.mark_committed(segment)
    assert (segment / COMMITTED_FILE).is_file()
    assert np.asarray(part.column("action")).shape[0] == 2
    assert part.check_files() == []


@pytest.mark.parametrize("process", ["two", "one"])
def test_one_leftover_of_each_of_several_killed_writers_is_removed(
    isolated_cache: Path, process: str
) -> None:
    """Two writers killed between their segment and its record leave one segment each: both
    leftovers, removed by compact; the committed episodes stay and the check passes. Two writers
    of one process (a demo writer beside an actor's) are two writers: every open refused the
    dataset as one that lost records, and compact never removed them."""
    directory = _append("g", 2)
    pids = (DEAD_PID, DEAD_PID + 1) if process == "two" else (DEAD_PID, DEAD_PID)
    for i, pid in enumerate(pids):
        live = next((directory / SEGMENTS_DIR).iterdir())
        orphan = directory / SEGMENTS_DIR / (f"e{i}" * 16)
        shutil.copytree(live, orphan)
        (orphan / COMMITTED_FILE).unlink()  # made after the record: a killed writer's has none
        manifest = json.loads((orphan / MANIFEST_FILE).read_text())
        manifest["source"]["writer"]["pid"] = pid
        manifest["source"]["writer"]["instance"] = f"writer-{i}"
        (orphan / MANIFEST_FILE).write_text(json.dumps(manifest))
        rewrite_manifest(orphan / MANIFEST_FILE)
    assert runner.invoke(app, ["inspect", "g", "--check"]).exit_code == 0
    removed = rlds_cli.compact("g", grace_seconds=0).removed
    assert {"e0" * 16, "e1" * 16} <= set(removed)
    assert rlds_cli.open_dataset("g").num_episodes == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("grace_seconds", None),
        ("grace_seconds", -1),
        ("grace_seconds", "soon"),
        ("capacity", 0),
        ("min_size", 1.5),
    ],
)
def test_a_bad_setting_in_the_manifest_is_one_line(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: object
) -> None:
    """A head manifest edited outside rlds: gc skips the dataset with one warning naming the
    key (and still cleans the others), opening it is one clear error."""
    directory = _grow("g", 3)
    other = _grow("other", 3)
    _later(monkeypatch)
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    manifest["source"]["growing"][key] = value
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(directory / MANIFEST_FILE)
    result = runner.invoke(app, ["gc"])
    assert result.exit_code == 0, result.output
    assert f"skipped growing dataset g: growing dataset 'g': its manifest's {key} must be" in result.stderr
    assert "unexpected" not in result.output and "Traceback" not in result.output
    assert len(list((other / SEGMENTS_DIR).iterdir())) == 1  # the other dataset was cleaned
    with pytest.raises(CorruptDatasetError, match=key):
        rlds_cli.open_dataset("g")
    result = runner.invoke(app, ["inspect", "g"])
    assert result.exit_code == 1 and key in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "option",
    [
        {"grace_seconds": -1.0},
        {"grace_seconds": float("nan")},
        {"capacity": 0},
        {"capacity_episodes": -2},
        {"min_size": -1},
        {"capacity": 2.5},
    ],
)
def test_bad_writer_settings_are_refused(isolated_cache: Path, option: dict[str, object]) -> None:
    key = next(iter(option))
    with pytest.raises(ValueError, match=key):
        rlds_cli.DatasetWriter("w", **option)  # type: ignore[arg-type]
    assert not (isolated_cache / "datasets" / "w").exists()


def test_gc_measures_a_segment_a_writer_removes_meanwhile(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's commit collects a due segment while gc measures it (gc lists, then measures,
    then removes): gc does not skip the dataset, and removes the others."""
    directory = _grow("g", 4)
    _later(monkeypatch)
    real_walk = os.walk
    taken: list[str] = []

    def walk(top: str, *args: object, **kwargs: object) -> object:
        for folder, dirs, names in real_walk(top, *args, **kwargs):  # type: ignore[arg-type]
            if not taken and Path(folder).parent.name == SEGMENTS_DIR:
                taken.append(folder)
                shutil.rmtree(folder)  # listed, then collected by a writer
            yield folder, dirs, names

    monkeypatch.setattr(os, "walk", walk)
    result = runner.invoke(app, ["gc"])
    assert taken and result.exit_code == 0 and "skipped" not in result.stderr, result.output
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 1


def test_tree_bytes_counts_nothing_of_what_is_removed_while_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "segment"
    (tree / "key").mkdir(parents=True)
    (tree / "key" / "data.bin").write_bytes(b"x" * 10_000)
    (tree / "manifest.json").write_bytes(b"{}")
    real_walk = os.walk

    def walk(top: str) -> object:
        for folder, dirs, names in real_walk(top):
            (tree / "manifest.json").unlink(missing_ok=True)  # listed, then removed
            shutil.rmtree(tree / "key", ignore_errors=True)  # listed below, then removed
            yield folder, dirs, names

    monkeypatch.setattr(os, "walk", walk)
    assert tree_bytes(tree) == 0
    assert tree_bytes(tmp_path / "gone") == 0


def test_collect_makes_a_removed_building_folder_again(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``building/`` removed by hand: the collection renames through it all the same, so the
    real run removes what the dry run listed."""
    directory = _grow("g", 4)
    shutil.rmtree(directory / SEGMENT_BUILDS_DIR)
    _later(monkeypatch)
    listed = remove_retired("g", dry_run=True)
    assert len(listed) == 3
    assert sorted(remove_retired("g")) == sorted(listed)
    assert len(list((directory / SEGMENTS_DIR).iterdir())) == 1


def test_the_segments_folder_is_listed_in_one_place_without_the_checkpoint(tmp_path: Path) -> None:
    """``segment_folders``: what ``gc``/``compact`` (unnamed segments) and ``stats`` count is
    every entry of ``segments/`` but the log's checkpoint, in name order; none without the folder."""
    from rlds_cli.cache.layout import LOG_CHECKPOINT_FILE, SEGMENTS_DIR, segment_folders

    assert segment_folders(tmp_path) == []
    segments = tmp_path / SEGMENTS_DIR
    segments.mkdir()
    for name in ("0b", "0a", "stray"):
        (segments / name).mkdir()
    (segments / LOG_CHECKPOINT_FILE).write_bytes(b"x")
    assert [p.name for p in segment_folders(tmp_path)] == ["0a", "0b", "stray"]


def test_a_folder_or_file_not_named_as_a_segment_is_kept(isolated_cache: Path) -> None:
    """A folder not named by a segment id was moved aside and deleted, then compact failed with
    "unexpected ValueError"; a stray file (a Finder .DS_Store) is no one's leftover either, and
    neither blocks the dataset."""
    directory = _append("g", 3)
    stray = directory / SEGMENTS_DIR / "notes"
    stray.mkdir()
    (stray / "mine.txt").write_text("keep")
    (directory / SEGMENTS_DIR / ".DS_Store").write_bytes(b"\0")
    for args in (
        ["compact", "g", "--grace", "0"],
        ["inspect", "g", "--check", "--no-stats"],
        ["verify", "g"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    assert (stray / "mine.txt").read_text() == "keep" and (directory / SEGMENTS_DIR / ".DS_Store").is_file()
    assert rlds_cli.open_dataset("g").num_episodes == 3
