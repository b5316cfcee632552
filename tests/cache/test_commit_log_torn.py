"""A commit log whose last record a machine crash tore (issue 25): readers skip it, the next
writer pads the log back to whole records and vouches for the torn one with a ``RECOVER``
record before its own, and ``inspect --check`` passes. (Anything else that fails its check is
damage: tests/cache/test_log_damage.py.)"""

from __future__ import annotations

import errno
import fcntl
import multiprocessing as mp
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache import commit_log
from rlds_cli.cache.commit_log import ADD, RECORD_SIZE, RECOVER, LogState, Record, new_segment_id
from rlds_cli.cache.layout import COMMIT_LOG_FILE, COMMITTED_FILE, SEGMENTS_DIR
from rlds_cli.cli.app import app
from rlds_cli.inspection.validate import check_dataset
from tests.dataset_fixtures import uid_episode
from tests.faults import assert_finishes_forked
from tests.waits import HANG_SECONDS, join_all


def _write(root: Path, uids: tuple[int, ...]) -> None:
    with rlds_cli.DatasetWriter("t", root=root, mode="append") as w:
        for uid in uids:
            w.add_episode(uid_episode(uid, 2 + uid))
            w.flush()  # a commit (a record) each


def _uids(root: Path) -> list[int]:
    ds = rlds_cli.open_dataset("t", root)
    assert check_dataset(ds).ok
    return [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)]


def _inspect_check(root: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", "t", "--check", "--root", str(root)])
    assert result.exit_code == 0 and "check passed" in result.output, result.output


@pytest.mark.parametrize("tear", ["partial", "zeros"])
def test_a_torn_last_record_is_skipped_and_the_next_writer_vouches_for_it(
    isolated_cache: Path, tear: str
) -> None:
    root = isolated_cache
    assert_finishes_forked(_write, root, (1, 2, 3))  # a writer process, gone since
    log = root / "datasets" / "t" / COMMIT_LOG_FILE
    data = log.read_bytes()
    assert len(data) == 3 * RECORD_SIZE
    # what a crash leaves of an append: its first sector's bytes, then nothing (the size
    # stopped there) or zeros (the size reached the disk, the data did not)
    kept = data[: -RECORD_SIZE + 32]
    log.write_bytes(kept if tear == "partial" else kept + b"\0" * (RECORD_SIZE - 32))
    # nor does the writer make its segment's committed file (made after the whole record)
    state = LogState()
    state.follow(log)
    (torn,) = [p for p in (log.parent / SEGMENTS_DIR).iterdir() if not state.names(bytes.fromhex(p.name))]
    (torn / COMMITTED_FILE).unlink()
    assert _uids(root) == [1, 2]  # the torn commit is not one
    _inspect_check(root)
    reader = rlds_cli.open_dataset("t", root)
    _write(root, (4,))
    # padded to whole records, then a RECOVER record for the torn one, then the commit
    assert log.stat().st_size == 5 * RECORD_SIZE
    assert Record.unpack(log.read_bytes()[3 * RECORD_SIZE : 4 * RECORD_SIZE]).kind == RECOVER
    assert reader.refresh() and reader[:]["info/episode_uid"].tolist() == [
        1,
        1,
        1,
        2,
        2,
        2,
        2,
        4,
        4,
        4,
        4,
        4,
        4,
    ]
    _write(root, (5,))
    assert _uids(root) == [1, 2, 4, 5]
    _inspect_check(root)
    # the segment of the torn commit is a dead writer's unreferenced one: the scan removes it
    report = rlds_cli.compact("t", root, grace_seconds=0)
    assert len(list((root / "datasets" / "t" / SEGMENTS_DIR).iterdir())) == 1, report.removed
    assert _uids(root) == [1, 2, 4, 5]


def _append_paused(log: Path, ready: int, go: int) -> None:
    """Append one ADD record to ``log``, pausing just before its write (its padding decided)
    until the parent says go."""
    import os

    from rlds_cli.cache import commit_log
    from rlds_cli.cache.commit_log import ADD, Record, new_segment_id

    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(log):
            real_write(ready, b"r")
            os.read(go, 1)
        return real_write(fd, data)

    os.write = write  # type: ignore[assignment]  # in this forked child only
    commit_log.append(log, Record(ADD, new_segment_id(), episodes=1, steps=1), fsync=False)


def test_two_writers_padding_a_torn_log_at_once_both_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends that both find a torn record at the end of the log: the one that writes
    second must not pad by the size it saw before the other's write (its record would
    straddle two slots and be skipped: a commit lost). A forked child decides its padding and
    waits; this process appends meanwhile (to its end, or until it waits for the child's lock
    of the log); then the child writes."""
    import fcntl
    import os

    from rlds_cli.cache import commit_log
    from rlds_cli.cache.commit_log import ADD, LogState, Record, new_segment_id

    log = tmp_path / COMMIT_LOG_FILE
    torn = Record(ADD, new_segment_id(), episodes=1, steps=1).pack()[:32]  # a crash's leftover
    log.write_bytes(Record(ADD, new_segment_id(), episodes=1, steps=1).pack() + torn)
    waiting = threading.Event()  # this process's append ended, or waits for the child's lock
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        try:
            real_flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting.set()
            real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)

    def append() -> None:
        commit_log.append(log, Record(ADD, new_segment_id(), episodes=1, steps=1), fsync=False)
        waiting.set()

    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = threading.Thread(target=assert_finishes_forked, args=(_append_paused, log, ready_w, go_r))
    child.start()
    assert os.read(ready_r, 1) == b"r"  # the child is about to write
    parent = threading.Thread(target=append)
    parent.start()
    assert waiting.wait(HANG_SECONDS)
    os.write(go_w, b"g")
    child.join(HANG_SECONDS)
    parent.join(HANG_SECONDS)
    assert not child.is_alive() and not parent.is_alive()
    state = LogState()
    state.follow(log)
    assert len(state.segments) == 3, log.stat().st_size / RECORD_SIZE
    assert log.stat().st_size % RECORD_SIZE == 0


def _append_many(path: str, n: int) -> None:
    for _ in range(n):
        commit_log.append(Path(path), Record(ADD, new_segment_id(), episodes=1, steps=1), fsync=False)


def test_appends_from_several_processes_at_once_are_all_readable(tmp_path: Path) -> None:
    """Four processes append 10,000 records each at once; every one is readable. A 96-byte
    record that straddles a page boundary extends the file in two steps: a writer that read
    the size between them took the log for torn, padded it, and wrote its own record across
    two slots (both skipped: a commit reported done and never visible). Before every append
    took the log's lock, 80-200 of 80,000 were lost so; the load test's log lost one commit."""
    log = tmp_path / COMMIT_LOG_FILE
    log.touch()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(log), 10_000)) for _ in range(4)]
    for p in procs:
        p.start()
    join_all(procs)
    state = LogState()
    state.follow(log)
    assert (state.records, state.invalid) == (40_000, 0)


def test_a_failed_append_leaves_the_log_unlocked_for_a_forked_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk) while another thread's fork holds a copy of the log's
    descriptor: the lock is released, not kept by the child's copy for as long as it lives."""
    log = tmp_path / "commits.log"
    log.write_bytes(b"")
    copies: list[int] = []

    def full_disk(fd: int, data: bytes) -> int:
        copies.append(os.dup(fd))  # what a fork at this moment keeps
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commit_log.os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        commit_log.append(log, Record(ADD, new_segment_id(), episodes=1, steps=2), fsync=False)
    monkeypatch.undo()
    other = os.open(log, os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another writer's append goes on
    finally:
        os.close(other)
        os.close(copies[0])
