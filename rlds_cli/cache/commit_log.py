"""The commit log of a growing (``segmented``) dataset: what readers follow, writers append.

A growing dataset is a directory with a head manifest (``layout: "segmented"``: schema and
settings), sealed *segments* (each a small complete TED dataset under ``segments/<id>/``) and
this log, ``commits.log``: fixed-size records of :data:`RECORD_SIZE` bytes, each with a crc32 of
its own bytes, appended with ``O_APPEND`` by several writer processes under the log's lock
(:func:`append`). Readers follow it with ``fstat`` and a read of the new bytes.

A machine crash can leave torn records at the log's end: the start of a record, then zeros
(:func:`looks_torn`). The next append vouches for them with a ``RECOVER`` record. A torn-looking
slot is accepted only at the log's end or right before the ``RECOVER`` record that counts it;
any other failed check, or a valid record that breaks the log's rules (:meth:`LogState.apply`),
is damage. Damage is never skipped: :meth:`LogState.follow` raises
:class:`~rlds_cli.errors.CorruptDatasetError` naming the log and the record.

Records (``kind``):

* ``ADD`` segment ``seg`` with ``episodes`` episodes and ``steps`` steps (flag bit 0: protected,
  never evicted);
* ``EVICT``: the first ``count`` unprotected episodes (in log order) are evicted. The count is
  absolute (two writers write the same record); a view takes the largest seen;
* ``COMPACT``: the live segments from ``first`` to ``last`` (consecutive in the view) are
  replaced by ``seg``, which holds their episodes but the first ``dropped`` (evicted ones that
  the compaction did not copy); ``count`` is ``seg``'s merge generation (see
  :attr:`SegmentEntry.generation`);
* ``RECOVER``: the ``count`` slots right before it are a crash's torn records (see above).

A reader's view is always a prefix of the log, so a consistent set of whole episodes.
:class:`LogState` is that view without segment files (:mod:`rlds_cli.cache.growing` opens them).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
import uuid
import zlib
from collections import Counter
from collections.abc import ItemsView, Iterable, Iterator, MutableMapping, ValuesView
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.locks import lock_fd, lock_fd_within, pid_alive, unlock_fd
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    COMMITTED_FILE,
    MANIFEST_FILE,
    SEGMENT_BUILDS_DIR,
    segment_folders,
)
from rlds_cli.cache.manifest import manifest_json
from rlds_cli.errors import CorruptDatasetError

MAGIC = b"RLG1"
ADD, EVICT, COMPACT, RECOVER = 1, 2, 3, 4
_KIND_NAMES = {ADD: "ADD", EVICT: "EVICT", COMPACT: "COMPACT", RECOVER: "RECOVER"}
PROTECTED = 1
#: The merge generation of an ``rlds compact`` segment: writers merge none of them.
FINAL_GENERATION = 1 << 16
#: magic, kind, flags, seg, first, last, episodes, steps, count, time (float64), pad, crc32
_FORMAT = "<4sBB2x16s16s16sqqqd4xI"
RECORD_SIZE = struct.calcsize(_FORMAT)
_NO_ID = b"\0" * 16


def new_segment_id() -> bytes:
    """A fresh segment id (16 random bytes; its hex is the segment's directory name)."""
    return uuid.uuid4().bytes


def seg_name(seg: bytes) -> str:
    """A segment's directory name."""
    return seg.hex()


@dataclass(frozen=True)
class Record:
    """One commit-log record (see the module docstring for the kinds)."""

    kind: int
    seg: bytes = _NO_ID
    first: bytes = _NO_ID
    last: bytes = _NO_ID
    episodes: int = 0
    steps: int = 0
    count: int = 0
    flags: int = 0
    time: float = 0.0

    def pack(self) -> bytes:
        body = struct.pack(
            _FORMAT,
            MAGIC,
            self.kind,
            self.flags,
            self.seg,
            self.first,
            self.last,
            self.episodes,
            self.steps,
            self.count,
            self.time or time.time(),
            0,
        )[:-4]
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes) -> Record | None:
        """The record in ``data`` (``RECORD_SIZE`` bytes), or ``None`` where its check fails. An
        unknown kind passes here; :meth:`LogState.apply` calls it damage."""
        if data[:4] != MAGIC or struct.unpack("<I", data[-4:])[0] != zlib.crc32(data[:-4]):
            return None
        _, kind, flags, seg, first, last, episodes, steps, count, t, _ = struct.unpack(_FORMAT, data)
        return cls(kind, seg, first, last, episodes, steps, count, flags, t)


def append(path: Path, record: Record, *, fsync: bool) -> None:
    """Append one record to the log at ``path`` with a single ``O_APPEND`` write.

    A killed process leaves no torn record; only a machine crash can. Where the log ends in torn
    records (:func:`tail_recovery`), the same write first pads them to whole slots and adds a
    ``RECOVER`` record. An exclusive lock is held from reading the size to the write (not through
    the fsync, so fsyncs overlap): unlocked, a half-copied page-straddling record made another
    writer pad needlessly and lose its commit (4 processes x 20,000 appends lost 80-200)."""
    data = record.pack()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
    try:
        lock_fd(fd)  # none on Windows: appends race with each other there
        try:
            data = tail_recovery(fd) + data
            written = os.write(fd, data)
            if written != len(data):  # pragma: no cover - a regular file takes a small write whole
                raise OSError(f"short write to {path}")
        finally:
            # unlock, not only close: a child forked meanwhile would hold the lock while it lives
            unlock_fd(fd)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def tail_recovery(fd: int) -> bytes:
    """The bytes an append to the log at ``fd`` (read-write, locked) writes before its record.

    Nothing after a valid last record; after up to :data:`MAX_TORN_RECORDS` torn slots (a partial
    last slot counts as one), zero padding and a ``RECOVER`` record counting them. Other failed
    slots are damage: only the padding, so readers report them."""
    size = os.fstat(fd).st_size
    whole = size - size % RECORD_SIZE
    pad = b"\0" * (-size % RECORD_SIZE)
    torn = [os.pread(fd, size - whole, whole) + pad] if pad else []
    at = whole
    while at > 0 and len(torn) <= MAX_TORN_RECORDS:
        slot = os.pread(fd, RECORD_SIZE, at - RECORD_SIZE)
        if Record.unpack(slot) is not None:
            break
        torn.append(slot)
        at -= RECORD_SIZE
    if not torn or len(torn) > MAX_TORN_RECORDS or not all(map(looks_torn, torn)):
        return pad
    return pad + Record(RECOVER, count=len(torn)).pack()


#: Seconds a reader waits for the log's lock to judge a partial tail (an append holds it for
#: microseconds; a writer stopped mid-append, e.g. by SIGSTOP, could hold it for ever).
TAIL_LOCK_SECONDS = 5.0


def partial_tail_damage(fd: int, wait: float = TAIL_LOCK_SECONDS) -> str | None:
    """What the bytes past the log's last whole record are, if not what a crash leaves (the start
    of a record, then zeros): ``None`` for none, or a crash's. Read under the log's lock, so no
    append is half-copied (a reader can see a record's first page before the rest).

    Raises:
        TimeoutError: The lock stayed held for ``wait`` seconds: not judged now (the whole
            records before the tail read as they are).
    """
    try:
        locked = lock_fd_within(fd, wait)
    except OSError:  # an exclusive lock of a read-only file where flock is emulated (NFS)
        locked = None
    if locked is False:
        raise TimeoutError("the commit log's lock stayed held")
    try:
        size = os.fstat(fd).st_size
        part = size % RECORD_SIZE
        if not part:
            return None
        slot = os.pread(fd, part, size - part) + b"\0" * (RECORD_SIZE - part)
    finally:
        if locked:
            unlock_fd(fd)
    if looks_torn(slot):
        return None
    return (
        f"it ends in {part} bytes (from byte {size - part}) that are not a whole record, and a crash "
        "leaves the start of a record then zeros"
    )


def has_added(path: Path, seg: bytes) -> bool:
    """Whether the log at ``path`` holds an ``ADD`` record of ``seg`` (reads the whole log; tells
    a committed segment from a leftover after a failed commit)."""
    with open(path, "rb") as fh:
        data = fh.read()
    for off in range(0, len(data) - RECORD_SIZE + 1, RECORD_SIZE):
        rec = Record.unpack(data[off : off + RECORD_SIZE])
        if rec is not None and rec.kind == ADD and rec.seg == seg:
            return True
    return False


@dataclass
class SegmentEntry:
    """One segment of a view.

    ``episodes``: its logical episode count (evicted ones included); ``dropped``: how many of
    those first episodes its files do not hold (left out by a compaction). ``ordinal``: logical
    episodes added before it, so its episode ``k`` is the log's episode ``ordinal + k``; no
    refresh, eviction or compaction changes it. ``generation``: 0 for a writer's commit, else
    its ``COMPACT`` record's count (a writer's merge: one more than those merged; ``rlds
    compact``: :data:`FINAL_GENERATION`, never merged again)."""

    seg: bytes
    protected: bool
    episodes: int
    steps: int
    dropped: int = 0
    added_at: float = 0.0
    ordinal: int = 0
    generation: int = 0


#: No segment id: the names of a view replayed from the log's first record.
NO_IDS = np.zeros(0, "S16")


class RetiredSegments(MutableMapping[bytes, float]):
    """Segments a view retired (evicted whole or compacted away) -> when, in retirement order.

    Entries loaded from the log checkpoint (:mod:`rlds_cli.cache.log_checkpoint`) stay arrays
    until first read or removal (building 100,000 takes ~40 ms)."""

    def __init__(
        self,
        entries: Iterable[tuple[bytes, float]] = (),
        *,
        sorted_ids: np.ndarray = NO_IDS,
        order: np.ndarray | None = None,
        times: np.ndarray | None = None,
    ) -> None:
        #: The checkpoint's ids, sorted (S16), with ``sorted_ids[order]`` in retirement order
        #: and ``times`` in that order too.
        self.sorted_ids = sorted_ids
        self._order, self._times = order, times
        self._later: dict[bytes, float] = dict(entries)
        self._loaded: dict[bytes, float] | None = None if len(sorted_ids) else self._later

    def _entries(self) -> dict[bytes, float]:
        if self._loaded is None:
            assert self._order is not None and self._times is not None
            ids = self.sorted_ids.view("V16")[self._order].tolist()  # V16: bytes, trailing zeros kept
            loaded = dict(zip(ids, self._times.tolist(), strict=True))
            for seg, when in self._later.items():
                loaded.setdefault(seg, when)
            self._loaded = self._later = loaded
        return self._loaded

    def __getitem__(self, seg: bytes) -> float:
        return self._entries()[seg]

    def __setitem__(self, seg: bytes, when: float) -> None:
        self._entries()[seg] = when

    def __delitem__(self, seg: bytes) -> None:
        del self._entries()[seg]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._entries())

    # the dict's own views, not the mixins' (a Python call per key; walked at every commit)
    def items(self) -> ItemsView[bytes, float]:
        return self._entries().items()

    def values(self) -> ValuesView[float]:
        return self._entries().values()

    def __contains__(self, seg: object) -> bool:
        return seg in self._entries()

    def pop(self, seg: bytes, *default: Any) -> Any:
        return self._entries().pop(seg, *default)

    def __len__(self) -> int:
        return len(self._entries())

    def __bool__(self) -> bool:
        return bool(self._later) or (self._loaded is None and len(self.sorted_ids) > 0)

    def setdefault(self, seg: bytes, when: float | None = None) -> float:
        """Record ``seg`` retired at ``when`` unless already retired (the first time stays).
        While checkpoint entries are unloaded, returns ``when`` even for one of them."""
        assert when is not None
        return self._later.setdefault(seg, when)

    def added_later(self) -> list[bytes]:
        """The ids not among the checkpoint's sorted ones (all, without a checkpoint)."""
        return list(self._later) if self._loaded is None else list(self._loaded)

    def copy(self) -> RetiredSegments:
        if self._loaded is not None:
            return RetiredSegments(self._loaded.items())
        return RetiredSegments(
            self._later.items(), sorted_ids=self.sorted_ids, order=self._order, times=self._times
        )


def sorted_has(sorted_ids: np.ndarray, seg: bytes) -> bool:
    """Whether ``seg`` is among ``sorted_ids`` (sorted S16)."""
    if not len(sorted_ids):
        return False
    at = int(np.searchsorted(sorted_ids, seg))  # S16 orders ids as bytes (zeros pad alike)
    # compared as 16 bytes: an S16 element drops trailing zero bytes (1 id in 256 has one)
    return at < len(sorted_ids) and sorted_ids[at : at + 1].tobytes() == seg


@dataclass
class LogState:
    """The view of a growing dataset as of a log position: its live segments in log order, the
    eviction count, and the segments retired (evicted whole or compacted away) with when."""

    segments: list[SegmentEntry] = field(default_factory=list)
    evicted: int = 0
    retired: RetiredSegments = field(default_factory=RetiredSegments)
    position: int = 0
    records: int = 0
    #: Record slots that failed their check and look torn (:func:`looks_torn`), all told.
    invalid: int = 0
    #: Torn slots at the end of what was read (from byte :attr:`torn_at`), not yet vouched for
    #: by a ``RECOVER`` record.
    torn: int = 0
    torn_at: int = 0
    #: Why the log is damaged (the record and the rule it breaks); ``None`` while it is not.
    damage: str | None = None
    #: Compaction segment -> the segments it replaced, for the last :data:`MERGES_REMEMBERED`
    #: compactions (a reader holding their rows maps them to it).
    merged: dict[bytes, tuple[bytes, ...]] = field(default_factory=dict)
    #: The record ending at :attr:`position`; a checkpoint is used only beside a log that holds
    #: the same record there.
    last_record: bytes = b""

    def names(self, seg: bytes) -> bool:
        """Whether the log (up to this position) added segment ``seg``, live or retired since."""
        return seg in self._added or sorted_has(self._names_before, seg)

    def __post_init__(self) -> None:
        if not isinstance(self.retired, RetiredSegments):
            self.retired = RetiredSegments(dict(self.retired).items())
        # every segment id ever added, so a duplicate ADD is found without a scan
        self._names_before = self.retired.sorted_ids
        self._added: set[bytes] = {s.seg for s in self.segments} | set(self.retired.added_later())
        # the next segment's ordinal; no eviction count may pass the unprotected sum
        self._logical = sum(s.episodes for s in self.segments)
        self._logical_unprotected = sum(s.episodes for s in self.segments if not s.protected)
        self._reset_front()
        self._advance_front(None)

    def _reset_front(self) -> None:
        # segments[:_front] hold no live unprotected episode (protected ones are listed in
        # _front_protected); it only moves forward, so a view costs only the segments past it
        self._front = 0
        self._front_evicted = 0
        self._front_protected: list[SegmentEntry] = []
        self._tail_memo: tuple[tuple[int, int], list[tuple[SegmentEntry, int]], int] | None = None
        self._tail_remaining = 0

    def _advance_front(self, when: float | None) -> None:
        """Move the front past segments now evicted whole, retiring them at ``when`` (``None``:
        retire nothing)."""
        segments = self.segments
        while self._front < len(segments):
            s = segments[self._front]
            if s.protected:
                self._front_protected.append(s)
            elif self._front_evicted + s.episodes <= self.evicted:
                self._front_evicted += s.episodes
                if when is not None:
                    self.retired.setdefault(s.seg, when)
            else:
                break
            self._front += 1

    def apply(self, rec: Record) -> str | None:
        """Apply one checksummed record; returns the log rule it breaks (view unchanged), or
        ``None``. Broken rules: a second ``ADD`` of a segment, an eviction past the episodes
        added, a compaction of unknown segments, of a reversed or mixed range, or of more
        episodes than the range holds, an unknown kind."""
        if rec.kind == ADD:
            return self._add(rec)
        if rec.kind == EVICT:
            if rec.count > self._logical_unprotected or rec.count < 0:
                return f"evicts {rec.count} episodes where {self._logical_unprotected} were added"
            self.records += 1
            if rec.count > self.evicted:
                self.evicted = rec.count
                self._advance_front(rec.time)
            return None
        if rec.kind == COMPACT:
            return self._compact(rec)
        return f"is of a kind this rlds does not know ({rec.kind})"

    def _add(self, rec: Record) -> str | None:
        return self._add_fields(rec.seg, rec.flags, rec.episodes, rec.steps, rec.time)

    def _add_fields(self, seg: bytes, flags: int, episodes: int, steps: int, when: float) -> str | None:
        if self.names(seg):
            return f"adds segment {seg_name(seg)} a second time"
        if episodes < 1 or steps < episodes:
            return f"adds a segment of {episodes} episodes and {steps} steps"
        self.records += 1
        self._added.add(seg)
        protected = bool(flags & PROTECTED)
        self.segments.append(SegmentEntry(seg, protected, episodes, steps, 0, when, self._logical))
        self._logical += episodes
        if not protected:
            self._logical_unprotected += episodes
        if self._front == len(self.segments) - 1:  # the front stops at the first live segment
            self._advance_front(when)
        return None

    def _compact(self, rec: Record) -> str | None:
        if not (self.names(rec.first) and self.names(rec.last)):
            return "compacts segments the log never added"
        if self.names(rec.seg):
            return f"names segment {seg_name(rec.seg)}, which the log added before, as a compaction's"
        ids = {s.seg: i for i, s in enumerate(self.segments)}
        if rec.first not in ids or rec.last not in ids:
            self.records += 1
            return None  # compacted already by another compaction: this one lost the race
        a, b = ids[rec.first], ids[rec.last]
        if a > b:
            return "compacts a reversed range of segments"
        old = self.segments[a : b + 1]
        if len({s.protected for s in old}) > 1:
            return "compacts protected and unprotected segments together"
        logical, steps = sum(s.episodes for s in old), sum(s.steps for s in old)
        if not 1 <= rec.episodes <= logical or not rec.episodes <= rec.steps <= steps:
            return (
                f"compacts {logical} episodes and {steps} steps into {rec.episodes} episodes and "
                f"{rec.steps} steps"
            )
        self.records += 1
        merged = SegmentEntry(
            rec.seg,
            old[0].protected,
            logical,
            rec.steps,
            logical - rec.episodes,
            rec.time,
            old[0].ordinal,
            max(0, min(rec.count, FINAL_GENERATION)),
        )
        self.segments[a : b + 1] = [merged]
        self.merged[rec.seg] = tuple(s.seg for s in old)
        if len(self.merged) > MERGES_REMEMBERED:
            del self.merged[next(iter(self.merged))]
        self._added.add(rec.seg)
        for s in old:
            self.retired.setdefault(s.seg, rec.time)
        self._reset_front()  # positions moved: found again, once per compaction
        self._advance_front(rec.time)
        return None

    def follow(self, path: Path, until: int | None = None) -> int:
        """Apply the records appended since :attr:`position` (up to byte ``until`` if given);
        returns how many were applied.

        Raises:
            CorruptDatasetError: The log is damaged (now and at every later call; the view
                stops before the damage).
        """
        if self.damage is not None:
            raise _damaged(path, self.damage)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size % RECORD_SIZE and until is None and self.__dict__.get("_tail_checked") != size:
                    # a lock held past one wait (a writer stopped mid-append) is polled briefly after
                    waited = self.__dict__.get("_tail_waited") == size
                    try:
                        problem = partial_tail_damage(fh.fileno(), 0.05 if waited else TAIL_LOCK_SECONDS)
                    except TimeoutError:  # judged at a later refresh; whole records read now
                        problem, self.__dict__["_tail_waited"] = None, size
                    else:
                        self.__dict__["_tail_checked"] = size  # a crash's torn tail: checked once
                    if problem is not None:
                        self.damage = problem
                        raise _damaged(path, problem)
                whole = size - size % RECORD_SIZE
                if until is not None:
                    whole = min(whole, until)
                if whole <= self.position:
                    if whole < self.position:
                        raise CorruptDatasetError(f"commit log {path} shrank under its reader")
                    return 0
                fh.seek(self.position)
                data = fh.read(whole - self.position)
        except FileNotFoundError:
            raise CorruptDatasetError(f"growing dataset {path.parent} has no commit log") from None
        except IsADirectoryError:
            raise _damaged(path, "is a folder, not a file") from None
        before = self.records
        view = memoryview(data)
        crc32 = zlib.crc32
        # fast path: valid ADD records after no torn slot apply from one C-level unpack;
        # the rest go through _read_slot (same rules)
        for off, fields in zip(
            range(0, len(data), RECORD_SIZE), struct.iter_unpack(_FORMAT, data), strict=True
        ):
            magic, kind, flags, seg, _, _, episodes, steps, _, when, _ = fields
            if (
                kind == ADD
                and magic == MAGIC
                and not self.torn
                and crc32(view[off : off + RECORD_SIZE - 4]) == fields[-1]
            ):
                problem = self._add_fields(seg, flags, episodes, steps, when)
                if problem is not None:
                    problem = f"record {self.position // RECORD_SIZE} (byte {self.position}), ADD, {problem}"
            else:
                problem = self._read_slot(data[off : off + RECORD_SIZE], self.position)
            if problem is not None:
                self.damage = problem
                raise _damaged(path, problem)
            self.position += RECORD_SIZE
        self.last_record = data[-RECORD_SIZE:]
        return self.records - before

    def _read_slot(self, slot: bytes, at: int) -> str | None:
        """Take the slot at byte ``at``; returns the damage it is, or ``None``."""
        where = f"record {at // RECORD_SIZE} (byte {at})"
        rec = Record.unpack(slot)
        if rec is None:
            if not looks_torn(slot):
                return f"{where} fails its checksum, and a crash leaves the start of a record then zeros"
            if not self.torn:
                self.torn_at = at
            self.torn += 1
            self.invalid += 1
            if self.torn > MAX_TORN_RECORDS:
                return (
                    f"{self.torn} records in a row from byte {self.torn_at} fail their checksum "
                    f"(a crash tears at most the {MAX_TORN_RECORDS} records being appended)"
                )
            return None
        if rec.kind == RECOVER:
            if rec.count != self.torn or not self.torn:
                return f"{where} vouches for {rec.count} torn records before it, where {self.torn} are"
            self.torn = 0  # vouched for; a RECOVER record commits nothing
            return None
        if self.torn:
            return (
                f"record {self.torn_at // RECORD_SIZE} (byte {self.torn_at}) fails its checksum in the "
                "middle of the log, where no crash leaves one"
            )
        problem = self.apply(rec)
        return None if problem is None else f"{where}, {_KIND_NAMES.get(rec.kind, 'a record')}, {problem}"

    def live(self) -> list[tuple[SegmentEntry, int]]:
        """Each segment with live episodes and how many of its first (logical) episodes are
        evicted, in log order; memoised per log position."""
        memo = self.__dict__.get("_live_memo")
        if memo is not None and memo[0] == (self.records, self.evicted, len(self.segments)):
            return list(memo[1])
        out = self._live()
        self.__dict__["_live_memo"] = ((self.records, self.evicted, len(self.segments)), out)
        return list(out)

    def _live(self) -> list[tuple[SegmentEntry, int]]:
        out = [(s, s.dropped) for s in self._front_protected]
        start, remaining = self._front, self.evicted - self._front_evicted
        memo = self._tail_memo
        if memo is not None and memo[0] == (self._front, self.evicted) and memo[2] <= len(self.segments):
            # only segments added since: the walk goes on from where it stopped
            tail, start = list(memo[1]), memo[2]
            remaining = self._tail_remaining
        else:
            tail = []
        for s in self.segments[start:]:
            skip = 0
            if not s.protected:
                skip = min(remaining, s.episodes)
                remaining -= skip
            if skip < s.episodes:
                tail.append((s, max(skip, s.dropped)))
        self._tail_memo = ((self._front, self.evicted), tail, len(self.segments))
        self._tail_remaining = remaining
        return out + tail

    def fully_evicted(self) -> list[SegmentEntry]:
        """Segments whose every episode is evicted (their files can go after a grace period)."""
        return [s for s in self.segments[: self._front] if not s.protected]

    def copy(self) -> LogState:
        copied = LogState(
            [SegmentEntry(**vars(s)) for s in self.segments],
            self.evicted,
            self.retired.copy(),
            self.position,
            self.records,
            self.invalid,
            self.torn,
            self.torn_at,
            self.damage,
            dict(self.merged),
            self.last_record,
        )
        copied._added = set(self._added)  # the names of segments collected since too
        copied._names_before = self._names_before
        return copied


#: Compactions whose replaced segments a view remembers (:attr:`LogState.merged`).
MERGES_REMEMBERED = 4096

#: Torn records a log may end in (a crash tears at most one per writer appending).
MAX_TORN_RECORDS = 16


def looks_torn(slot: bytes) -> bool:
    """Whether a failed slot has a crash-torn shape: the start of a record (magic, or part of
    it, first), then zeros through the checksum. A whole record with a flipped byte never looks torn."""
    if any(slot[-4:]):
        return False
    head = slot.rstrip(b"\0")
    return head[: len(MAGIC)] == MAGIC[: len(head)]


# ----------------------------------------------------------------------------- segments it does not name
#
# A writer renames a sealed segment into segments/, appends its record, then makes the segment's
# COMMITTED_FILE. Killed between the rename and the append, it leaves a segment the log does not
# name and that has no COMMITTED_FILE: a leftover. A segment the log does not name that has its
# COMMITTED_FILE had its record appended: the log lost it (cut short, restored from an old copy),
# whatever else the files say, and it is never taken for a leftover.


def mark_committed(segment: Path) -> None:
    """Make ``segment``'s :data:`~rlds_cli.cache.layout.COMMITTED_FILE`, once its record is in the
    log. Never raises: a segment without it is only told from a leftover by the older rules of
    :func:`unnamed` (as every segment of a dataset written before rlds made it)."""
    # the record is what commits; the file only tells damage from a crash later
    with contextlib.suppress(OSError):
        os.close(os.open(segment / COMMITTED_FILE, os.O_WRONLY | os.O_CREAT, 0o644))


def segment_writer(path: Path) -> tuple[str, int] | None:
    """``(host, pid)`` from a segment manifest's ``source.writer``, or ``None`` when unreadable."""
    return _segment_origin(path)[0]


def _segment_origin(path: Path) -> tuple[tuple[str, int] | None, str | None, bool]:
    """A segment's writer (:func:`segment_writer`), the writer instance within its process
    (``source.writer.instance``; ``None`` before rlds wrote one) and whether the segment is a
    merge of others (``source.writer.compacted``, written by a compaction)."""
    try:
        file = path / MANIFEST_FILE
        writer = manifest_json(file.read_bytes(), file)["source"]["writer"]
        merged = bool(writer.get("compacted"))
        host, pid = writer["host"], writer["pid"]
        instance = writer.get("instance")
    except (OSError, KeyError, TypeError, AttributeError):  # CorruptDatasetError is an OSError
        return None, None, False
    if not isinstance(host, str) or not str(pid).isdigit():
        return None, None, merged
    return (host, int(pid)), instance if isinstance(instance, str) else None, merged


def writer_alive(path: Path) -> bool:
    """Whether the process writing ``path`` (a build named ``<id>.<pid>``, or a segment naming
    its writer in its manifest) still runs on this host; ``False`` without a readable writer."""
    if path.parent.name == SEGMENT_BUILDS_DIR:
        parts = path.name.split(".")
        return len(parts) == 2 and parts[1].isdigit() and _running((socket.gethostname(), int(parts[1])))
    return _running(segment_writer(path))


def _running(writer: tuple[str, int] | None) -> bool:
    """Whether ``writer`` (host, pid) is a process running on this host."""
    return writer is not None and writer[0] == socket.gethostname() and pid_alive(writer[1])


def unnamed(directory: Path, *views: LogState) -> tuple[list[Path], str | None]:
    """The segment folders of ``directory`` named by neither the log (followed to its end after the
    folders are listed) nor ``views``, whose writer no longer runs or that have their
    :data:`~rlds_cli.cache.layout.COMMITTED_FILE`; and why they look like lost records (``None``:
    each can be a leftover).

    Raises:
        CorruptDatasetError: The log is damaged.
    """
    # followed on from the furthest view: a full replay grows with history (0.4 s at 100k commits)
    latest = max(views, key=lambda v: v.position).copy() if views else LogState()
    latest.follow(directory / COMMIT_LOG_FILE)
    listed: list[tuple[Path, bytes, tuple[str, int] | None, str | None, bool, bool]] = []
    for path in segment_folders(directory):
        try:
            seg = bytes.fromhex(path.name)
        except ValueError:
            seg = b""
        if len(seg) != 16 or not path.is_dir():
            # no segment rlds named (a folder or file put there): no leftover, never removed (it
            # was moved aside and deleted, then compact failed with "unexpected ValueError")
            continue
        if any(state.names(seg) for state in (latest, *views)):
            continue
        writer, instance, merged = _segment_origin(path)  # read once: runs? whose? what?
        marked = (path / COMMITTED_FILE).is_file()
        # a running writer may be between its segment's rename and its record, unless the segment
        # has its commit/recorded file (made after the record)
        if (_running(writer) and not marked) or not path.is_dir():  # gone: removed by compact or gc
            continue
        listed.append((path, seg, writer, instance, merged, marked))
    # followed again: a record appended since the first follow (its writer then made the mark,
    # or died, before the listing looked) names its segment, which is no leftover
    latest.follow(directory / COMMIT_LOG_FILE)
    found: list[Path] = []
    merges: list[Path] = []
    committed: list[Path] = []
    writers: Counter[Any] = Counter()
    for path, seg, writer, instance, merged, marked in listed:
        if latest.names(seg):
            continue
        found.append(path)
        if merged:
            merges.append(path)
        if marked:
            committed.append(path)
        # a segment that does not say its writer (a rollback killed in its removal) counts as a
        # writer of its own; each writer of a process (several may share one) may leave one
        writers[(*writer, instance) if writer is not None else path.name] += 1
    return found, _lost_records(latest, found, writers, merges, committed)


def _lost_records(
    state: LogState, paths: list[Path], writers: Counter[Any], merges: list[Path], committed: list[Path]
) -> str | None:
    """Why ``paths`` look like records the log lost rather than leftovers, or ``None``."""
    if not writers:
        return None
    if state.records == 0 and merges:  # a merge is made of segments the log named
        return (
            f"{COMMIT_LOG_FILE} holds no record, and segment {merges[0].name} on disk merges others "
            "(a compaction runs only on a log that names segments)"
        )
    writer, count = writers.most_common(1)[0]
    if count > 1:
        host, pid, _ = writer
        return (
            f"{COMMIT_LOG_FILE} does not name {count} segments written by one writer (process {pid} "
            f"on {host}), and a writer leaves at most one (killed between a segment and its record)"
        )
    if state.records == 0 and len(paths) > 1:
        return f"{COMMIT_LOG_FILE} holds no record, and {len(paths)} segments are on disk"
    if committed:
        more = f" (and {len(committed) - 1} more)" if len(committed) > 1 else ""
        return (
            f"{COMMIT_LOG_FILE} does not name segment {committed[0].name}{more}, whose record was "
            f"appended (the segment has its '{COMMITTED_FILE}' file, made after the record)"
        )
    return None


def damage_hint(directory: Path) -> str:
    """What to do about the growing dataset at ``directory`` whose log is damaged."""
    return (
        f"rlds removes none of its segments while the log is damaged; restore {directory / 'commits.log'} "
        f"from a backup, or remove the dataset (rlds rm)"
    )


def segment_damage_hint(name: str) -> str:
    """What to do about growing dataset ``name`` whose segment is missing or damaged (its log is
    whole: the log's own damage has :func:`damage_hint`)."""
    return (
        f"rlds removes none of its segments while one is damaged; restore the dataset from a copy "
        f"('rlds pull URL --force' of one pushed before), or remove it ('rlds rm {name}')"
    )


def _damaged(path: Path, problem: str) -> CorruptDatasetError:
    return CorruptDatasetError(f"commit log {path} is damaged: {problem}", hint=damage_hint(path.parent))
