"""A writer's commits on their own thread (rlds_cli/write/committer.py, issue 25): ``add`` returns
before the commit, ``flush`` waits for it, episodes that end during a commit go together into
the next, waiting episodes are bounded, a failed commit is told before any later one lands, and
a writer left open (an error in its block, dropped, the interpreter exiting, a fork) commits its
full batches and never hangs."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.errors import CommitFailedError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.write import segments
from rlds_cli.write.committer import Committer
from rlds_cli.write.validate import episode_columns, flatten
from tests.faults import assert_finishes_forked
from tests.waits import HANG_SECONDS
from tests.write.test_writer import episode
from tests.write.test_writer_failures import wait_for


def _uids(name: str) -> list[int]:
    ds = rlds_cli.open_dataset(name)
    assert check_dataset(ds).ok
    return [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)]


def _segments(name: str) -> int:
    return int(rlds_cli.open_dataset(name).growth()["segments"])


class HeldCommits:
    """``segments.commit_segment`` held until :meth:`release` (in this process only: a forked
    child commits at once); ``started`` is set when a held commit has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started, self.released = threading.Event(), threading.Event()
        self.pid, self.real = os.getpid(), segments.commit_segment
        monkeypatch.setattr(segments, "commit_segment", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() == self.pid:
            self.started.set()
            assert self.released.wait(HANG_SECONDS), "the test never released the commit"
        return self.real(*args, **kwargs)

    def release(self) -> None:
        self.released.set()


def test_add_returns_before_the_commit_and_flush_waits_for_it(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldCommits(monkeypatch)
    with rlds_cli.DatasetWriter("bg") as w:
        w.add_episode(episode(3, uid=1))  # returns while its commit is held
        assert held.started.wait(HANG_SECONDS)
        assert rlds_cli.open_dataset("bg").num_episodes == 0 and w.episodes_written == 0
        held.release()
        w.flush()
        assert _uids("bg") == [1] and (w.episodes_written, w.steps_written) == (1, 3)


def test_episodes_added_during_a_commit_go_together_into_the_next(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: one commit per episode asked, five episodes end while the first is under
    way, and they become one segment, in the order they were added."""
    held = HeldCommits(monkeypatch)
    with rlds_cli.DatasetWriter("group", episodes_per_commit=1) as w:
        w.add_episode(episode(2, uid=0))
        assert held.started.wait(HANG_SECONDS)
        for uid in range(1, 6):
            w.add_episode(episode(2, float(uid), uid=uid))
        assert w._committer.waiting == 5
        held.release()
    assert _uids("group") == [0, 1, 2, 3, 4, 5]
    assert _segments("group") == 2


def _columns(uid: int) -> Any:
    return episode_columns(flatten(episode(4, float(uid), uid=uid)))


@pytest.mark.parametrize("bound", ["bytes", "episodes"])
def test_waiting_episodes_are_bounded_while_a_commit_is_under_way(bound: str) -> None:
    """Past ``max_waiting_bytes`` of waiting episodes, or ``max_waiting_episodes`` of them,
    ``add`` waits for the commit under way (memory and the last commit's time stay bounded
    when the commits are slower than the caller)."""
    one = _columns(0).nbytes()
    limit = {"max_waiting_bytes": 2 * one} if bound == "bytes" else {"max_waiting_episodes": 2}
    committed: list[int] = []
    started, released = threading.Event(), threading.Event()

    def commit(batch: list[Any]) -> None:
        started.set()
        assert released.wait(HANG_SECONDS)
        committed.extend(int(ep.steps["info/episode_uid"][0]) for ep in batch)

    committer = Committer(commit, 1, name="bounded", **limit)
    blocked = threading.Event()
    real_wait = committer._cond.wait

    def wait(timeout: float | None = None) -> bool:
        if threading.current_thread() is caller:
            blocked.set()  # the caller waits for the disk: what is bounded
        return real_wait(timeout)

    committer._cond.wait = wait  # type: ignore[method-assign]
    committer.add(_columns(0))
    assert started.wait(HANG_SECONDS)  # the commit of episode 0 is under way
    added: list[int] = []

    def add_all() -> None:
        for uid in range(1, 5):
            committer.add(_columns(uid))
            added.append(uid)

    caller = threading.Thread(target=add_all)
    caller.start()
    assert blocked.wait(HANG_SECONDS)
    assert added == [1, 2] and committer.waiting == 2  # two waiting, the third held back
    released.set()
    caller.join(HANG_SECONDS)
    committer.finish(due_only=False)
    assert [0, *added] == committed == [0, 1, 2, 3, 4]


def test_the_call_after_a_failed_commit_raises_and_the_later_episodes_wait_for_it(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit fails while later episodes wait: none of them is committed before the caller
    is told (no later episode without the earlier ones); the call that tells adds nothing;
    afterwards the writer goes on."""
    started, released = threading.Event(), threading.Event()
    real, calls = segments.commit_segment, {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            started.set()
            assert released.wait(HANG_SECONDS)
            raise OSError(28, "No space left on device", "/cache/x")
        return real(*args, **kwargs)

    monkeypatch.setattr(segments, "commit_segment", flaky)
    w = rlds_cli.DatasetWriter("told")
    w.add_episode(episode(2, uid=1))
    assert started.wait(HANG_SECONDS)
    w.add_episode(episode(2, 2.0, uid=2))
    w.add_episode(episode(2, 3.0, uid=3))
    released.set()
    committer = w._committer
    with committer._cond:
        assert committer._cond.wait_for(
            lambda: committer._error is not None and committer._busy is None, HANG_SECONDS
        )
    assert rlds_cli.open_dataset("told").num_episodes == 0  # held back until the caller is told
    with pytest.raises(CommitFailedError, match=r"1 episode\(s\) \(2 steps\) failed.*no space left") as err:
        w.add_episode(episode(2, 4.0, uid=4))  # tells, and adds nothing
    assert "free some space" in err.value.hint  # the full disk's own advice
    w.add_episode(episode(2, 5.0, uid=5))
    w.close()
    assert _uids("told") == [2, 3, 5]


def test_an_error_in_the_block_commits_the_full_batches_and_drops_the_rest(isolated_cache: Path) -> None:
    with (
        pytest.raises(ValueError, match="the actor crashed"),
        rlds_cli.DatasetWriter("err", episodes_per_commit=2) as w,
    ):
        for uid in range(3):
            w.add_episode(episode(2, float(uid), uid=uid))
        raise ValueError("the actor crashed")
    assert _uids("err") == [0, 1]


def test_a_writer_dropped_without_close_commits_its_full_batches(isolated_cache: Path) -> None:
    w = rlds_cli.DatasetWriter("dropped", episodes_per_commit=2)
    for uid in range(3):
        w.add_episode(episode(2, float(uid), uid=uid))
    del w
    gc.collect()
    assert _uids("dropped") == [0, 1]


_LEFT_OPEN = """
import sys
import numpy as np
import rlds_cli
sys.path.insert(0, sys.argv[1])
from tests.write.test_writer import episode
w = rlds_cli.DatasetWriter("open", episodes_per_commit=int(sys.argv[2]))
for uid in range(5):
    w.add_episode(episode(3, float(uid), uid=uid))
# no close(): the interpreter exits with commits due or under way
"""


@pytest.mark.parametrize(("per_commit", "kept"), [(1, [0, 1, 2, 3, 4]), (2, [0, 1, 2, 3])])
def test_the_interpreter_exiting_commits_what_a_writer_left_open(
    isolated_cache: Path, per_commit: int, kept: list[int]
) -> None:
    """Every full batch is committed, in order. The last, unfinished one may be too: a commit
    under way when the interpreter exits takes every episode waiting (group commit), and the
    exit hook runs only after the other threads and ``atexit`` handlers (on a loaded machine
    the commit thread gets there first)."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RLDS_FSYNC": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, str(repo), str(per_commit)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = _uids("open")
    assert got[: len(kept)] == kept and got == list(range(len(got))), got


def _child_adds_and_closes(writer: rlds_cli.DatasetWriter) -> None:
    writer.add_episode(episode(2, 9.0, uid=9))
    writer.close()


def test_a_fork_during_a_commit_leaves_it_to_the_parent(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process forked while its writer's commit is under way: the child has no commit thread
    and does not wait for the parent's commit (no hang); it commits its own episodes on a
    thread of its own. The parent's commit then lands: each episode once."""
    held = HeldCommits(monkeypatch)
    w = rlds_cli.DatasetWriter("forked")
    w.add_episode(episode(2, uid=1))
    assert held.started.wait(HANG_SECONDS)
    try:
        assert_finishes_forked(_child_adds_and_closes, w)
    finally:
        held.release()
    w.close()
    assert sorted(_uids("forked")) == [1, 9]


def test_copy_false_hands_the_arrays_over(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy=False``: no copy of the episode is made (the recorder builds its arrays for the
    call); the default copies, so the caller may refill its arrays at once."""
    from rlds_cli.write.validate import EpisodeColumns

    def no_copy(self: EpisodeColumns) -> EpisodeColumns:
        raise AssertionError("copied")

    monkeypatch.setattr(EpisodeColumns, "owned", no_copy)
    with rlds_cli.DatasetWriter("handed") as w:
        w.add_episode(episode(3, 1.0, uid=1), copy=False)
        with pytest.raises(AssertionError, match="copied"):
            w.add_episode(episode(3, 2.0, uid=2))
    assert _uids("handed") == [1]


def test_a_large_batch_of_frames_commits_exactly(isolated_cache: Path) -> None:
    """Frames across a group commit: every frame read back as written, digests checked."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (61, 84, 84, 3), dtype=np.uint8)
    flags = np.zeros((20, 1), bool)
    flags[-1] = True
    with rlds_cli.DatasetWriter("frames") as w:
        for start in (0, 20, 40):
            w.add_episode(
                {
                    "observation": frames[start : start + 20],
                    "next/observation": frames[start + 1 : start + 21],
                    "action": np.zeros((20, 1), np.float32),
                    "next/reward": np.zeros((20, 1), np.float32),
                    "next/terminated": flags,
                    "next/truncated": np.zeros_like(flags),
                }
            )
    ds = rlds_cli.open_dataset("frames")
    assert check_dataset(ds).ok
    for i, start in enumerate((0, 20, 40)):
        assert np.array_equal(ds.episode(i)["observation"], frames[start : start + 20])
        assert np.array_equal(ds.episode(i)["next/observation"][-1], frames[start + 20])


# ---------------------------------------------------------------------- the commit interval

#: An interval no test waits out: a commit that waited for it would hang the test, not pass it.
FOREVER = 3_600.0


def _finishes(call: Any) -> None:
    """Run ``call`` on a thread; it must return (it would wait ``FOREVER`` if it waited for the
    interval)."""
    done = threading.Thread(target=call, daemon=True)
    done.start()
    done.join(HANG_SECONDS)
    assert not done.is_alive(), f"{call} waited for the commit interval"


def _recording_committer(
    interval: float, **kwargs: Any
) -> tuple[Committer, list[list[int]], threading.Event]:
    """A committer whose commits only record their batches (by uid); the event is set by each."""
    batches: list[list[int]] = []
    committed = threading.Event()

    def commit(batch: list[Any]) -> None:
        batches.append([int(ep.steps["info/episode_uid"][0]) for ep in batch])
        committed.set()

    return Committer(commit, 1, name="interval", commit_interval=interval, **kwargs), batches, committed


def test_episodes_within_the_commit_interval_wait_for_one_commit() -> None:
    """The first commit starts at once; the episodes that end within the interval after it wait
    (none committed yet) and are committed together, by flush, without waiting it out."""
    committer, batches, committed = _recording_committer(FOREVER)
    committer.add(_columns(0))
    assert committed.wait(HANG_SECONDS) and batches == [[0]]
    for uid in (1, 2, 3):
        committer.add(_columns(uid))
    committed.clear()
    assert not committed.wait(0.3) and committer.waiting == 3  # the interval holds them
    _finishes(committer.flush)
    assert batches == [[0], [1, 2, 3]]
    committer.add(_columns(4))
    _finishes(lambda: committer.finish(due_only=False))  # close does not wait for it either
    assert batches == [[0], [1, 2, 3], [4]]


def test_a_full_backlog_is_committed_without_waiting_for_the_interval() -> None:
    one = _columns(0).nbytes()
    committer, batches, committed = _recording_committer(FOREVER, max_waiting_bytes=3 * one)
    committer.add(_columns(0))
    assert committed.wait(HANG_SECONDS)
    committed.clear()
    committer.add(_columns(1))
    committer.add(_columns(2))
    assert not committed.wait(0.3) and committer.waiting == 2
    committer.add(_columns(3))  # three episodes' bytes wait: the backlog is full
    assert committed.wait(HANG_SECONDS), "a full backlog waited for the interval"
    assert batches == [[0], [1, 2, 3]]
    committer.finish(due_only=False)


def test_no_interval_commits_each_episode_as_it_comes(isolated_cache: Path) -> None:
    """``commit_interval=0``: an episode added after the last commit ended is a commit of its
    own (waited for by polling the writer's count, not by flush)."""
    with rlds_cli.DatasetWriter("eager", commit_interval=0) as w:
        for uid in range(3):
            w.add_episode(episode(2, uid=uid))
            wait_for(lambda uid=uid: w.episodes_written == uid + 1)
    assert _uids("eager") == [0, 1, 2] and _segments("eager") == 3


@pytest.mark.parametrize("interval", [-1.0, float("nan")])
def test_a_negative_or_nan_commit_interval_is_refused(isolated_cache: Path, interval: float) -> None:
    with pytest.raises(ValueError, match="commit_interval"):
        rlds_cli.DatasetWriter("bad", commit_interval=interval)
