"""A writer merges its dataset's newest small segments as it goes (issue 37, item 7): many small
commits stay a few segments, read back exactly, never mixing protected with unprotected
episodes, never past the capacity's share, never merging damage; killed before every step of a
merge, nothing is lost."""

from __future__ import annotations

import multiprocessing as mp
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.commit_log import FINAL_GENERATION
from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.cache.layout import SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.cli.app import app
from rlds_cli.errors import CommitFailedError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.write import compact as merging
from tests import faults
from tests.write.test_writer import episode

runner = CliRunner()


def _length(uid: int) -> int:
    return 1 + uid % 4


def _episode(uid: int) -> dict[str, np.ndarray]:
    return episode(_length(uid), 10.0 * uid, uid=uid)


def add(root: Path | None, uids: range | list[int], name: str = "m", **options: object) -> None:
    """One commit per episode (``flush`` after each)."""
    with rlds_cli.DatasetWriter(name, root=root, mode="append", **options) as w:  # type: ignore[arg-type]
        for uid in uids:
            w.add_episode(_episode(uid))
            w.flush()


def uids(name: str = "m", root: Path | None = None) -> list[int]:
    """The episodes visible, by uid, each checked whole against what was written."""
    ds = rlds_cli.open_dataset(name, root)
    report = check_dataset(ds)
    assert report.ok, [str(v) for v in report.violations]
    got = []
    for i in range(ds.num_episodes):
        ep = ds.episode(i)
        uid = int(ep["info/episode_uid"][0])
        for key, value in _episode(uid).items():
            assert np.array_equal(ep[key].reshape(value.shape), value), (uid, key)
        got.append(uid)
    return got


def generations(name: str = "m", root: Path | None = None) -> list[int]:
    ds = rlds_cli.open_dataset(name, root)
    assert isinstance(ds, GrowingDataset)
    return [entry.generation for entry, _ in ds.live_segments()]


@pytest.fixture
def fanin4(monkeypatch: pytest.MonkeyPatch) -> None:
    """Merges of 4 segments (16 by default): the same rules in fewer commits."""
    monkeypatch.setattr(merging, "MERGE_FANIN", 4)


def test_one_episode_commits_become_a_base_16_counter(isolated_cache: Path) -> None:
    add(None, range(300))
    assert uids() == list(range(300))
    # 300 = 1 x 256 + 2 x 16 + 12: one segment of generation 2, two of 1, twelve commits
    assert generations() == [2, 1, 1] + [0] * 12
    ds = rlds_cli.open_dataset("m")
    assert np.array_equal(ds.episode_ids, np.arange(300))


def test_a_reader_keeps_its_view_and_follows_the_merges(isolated_cache: Path, fanin4: None) -> None:
    add(None, range(3))
    before = rlds_cli.open_dataset("m")
    rows = before.gather(np.arange(before.num_steps))
    add(None, range(3, 20))  # merges retire the segments the reader's view holds
    assert np.array_equal(before.gather(np.arange(before.num_steps))["observation"], rows["observation"])
    assert before.refresh()
    assert uids() == list(range(20))
    assert np.array_equal(before.episode_ids, np.arange(20))
    assert before.num_episodes == 20 and len(before.segment_datasets()) == len(generations())


def test_protected_and_compacted_segments_are_never_merged_with_others(
    isolated_cache: Path, fanin4: None
) -> None:
    add(None, range(6), protected=True)
    assert generations() == [1, 0, 0]
    add(None, range(6, 9))
    rlds_cli.compact("m")  # one run of each kind
    assert generations() == [FINAL_GENERATION, FINAL_GENERATION]
    add(None, range(9, 13))
    assert generations() == [FINAL_GENERATION, FINAL_GENERATION, 1]
    ds = rlds_cli.open_dataset("m")
    assert isinstance(ds, GrowingDataset)
    assert [entry.protected for entry, _ in ds.live_segments()] == [True, False, False]
    assert uids() == list(range(13))


def test_protected_segments_apart_in_the_log_are_never_merged(isolated_cache: Path, fanin4: None) -> None:
    """A protected and an ordinary writer in turn, with a capacity: the ordinary episodes between
    the protected segments were evicted, the protected ones became neighbours in the view, and
    their merge recorded a log range the log calls damage: the dataset opened for no one."""
    with (
        rlds_cli.DatasetWriter("m", mode="append", capacity_episodes=1, protected=True) as demo,
        rlds_cli.DatasetWriter("m", mode="append") as actor,
    ):
        for uid in range(0, 20, 2):
            demo.add_episode(_episode(uid))
            demo.flush()
            actor.add_episode(_episode(uid + 1))  # evicts the ordinary episode before it
            actor.flush()
    assert uids() == [*range(0, 20, 2), 19]
    assert generations() == [0] * 11  # protected segments apart in the log: none merged
    result = runner.invoke(app, ["inspect", "m", "--check", "--no-stats"])
    assert result.exit_code == 0, result.output


def test_a_segment_folder_holding_another_segment_s_files_is_damage(isolated_cache: Path) -> None:
    """A copy of one segment's folder over another's passed check and verify, was served, and
    compact merged it with a fresh digest."""
    add(None, range(2))
    ds = rlds_cli.open_dataset("m")
    assert isinstance(ds, GrowingDataset)
    first, second = (ds.directory / SEGMENTS_DIR / entry.seg.hex() for entry in ds.log_segments)
    shutil.rmtree(second)
    shutil.copytree(first, second)
    for args in (
        ["inspect", "m", "--check", "--no-stats"],
        ["verify", "m"],
        ["compact", "m", "--grace", "0"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and "holds the files of segment" in result.output, args
    assert sorted(p.name for p in (ds.directory / SEGMENTS_DIR).iterdir()) == sorted(
        [first.name, second.name]
    )


def test_a_head_manifest_copied_from_another_dataset_is_damage(isolated_cache: Path) -> None:
    """Another growing dataset's head (capacity 1) over this one's opened it under the other
    name, passed check and verify, and the next writer evicted by the other's capacity."""
    add(None, range(5))
    add(None, range(1), name="other", capacity_episodes=1)
    head = rlds_cli.open_dataset("m").directory / "manifest.json"
    shutil.copy(head.parent.parent / "other" / "manifest.json", head)
    for args in (["inspect", "m", "--check", "--no-stats"], ["verify", "m"]):
        result = runner.invoke(app, args)
        assert (
            result.exit_code == 1 and "names dataset 'other', not the one of its folder" in result.output
        ), args
    with pytest.raises(rlds_cli.errors.CorruptDatasetError, match="names dataset 'other'"):
        add(None, range(5, 6))


def test_a_folder_reached_by_another_spelling_of_its_name_is_its_own(isolated_cache: Path) -> None:
    """On a case-insensitive file system (macOS), open_dataset("M") of the dataset "m" reached
    its folder and was called damaged: its manifest names "m". (A link stands for such a name.)"""
    from rlds_cli.cache.manifest import read_manifest

    add(None, range(2))
    folder = rlds_cli.open_dataset("m").directory
    spelled = folder.with_name("M")
    spelled.symlink_to(folder.name)
    assert read_manifest(spelled).name == "m"
    other = folder.with_name("n")
    other.mkdir()
    shutil.copy(folder / "manifest.json", other / "manifest.json")
    with pytest.raises(rlds_cli.errors.CorruptDatasetError, match="names dataset 'm', not the one"):
        read_manifest(other)


def test_a_merged_segment_stays_under_its_share_of_the_capacity(isolated_cache: Path, fanin4: None) -> None:
    # episodes of 1-4 steps (10 every 4); capacity 80 steps: a merge holds at most 10 of them
    add(None, range(40), capacity=80)
    ds = rlds_cli.open_dataset("m")
    assert isinstance(ds, GrowingDataset)
    assert max(entry.steps for entry, _ in ds.live_segments()) <= 80 // merging.MERGE_CAPACITY_SHARE
    assert ds.num_steps <= 80
    kept = uids()
    assert kept == list(range(40 - len(kept), 40))


def test_a_damaged_input_stops_the_merge_once_and_is_reported(isolated_cache: Path, fanin4: None) -> None:
    add(None, range(3))
    ds = rlds_cli.open_dataset("m")
    assert isinstance(ds, GrowingDataset)
    damaged = ds.segment_datasets()[1].directory
    column = damaged / "arrays" / "observation.npy"
    data = bytearray(column.read_bytes())
    data[-1] ^= 0x01
    column.write_bytes(bytes(data))
    with rlds_cli.DatasetWriter("m", mode="append") as w:
        w.add_episode(_episode(3))
        with pytest.raises(CommitFailedError, match=r"were committed, but .*does not match its digest"):
            w.flush()
        for uid in range(4, 9):  # the commits go on, unmerged; the error was told once
            w.add_episode(_episode(uid))
            w.flush()
    assert damaged.is_dir()
    assert generations() == [0] * 9
    result = runner.invoke(app, ["inspect", "m", "--check"])
    assert result.exit_code == 1 and damaged.name in result.output, result.output


def _writer_process(root: str, first: int) -> None:
    merging.MERGE_FANIN = 4
    add(Path(root), range(first, first + 40))


def test_two_writers_merging_at_once_lose_and_duplicate_nothing(isolated_cache: Path) -> None:
    add(None, range(1))
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer_process, args=(str(isolated_cache), first)) for first in (100, 200)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    got = uids()
    assert sorted(got) == [0, *range(100, 140), *range(200, 240)]
    for first in (100, 200):  # each writer's episodes in the order it wrote them
        assert [u for u in got if first <= u < first + 40] == list(range(first, first + 40))
    gens = generations()  # 81 commits; merges raced, none lost, none left behind
    assert gens == sorted(gens, reverse=True) and len(gens) < 20, gens


def _evicting_writer(root: str, first: int) -> None:
    merging.MERGE_FANIN = 4
    add(Path(root), range(first, first + 60), capacity_episodes=12, grace_seconds=0)


@pytest.mark.slow
def test_writers_evicting_with_no_grace_never_fail_each_other(isolated_cache: Path) -> None:
    """grace_seconds=0: a segment one writer's view held was evicted and removed by another while
    it read it, and CommitFailedError (a missing episodes.npy, a merge input called damaged)
    reached the user's flush() within a second. Beside them, an open or a refresh of a view met a
    segment removed between its read of the log and of the segment: DatasetReplacedError, 'rlds
    list' called the dataset damaged, and 'rlds compact' failed on an input evicted under it."""
    from rlds_cli.inspection.listing import list_datasets

    add(None, range(1), capacity_episodes=12, grace_seconds=0)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_evicting_writer, args=(str(isolated_cache), f)) for f in (100, 200, 300)]
    for p in procs:
        p.start()
    views = 0
    while any(p.is_alive() for p in procs):
        ds = rlds_cli.open_dataset("m")
        ds.refresh()
        (row,) = list_datasets()
        assert row.damaged is None, row
        rlds_cli.compact("m", grace_seconds=0)  # its inputs evicted under it: it plans again
        views += 1
    for p in procs:
        p.join(300)
    assert views >= 1  # how many fit while the writers ran depends on the machine: at least one
    assert [p.exitcode for p in procs] == [0, 0, 0]
    got = uids()  # whole, each the episode written, and within the capacity
    assert len(got) <= 12 and set(got) <= {0, *range(100, 160), *range(200, 260), *range(300, 360)}


def _leftovers(root: Path) -> tuple[int, int]:
    d = root / "datasets" / "m"
    return len(list((d / SEGMENT_BUILDS_DIR).iterdir())), len(list((d / SEGMENTS_DIR).iterdir()))


@pytest.mark.xdist_group("disk-heavy")
def test_a_writer_killed_before_every_step_of_a_merge_loses_nothing(
    isolated_cache: Path, tmp_path: Path, fanin4: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLDS_FSYNC", "1")  # the fsyncs are steps too
    base = tmp_path / "base"
    add(base, range(3), grace_seconds=0)
    work = tmp_path / "full"
    shutil.copytree(base, work)
    points = faults.kill_points(lambda: add(work, [3]), "memmap")
    assert uids(root=work) == [0, 1, 2, 3] and generations(root=work) == [1]
    seen = set()
    for i, step in enumerate(points):
        root = tmp_path / f"k{i}"
        shutil.copytree(base, root)
        killed = faults.kill_at(lambda root=root: add(root, [3]), step)
        assert killed is not None, step
        got = uids(root=root)
        assert got in ([0, 1, 2], [0, 1, 2, 3]), (killed, got)
        seen.add((len(got), len(generations(root=root))))
        add(root, [4])  # the next writer merges what the killed one did not
        assert uids(root=root) == [*got, 4], killed
        rlds_cli.compact("m", root, grace_seconds=0)
        assert uids(root=root) == [*got, 4] and _leftovers(root) == (0, 1), killed
        shutil.rmtree(root)
    # killed before the commit, after the commit and before the merge's record, after it
    assert seen >= {(3, 3), (4, 4), (4, 1)}, seen


def test_a_follower_maps_a_merge_to_the_rows_it_holds(
    isolated_cache: Path, fanin4: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's in-RAM tail of small segments follows a merge of segments it holds without
    reading them again, and a merge that took newer ones too by one read of the merge."""
    from rlds_cli.cache.backends import get_backend
    from rlds_cli.write.compact import try_compaction_lock

    backend = type(get_backend("memmap"))
    reads: list[str] = []
    real = backend.read_column

    def counted(self: object, directory: Path, key: str, stop: int | None = None) -> np.ndarray:
        if key == "observation":
            reads.append(Path(directory).name)
        return real(self, directory, key, stop)  # type: ignore[arg-type]

    monkeypatch.setattr(backend, "read_column", counted)

    def follow() -> int:
        """Refresh the reader, read its column; the segments read, checked against a fresh view."""
        reads.clear()
        assert reader.refresh()
        got = np.asarray(reader.column("observation")[:])
        count = len(reads)
        fresh = rlds_cli.open_dataset("m")
        assert np.array_equal(got, np.asarray(fresh.column("observation")[:]))
        return count

    add(None, range(1))
    reader = rlds_cli.open_dataset("m")
    reader.column("observation")[:]
    lock = try_compaction_lock(rlds_cli.CacheRoot(), "m")  # no merge while the reader looks
    assert lock is not None
    add(None, range(1, 5))
    assert generations() == [0] * 5
    assert follow() == 4  # the new segments, one read each
    lock.release()
    add(None, [5])  # merges the oldest 4 of the 6: all held by the reader
    assert generations() == [1, 0, 0]
    assert follow() == 1  # the new commit only; the merge is mapped to the rows held
    add(None, [6, 7])  # merges 4 of which the reader holds 2
    assert generations() == [1, 1]
    assert follow() == 1  # the merge, read whole once
    assert uids() == list(range(8))


def test_a_waiting_compaction_goes_before_the_writers_merges(isolated_cache: Path) -> None:
    """Writers take the compaction lock only when no compaction waits for it: they merge
    often enough to hold it most of the time, and a compaction that polled was starved."""
    import threading

    from filelock import FileLock, Timeout

    from rlds_cli.write.compact import compaction_lock, try_compaction_lock

    cache = rlds_cli.CacheRoot()
    wanted = cache.locks_dir / "m.compact-wanted.lock"
    cache.locks_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(wanted)):  # a compaction waits: the lock is free, and writers leave it
        assert try_compaction_lock(cache, "m") is None
    merge = try_compaction_lock(cache, "m")  # a writer's merge under way
    assert merge is not None
    got, done = threading.Event(), threading.Event()

    def compaction() -> None:
        lock = compaction_lock(cache, "m", 60)
        got.set()
        done.wait(60)
        lock.release()  # the thread that took it (filelock's locks are per thread)

    waiting = threading.Thread(target=compaction)
    waiting.start()
    for _ in range(600):  # until the compaction holds the wanted lock (a hang guard, not a time)
        try:
            with FileLock(str(wanted), timeout=0):
                pass
        except Timeout:
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("the compaction never took the wanted lock")
    assert try_compaction_lock(cache, "m") is None  # another writer gives way
    merge.release()
    assert got.wait(60) and try_compaction_lock(cache, "m") is None  # the compaction holds it
    done.set()
    waiting.join(60)
    after = try_compaction_lock(cache, "m")
    assert after is not None
    after.release()


def test_a_collection_renames_only_the_segments_still_there(
    isolated_cache: Path, fanin4: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh view's log names every segment it ever retired, nearly all removed by the
    writers already: a collection lists the folder once instead of trying a rename of each."""
    import os

    add(None, range(64), grace_seconds=0)  # 21 merges: 84 segments retired and removed
    segments = isolated_cache / "datasets" / "m" / SEGMENTS_DIR
    on_disk = len(os.listdir(segments))
    renames: list[str] = []
    real = os.rename

    def counted(src: object, dst: object) -> None:
        renames.append(str(src))
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", counted)
    rlds_cli.compact("m", grace_seconds=0)
    # the merged segment's rename into segments/, and one per segment still there at most
    assert len([r for r in renames if f"/{SEGMENTS_DIR}/" in r]) <= on_disk, renames
    assert uids() == list(range(64))


def test_a_compaction_whose_inputs_keep_being_evicted_says_what_it_left(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers evicting (grace_seconds=0) under each of the compaction's plans: it merged nothing
    and returned as if the dataset were compact."""
    from rlds_cli.errors import DatasetReplacedError

    add(None, range(5))  # 5 one-episode segments: under the writers' fan-in, nothing merged yet
    tries: list[int] = []

    def evicted_under_it(*args: object, **kwargs: object) -> None:
        tries.append(1)
        raise DatasetReplacedError("a segment of 'm' was removed while it was read")

    monkeypatch.setattr(merging, "merge_run", evicted_under_it)
    report = rlds_cli.compact("m", grace_seconds=0)
    assert len(tries) == merging.MERGE_ATTEMPTS
    assert (report.merged_runs, report.runs_left, report.segments_after) == (0, 1, 5)
    result = CliRunner().invoke(app, ["compact", "m"])
    assert result.exit_code == 0, result.output
    assert "1 run of segments still unmerged" in result.output
    assert "rlds compact m" in result.output
    assert '"runs_left": 1' in CliRunner().invoke(app, ["compact", "m", "--json"]).output
    assert uids() == list(range(5))
