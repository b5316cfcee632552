"""A writer's commits: on a thread of their own, each written to disk as a segment (the sink).

The caller hands whole episodes over and goes on (an actor steps its environment, a collector fills
its next batch) while earlier episodes are written, fsynced and logged.

**Group commit.** A commit starts once ``episodes_per_commit`` episodes wait, no commit is under way
and ``commit_interval`` seconds have passed since the last one started; it takes every episode
waiting (one segment, one set of fsync waves, one log record). A caller that adds faster than the
disk syncs gets fewer, larger commits instead of waiting on every fsync; the interval does the same
for episodes that end faster than a commit is worth (a commit's own Python work, ~0.5 ms, holds the
GIL beside the environment loop). A slower caller gets a commit per ``episodes_per_commit``
episodes, each visible at most about ``commit_interval`` plus one commit's time after it was added.
``flush``, ``close`` and a full backlog (:data:`MAX_WAITING_BYTES`, :data:`MAX_WAITING_EPISODES`) do
not wait for the interval.

Guarantees:

* **Order.** One thread commits, in the order the episodes were added. A failed commit holds back
  the ones after it until the caller's next call (``check``, which the writer makes before it
  changes anything, ``flush``, ``close``) raises its error. ``close`` after a failure says how many
  episodes were not written in all (the failed batch and those behind it).
* **Bounded memory and latency.** While a commit is under way, waiting episodes take at most
  :data:`MAX_WAITING_BYTES` (or one episode) and number at most :data:`MAX_WAITING_EPISODES` (or two
  commits' worth); beyond that ``add`` waits. The count bounds small episodes added in a busy loop,
  which keeps the GIL from the commit thread (it gets it back once per 5 ms switch interval after
  each system call): unbounded, a quarter of a GiB of tiny episodes piled up and ``close`` took
  minutes.
* **flush** returns once every episode added before it is committed (visible, and durable with fsync
  on), or raises why not.
* **Ends.** ``finish(due_only=True)`` (an error in the writer's ``with`` block, a writer dropped
  without ``close()``, interpreter exit) commits the episodes of every full batch of
  ``episodes_per_commit`` and drops the rest, with a warning.
* **fork.** A forked child forgets the commit under way and the waiting episodes (the parent's to
  commit) and starts its own thread for its next commit.
* **Exit.** A writer left open at interpreter exit commits its full batches from an ``atexit``
  handler registered at import: it runs after the non-daemon threads have ended and after every
  handler registered later (a user's ``atexit.register(writer.close)`` closes the writer first,
  whole).

**The sink.** :class:`SegmentSink` is the disk side of a :class:`~rlds_cli.DatasetWriter`: one batch
of whole episodes committed as a segment (:func:`rlds_cli.write.segments.commit_segment`), then
eviction past the dataset's capacity and removal of segments retired long enough. It holds no
reference to the writer, so a writer dropped without ``close()`` can still be finalized. Every
failure is one :class:`~rlds_cli.errors.CommitFailedError` that says whether the batch was committed
(the eviction after it failed) or not (its episodes were not written).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache import log_checkpoint
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.backends.memmap import load_npy
from rlds_cli.cache.commit_log import RECORD_SIZE, LogState, Record, damage_hint, seg_name, unnamed
from rlds_cli.cache.growing import growing_settings
from rlds_cli.cache.layout import COMMIT_LOG_FILE, EPISODES_FILE, MANIFEST_FILE, SEGMENTS_DIR
from rlds_cli.cache.manifest import Manifest
from rlds_cli.errors import (
    CommitFailedError,
    CorruptDatasetError,
    DatasetReplacedError,
    RldsError,
    from_os_error,
)
from rlds_cli.frames.codecs import DEFAULT_JPEG_QUALITY
from rlds_cli.write import segments
from rlds_cli.write.compact import SmallSegmentMerger
from rlds_cli.write.validate import EpisodeColumns

__all__ = ["MAX_WAITING_BYTES", "MAX_WAITING_EPISODES", "Committer", "SegmentSink"]

#: Retired segments a commit removes at most (:func:`rlds_cli.write.segments.collect`): more than
#: the one it makes, so they never pile up; few, so the commit thread (which a full backlog waits
#: for) never stands still.
COLLECT_PER_COMMIT = 4
#: Reads of the log an eviction makes when a segment of its view was removed meanwhile.
EVICT_ATTEMPTS = 5


class SegmentSink:
    """Commits batches of episodes into the growing dataset at ``directory``.

    Args:
        directory: The dataset's folder.
        protected: The episodes are never evicted (demonstrations).
        fsync: Make each segment durable before its commit record.
        writer: What wrote the segments (:func:`~rlds_cli.write.segments.writer_identity`).

    ``head`` (the dataset's head manifest) is set by the writer (:meth:`adopt`) before the first
    commit.
    """

    def __init__(
        self,
        directory: Path,
        *,
        protected: bool,
        fsync: bool,
        writer: dict[str, Any],
        try_lock: Callable[[], Any | None] | None = None,
        quality: int = DEFAULT_JPEG_QUALITY,
    ) -> None:
        self.directory = directory
        self.quality = quality  # of the frames a frame column encodes
        self.protected = protected
        self.fsync = fsync
        self.writer = writer
        self.head: Manifest | None = None
        self._head_file: tuple[int, int, int] | None = None  # see adopt()
        self._state = LogState()
        self._checkpointed = 0  # the log position at this writer's last checkpoint
        self._lengths: dict[bytes, np.ndarray] = {}
        self.merger = None if try_lock is None else SmallSegmentMerger(directory, try_lock, fsync=fsync)
        #: Episodes and steps committed through this sink.
        self.episodes_written = 0
        self.steps_written = 0

    def commit(self, batch: list[EpisodeColumns]) -> None:
        """Write ``batch`` as one segment and commit it, then evict and collect."""
        head = self.head
        assert head is not None, "the writer sets the head before its first commit"
        if self.writer.get("pid") != os.getpid():  # a forked child: its segments are its own
            self.writer = {**self.writer, **segments.writer_identity()}
        try:
            self._check_same_dataset(head)
            if self._state.position == 0 and (self.directory / MANIFEST_FILE).exists():
                self._check_log_whole()  # (a dataset removed: committing the segment says so)
            record = segments.commit_segment(
                self.directory,
                head,
                get_backend(head.backend),
                batch,
                protected=self.protected,
                fsync=self.fsync,
                writer=self.writer,
                quality=self.quality,
            )
        except segments.CommittedNotSynced as exc:
            self._count(exc.record, batch)
            raise CommitFailedError(
                f"dataset {head.name!r}: {exc.record.episodes} episode(s) were committed and are "
                f"visible, but syncing the commit log failed, so they may not survive a power "
                f"loss: {_cause(exc.cause)[0]}",
                hint="do not add them again; check the disk (the next commit syncs the log again)",
            ) from exc.cause
        except Exception as exc:
            steps = sum(ep.num_steps for ep in batch)
            what, hint = _cause(exc)
            raise CommitFailedError(
                f"dataset {head.name!r}: the commit of {len(batch)} episode(s) ({steps} steps) failed, "
                f"they were not written: {what}",
                hint=hint,
            ) from exc
        self._count(record, batch)
        try:
            self._after_commit(head)
        except Exception as exc:
            what, hint = _cause(exc)
            if not isinstance(exc, CorruptDatasetError):
                hint = "the committed episodes are safe; the next commit evicts and cleans up again"
            raise CommitFailedError(
                f"dataset {head.name!r}: {record.episodes} episode(s) were committed, but the "
                f"eviction, merge or cleanup after them failed: {what}",
                hint=hint,
            ) from exc

    def adopt(self, head: Manifest) -> None:
        """Commit into the dataset whose head manifest ``head`` was just read (or written): the
        head's file is remembered, as it is written once, when the dataset is made."""
        self.head = head
        self._head_file = self._head_identity()

    def _head_identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.directory / MANIFEST_FILE)
        except FileNotFoundError:
            return None  # removed: building the segment says so
        return (st.st_dev, st.st_ino, st.st_mtime_ns)

    def _check_same_dataset(self, head: Manifest) -> None:
        """Refuse to commit into another dataset of the same name (removed and made again while this
        writer was open: its segments would mix in, or break the new schema)."""
        now = self._head_identity()
        if now is not None and now != self._head_file:
            raise DatasetReplacedError(
                f"growing dataset {head.name!r} was removed and made again while a writer was open",
                hint="open a new writer (mode='append') to write into the new one",
            )

    def _check_log_whole(self) -> None:
        """Before a writer's first commit: the whole log replayed (damage raises), and no record lost
        where the segments on disk show it (:func:`~rlds_cli.cache.commit_log.unnamed`): committed into,
        such a log's lost episodes would stay unseen."""
        self._state.follow(self.directory / COMMIT_LOG_FILE)
        _, why = unnamed(self.directory, self._state)
        if why is not None:
            name = self.head.name if self.head is not None else self.directory.name
            raise CorruptDatasetError(
                f"growing dataset {name!r} is damaged: {why}",
                hint=damage_hint(self.directory),
            )

    def _count(self, record: Record, batch: list[EpisodeColumns]) -> None:
        """A committed segment: its episodes' lengths kept for eviction, the totals counted."""
        self._lengths[record.seg] = np.array([ep.num_steps for ep in batch], np.int64)
        self.episodes_written += record.episodes
        self.steps_written += record.steps

    def _after_commit(self, head: Manifest) -> None:
        """Evict past the capacity, merge the newest small segments where due
        (:mod:`rlds_cli.write.compact`), then remove the files of segments retired long enough."""
        conf = growing_settings(head)
        log_path = self.directory / COMMIT_LOG_FILE
        # the first commit replays the whole log, not the checkpoint and its tail (a writer must
        # not evict, merge or remove on a damaged log, and damage before a checkpoint is unseen
        # from it); later ones read the few records since the last commit
        self._state.follow(log_path)
        if self._state.position - self._checkpointed >= log_checkpoint.CHECKPOINT_RECORDS * RECORD_SIZE:
            # from a replay of its own: this view's retired segments shrink as they are collected
            log_checkpoint.load_state(self.directory)
            self._checkpointed = self._state.position
        if conf["capacity"] is not None or conf["capacity_episodes"] is not None:
            for attempt in range(EVICT_ATTEMPTS):
                try:
                    count = segments.evict_to(
                        self.directory,
                        self._state,
                        self._segment_lengths,
                        capacity=conf["capacity"],
                        capacity_episodes=conf["capacity_episodes"],
                        fsync=self.fsync,
                    )
                    break
                except FileNotFoundError:
                    # a segment of this view merged and removed by another writer since the log was
                    # read (grace_seconds=0): read it again; the log, not the view, is the truth
                    if attempt + 1 == EVICT_ATTEMPTS:
                        raise
                    self._state.follow(log_path)
            if count is not None:
                self._state.follow(log_path)
        if self.merger is not None and self.merger.after_commit(self._state.live(), head, conf["capacity"]):
            self._state.follow(log_path)
        if self._state.retired:
            segments.collect(
                self.directory, self._state, conf["grace_seconds"], limit=COLLECT_PER_COMMIT, background=True
            )

    def _segment_lengths(self, seg: bytes) -> np.ndarray:
        got = self._lengths.get(seg)
        if got is None:
            path = self.directory / SEGMENTS_DIR / seg_name(seg) / EPISODES_FILE
            index = load_npy(path, mmap=False, what="episode index")
            got = self._lengths[seg] = np.asarray(index["length"], np.int64)
        return got


def _cause(exc: Exception) -> tuple[str, str | None]:
    """What went wrong and what to do, in words the user can act on (a full disk names the file and
    how to free space); hint ``None``: the error's default."""
    known = exc if isinstance(exc, RldsError) else None
    if known is None and isinstance(exc, OSError):
        known = from_os_error(exc)
    if known is not None:
        return str(known), known.hint or None
    return str(exc) or type(exc).__name__, None


log = logging.getLogger(__name__)

#: Bytes of episodes that may wait while a commit is under way before ``add`` waits for it.
MAX_WAITING_BYTES = 256 * 1024 * 1024
#: Episodes that may wait while a commit is under way (or ``2 * episodes_per_commit``, when
#: more) before ``add`` waits for it.
MAX_WAITING_EPISODES = 1024

_live: weakref.WeakSet[Committer] = weakref.WeakSet()


class Committer:
    """Runs ``commit(batch)`` for whole episodes on one background thread (see the module
    docstring). ``name`` is the dataset's, for messages."""

    def __init__(
        self,
        commit: Callable[[list[EpisodeColumns]], None],
        episodes_per_commit: int,
        *,
        name: str,
        commit_interval: float = 0.0,
        max_waiting_bytes: int = MAX_WAITING_BYTES,
        max_waiting_episodes: int = MAX_WAITING_EPISODES,
    ) -> None:
        self._commit = commit
        self._per = episodes_per_commit
        self._interval = commit_interval
        self._last_start = -float("inf")  # monotonic time the last commit started
        self._name = name
        self._max_bytes = max_waiting_bytes
        self._max_episodes = max(max_waiting_episodes, 2 * episodes_per_commit)
        self._waiting: list[EpisodeColumns] = []
        self._waiting_bytes = 0
        self._error: BaseException | None = None
        self._new_process_state()
        _live.add(self)

    def _new_process_state(self) -> None:
        """The state that belongs to one process: a forked child makes its own."""
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy: list[EpisodeColumns] | None = None  # the batch being committed
        self._draining = 0  # callers waiting for every waiting episode to be committed
        self._stopping = False
        self._pid = os.getpid()

    # ------------------------------------------------------------------ the caller's side

    @property
    def waiting(self) -> int:
        """Episodes added and not yet handed to a commit."""
        return len(self._waiting)

    def check(self) -> None:
        """Raise (once) the error of a commit that failed since the caller was last told."""
        with self._cond:
            self._raise_error()

    def add(self, episode: EpisodeColumns) -> None:
        """Hand ``episode`` over (the committer owns its arrays from now on). Never raises a
        commit's error (call :meth:`check` first): one that comes while this call waits is raised by
        the next ``check``, ``flush`` or ``finish`` and the episode waits behind it, so a caller
        adding several episodes never loses some to an error raised half-way."""
        nbytes = episode.nbytes()
        with self._cond:
            while self._busy is not None and self._error is None and self._full(nbytes):
                self._cond.wait()
            self._waiting.append(episode)
            self._waiting_bytes += nbytes
            if len(self._waiting) >= self._per:
                self._wake()

    def flush(self) -> None:
        """Commit every waiting episode and wait for it (and any commit under way)."""
        with self._cond:
            self._raise_error()
            if not self._waiting and self._busy is None:
                return
            self._draining += 1
            try:
                self._wake()
                while (self._waiting or self._busy is not None) and self._error is None:
                    self._cond.wait()
            finally:
                self._draining -= 1
            self._raise_error()

    def discard(self) -> None:
        """Drop every waiting episode (none of them can be committed)."""
        with self._cond:
            self._waiting.clear()
            self._waiting_bytes = 0

    def finish(self, *, due_only: bool) -> None:
        """Commit what must be, then end the thread: every waiting episode, or with ``due_only``
        those of full batches (the rest dropped, logged). Raises a commit's error unless
        ``due_only`` (then logged: the caller is already failing or going away). Safe from any
        thread, the committer's own included (which then does not wait)."""
        with self._cond:
            if due_only:
                keep = len(self._waiting) // self._per * self._per
                self._drop(self._waiting[keep:], "added but not committed")
                del self._waiting[keep:]
            self._stopping = True  # the thread commits what waits, then ends
            inline = False
            if self._waiting and self._thread is None and self._error is None:
                try:
                    self._wake()
                except RuntimeError:  # no new thread at interpreter shutdown (Python >= 3.12)
                    inline = True
            self._cond.notify_all()
            thread = self._thread
        if inline:
            self._run()  # the commits this thread would have made, made here
        elif thread is threading.current_thread():
            return  # (a finalizer run on the thread itself) it commits what waits, then ends
        elif thread is not None:
            thread.join()
        with self._cond:
            error, self._error = self._error, None
            behind = len(self._waiting)
            self._drop(self._waiting, "waiting behind a failed commit")
            self._waiting.clear()
        if error is not None:
            if behind and isinstance(error, CommitFailedError):
                error = _with_episodes_behind(error, behind)
            if not due_only:
                raise error
            log.warning("%s", error)

    def _drop(self, episodes: list[EpisodeColumns], why: str) -> None:
        if episodes:
            log.warning("dataset %r: %d episode(s) %s were dropped", self._name, len(episodes), why)
            self._waiting_bytes -= sum(ep.nbytes() for ep in episodes)

    def _full(self, nbytes: int) -> bool:
        """Whether the episodes waiting (and one more of ``nbytes``, when given) are more than
        may wait; the caller holds the lock."""
        if not self._waiting:
            return False
        if nbytes:
            return self._waiting_bytes + nbytes > self._max_bytes or len(self._waiting) >= self._max_episodes
        return self._waiting_bytes >= self._max_bytes or len(self._waiting) >= self._max_episodes

    def _raise_error(self) -> None:
        """Raise (once) the error of a commit that failed; the caller holds the lock."""
        error, self._error = self._error, None
        if error is not None:
            self._cond.notify_all()  # the thread waits for the caller to have been told
            raise error

    def _wake(self) -> None:
        """Make sure the thread runs, and tell it there is work; the caller holds the lock."""
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=f"rlds-commit-{self._name}", daemon=True)
            thread.start()
            self._thread = thread
        self._cond.notify_all()

    def _forked(self) -> None:
        """In a forked child: the thread, the batch under way, the episodes waiting and a
        failure not yet told are the parent's."""
        self._new_process_state()
        self._waiting = []
        self._waiting_bytes = 0
        self._error = None
        self._last_start = -float("inf")

    # ------------------------------------------------------------------ the thread

    def _next_batch(self) -> list[EpisodeColumns] | None:
        """Wait for a batch to commit (taken off the waiting list), or ``None`` to end."""
        with self._cond:
            while True:
                urgent = self._draining or self._stopping or self._full(0)
                ready = self._waiting and (len(self._waiting) >= self._per or urgent)
                if ready and self._error is None:
                    early = self._last_start + self._interval - time.monotonic()
                    if early > 0 and not urgent:
                        self._cond.wait(early)  # an add, a flush or close wakes it sooner
                        continue
                    batch, self._waiting, self._waiting_bytes = self._waiting, [], 0
                    self._busy = batch
                    self._last_start = time.monotonic()
                    return batch
                if self._stopping:
                    self._thread = None
                    self._cond.notify_all()
                    return None
                self._cond.wait()

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._commit(batch)
            except BaseException as exc:  # told to the caller at its next call
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = None
                    self._cond.notify_all()


def _after_fork_in_child() -> None:
    for committer in list(_live):
        committer._forked()


def _finish_all_at_exit() -> None:
    """At interpreter exit: commit what every live committer must (full batches)."""
    for committer in list(_live):
        if committer._pid == os.getpid():
            committer.finish(due_only=True)


def _with_episodes_behind(error: CommitFailedError, behind: int) -> CommitFailedError:
    """``error``, also saying that the ``behind`` episodes waiting after the failed batch were not written."""
    told = CommitFailedError(
        f"{error}; the {behind} episode(s) added after them were not written either", hint=error.hint
    )
    told.__cause__ = error.__cause__
    return told


# Registered at import, before a user can register a handler that closes a writer (atexit runs
# handlers last in, first out, and only after the threads that are not daemons have ended).
atexit.register(_finish_all_at_exit)

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
