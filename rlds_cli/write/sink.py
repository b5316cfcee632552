"""The disk side of a :class:`~rlds_cli.DatasetWriter`: one batch of whole episodes committed as
a segment (:func:`rlds_cli.write.segments.commit_segment`), then the eviction past the
dataset's capacity and the removal of segments retired long enough.

A sink is what the writer's commit thread (:mod:`rlds_cli.write.committer`) calls; it holds
no reference to the writer, so a writer dropped without ``close()`` can still be finalized.
Every failure is one :class:`~rlds_cli.errors.CommitFailedError` that says whether the batch
was committed (the eviction after it failed) or not (its episodes were not written).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache import log_checkpoint
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.backends.memmap import load_npy
from rlds_cli.cache.commit_log import RECORD_SIZE, LogState, Record, seg_name
from rlds_cli.cache.growing import growing_settings
from rlds_cli.cache.layout import COMMIT_LOG_FILE, EPISODES_FILE, SEGMENTS_DIR
from rlds_cli.cache.manifest import Manifest
from rlds_cli.errors import CommitFailedError, CorruptDatasetError, RldsError, from_os_error
from rlds_cli.frames.codecs import DEFAULT_JPEG_QUALITY
from rlds_cli.write import segments
from rlds_cli.write.compact import SmallSegmentMerger
from rlds_cli.write.validate import EpisodeColumns

#: Retired segments a commit removes at the most (:func:`rlds_cli.write.segments.collect`): a
#: few more than the one it makes, so the retired ones never pile up, and never so many that
#: the commit thread, which the writer's full backlog waits for, stands still.
COLLECT_PER_COMMIT = 4


class SegmentSink:
    """Commits batches of episodes into the growing dataset at ``directory``.

    Args:
        directory: The dataset's folder.
        protected: The episodes are never evicted (demonstrations).
        fsync: Make each segment durable before its commit record.
        writer: What wrote the segments (:func:`~rlds_cli.write.segments.writer_identity`).

    ``head`` (the dataset's head manifest) is set by the writer before the first commit.
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

    def _count(self, record: Record, batch: list[EpisodeColumns]) -> None:
        """A committed segment: its episodes' lengths kept for eviction, the totals counted."""
        self._lengths[record.seg] = np.array([ep.num_steps for ep in batch], np.int64)
        self.episodes_written += record.episodes
        self.steps_written += record.steps

    def _after_commit(self, head: Manifest) -> None:
        """Evict past the capacity, merge the newest small segments where they are due
        (:mod:`rlds_cli.write.compact`), then remove the files of segments retired long
        enough."""
        conf = growing_settings(head)
        log_path = self.directory / COMMIT_LOG_FILE
        # the first commit replays the whole log, not the checkpoint and its tail: a writer
        # evicts, merges and removes segments, which it must not do on a damaged log (damage
        # in the records before the checkpoint is what a reader from it never sees); then the
        # records since the last commit, a read of a few
        self._state.follow(log_path)
        if self._state.position - self._checkpointed >= log_checkpoint.CHECKPOINT_RECORDS * RECORD_SIZE:
            # from a replay of its own: this view's retired segments shrink as they are collected
            log_checkpoint.load_state(self.directory)
            self._checkpointed = self._state.position
        if conf["capacity"] is not None or conf["capacity_episodes"] is not None:
            count = segments.evict_to(
                self.directory,
                self._state,
                self._segment_lengths,
                capacity=conf["capacity"],
                capacity_episodes=conf["capacity_episodes"],
                fsync=self.fsync,
            )
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
    """What went wrong and what to do, in the words the user can act on (a full disk names the
    file and says how to free space); ``None``: the error's default hint."""
    known = exc if isinstance(exc, RldsError) else None
    if known is None and isinstance(exc, OSError):
        known = from_os_error(exc)
    if known is not None:
        return str(known), known.hint or None
    return str(exc) or type(exc).__name__, None


__all__ = ["SegmentSink"]
