"""The disk steps of a growing dataset: its head, a segment's commit, eviction, cleanup (retired
folders deleted on a thread of their own).

A commit (:func:`commit_segment`), in order:

1. ``mkdir building/<id>.<pid>`` (private to this writer: nobody reads ``building/``);
2. write every column through the storage backend (hashed as it is written), then the episode index,
   then ``manifest.json`` (temp file, rename);
3. ``rename`` the build to ``segments/<id>``; then fsync, all at once, every file of the segment,
   every folder of it and ``segments/``;
4. append an ``ADD`` record to ``commits.log`` (one ``O_APPEND`` write) and fsync the log;
5. make the segment's empty ``commit/recorded`` file (no fsync; ``commit/`` was made with the
   build, so no folder a reader pins changes).

The episodes become visible at step 4 and only there: killed before it, the writer leaves a build
folder or an unreferenced segment without ``commit/recorded``, which no reader looks at and a compaction's
:func:`collect` removes once older than the grace period and its writer no longer runs (a segment:
where the log is not damaged); killed after it, the episodes are committed. Step 5 is what tells a
log that lost its last record from that kill: a segment the log does not name but that has
``commit/recorded`` is damage, never a leftover (:func:`~rlds_cli.cache.commit_log.unnamed`). Several
writers commit at once: each has its own build folder and segment id, and the log takes whole
records.

A segment's commit record is the log's, not its manifest: nothing reads a segment before a record
names it, so its files need only be durable before that record, in any order. That is two waves of
fsyncs (the segment's files and folders; the log), where a converted dataset's seal and publish wait
for six in a row. Commits run on the writer's commit thread (:mod:`rlds_cli.write.committer`), so
these waits overlap the caller's work.

**Deleting.** The commit thread renames a retired segment out of the dataset (one ``rename``: gone
from every reader's sight at once) and hands the folder to this process's deleting thread
(:func:`delete_later`); walking its files on the commit thread took 40% of a commit's time on a busy
disk. A folder not yet deleted when the process ends stays under ``building/`` with this process's
id in its name: ``rlds compact`` and ``rlds gc`` remove it as the build of a writer that no longer
runs. A forked child starts a thread of its own; what the parent handed over is the parent's.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.io import fsync_wave, tree_paths
from rlds_cli._version import __version__
from rlds_cli.cache import commit_log, digest, episodes
from rlds_cli.cache.backends import Backend
from rlds_cli.cache.backends.frames import FramesColumnWriter, column_writer
from rlds_cli.cache.commit_log import (
    ADD,
    EVICT,
    PROTECTED,
    LogState,
    Record,
    new_segment_id,
    seg_name,
    unnamed,
    writer_alive,
)
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    COMMIT_MARK_DIR,
    GROWING_FOLDERS,
    SEGMENT_BUILDS_DIR,
    SEGMENTED_LAYOUT,
    SEGMENTS_DIR,
)
from rlds_cli.cache.manifest import FieldSpec, Manifest, write_manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.transaction import CacheTransaction
from rlds_cli.errors import CorruptDatasetError, DatasetNotFoundError
from rlds_cli.frames.codecs import DEFAULT_JPEG_QUALITY
from rlds_cli.write.validate import EpisodeColumns

__all__ = ["delete_later", "wait_deleted"]

_lock = threading.Lock()
_queue: queue.Queue[Path] | None = None
_pid = 0


def delete_later(path: Path) -> None:
    """Delete the folder ``path`` (already out of every reader's sight) on this process's deleting thread."""
    global _queue, _pid
    with _lock:
        if _queue is None or _pid != os.getpid():
            _queue, _pid = queue.Queue(), os.getpid()
            threading.Thread(target=_run, args=(_queue,), name="rlds-trash", daemon=True).start()
        _queue.put(path)


def wait_deleted() -> None:
    """Return once every folder this process handed over has been deleted."""
    with _lock:
        pending = _queue if _pid == os.getpid() else None
    if pending is not None:
        pending.join()


def _run(pending: queue.Queue[Path]) -> None:
    while True:
        path = pending.get()
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            pending.task_done()


log = logging.getLogger(__name__)


def writer_identity() -> dict[str, Any]:
    """What wrote a segment: host, process, the writer within it (``instance``: a process may
    hold several writers, each of which a kill may leave one segment of), rlds version (its
    manifest's ``source.writer``)."""
    return {
        "host": socket.gethostname(), "pid": os.getpid(), "instance": secrets.token_hex(8),
        "created_by": f"rlds-cli {__version__}",
    }  # fmt: skip


def create_head(
    cache: CacheRoot, name: str, backend: str, fields: dict[str, FieldSpec], source: dict[str, Any]
) -> Manifest:
    """Publish an empty growing dataset (head manifest, empty log, ``segments/``) through the
    cache's transaction. Raises :class:`~rlds_cli.errors.DatasetExistsError` when the name was
    taken meanwhile."""
    with CacheTransaction(name, root=cache) as txn:
        txn.check_free()
        build = txn.new_build_dir()
        for folder in GROWING_FOLDERS:
            (build / folder).mkdir()
        (build / COMMIT_LOG_FILE).touch()
        manifest = Manifest(
            name=txn.name,
            backend=backend,
            num_steps=0,
            num_episodes=0,
            fields=dict(fields),
            source=source,
            layout=SEGMENTED_LAYOUT,
        )
        txn.commit(manifest)
    return manifest


@contextmanager
def building_segment(directory: Path, seg: bytes, *, fsync: bool) -> Iterator[Path]:
    """A build folder for segment ``seg`` of the growing dataset at ``directory``: renamed into
    ``segments/`` whole when the block ends (then fsynced), removed if it raises. The caller commits
    the segment (a log record) afterwards."""
    build = directory / SEGMENT_BUILDS_DIR / f"{seg_name(seg)}.{os.getpid()}"
    if not (directory / COMMIT_LOG_FILE).is_file():  # 'rlds rm' while this writer was open
        raise DatasetNotFoundError(
            f"growing dataset {directory.name!r} was removed while a writer was open",
            hint="open a new writer (mode='create') to write it again",
        )
    if build.parent.exists() and not build.parent.is_dir():
        raise CorruptDatasetError(
            f"growing dataset {directory.name!r}: {build.parent} is not the folder of segment builds",
            hint=f"remove it (rlds makes the folder again), or the dataset ('rlds rm {directory.name}')",
        )
    # datasets copied by hand may lack the empty building/ (nothing to copy in it)
    build.parent.mkdir(exist_ok=True)
    os.mkdir(build)
    try:
        os.mkdir(build / COMMIT_MARK_DIR)  # empty until the segment's record is in the log
        yield build
        final = directory / SEGMENTS_DIR / seg_name(seg)
        os.rename(build, final)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    if fsync:  # every file's data and every folder's entries, in one wave (see the module docstring)
        files, folders = tree_paths(final)
        fsync_wave(files, [*folders, final.parent])


def commit_segment(
    directory: Path,
    head: Manifest,
    backend: Backend,
    batch: list[EpisodeColumns],
    *,
    protected: bool,
    fsync: bool,
    writer: dict[str, Any],
    quality: int = DEFAULT_JPEG_QUALITY,
) -> Record:
    """Write ``batch`` (whole episodes) as one segment and commit it (see the module docstring);
    returns the ``ADD`` record appended.

    A failure after the segment's rename and before its record is written removes the segment at
    once (its writer still runs, so :func:`collect` would keep it until the writer ends). A failure
    after the record (its fsync) leaves the segment committed and raises
    :class:`CommittedNotSynced`. ``quality``: the JPEG quality of frames a frame column encodes.
    """
    seg = new_segment_id()
    log_path = directory / COMMIT_LOG_FILE
    final = directory / SEGMENTS_DIR / seg_name(seg)
    try:
        with building_segment(directory, seg, fsync=fsync) as build:
            manifest = _write_segment(build, head, backend, batch, writer, fsync=fsync, quality=quality)
        record = Record(
            ADD,
            seg,
            episodes=manifest.num_episodes,
            steps=manifest.num_steps,
            flags=PROTECTED if protected else 0,
        )
        commit_log.append(log_path, record, fsync=fsync)
    except BaseException as exc:
        if not final.exists():
            raise
        try:
            logged = commit_log.has_added(log_path, seg)
        except OSError:  # unknown: the segment stays, for collect to judge once its writer ends
            raise exc from None
        if logged:
            if isinstance(exc, Exception):
                raise CommittedNotSynced(record, exc) from exc
            raise
        shutil.rmtree(final, ignore_errors=True)
        raise
    commit_log.mark_committed(final)
    return record


class CommittedNotSynced(Exception):
    """A segment's record is in the log (its episodes are committed and visible) but the commit
    failed after writing it: the log's fsync. ``record`` is that record, ``cause`` the error."""

    def __init__(self, record: Record, cause: Exception) -> None:
        super().__init__(str(cause))
        self.record = record
        self.cause = cause


def _write_segment(
    build: Path,
    head: Manifest,
    backend: Backend,
    batch: list[EpisodeColumns],
    writer: dict[str, Any],
    *,
    fsync: bool,
    quality: int,
) -> Manifest:
    # each episode's pieces written one after the other (never joined into a copy) and hashed
    # as written: no second read for the digests
    hashes: dict[str, str] = {}
    for key, spec in head.fields.items():
        pieces = [rows for ep in batch for rows in ep.pieces(key)]
        column = column_writer(backend, build, spec, quality, rows=sum(len(rows) for rows in pieces))
        # a frame column's writer hashes the bytes it stores (cache/backends/frames.py)
        hasher = None if isinstance(column, FramesColumnWriter) else digest.ColumnHasher(spec.dtype)
        try:
            for rows in pieces:
                column.append(rows)
                if hasher is not None:
                    hasher.update(rows)
        except BaseException:
            column.abort()  # its files and thread released; building_segment removes the folder
            raise
        column.close(fsync=False)  # building_segment fsyncs the segment's files together
        if isinstance(column, FramesColumnWriter):
            hashes[key] = column.hasher.hexdigest()
        else:
            assert hasher is not None
            hashes[key] = hasher.hexdigest()
    lengths = np.array([ep.num_steps for ep in batch], np.int64)
    return seal_segment(build, head, backend, lengths, hashes, writer)


def seal_segment(
    build: Path,
    head: Manifest,
    backend: Backend,
    lengths: np.ndarray,
    hashes: dict[str, str],
    writer: dict[str, Any],
) -> Manifest:
    """Finish a segment whose columns are written (``hashes``: each column's digest): its episode
    index (every episode ends by its flags, none sliced) and its manifest with the content digest
    (steps 2-3 of the module docstring; :func:`building_segment` syncs them). Written and compacted
    segments end the same way."""
    index = episodes.build_index(
        np.cumsum(lengths) - 1, np.full(len(lengths), -1, np.int64), np.ones(len(lengths), bool)
    )
    episodes.write_index(build, index, fsync=False)
    content = digest.record(hashes, index)
    manifest = Manifest(
        name=head.name,
        backend=backend.name,
        num_steps=int(lengths.sum()),
        num_episodes=len(lengths),
        fields=dict(head.fields),
        # its own name: a folder holding another segment's files is told apart (a copy passed)
        source={"format": "rlds-writer", "writer": writer, "segment": build.name.partition(".")[0]},
        content_digest=content,
    )
    # made durable with the folders (building_segment); one line: no one reads it by eye
    write_manifest(build, manifest, fsync=False, compact=True)
    return manifest


def evict_to(
    directory: Path,
    state: LogState,
    lengths_of: Any,
    *,
    capacity: int | None,
    capacity_episodes: int | None,
    fsync: bool,
) -> int | None:
    """Append an ``EVICT`` record that brings the unprotected live episodes of ``state`` under
    ``capacity`` steps and ``capacity_episodes`` episodes (oldest first; the newest episode is
    always kept). ``lengths_of(seg)`` gives a segment's episode lengths. Returns the new
    eviction count, or ``None`` when nothing had to go."""
    lengths: list[np.ndarray] = []
    for entry, skip in state.live():
        if not entry.protected:
            lengths.append(np.asarray(lengths_of(entry.seg))[skip - entry.dropped :])
    live = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    k = 0
    if capacity_episodes is not None:
        k = max(k, len(live) - capacity_episodes)
    if capacity is not None and live.sum() > capacity:
        # the fewest oldest episodes whose removal leaves at most `capacity` steps
        removed = np.cumsum(live)
        k = max(k, int(np.searchsorted(removed, live.sum() - capacity, side="left")) + 1)
    k = min(k, len(live) - 1)
    if k <= 0:
        return None
    count = state.evicted + k
    commit_log.append(directory / COMMIT_LOG_FILE, Record(EVICT, count=count), fsync=fsync)
    return count


@dataclass
class Leftovers:
    """What a collection removes from a growing dataset's folder: retired segments (names
    under ``segments/``, the oldest first) and builds of writers that no longer run."""

    segments: list[str] = field(default_factory=list)
    builds: list[Path] = field(default_factory=list)


def leftovers(
    directory: Path, state: LogState, grace: float, *, builds: bool = False, unreferenced: bool = False
) -> Leftovers:
    """The segments ``state`` retired (evicted whole, or compacted away) more than ``grace`` seconds
    ago, in the order the log retired them, up to the first one retired more recently; with
    ``builds``, also the builds older than that whose writer no longer runs; with ``unreferenced``,
    also the segments the log does not name (a writer killed between its segment's rename and its
    record) older than that whose writer no longer runs. Removes nothing (:func:`collect` does;
    ``rlds gc --dry-run`` lists them).

    A segment the log does not name is a leftover only if the log is whole (a damaged, emptied or
    cut log names nothing past its damage); ``rlds compact`` looks for them, ``rlds gc`` does not. A
    damaged log raises :class:`~rlds_cli.errors.CorruptDatasetError` before anything is removed;
    unnamed segments that are not what killed writers leave are kept, with a warning
    (:mod:`rlds_cli.cache.growing`).
    """
    now = time.time()
    due = Leftovers([])
    for seg, when in state.retired.items():
        # retirement order is time order (records stamped as appended): the first entry not yet
        # due ends the walk, so a commit costs the entries due, not all within the grace (36,000
        # with three writers at 200 commits/s and 60 s). Skewed host clocks make an entry late
        # by at most the skew, never early.
        if when >= now - grace:
            break
        due.segments.append(seg_name(seg))
    if unreferenced:
        # against the log as it is now, not only the caller's view: a segment committed since
        # is no leftover
        candidates, why = unnamed(directory, state)
        if why is not None:
            log.warning("%s: %s; the segments it does not name are kept", directory, why)
        else:
            due.segments += [p.name for p in candidates if _older(p, now - grace)]
    building = directory / SEGMENT_BUILDS_DIR
    for path in building.iterdir() if builds and building.is_dir() else ():
        if _older(path, now - grace) and not writer_alive(path):
            due.builds.append(path)
    return due


def collect(
    directory: Path,
    state: LogState,
    grace: float,
    *,
    builds: bool = False,
    unreferenced: bool = False,
    limit: int | None = None,
    background: bool = False,
) -> list[str]:
    """Remove the :func:`leftovers` of ``directory``: at most ``limit`` segments (``None``: all),
    the oldest first, and every build. Each segment is first renamed into ``building/`` (a reader
    sees a segment whole or not at all), then deleted (with ``background``, on this process's
    deleting thread). Returns the names removed (a build as ``building/<name>``).

    A writer collects after each commit, on its commit thread, with a ``limit``: that thread is what
    a full backlog waits for, and unbounded, one commit after a stall took on thousands of retired
    segments and stood still for minutes. A few more than one commit makes still shrinks a backlog,
    commit by commit.

    Every retired segment that is gone afterwards (removed here, or by another writer: each follows
    the whole log) leaves ``state.retired``; kept, it would be tried again at every commit (10,000
    renames after a minute of eight writers).
    """
    due = leftovers(directory, state, grace, builds=builds, unreferenced=unreferenced)
    removed: list[str] = []
    for path in due.builds:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:  # a checkpoint of the commit log that its writer never renamed into place
            path.unlink(missing_ok=True)
        removed.append(f"{SEGMENT_BUILDS_DIR}/{path.name}")
    taken = 0
    # one listing, not a rename per segment the log ever retired (21,000 renames were 1.8 s of a
    # 2.8 s compaction after 20,000 commits); a removed segment never comes back
    try:
        present = set(os.listdir(directory / SEGMENTS_DIR)) if due.segments else set()
    except FileNotFoundError:  # segments/ removed by hand: nothing of it to remove
        present = set()
    for name in due.segments:
        if limit is not None and taken >= limit:
            break
        if name not in present:
            state.retired.pop(bytes.fromhex(name), None)
            continue
        trash = directory / SEGMENT_BUILDS_DIR / f"{name}.{os.getpid()}.trash"
        try:
            _move(directory / SEGMENTS_DIR / name, trash)
        except FileNotFoundError:  # gone already (another writer collected it)
            state.retired.pop(bytes.fromhex(name), None)
            continue
        taken += 1
        if background:
            delete_later(trash)
        else:
            shutil.rmtree(trash, ignore_errors=True)
        state.retired.pop(bytes.fromhex(name), None)
        removed.append(name)
    return removed


def _move(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``, making the target's folder (``building/``) again if it was
    removed by hand. ``FileNotFoundError`` only when ``source`` is gone."""
    try:
        os.rename(source, target)
    except FileNotFoundError:
        if not source.exists():
            raise
        target.parent.mkdir(exist_ok=True)
        os.rename(source, target)


def _older(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False
