"""The commit log of a growing (``segmented``) dataset: what readers follow, writers append.

A growing dataset is a directory with a head manifest (``layout: "segmented"``: the schema,
the settings), sealed *segments* (each a small complete TED dataset under ``segments/<id>/``)
and this log, ``commits.log``: fixed-size records, appended with ``O_APPEND`` by several writer
processes, each holding the log's lock for the write alone (:func:`append`). A record is
:data:`RECORD_SIZE` bytes with a crc32 of its own bytes; a record that fails its check (a
torn write after a machine crash, or the zero padding a later writer adds to realign the file)
is skipped. Readers follow the log cheaply: ``fstat`` and a read of the new bytes.

Records (``kind``):

* ``ADD`` segment ``seg`` with ``episodes`` episodes and ``steps`` steps (flag bit 0: protected,
  never evicted);
* ``EVICT``: the first ``count`` unprotected episodes (in log order) are evicted. The count is
  absolute, so two writers deciding the same eviction write the same record, and a view takes
  the largest one seen;
* ``COMPACT``: the live segments from ``first`` to ``last`` (consecutive in the view) are
  replaced by ``seg``, which holds their episodes but the first ``dropped`` (evicted ones that
  the compaction did not copy).

A reader's view is always a prefix of the log, so always a consistent set of whole episodes.
:class:`LogState` is that view, without any segment's files: :mod:`rlds_cli.cache.growing` opens
those.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from rlds_cli.errors import CorruptDatasetError

MAGIC = b"RLG1"
ADD, EVICT, COMPACT = 1, 2, 3
PROTECTED = 1
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
        """The record in ``data`` (``RECORD_SIZE`` bytes), or ``None`` where its check fails."""
        if data[:4] != MAGIC or struct.unpack("<I", data[-4:])[0] != zlib.crc32(data[:-4]):
            return None
        _, kind, flags, seg, first, last, episodes, steps, count, t, _ = struct.unpack(_FORMAT, data)
        if kind not in (ADD, EVICT, COMPACT):
            return None
        return cls(kind, seg, first, last, episodes, steps, count, flags, t)


def append(path: Path, record: Record, *, fsync: bool) -> None:
    """Append one record to the log at ``path`` with a single ``O_APPEND`` write (whole, or
    nothing: a process killed around it leaves no torn record; only a machine crash can, and
    the check skips it). A log whose size is not a whole number of records (a torn record of a
    crash) is first padded with zeros to the next record, which readers skip.

    Every append holds an exclusive lock of the log from reading its size to its write (not
    through the fsync, so writers' fsyncs still overlap). Unlocked, a writer could read the
    size while another writer's record was half copied: a record that straddles a page
    boundary (2 records in every 128 do) extends the file once per page, so the size
    seen was not a whole number of records, and the writer padded a log that needed none,
    writing its own record across two slots, both skipped: a commit reported done and never
    visible (4 processes appending 20,000 records each lost 80-200 of them)."""
    data = record.pack()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
    try:
        _lock(fd)
        try:
            size = os.fstat(fd).st_size
            if size % RECORD_SIZE:
                data = b"\0" * (RECORD_SIZE - size % RECORD_SIZE) + data
            written = os.write(fd, data)
            if written != len(data):  # pragma: no cover - a regular file takes a small write whole
                raise OSError(f"short write to {path}")
        finally:
            # unlocked, not only closed, where the write failed too: a child forked meanwhile
            # (another thread's fork) holds this descriptor's lock for as long as it lives
            _unlock(fd)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def has_added(path: Path, seg: bytes) -> bool:
    """Whether the log at ``path`` holds an ``ADD`` record of segment ``seg`` (read whole: for
    a commit that failed around its append, to tell a committed segment from a leftover)."""
    with open(path, "rb") as fh:
        data = fh.read()
    for off in range(0, len(data) - RECORD_SIZE + 1, RECORD_SIZE):
        rec = Record.unpack(data[off : off + RECORD_SIZE])
        if rec is not None and rec.kind == ADD and rec.seg == seg:
            return True
    return False


def _lock(fd: int) -> None:
    """An exclusive lock of the open log (``flock``; none where there is no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: appends race with each other
        return
    fcntl.flock(fd, fcntl.LOCK_EX)


def _unlock(fd: int) -> None:
    """Release :func:`_lock`."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return
    fcntl.flock(fd, fcntl.LOCK_UN)


@dataclass
class SegmentEntry:
    """One segment of a view: its id, whether it is protected, its logical episode count (what
    the log says it holds, evicted ones included), and ``dropped``: how many of those first
    episodes its files do not hold (a compaction left out evicted ones). ``ordinal``: the
    logical episodes added to the log before its first one, so episode ``k`` of the segment
    (logically) is the log's episode ``ordinal + k``: a number no refresh, eviction or
    compaction changes (a compaction's segment takes the ordinal of the first one it replaces
    and holds as many logical episodes as they did)."""

    seg: bytes
    protected: bool
    episodes: int
    steps: int
    dropped: int = 0
    added_at: float = 0.0
    ordinal: int = 0


@dataclass
class LogState:
    """The view of a growing dataset as of a log position: its live segments in log order, the
    eviction count, and the segments retired (evicted whole or compacted away) with when."""

    segments: list[SegmentEntry] = field(default_factory=list)
    evicted: int = 0
    retired: dict[bytes, float] = field(default_factory=dict)
    position: int = 0
    records: int = 0
    #: Record slots that failed their check (a crash's torn record, or damage), and those of
    #: them that do not look torn (:func:`looks_torn`).
    invalid: int = 0
    garbled: int = 0

    def names(self, seg: bytes) -> bool:
        """Whether the log (up to this position) added segment ``seg``, live or retired since."""
        return seg in self._added

    def __post_init__(self) -> None:
        # every segment id ever added: a duplicate ADD is found without a scan of the view
        self._added: set[bytes] = {s.seg for s in self.segments} | set(self.retired)
        # logical episodes ever added: the next segment's ordinal (a compaction keeps the sum)
        self._logical = sum(s.episodes for s in self.segments)
        self._reset_front()
        self._advance_front(None)

    def _reset_front(self) -> None:
        # The front: segments[:_front] hold no live unprotected episode (each unprotected one
        # is evicted whole; the protected ones are listed in _front_protected), and
        # _front_evicted counts their unprotected episodes. It only moves forward (eviction is
        # oldest first), so the view costs the segments past it, not every segment ever added.
        self._front = 0
        self._front_evicted = 0
        self._front_protected: list[SegmentEntry] = []
        self._tail_memo: tuple[tuple[int, int], list[tuple[SegmentEntry, int]], int] | None = None
        self._tail_remaining = 0

    def _advance_front(self, when: float | None) -> None:
        """Move the front past the segments now evicted whole (retired from ``when``; ``None``:
        a copy's front, whose retired segments are the original's)."""
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

    def apply(self, rec: Record) -> None:
        self.records += 1
        if rec.kind == ADD:
            if rec.seg in self._added:
                return  # a duplicate (never written by rlds): the first one counts
            self._added.add(rec.seg)
            self.segments.append(
                SegmentEntry(
                    rec.seg, bool(rec.flags & PROTECTED), rec.episodes, rec.steps, 0, rec.time, self._logical
                )
            )
            self._logical += rec.episodes
            self._advance_front(rec.time)
        elif rec.kind == EVICT:
            if rec.count > self.evicted:
                self.evicted = rec.count
                self._advance_front(rec.time)
        else:
            ids = [s.seg for s in self.segments]
            if rec.first not in ids or rec.last not in ids:
                return  # compacted already by another compaction: this one lost the race
            a, b = ids.index(rec.first), ids.index(rec.last)
            old = self.segments[a : b + 1]
            logical = sum(s.episodes for s in old)
            merged = SegmentEntry(
                rec.seg,
                old[0].protected,
                logical,
                rec.steps,
                logical - rec.episodes,
                rec.time,
                old[0].ordinal,
            )
            self.segments[a : b + 1] = [merged]
            self._added.add(rec.seg)
            for s in old:
                self.retired.setdefault(s.seg, rec.time)
            self._reset_front()  # positions moved: found again, once per compaction
            self._advance_front(rec.time)

    def follow(self, path: Path, until: int | None = None) -> int:
        """Apply the records appended to the log at ``path`` since :attr:`position` (up to byte
        ``until``, when given: a snapshot handed to another process); returns how many were
        read."""
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
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
        n = 0
        for off in range(0, len(data) - len(data) % RECORD_SIZE, RECORD_SIZE):
            rec = Record.unpack(data[off : off + RECORD_SIZE])
            if rec is not None:
                self.apply(rec)
                n += 1
            else:
                self.invalid += 1
                self.garbled += not looks_torn(data[off : off + RECORD_SIZE])
        self.position += len(data) - len(data) % RECORD_SIZE
        return n

    def live(self) -> list[tuple[SegmentEntry, int]]:
        """Each segment with live episodes and the number of its first (logical) episodes that
        are evicted, in log order. Eviction counts unprotected episodes only. (Computed once
        per log position: a view asks several times.)"""
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
        return LogState(
            [SegmentEntry(**vars(s)) for s in self.segments],
            self.evicted,
            dict(self.retired),
            self.position,
            self.records,
            self.invalid,
            self.garbled,
        )


#: Torn records a log may hold beyond its valid ones before it is taken for damaged.
MAX_TORN_RECORDS = 16


def looks_torn(slot: bytes) -> bool:
    """Whether a record slot that fails its check looks like what a machine crash leaves: the
    start of a record (it begins with the magic, or with part of it) and then zeros (the rest
    never reached the disk, or :func:`append`'s padding). Anything else was written by
    something other than rlds."""
    head = slot.rstrip(b"\0")
    return head[: len(MAGIC)] == MAGIC[: len(head)]


def plausibly_torn(state: LogState) -> bool:
    """Whether the records of a log that fail their check can all be crashes' torn records:
    each looks torn (:func:`looks_torn`), and there are at most as many as valid records, or
    :data:`MAX_TORN_RECORDS` (a crash tears at most the records being appended at that moment,
    one a writer; a later append pads the slot and goes on). A log overwritten outside rlds
    holds other bytes; one zeroed by a damaged disk is all torn-looking slots."""
    return state.garbled == 0 and (state.invalid <= MAX_TORN_RECORDS or state.invalid <= state.records)
