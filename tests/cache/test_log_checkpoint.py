"""The commit log's checkpoint (issue 37, item 7): opens replay only the records after it, it is
used only where it is the log's own, and damage before it is still reported.

Every test lowers :data:`log_checkpoint.CHECKPOINT_RECORDS` so that a few commits make
checkpoints (forked writers inherit it)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache import log_checkpoint
from rlds_cli.cache.commit_log import RECORD_SIZE, LogState
from rlds_cli.cache.dataset import version_identity
from rlds_cli.cache.layout import COMMIT_LOG_FILE, SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.cli.app import app
from rlds_cli.errors import CommitFailedError, CorruptDatasetError
from tests.dataset_fixtures import uid_episode
from tests.faults import assert_finishes_forked

runner = CliRunner()
EVERY = 4


@pytest.fixture(autouse=True)
def _small_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_checkpoint, "CHECKPOINT_RECORDS", EVERY)


def _write(root: Path, name: str, uids: list[int], options: dict[str, object]) -> None:
    with rlds_cli.DatasetWriter(name, root=root, mode="append", **options) as w:  # type: ignore[arg-type]
        for uid in uids:
            w.add_episode(uid_episode(uid, 2 + uid % 5))
            w.flush()  # a commit (a record) each


def _grow(root: Path, uids: list[int], name: str = "g", **options: object) -> Path:
    """A growing dataset written by a process that has exited since: evictions (a capacity of
    30 episodes) and the writer's merges of small segments (COMPACT records) among the ADDs."""
    assert_finishes_forked(_write, root, name, uids, {"capacity_episodes": 30, **options})
    return root / "datasets" / name


def _uids(root: Path, name: str = "g") -> list[int]:
    ds = rlds_cli.open_dataset(name, root)
    return [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)]


def _replay(directory: Path, until: int | None = None) -> LogState:
    state = LogState()
    state.follow(directory / COMMIT_LOG_FILE, until=until)
    return state


def _same_view(a: LogState, b: LogState) -> None:
    assert a.position == b.position and a.records == b.records and a.evicted == b.evicted
    assert [(vars(s), skip) for s, skip in a.live()] == [(vars(s), skip) for s, skip in b.live()]
    assert dict(a.retired) == dict(b.retired) and a.merged == b.merged


def test_writers_keep_a_checkpoint_that_is_the_log_s_replay(isolated_cache: Path) -> None:
    directory = _grow(isolated_cache, list(range(1, 61)))
    saved = log_checkpoint.read_checkpoint(directory)
    assert saved is not None
    log_size = (directory / COMMIT_LOG_FILE).stat().st_size
    assert log_size - saved.position < 2 * EVERY * RECORD_SIZE  # written as the writer committed
    kinds = {
        bytes(rec)[4] for rec in np.frombuffer((directory / COMMIT_LOG_FILE).read_bytes(), f"V{RECORD_SIZE}")
    }
    assert kinds >= {1, 2, 3}  # ADD, EVICT and COMPACT records behind it
    _same_view(saved, _replay(directory, until=saved.position))
    for seg in {bytes(s) for s in saved.retired} | {s.seg for s in saved.segments}:
        assert saved.names(seg)
    # from the checkpoint and the records after it: the same view, the same episodes
    loaded = log_checkpoint.load_state(directory, write=False)
    _same_view(loaded, _replay(directory))
    assert log_checkpoint.verify_log(directory).position == log_size
    assert _uids(isolated_cache) == list(range(31, 61))


def test_an_open_replays_only_the_records_after_the_checkpoint(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _grow(isolated_cache, list(range(1, 41)))
    saved = log_checkpoint.read_checkpoint(directory)
    assert saved is not None
    starts: list[int] = []
    follow = LogState.follow

    def counting(self: LogState, path: Path, until: int | None = None) -> int:
        starts.append(self.position)
        return follow(self, path, until)

    monkeypatch.setattr(LogState, "follow", counting)
    assert _uids(isolated_cache) == list(range(11, 41))
    # then only from the log's end (whether records were committed since: the lost-records check)
    assert starts[0] == saved.position and set(starts[1:]) <= {(directory / COMMIT_LOG_FILE).stat().st_size}


def test_a_reader_that_replays_many_records_writes_the_checkpoint(isolated_cache: Path) -> None:
    directory = _grow(isolated_cache, list(range(1, 41)))
    log_checkpoint.checkpoint_path(directory).unlink()
    assert _uids(isolated_cache) == list(range(11, 41))
    saved = log_checkpoint.read_checkpoint(directory)
    assert saved is not None and saved.position == (directory / COMMIT_LOG_FILE).stat().st_size
    # a view handed to a worker at an earlier position never writes one (nor uses a later one)
    log_checkpoint.checkpoint_path(directory).unlink()
    state = log_checkpoint.load_state(directory, until=saved.position - 8 * RECORD_SIZE)
    assert state.position == saved.position - 8 * RECORD_SIZE
    assert not log_checkpoint.checkpoint_path(directory).exists()


def test_a_damaged_record_before_the_checkpoint_is_reported_by_the_check_and_stops_compact_and_gc(
    isolated_cache: Path,
) -> None:
    """Readers start from the checkpoint, made when the records were whole, and serve that
    view; the commands that replay the whole log report the damage and remove nothing."""
    root = isolated_cache
    directory = _grow(root, list(range(1, 41)))
    expected = _uids(root)
    log = directory / COMMIT_LOG_FILE
    data = bytearray(log.read_bytes())
    data[3 * RECORD_SIZE + 30] ^= 0x01  # inside the fourth record
    log.write_bytes(bytes(data))
    before = sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir())
    assert _uids(root) == expected
    check = runner.invoke(app, ["inspect", "g", "--check", "--root", str(root)])
    assert check.exit_code == 1 and "record 3" in check.output and "damaged" in check.output, check.output
    assert "Traceback" not in check.output and "unexpected" not in check.output
    with pytest.raises(CorruptDatasetError, match="record 3"):
        rlds_cli.compact("g", root, grace_seconds=0)
    gc = runner.invoke(app, ["gc", "--root", str(root)])
    assert gc.exit_code == 0 and "skipped growing dataset g" in gc.output, gc.output
    listed = runner.invoke(app, ["list", "--root", str(root)])
    assert listed.exit_code == 0 and "damaged" in listed.output, listed.output
    # a writer evicts, merges and removes segments: it replays the whole log, and refuses
    with (
        pytest.raises(CommitFailedError, match="record 3"),
        rlds_cli.DatasetWriter("g", root=root, mode="append", grace_seconds=0) as w,
    ):
        for uid in range(100, 120):
            w.add_episode(uid_episode(uid, 3))
            w.flush()
    assert set(before) <= {p.name for p in (directory / SEGMENTS_DIR).iterdir()}
    assert _uids(root)[: len(expected)] == expected


def test_every_flipped_byte_of_a_log_with_a_checkpoint_is_detected_or_serves_the_same_view(
    isolated_cache: Path,
) -> None:
    """The property test of the log with a checkpoint: each byte flipped in turn is either
    reported by the reader, or (before the checkpoint) the reader serves the view the whole
    log made, and the whole-log check reports it. Never a view of other episodes."""
    root = isolated_cache
    directory = _grow(root, list(range(1, 12)), capacity_episodes=None)
    log = directory / COMMIT_LOG_FILE
    pristine = log.read_bytes()
    expected = _uids(root)
    saved = log_checkpoint.read_checkpoint(directory)
    assert saved is not None and 0 < saved.position < len(pristine)
    missed = []
    for offset in range(len(pristine)):
        data = bytearray(pristine)
        data[offset] ^= 0x01
        log.write_bytes(bytes(data))
        try:
            served = _uids(root)
        except CorruptDatasetError:
            assert offset >= saved.position - RECORD_SIZE  # the copied last record, or after
            continue
        with pytest.raises(CorruptDatasetError):
            log_checkpoint.verify_log(directory)
        if served != expected or offset >= saved.position:
            missed.append(offset)
    log.write_bytes(pristine)
    assert missed == [] and _uids(root) == expected


def test_every_flipped_byte_of_the_checkpoint_is_detected_and_the_log_replayed(
    isolated_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = isolated_cache
    directory = _grow(root, list(range(1, 41)))
    path = log_checkpoint.checkpoint_path(directory)
    pristine = path.read_bytes()
    expected = _uids(root)
    full = _replay(directory)
    offsets = range(len(pristine)) if len(pristine) < 4000 else np.linspace(0, len(pristine) - 1, 4000)
    for offset in sorted({int(o) for o in offsets}):
        data = bytearray(pristine)
        data[offset] ^= 0x01
        path.write_bytes(bytes(data))
        assert log_checkpoint.read_checkpoint(directory) is None, offset
        _same_view(log_checkpoint.load_state(directory, write=False), full)
        with pytest.raises(CorruptDatasetError, match="checkpoint"):
            log_checkpoint.verify_log(directory)
    # reported by the whole-log check; a reader replays the log whole and says so in a warning,
    # and leaves the damaged one in place: rewritten, it hid the damage from inspect --check,
    # compact and gc (the check opens the dataset before it replays the whole log)
    damaged = pristine[:-1] + bytes([pristine[-1] ^ 1])
    path.write_bytes(damaged)
    with pytest.raises(CorruptDatasetError, match="fails its checksum"):
        log_checkpoint.verify_log(directory)
    caplog.set_level(logging.WARNING)
    assert _uids(root) == expected
    assert log_checkpoint.load_state(directory).position == full.position
    assert "fails its checksum" in caplog.text
    assert path.read_bytes() == damaged
    result = CliRunner().invoke(app, ["inspect", "g", "--check", "--root", str(root)])
    assert result.exit_code == 1 and "checkpoint" in result.output, result.output
    path.unlink()  # what the hint says: it is derived from the log
    assert log_checkpoint.verify_log(directory).position == full.position


def test_a_checkpoint_of_another_or_a_longer_log_is_not_used(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root, list(range(1, 41)))
    log = directory / COMMIT_LOG_FILE
    saved = log_checkpoint.read_checkpoint(directory)
    assert saved is not None
    # the log cut short before the checkpoint's position (restored from an older copy)
    pristine = log.read_bytes()
    log.write_bytes(pristine[: saved.position - 2 * RECORD_SIZE])
    assert log_checkpoint.read_checkpoint(directory) is None
    _same_view(log_checkpoint.load_state(directory, write=False), _replay(directory))
    with pytest.raises(CorruptDatasetError, match="ends at byte"):
        log_checkpoint.verify_log(directory)
    # another dataset's log in its place, longer than the checkpoint's position
    other = _grow(root, list(range(100, 150)), name="other")
    log.write_bytes((other / COMMIT_LOG_FILE).read_bytes())
    assert log_checkpoint.read_checkpoint(directory) is None


def test_a_forged_checkpoint_with_a_valid_checksum_is_reported_by_the_check(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root, list(range(1, 41)))
    saved = log_checkpoint.read_checkpoint(directory)
    assert saved is not None
    saved.evicted -= 1
    log_checkpoint.checkpoint_path(directory).write_bytes(log_checkpoint.encode(saved))
    with pytest.raises(CorruptDatasetError, match="differs from the log's replay"):
        log_checkpoint.verify_log(directory)
    with pytest.raises(CorruptDatasetError):
        rlds_cli.compact("g", root, grace_seconds=0)


@pytest.mark.parametrize(
    "cut",
    [
        lambda d: d[:-5],  # short
        lambda d: d[:8] + b"\xff" * 8 + d[16:],  # reserved bytes, checksum broken
        lambda d: b"",
        lambda d: b"RLGSTAT1" + b"\0" * 200,
    ],
)
def test_bytes_that_are_no_checkpoint_are_refused_with_a_reason(cut: object, isolated_cache: Path) -> None:
    directory = _grow(isolated_cache, list(range(1, 21)))
    data = log_checkpoint.checkpoint_path(directory).read_bytes()
    got = log_checkpoint.decode(cut(data))  # type: ignore[operator]
    assert isinstance(got, str)


def test_counts_that_do_not_fit_the_size_are_refused_before_anything_is_built(isolated_cache: Path) -> None:
    import struct
    import zlib

    directory = _grow(isolated_cache, list(range(1, 21)))
    body = bytearray(log_checkpoint.checkpoint_path(directory).read_bytes()[:-4])
    struct.pack_into("<q", body, 8 + 8 + 5 * 8, 2**40)  # the retired count
    forged = bytes(body) + struct.pack("<I", zlib.crc32(body))
    assert log_checkpoint.decode(forged) == "its counts do not fit its size"


def _kill_while_writing(root: Path) -> None:
    directory = root / "datasets" / "g"
    identity = version_identity(directory)
    state = log_checkpoint.load_state(directory, write=False)

    def killed(*args: object) -> None:
        os._exit(9)

    os.replace = killed  # type: ignore[assignment]
    log_checkpoint.write_checkpoint(directory, state, identity)


def test_a_process_killed_while_writing_a_checkpoint_leaves_a_build_that_compact_removes(
    isolated_cache: Path,
) -> None:
    root = isolated_cache
    directory = _grow(root, list(range(1, 21)))
    before = log_checkpoint.checkpoint_path(directory).read_bytes()
    child = mp.get_context("fork").Process(target=_kill_while_writing, args=(root,))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    (left,) = list((directory / SEGMENT_BUILDS_DIR).iterdir())
    assert left.name.startswith("log-state-") and left.is_file()
    assert log_checkpoint.checkpoint_path(directory).read_bytes() == before  # the old one stands
    assert _uids(root) == list(range(1, 21))
    report = rlds_cli.compact("g", root, grace_seconds=0)
    assert f"{SEGMENT_BUILDS_DIR}/{left.name}" in report.removed
    assert list((directory / SEGMENT_BUILDS_DIR).iterdir()) == []
    assert _uids(root) == list(range(1, 21))


def test_names_are_found_whatever_bytes_the_ids_end_in() -> None:
    """Segment ids are 16 random bytes: 1 in 256 ends in a zero byte, which an S16 element
    drops. Found by the writers' test above, one run in six."""
    from rlds_cli.cache.commit_log import RetiredSegments, SegmentEntry

    ids = [bytes([i]) * 15 + bytes([end]) for i in range(1, 40) for end in (0, 1, 255)]
    ids += [b"\0" * 16, b"\0" * 15 + b"\1"]
    state = LogState([SegmentEntry(ids[0], False, 1, 1)], 0, RetiredSegments((s, 1.0) for s in ids[1:]))
    state.position, state.last_record = 5 * RECORD_SIZE, b"\1" * RECORD_SIZE
    saved = log_checkpoint.decode(log_checkpoint.encode(state))
    assert isinstance(saved, LogState)
    assert all(saved.names(seg) for seg in ids)
    assert not saved.names(bytes([1]) * 15 + bytes([2])) and not saved.names(b"\0" * 15 + b"\2")
    assert dict(saved.retired) == {s: 1.0 for s in ids[1:]}


def test_a_checkpoint_that_cannot_be_read_or_says_position_0_is_one_clear_error(isolated_cache: Path) -> None:
    import struct
    import zlib

    root = isolated_cache
    directory = _grow(root, list(range(1, 41)))
    path = log_checkpoint.checkpoint_path(directory)
    pristine = path.read_bytes()
    body = bytearray(pristine[:-4])
    struct.pack_into("<q", body, 16, 0)  # the position
    path.write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(body)))
    with pytest.raises(CorruptDatasetError, match="counts do not fit"):
        log_checkpoint.verify_log(directory)
    path.unlink()
    path.mkdir()
    with pytest.raises(CorruptDatasetError, match="cannot be read"):
        log_checkpoint.verify_log(directory)
    assert _uids(root) == list(range(11, 41))  # readers replay the log whole
    for args in (["inspect", "g", "--check"], ["compact", "g"]):
        result = runner.invoke(app, [*args, "--root", str(root)])
        assert result.exit_code == 1 and "checkpoint" in result.output, result.output
        assert "unexpected" not in result.output and "Traceback" not in result.output


def test_no_checkpoint_is_placed_in_a_dataset_replaced_since_the_replay(isolated_cache: Path) -> None:
    directory = _grow(isolated_cache, list(range(1, 41)))
    before = log_checkpoint.checkpoint_path(directory).read_bytes()
    state = log_checkpoint.load_state(directory, write=False)
    log_checkpoint.write_checkpoint(directory, state, (0, 0, 0))  # another version's identity
    assert log_checkpoint.checkpoint_path(directory).read_bytes() == before
    assert list((directory / SEGMENT_BUILDS_DIR).iterdir()) == []


def test_a_compaction_with_fsync_off_syncs_nothing(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = isolated_cache
    with rlds_cli.DatasetWriter("f", root=root, capacity_episodes=None) as w:
        for uid in range(1, 6):
            episode = uid_episode(uid, 3000)  # 9 MB of frames a segment: past the write-behind size
            episode["pixels"] = np.full((3000, 32, 32, 3), uid, np.uint8)
            w.add_episode(episode)
            w.flush()
    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    report = rlds_cli.compact("f", root)
    assert report.segments_after == 1 and synced == []
    ds = rlds_cli.open_dataset("f", root)
    assert [int(ds.episode(i)["pixels"][0, 0, 0, 0]) for i in range(5)] == [1, 2, 3, 4, 5]
