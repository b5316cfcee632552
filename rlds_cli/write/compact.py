"""Merging a growing dataset's segments: ``rlds compact``, and the small merges a writer makes as it
goes.

**rlds compact** makes the dataset read as fast as a converted one. It takes the dataset's
compaction lock (one at a time), opens a view, and for every run of consecutive segments of one kind
(protected or not) with more than one segment, or with evicted episodes still on disk, writes one
segment holding their live episodes, in order:

1. ``mkdir building/<id>.<pid>``; write the columns (read from the view, each input checked against
   its digests), the episode index and ``manifest.json``;
2. ``rename`` it to ``segments/<id>``; fsync together its files, its folders and ``segments/``
   (sealed as a writer's segment is: :mod:`rlds_cli.write.segments`);
3. append a ``COMPACT`` record ("segments A..B replaced by C") and fsync the log;
4. remove the files of segments retired more than the grace period ago (:func:`collect`).

Readers of older views keep reading the old segments (kept for the grace period); a refresh moves
them to the compacted one. Writers keep appending meanwhile: their segments come after the run in
the log, and evictions count logical episodes, which a compaction keeps.

**As a writer goes.** Small commits are merged so that a dataset of many small commits stays a few
segments (it opens, reads and takes disk like the same data in a few commits). After each commit a
writer looks at the segments of its view (no file opened). Where :data:`MERGE_FANIN` consecutive
live segments share a kind and a merge generation and together hold at most :func:`merge_cap` steps,
it merges the oldest :data:`MERGE_FANIN` of that run into one segment of the next generation: the
verified copy ``rlds compact`` makes (:func:`merge_run`), committed by a ``COMPACT`` record. Commits
are generation 0, so the segments form a base-``MERGE_FANIN`` counter: every step is copied about
``log(commits) / log(MERGE_FANIN)`` times, and a view holds at most about ``MERGE_FANIN`` segments
per generation (10**5 one-episode commits: 3 copies, under 60 segments). Segments of
``rlds compact`` are never merged again by a writer.

One merge at a time: a writer takes the compaction lock without waiting and skips the merge where
another writer or ``rlds compact`` holds it (its next commit looks again); under the lock the plan
is made again on a fresh view. Generations never rise from one segment to the next (a kind's
segments go from the oldest, highest generation to the newest), and a merge keeps it so: it takes
the oldest of its generation's run, so its segment lands right after the run of the next generation
and what others commit meanwhile comes after it. So no segment is ever left, unmerged for good,
between two of a higher generation. A merge that completes a generation's run is followed by the
merge of that run (a carry). Merged segments are retired like compacted ones: their files stay for
the grace period, then the writers' collection removes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli import settings
from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli.cache import commit_log, digest, log_checkpoint
from rlds_cli.cache.backends import Backend, get_backend
from rlds_cli.cache.backends.base import key_path
from rlds_cli.cache.backends.frames import FramesColumnWriter, column_writer, open_frames
from rlds_cli.cache.backends.memmap import NpyConcatenation, NpySource
from rlds_cli.cache.commit_log import (
    COMPACT,
    FINAL_GENERATION,
    Record,
    SegmentEntry,
    new_segment_id,
    seg_name,
    unnamed,
)
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.growing import GrowingDataset, grace_problem, growing_settings
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    COMPACT_LOCK_SUFFIX,
    COMPACT_WANTED_SUFFIX,
    SEGMENTED_LAYOUT,
    SEGMENTS_DIR,
    entry_name,
)
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import (
    CacheError,
    CorruptDatasetError,
    DatasetReplacedError,
    LockTimeoutError,
    SchemaMismatchError,
    SettingError,
)
from rlds_cli.write.segments import building_segment, collect, leftovers, seal_segment, writer_identity

__all__ = [
    "MERGE_FANIN",
    "CompactReport",
    "SmallSegmentMerger",
    "compact",
    "compaction_lock",
    "merge_cap",
    "merge_plan",
    "merge_run",
    "remove_retired",
    "try_compaction_lock",
]

#: Segments merged at once (and the most of one generation a view holds, less one).
MERGE_FANIN = 16
#: Plans a writer's merge makes when an input was removed meanwhile by another writer.
MERGE_ATTEMPTS = 5
#: A merged segment holds at most this many bytes (all columns): merging is for segments whose
#: per-file costs (a folder, a manifest, a file a key: a few KiB and opens each) are a large share
#: of them; a copy of larger ones (camera frames) would cost a writer its commits' disk time again ...
MERGE_MAX_BYTES = 32 << 20
#: ... and at most this share of a dataset's capacity: a partly evicted merged segment keeps its
#: evicted rows on disk until evicted whole (or compacted), so this bounds them to 1/8 of it.
MERGE_CAPACITY_SHARE = 8


def merge_cap(head: Manifest, capacity: int | None) -> int:
    """The most steps a writer's merge may put in one segment of the dataset ``head``."""
    row_bytes = sum(spec.row_bytes for spec in head.fields.values())
    cap = MERGE_MAX_BYTES // max(row_bytes, 1)
    if capacity is not None:
        cap = min(cap, capacity // MERGE_CAPACITY_SHARE)
    return cap


def merge_plan(
    live: list[tuple[SegmentEntry, int]], cap: int, order: dict[bytes, int] | None = None
) -> list[tuple[SegmentEntry, int]] | None:
    """The segments of ``live`` (a view's live segments, in log order) due for a merge, else
    ``None``: the oldest :data:`MERGE_FANIN` of the newest run of consecutive segments of one kind
    and generation that holds at least that many, where together they hold at most ``cap`` steps.
    ``order``: each segment's position in the log, where runs must be consecutive too (a merge
    records a range of the log: protected segments made neighbours by the eviction of the
    unprotected ones between them were merged into a record the log calls damage); ``None``: a
    first guess from a writer's state, made again under the lock."""
    end = len(live)
    while end >= MERGE_FANIN:
        last = live[end - 1][0]
        start = end - 1
        while start > 0 and (live[start - 1][0].protected, live[start - 1][0].generation) == (
            last.protected,
            last.generation,
        ):
            if order is not None and order[live[start - 1][0].seg] + 1 != order[live[start][0].seg]:
                break
            start -= 1
        run = live[start : start + MERGE_FANIN]
        if (
            end - start >= MERGE_FANIN
            and last.generation < FINAL_GENERATION
            and sum(entry.steps for entry, _ in run) <= cap
        ):
            return run
        end = start
    return None


class SmallSegmentMerger:
    """A writer's merges of its dataset's small segments (see the module docstring).

    Args:
        directory: The growing dataset's folder.
        try_lock: Takes the dataset's compaction lock without waiting: the lock held (to
            ``release()``), or ``None`` where someone else holds it.
        fsync: Make the merged segment durable before its record.
    """

    def __init__(self, directory: Path, try_lock: Callable[[], Any | None], *, fsync: bool) -> None:
        self.directory = directory
        self._try_lock = try_lock
        self.fsync = fsync
        self._view: GrowingDataset | None = None
        #: Merges this writer made.
        self.merges = 0
        #: Why this writer merges no more: a damaged segment found in a merge's input (raised
        #: once, by the merge that found it; the dataset's commits go on, unmerged).
        self.damage: CorruptDatasetError | None = None

    def after_commit(
        self, live: list[tuple[SegmentEntry, int]], head: Manifest, capacity: int | None
    ) -> bool:
        """Merge where :func:`merge_plan` says so for ``live`` (the writer's view after its commit),
        then any run that merge completes, and so on; returns whether a merge was committed. The
        plan is made again on a view read under the lock (another merge may have taken the
        segments). Segments retired and removed by other writers while it reads (grace_seconds=0)
        make it plan again, and after :data:`MERGE_ATTEMPTS` leave the merge to a later commit: a
        merge is an economy, never a reason for a commit to fail."""
        cap = merge_cap(head, capacity)
        if self.damage is not None or merge_plan(live, cap) is None:
            return False
        lock = self._try_lock()
        if lock is None:
            return False
        merged, raced = False, 0
        try:
            view = self._fresh_view()
            while (run := merge_plan(view.live_segments(), cap, view.log_order())) is not None:
                try:
                    merge_run(view, run, generation=run[0][0].generation + 1, fsync=self.fsync)
                except (DatasetReplacedError, CorruptDatasetError, FileNotFoundError) as exc:
                    gone = _gone_inputs(view, [e.seg for e, _ in run])
                    damage = [err for err in gone if not isinstance(err, DatasetReplacedError)]
                    if damage or (not gone and not isinstance(exc, DatasetReplacedError)):
                        raise (
                            damage[0] if damage else exc
                        ) from None  # an input damaged, or missing but live
                    raced += 1  # an input retired and removed meanwhile (a zarr read named it missing)
                    if raced == MERGE_ATTEMPTS:
                        break
                    view = self._fresh_view()
                    continue
                self.merges += 1
                merged = True
                view = self._fresh_view()
        except DatasetReplacedError:  # the view kept losing segments while it was read
            self._view = None
        except CorruptDatasetError as exc:
            self.damage = exc
            raise
        finally:
            lock.release()
        return merged

    def _fresh_view(self) -> GrowingDataset:
        """The dataset's view at the log's end (opened once, then followed; the view itself reads
        the log again when a segment of it is removed while it is made: grace_seconds=0)."""
        if self._view is None:
            self._view = GrowingDataset(self.directory)
        else:
            self._view.refresh()
        return self._view


@dataclass
class CompactReport:
    """What :func:`compact` did."""

    name: str
    segments_before: int
    segments_after: int
    merged_runs: int
    episodes: int
    steps: int
    removed: list[str] = field(default_factory=list)
    #: Runs still worth merging at the end: writers appended meanwhile, or evicted inputs under
    #: each of :data:`MERGE_ATTEMPTS` plans (grace_seconds=0). Another compaction merges them.
    runs_left: int = 0

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


def compact(
    name: str,
    root: CacheRoot | str | os.PathLike[str] | None = None,
    *,
    grace_seconds: float | None = None,
    lock_timeout: float = -1,
) -> CompactReport:
    """Merge the segments of the growing dataset ``name`` (see the module docstring).

    Args:
        name: A growing dataset (written by :class:`rlds_cli.DatasetWriter`).
        root: Cache root.
        grace_seconds: Keep retired segments' files this long for readers of older views
            (``None``: the dataset's setting; ``0``: remove them now: readers that do not
            refresh first get :class:`~rlds_cli.errors.DatasetReplacedError`).
        lock_timeout: Seconds to wait for a compaction already running (``-1``: forever).

    Returns:
        A :class:`CompactReport`.
    """
    from rlds_cli.cache.opening import open_dataset

    # a negative or NaN grace would remove files readers of older views still read
    problem = grace_problem(grace_seconds) if grace_seconds is not None else None
    if problem is not None:
        raise SettingError(
            problem, hint="0 removes the merged segments' files now; leave it out for the dataset's own"
        )
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    ds = open_dataset(name, cache)
    if not isinstance(ds, GrowingDataset):
        raise _not_growing(name, "nothing to compact")
    lock = compaction_lock(cache, ds.name, lock_timeout)
    try:
        ds.refresh()  # the view as of the lock: no other compaction can move it now
        return _compact_locked(ds, grace_seconds)
    finally:
        lock.release()


def remove_retired(
    name: str, root: CacheRoot | str | os.PathLike[str] | None = None, *, dry_run: bool = False
) -> list[Path]:
    """Remove the segments of the growing dataset ``name`` that its commit log retired (evicted
    whole, or compacted away) longer ago than its grace period, merging nothing: what ``rlds gc``
    does for every growing dataset, for those whose writers have stopped (writers remove a few after
    each commit, :func:`compact` every one).

    Only what the log says is retired goes. :func:`compact` also removes what a killed writer left:
    builds (named by the writer's pid alone, which a writer in another container can share) and
    segments the log does not name (see :func:`~rlds_cli.write.segments.leftovers`).

    Args:
        name: A growing dataset (written by :class:`rlds_cli.DatasetWriter`).
        root: Cache root.
        dry_run: Only say what would be removed.

    Returns:
        The segment folders removed (or that would be). While a compaction of the dataset runs, none
            (the compaction removes them when it ends).
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    # the head manifest and the log, not a view: a view opens every live segment (slow for
    # thousands), and a damaged live segment would keep the retired ones forever
    head = cache.manifest(name)
    if head.layout != SEGMENTED_LAYOUT:
        raise _not_growing(name, "it has no retired segments")
    directory = cache.dataset_dir(name)
    grace = growing_settings(head)["grace_seconds"]
    segments = directory / SEGMENTS_DIR
    try:
        lock = compaction_lock(cache, head.name, 0)
    except LockTimeoutError:
        return []
    try:
        state = log_checkpoint.verify_log(directory)  # the whole log: removal trusts no checkpoint
        if dry_run:
            # the log names every segment it ever retired; most are gone already
            due = leftovers(directory, state, grace).segments
            return [segments / seg for seg in due if (segments / seg).is_dir()]
        return [segments / seg for seg in collect(directory, state, grace)]
    finally:
        lock.release()


def _not_growing(name: str, what: str) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"dataset {name!r} is not a growing dataset: {what}",
        hint="only datasets written with DatasetWriter have segments to merge or remove",
    )


def compaction_lock(cache: CacheRoot, name: str, timeout: float) -> FileLock:
    """The dataset's compaction lock, held (one compaction, collection or writer's merge at a time);
    :class:`~rlds_cli.errors.LockTimeoutError` after ``timeout`` seconds.

    While it waits, it holds the dataset's *compaction-wanted* lock, which writers check first
    (:func:`try_compaction_lock`): writers merging small segments at hundreds of commits a second
    hold the lock most of the time, and a compaction that only polled was starved (no round in 15
    minutes under 4 writers).
    """
    try:  # in locks/, not in the dataset: a new file there would change the directory's identity
        with FileLock(_lock_path(cache, name, COMPACT_WANTED_SUFFIX), timeout=timeout):
            lock = FileLock(_lock_path(cache, name, COMPACT_LOCK_SUFFIX), timeout=timeout).acquire()
    except Timeout:
        raise LockTimeoutError(f"dataset {name!r} is being compacted by another process") from None
    return lock


def try_compaction_lock(cache: CacheRoot, name: str) -> FileLock | None:
    """The dataset's compaction lock, held, or ``None`` where another process holds it or a
    compaction waits for it (for a writer's merge, which never waits and gives way to a compaction)."""
    try:
        with FileLock(_lock_path(cache, name, COMPACT_WANTED_SUFFIX), timeout=0):
            pass  # nobody waits for the lock
        lock = FileLock(_lock_path(cache, name, COMPACT_LOCK_SUFFIX), timeout=0).acquire()
    except Timeout:
        return None
    return lock


def _lock_path(cache: CacheRoot, name: str, suffix: str) -> Path:
    return cache.layout.lock_file(entry_name(name) + suffix)


def _runs(ds: GrowingDataset) -> list[list[tuple[SegmentEntry, int]]]:
    """Runs of consecutive live segments of one kind worth merging: more than one segment, or
    one whose files still hold evicted episodes."""
    live = ds.live_segments()
    order = ds.log_order()
    runs: list[list[tuple[SegmentEntry, int]]] = []
    for entry, first in live:
        run = runs[-1] if runs else None
        if (
            run is not None
            and run[-1][0].protected == entry.protected
            and order[entry.seg] == order[run[-1][0].seg] + 1
        ):
            run.append((entry, first))
        else:
            runs.append([(entry, first)])
    return [r for r in runs if len(r) > 1 or r[0][1] > 0]


def _compact_locked(ds: GrowingDataset, grace_seconds: float | None) -> CompactReport:
    fsync = settings.fsync_enabled()
    # the whole log, not the checkpoint's view: damage before the checkpoint stops the compaction
    # (nothing merged, nothing removed)
    state = log_checkpoint.verify_log(ds.directory)
    _, why = unnamed(ds.directory, state)
    if why is not None:  # merged, the log's lost segments could never be named again
        raise CorruptDatasetError(
            f"compaction of {ds.name!r} stopped before merging anything: {why}",
            hint=commit_log.damage_hint(ds.directory),
        )
    before = len(ds.live_segments())
    merged = 0
    for _ in range(MERGE_ATTEMPTS):
        try:
            for run in _runs(ds):
                merge_run(ds, run, generation=FINAL_GENERATION, fsync=fsync)
                merged += 1
            break
        except DatasetReplacedError:  # a writer evicted an input and removed it (grace 0): plan again
            ds.refresh()
    ds.refresh()
    problem = _live_damage(ds)
    if problem is not None:  # the segments merged above were checked; nothing is removed
        raise CorruptDatasetError(
            f"compaction of {ds.name!r} merged {merged} run(s), then stopped: {problem}",
            hint=commit_log.segment_damage_hint(ds.name),
        )
    grace = ds.settings["grace_seconds"] if grace_seconds is None else grace_seconds
    removed = collect(ds.directory, ds.state, grace, builds=True, unreferenced=True)
    return CompactReport(
        ds.name,
        before,
        len(ds.live_segments()),
        merged,
        ds.num_episodes,
        ds.num_steps,
        removed,
        runs_left=len(_runs(ds)),
    )


def _live_damage(ds: GrowingDataset) -> str | None:
    """The first problem of a live segment's files (sizes, zarr group metadata: what a merge
    checks of its inputs); a segment a writer evicted meanwhile is no damage."""

    def check(segment: Dataset) -> list[str]:
        try:
            return segment.check_files()
        except CacheError as exc:  # missing, or not the dataset's schema
            return [str(exc)]

    for segment, problems in ds.check_segments(check, list):
        if problems:
            return f"segment {segment.directory.name}: {problems[0]}"
    return None


def merge_run(
    ds: GrowingDataset, run: list[tuple[SegmentEntry, int]], *, generation: int, fsync: bool
) -> None:
    """Write the live episodes of ``run`` (consecutive live segments of one kind, as
    :meth:`GrowingDataset.live_segments` gives them) as one segment of merge ``generation`` and
    commit it (steps 1-3 of the module docstring). The fully evicted segments of the same kind right
    before the run are dropped with it.

    Each input is checked as it is read, as ``inspect --check`` checks it: its episode index and
    every column, whole (evicted rows too), against its manifest's digests. A damaged input raises
    :class:`~rlds_cli.errors.CorruptDatasetError` before the record: the build is removed and the
    segments it would have replaced stay. The caller holds the dataset's compaction lock.
    """
    backend = get_backend(ds.head.backend)
    segments = ds.log_segments
    live = {s.seg for s, _ in ds.live_segments()}
    i = next(k for k, s in enumerate(segments) if s.seg == run[0][0].seg)
    kind = run[0][0].protected
    while i > 0 and segments[i - 1].protected == kind and segments[i - 1].seg not in live:
        i -= 1
    first = segments[i].seg
    seg = new_segment_id()
    with building_segment(ds.directory, seg, fsync=fsync) as build:
        parts = [(ds.segment(entry.seg), skip) for entry, skip in run]
        for part, _ in parts:
            problems = part.check_files()  # every file at full size, zarr's group metadata too
            if problems:
                raise _damaged_input(ds, part.directory, problems[0])
            recorded = part.manifest.content_digest.get("episodes")
            algorithm = _input_algorithm(ds, part)
            if recorded is None or digest.array_digest(part.episode_index, algorithm) != recorded:
                raise _damaged_input(ds, part.directory, "its episode index does not match its digest")
        hashes: dict[str, str] = {}
        checker = digest.BlockHasher()  # the inputs' digests, beside the copy and the output's
        try:
            for key, spec in ds.head.fields.items():
                if backend.name == "memmap" and spec.frame_format is None and digest.canonical(spec.dtype):
                    hasher: Any = digest.ColumnHasher(spec.dtype)  # stored bytes copied and hashed as read
                    _concatenate_checked(ds, build, parts, key, hasher).close(fsync=False)
                    hashes[key] = hasher.hexdigest()
                    continue
                column = column_writer(backend, build, spec, encodes=False, checks=False)  # checked by digest
                try:
                    if isinstance(column, FramesColumnWriter):  # its bytes copied, never re-encoded
                        for part, skip in parts:
                            _copy_frames_checked(ds, part, skip, key, column)
                        hasher = column.hasher
                    else:
                        hasher = digest.ColumnHasher(spec.dtype)
                        for part, skip in parts:
                            _copy_checked(ds, part, skip, key, column, hasher, backend, checker, fsync)
                except BaseException:
                    column.abort()  # a damaged input: the build is removed, its writer released
                    raise
                column.close(fsync=False)
                hashes[key] = hasher.hexdigest()
        finally:
            checker.close()
        lengths = np.concatenate([part.episode_index["length"][skip:] for part, skip in parts])
        lengths = lengths.astype(np.int64)
        writer = {**writer_identity(), "compacted": len(run)}
        seal_segment(build, ds.head, backend, lengths, hashes, writer)
    record = Record(
        COMPACT,
        seg,
        first=first,
        last=run[-1][0].seg,
        episodes=len(lengths),
        steps=int(lengths.sum()),
        count=generation,
    )
    commit_log.append(ds.directory / COMMIT_LOG_FILE, record, fsync=fsync)
    commit_log.mark_committed(ds.directory / SEGMENTS_DIR / seg_name(seg))


#: Bytes copied at a time (at least one row): bounded memory on large runs.
_BLOCK_BYTES = 8 << 20
#: Frames copied at a time (a frame is kilobytes, not a row's bytes).
_FRAME_BLOCK_ROWS = 1024


def _copy_checked(
    ds: GrowingDataset,
    part: Any,
    skip: int,
    key: str,
    out: Any,
    hasher: Any,
    backend: Backend,
    checker: digest.BlockHasher,
    fsync: bool,
) -> None:
    """Append the live rows of ``key`` in segment ``part`` (its episodes from ``skip`` on) to
    ``out``, hashed into ``hasher``, reading the whole column once to check it against the segment's
    recorded digest.

    The path of columns :func:`_concatenate_checked` does not copy (zarr; byte orders other than
    little-endian). Each block is read into memory of its own and checked on ``checker``'s thread
    while this one writes and hashes it, and with ``fsync`` the output is synced behind the copy.
    """
    spec = ds.head.fields[key]
    start, stop = _live_rows(ds, part, skip, key)
    # opened for this copy only: a map per segment kept open would hold a descriptor each
    col = backend.open_column(part.directory, key)
    _check_stored(ds, part, key, col.dtype, tuple(col.shape), stop)
    check = digest.ColumnHasher(spec.dtype, _input_algorithm(ds, part))
    row_bytes = max(1, int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize)
    step = max(1, _BLOCK_BYTES // row_bytes)
    for lo in range(0, stop, step):
        hi = min(stop, lo + step)
        rows = col[lo:hi]
        rows = np.array(rows) if isinstance(rows, np.memmap) else np.asarray(rows)
        checked = checker.start([(check, rows)])
        try:
            if hi > start:
                live = rows[max(start - lo, 0) :]
                out.append(live)
                hasher.update(live)
                if fsync:
                    out.write_behind()
        finally:
            checked()  # the rows are the checker's until it is done with them
    del col
    if check.hexdigest() != _recorded_digest(part, key):
        raise _damaged_input(ds, part.directory, f"array {key!r} does not match its digest (content changed)")


def _concatenate_checked(
    ds: GrowingDataset, build: Path, parts: list[tuple[Any, int]], key: str, hasher: digest.ColumnHasher
) -> NpyConcatenation:
    """The live rows of ``key`` in ``parts`` (segments and their first live episodes) written to
    the file of ``key`` in ``build`` by one :class:`NpyConcatenation`, hashed into ``hasher``;
    each input's whole column is read once and checked against its recorded digest on the way.
    Returns the concatenation to close; on an error it is aborted (the caller removes the build)."""
    spec = ds.head.fields[key]
    ranges = [_live_rows(ds, part, skip, key) for part, skip in parts]
    rows = sum(stop - start for start, stop in ranges)
    out = NpyConcatenation(key_path(build, key, ".npy"), np.dtype(spec.dtype), spec.shape, rows)
    try:
        for (part, _), (start, stop) in zip(parts, ranges, strict=True):
            path = key_path(part.directory, key, ".npy")
            try:
                source = NpySource(path)
            except FileNotFoundError:
                raise _damaged_input(ds, part.directory, f"array file {path} is missing") from None
            except CorruptDatasetError as exc:
                raise _damaged_input(ds, part.directory, exc.message) from None
            with source:
                _check_stored(ds, part, key, source.dtype, source.shape, stop)
                check = digest.ColumnHasher(spec.dtype, _input_algorithm(ds, part))
                try:
                    out.copy(source, start, stop, check.update_bytes, hasher.update_bytes)
                except CorruptDatasetError as exc:
                    raise _damaged_input(ds, part.directory, exc.message) from None
            if check.hexdigest() != _recorded_digest(part, key):
                raise _damaged_input(
                    ds, part.directory, f"array {key!r} does not match its digest (content changed)"
                )
    except BaseException:
        out.abort()
        raise
    return out


def _check_stored(
    ds: GrowingDataset, part: Any, key: str, dtype: np.dtype, shape: tuple[int, ...], rows: int
) -> None:
    """Raise where the stored array of ``key`` in segment ``part`` is not of the dataset's dtype
    and row shape with ``rows`` rows (a segment is the truth for its data, never cast)."""
    spec = ds.head.fields[key]
    if shape != (rows, *spec.shape) or np.dtype(dtype) != np.dtype(spec.dtype):
        expected = f"{spec.dtype} {(rows, *spec.shape)}"
        raise _damaged_input(ds, part.directory, f"array {key!r} is {dtype} {shape}, expected {expected}")


def _live_rows(ds: GrowingDataset, part: Any, skip: int, key: str) -> tuple[int, int]:
    """``(first live row, rows)`` of stored column ``key`` in segment ``part`` whose episodes
    from ``skip`` on are live."""
    flat = ds.head.fields[key].storage == "flat"
    step0 = int(part.episode_index["start"][skip])
    return (step0 + skip if flat else step0), part.num_steps + (part.num_episodes if flat else 0)


def _copy_frames_checked(ds: GrowingDataset, part: Any, skip: int, key: str, out: FramesColumnWriter) -> None:
    """Append the live frames of ``key`` in segment ``part`` to ``out`` as stored, after checking
    the whole column (files, offsets, digest) against what the segment recorded."""
    spec = ds.head.fields[key]
    fmt = spec.frame_format
    assert fmt is not None
    start, stop = _live_rows(ds, part, skip, key)
    try:
        col = open_frames(part.directory, key, fmt, repr(key))
    except CorruptDatasetError as exc:
        raise _damaged_input(ds, part.directory, exc.message) from None
    if len(col) != stop:
        raise _damaged_input(ds, part.directory, f"frames {key!r} hold {len(col)} rows, expected {stop}")
    if col.content_digest(_input_algorithm(ds, part)) != _recorded_digest(part, key):
        raise _damaged_input(
            ds, part.directory, f"frames {key!r} do not match their digest (content changed)"
        )
    for lo in range(start, stop, _FRAME_BLOCK_ROWS):
        out.append(col.encoded(lo, min(stop, lo + _FRAME_BLOCK_ROWS)))


def _recorded_digest(part: Any, key: str) -> Any:
    """The digest segment ``part``'s manifest records of column ``key`` (``None``: none)."""
    return part.manifest.content_digest.get("columns", {}).get(key)


def _input_algorithm(ds: GrowingDataset, part: Any) -> str:
    """The digest algorithm segment ``part`` recorded (an older segment's sha256 is checked as
    such; the merged output gets :data:`rlds_cli.cache.digest.ALGORITHM`)."""
    try:
        return digest.recorded_algorithm(part.manifest.content_digest)
    except ValueError as exc:
        raise _damaged_input(ds, part.directory, str(exc)) from None


def _gone_inputs(ds: GrowingDataset, segs: list[bytes]) -> list[CacheError]:
    """For each of the segments ``segs`` whose folder is gone, why (:meth:`GrowingDataset.removal_error`:
    retired and removed since the view, or missing while the log holds it live)."""
    return [
        ds.removal_error(seg) for seg in segs if not (ds.directory / SEGMENTS_DIR / seg_name(seg)).is_dir()
    ]


def _damaged_input(ds: GrowingDataset, directory: Path, problem: str) -> CacheError:
    """The error for an input segment of a merge found wanting: damage, or
    :class:`DatasetReplacedError` when another writer retired and removed it (moved out whole)
    while it was read (``grace_seconds=0``)."""
    gone = _gone_inputs(ds, [bytes.fromhex(directory.name)])
    if gone and isinstance(gone[0], DatasetReplacedError):
        return gone[0]
    return CorruptDatasetError(
        f"compaction of {ds.name!r} stopped: segment {directory.name}: {problem}",
        hint=f"nothing of it was merged or removed; 'rlds inspect {ds.name} --check' lists the damage",
    )
