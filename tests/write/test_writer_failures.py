"""A writer's failures and ends that lose or repeat nothing (issue 25): the interpreter exiting
while other threads or the user's own ``atexit`` handler still use the writer, a fork with
episodes waiting, a failed commit told by ``add_step``/``extend``/``close``, a commit whose
log record was written but not synced, and one that failed after its segment's rename."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli._util import io as durable
from rlds_cli.cache import commit_log
from rlds_cli.cache.layout import COMMIT_LOG_FILE, MANIFEST_FILE, SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.errors import CommitFailedError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.write import segments
from tests.waits import HANG_SECONDS
from tests.write.test_writer import episode

REPO = Path(__file__).resolve().parents[2]


def _uids(name: str) -> list[int]:
    ds = rlds_cli.open_dataset(name)
    assert check_dataset(ds).ok
    return [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)]


def _python(code: str) -> None:
    """Run ``code`` in a fresh interpreter (the test's cache; fsync on: the fsync pool is in
    play when the interpreter exits), which must end cleanly."""
    env = {**os.environ, "RLDS_FSYNC": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


_HEAD = """
import sys, os, atexit, threading, time
sys.path.insert(0, sys.argv[1])
import rlds_cli
from tests.write.test_writer import episode
"""


def test_a_users_atexit_close_commits_every_episode(isolated_cache: Path) -> None:
    """The writer's own exit hook runs after the user's ``atexit.register(w.close)`` (registered
    later, run first): close commits all 13 episodes, not only the full batches of 10."""
    _python(
        _HEAD
        + """
w = rlds_cli.DatasetWriter("user-atexit", episodes_per_commit=10)
atexit.register(w.close)
for uid in range(13):
    w.add_episode(episode(2, float(uid), uid=uid))
"""
    )
    assert _uids("user-atexit") == list(range(13))


def test_a_thread_still_recording_when_main_returns_commits_everything(isolated_cache: Path) -> None:
    """A thread that is not a daemon records after the main thread has returned: the interpreter
    waits for it, and its ``with`` block commits every episode (the exit hook runs after it and
    the fsyncs of its commits still run)."""
    _python(
        _HEAD
        + """
started = threading.Event()
def record():
    with rlds_cli.DatasetWriter("late", episodes_per_commit=3) as w:
        for uid in range(20):
            w.add_episode(episode(2, float(uid), uid=uid))
            started.set()
            time.sleep(0.02)
threading.Thread(target=record).start()
started.wait(60)
"""
    )
    assert _uids("late") == list(range(20))


def test_a_forked_child_never_commits_the_parents_waiting_episodes(isolated_cache: Path) -> None:
    """Episodes waiting (for the commit interval) when the process forks are the parent's: a
    child that exits normally, and one that writes and closes, commit none of them again; the
    child's segment names the child as its writer."""
    _python(
        _HEAD
        + """
from tests.write.test_writer_failures import wait_for
w = rlds_cli.DatasetWriter("forked", commit_interval=3600)
w.add_episode(episode(2, 1.0, uid=1))
wait_for(lambda: w.episodes_written == 1)
w.add_episode(episode(2, 2.0, uid=2))  # waits for the interval
for writes in (False, True):
    pid = os.fork()
    if pid == 0:
        if writes:
            w.add_episode(episode(2, 9.0, uid=9))
            w.close()
            print(os.getpid(), file=open(os.path.join(os.environ["RLDS_HOME"], "child.pid"), "w"))
        sys.exit(0)  # a normal exit: atexit handlers run in the child
    assert os.waitpid(pid, 0)[1] == 0
w.close()
"""
    )
    assert sorted(_uids("forked")) == [1, 2, 9]
    child = int((isolated_cache / "child.pid").read_text())
    seg_dir = isolated_cache / "datasets" / "forked" / SEGMENTS_DIR
    writers = [
        json.loads((d / MANIFEST_FILE).read_text())["source"]["writer"]["pid"] for d in seg_dir.iterdir()
    ]
    assert child in writers


def wait_for(condition: Any, seconds: float = HANG_SECONDS) -> None:
    """Poll ``condition`` until it holds (a correctness bound, not a timing one)."""
    ticks = int(seconds / 0.01)
    for _ in range(ticks):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("the condition never held")


class FailFirstCommit:
    """``segments.commit_segment`` whose first call fails with a full disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real, self.calls = segments.commit_segment, 0
        monkeypatch.setattr(segments, "commit_segment", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise OSError(errno.ENOSPC, "No space left on device", "/cache/x")
        return self.real(*args, **kwargs)


class HeldThenFull:
    """``segments.commit_segment`` whose first call waits for :meth:`release`, then fails with
    a full disk; ``started`` is set when it has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real, self.calls = segments.commit_segment, 0
        self.started, self.released = threading.Event(), threading.Event()
        monkeypatch.setattr(segments, "commit_segment", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            assert self.released.wait(HANG_SECONDS)
            raise OSError(errno.ENOSPC, "No space left on device", "/cache/x")
        return self.real(*args, **kwargs)


def _failed(w: rlds_cli.DatasetWriter) -> None:
    """Wait until the writer's first commit has failed (and nothing is under way)."""
    committer = w._committer
    with committer._cond:
        assert committer._cond.wait_for(
            lambda: committer._error is not None and committer._busy is None, HANG_SECONDS
        )


def _step(w: rlds_cli.DatasetWriter, uid: int, t: int, n: int) -> None:
    """Step ``t`` of an ``n``-step episode ``uid`` (its observation says both)."""
    obs = np.array([uid, t], np.float32)
    w.add_step(
        observation=obs,
        next_observation=obs + np.array([0, 1], np.float32),
        action=np.zeros(1, np.float32),
        reward=1.0,
        terminated=t == n - 1,
        truncated=False,
        info={"episode_uid": np.int64(uid)},
    )


def _steps(w: rlds_cli.DatasetWriter, uid: int, n: int) -> None:
    for t in range(n):
        _step(w, uid, t, n)


def test_add_step_that_tells_a_failed_commit_adds_no_step(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FailFirstCommit(monkeypatch)
    w = rlds_cli.DatasetWriter("steps", commit_interval=0)
    _steps(w, 1, 3)
    _failed(w)
    with pytest.raises(CommitFailedError, match="were not written"):
        _step(w, 2, 0, 4)  # the next call tells (not the episode's last step, which would lose it)
    assert w._steps == []  # the step that told was not kept
    _steps(w, 2, 4)  # the whole episode again, after the cause is gone
    w.close()
    assert _uids("steps") == [2]
    assert rlds_cli.open_dataset("steps").episode(0)["observation"][:, 1].tolist() == [0, 1, 2, 3]


def _batch(uids: list[int], n: int = 3) -> dict[str, np.ndarray]:
    """Consecutive episodes of ``n`` steps each, in one TED batch for ``extend``."""
    eps = [episode(n, 10.0 * uid, uid=uid) for uid in uids]
    return {k: np.concatenate([ep[k] for ep in eps]) for k in eps[0]}


def test_extend_during_a_failing_commit_loses_none_of_its_episodes(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit fails while ``extend`` hands its episodes over (waiting for the disk: the
    backlog is full): every episode of the batch still waits behind the failure, told by the
    next call, and is committed after it."""
    held = HeldThenFull(monkeypatch)
    w = rlds_cli.DatasetWriter("ext", commit_interval=0)
    w.add_episode(episode(3, 0.0, uid=0))
    assert held.started.wait(HANG_SECONDS)
    w._committer._max_bytes = 1  # every later episode waits for the commit under way
    adder = threading.Thread(target=w.extend, args=(_batch([1, 2, 3]),))
    adder.start()
    held.released.set()  # the commit under way fails while extend waits to hand episode 1 over
    adder.join(HANG_SECONDS)
    assert not adder.is_alive()
    with pytest.raises(CommitFailedError):
        w.flush()
    w.close()
    assert _uids("ext") == [1, 2, 3]


def test_close_after_a_failed_commit_counts_every_episode_not_written(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three episodes are added while the first commit is under way; it fails; ``close`` says
    that the failed one and the three behind it were not written."""
    held = HeldThenFull(monkeypatch)
    w = rlds_cli.DatasetWriter("closed", commit_interval=0)
    w.add_episode(episode(2, uid=1))
    assert held.started.wait(HANG_SECONDS)
    for uid in (2, 3, 4):
        w.add_episode(episode(2, float(uid), uid=uid))
    held.released.set()
    with pytest.raises(CommitFailedError, match=r"1 episode\(s\).*the 3 episode\(s\) added after them"):
        w.close()
    assert rlds_cli.open_dataset("closed").num_episodes == 0


def test_a_log_record_written_but_not_synced_is_committed_and_said_so(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's fsync fails after its record was written: the episodes are visible, counted as
    written, and the error says so (adding them again would write them twice); nothing is
    removed and the next commit goes on."""
    monkeypatch.setenv("RLDS_FSYNC", "1")
    real_fsync, failed = os.fsync, []

    def fsync(fd: int) -> None:
        if not failed and os.readlink(f"/proc/self/fd/{fd}").endswith(COMMIT_LOG_FILE):
            failed.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    w = rlds_cli.DatasetWriter("unsynced", commit_interval=0)
    w.add_episode(episode(2, uid=1))
    w.flush()  # the dataset exists; its first commit synced
    monkeypatch.setattr(commit_log.os, "fsync", fsync)
    w.add_episode(episode(2, 2.0, uid=2))
    with pytest.raises(CommitFailedError, match="were committed and are visible") as err:
        w.flush()
    assert "do not add them again" in err.value.hint
    assert failed and w.episodes_written == 2
    assert _uids("unsynced") == [1, 2]
    w.add_episode(episode(2, 3.0, uid=3))
    w.close()
    assert _uids("unsynced") == [1, 2, 3]


def test_a_commit_failing_after_its_rename_leaves_no_segment(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's write fails (a full disk) after the segment was renamed into ``segments/``:
    the segment, which no record names, is removed at once (the writer still runs, so a
    collection would keep it), and the next commit goes on."""
    real_append, calls = commit_log.append, {"n": 0}

    def append(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(*args, **kwargs)

    monkeypatch.setattr(commit_log, "append", append)
    w = rlds_cli.DatasetWriter("renamed", commit_interval=0)
    w.add_episode(episode(2, uid=1))
    w.flush()
    w.add_episode(episode(2, 2.0, uid=2))
    with pytest.raises(CommitFailedError, match="were not written"):
        w.flush()
    d = isolated_cache / "datasets" / "renamed"
    assert len(list((d / SEGMENTS_DIR).iterdir())) == 1 and not list((d / SEGMENT_BUILDS_DIR).iterdir())
    w.add_episode(episode(2, 2.0, uid=2))
    w.close()
    assert _uids("renamed") == [1, 2]


def test_fsyncs_asked_after_the_pool_stopped_are_made_by_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once concurrent.futures has shut its pools down (the interpreter exiting), the paths
    are synced by the wait itself, each one, and its errors still raised."""
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_bytes(b"x")
    synced: list[Path] = []
    monkeypatch.setattr(durable, "fsync_file", lambda p: synced.append(p))
    monkeypatch.setattr(durable, "fsync_dir", lambda p: synced.append(p))

    class Stopped:
        def submit(self, *args: Any) -> Any:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(durable, "_fsync_pool", Stopped)
    wait = durable.start_fsyncs(files, [tmp_path])
    assert synced == []  # made by the wait, not before
    wait()
    assert synced == [*files, tmp_path]

    def broken(p: Path) -> None:
        raise OSError(errno.EIO, "Input/output error", str(p))

    monkeypatch.setattr(durable, "fsync_dir", broken)
    with pytest.raises(OSError, match="Input/output"):
        durable.start_fsyncs(files, [tmp_path])()
