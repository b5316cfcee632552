"""The commit log's checkpoint: a growing dataset opens in time that does not grow with its history.

Replaying ``commits.log`` costs ~2 µs a record (0.2 s at 100,000 commits). The checkpoint,
``segments/.log-state``, is a :class:`~rlds_cli.cache.commit_log.LogState` as of one log position;
a reader loads it and replays only later records (:func:`load_state`). The log stays the truth:

* It is used only where its crc32 holds, its position is within the log, and the log's record
  before that position is the one it copied (:func:`read_checkpoint`); otherwise the log is
  replayed from the start (with a warning for a failed checksum).
* It is written to ``building/`` (named as a build, so leftovers are collected), synced where
  fsync is on, then renamed into place, by any process that replayed :data:`CHECKPOINT_RECORDS`
  or more records past it, from an undamaged view with no torn record pending.
* It lives in ``segments/`` (a dot name no segment has) because a new file in the dataset's
  folder would change the ctime that :func:`~rlds_cli.cache.dataset.version_identity` reads.

A checkpoint hides damage in the records before it, so whatever evicts, merges or removes
replays the whole log first (:func:`verify_log`) and removes or merges nothing on any damage or
checkpoint mismatch.
"""

from __future__ import annotations

import logging
import os
import struct
import uuid
import zlib
from pathlib import Path

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.commit_log import (
    MERGES_REMEMBERED,
    RECORD_SIZE,
    LogState,
    RetiredSegments,
    SegmentEntry,
    damage_hint,
)
from rlds_cli.cache.dataset import version_identity
from rlds_cli.cache.layout import COMMIT_LOG_FILE, LOG_CHECKPOINT_FILE, SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.errors import CorruptDatasetError

log = logging.getLogger(__name__)

#: Records replayed past the checkpoint after which a new one is written (384 KiB of log,
#: ~8 ms of replay: what an open past the checkpoint costs at most).
CHECKPOINT_RECORDS = 4096

_MAGIC = b"RLGSTAT1"
#: magic, reserved, position, records, invalid, evicted, segments, retired, merges, merged ids
_HEADER = struct.Struct("<8s8xqqqqqqqq")
#: seg, protected, episodes, steps, dropped, added_at, ordinal, generation
_SEGMENT = struct.Struct("<16sB7xqqqdqq")
_ID = 16


def checkpoint_path(directory: Path) -> Path:
    """Where the checkpoint of the growing dataset at ``directory`` lives."""
    return directory / SEGMENTS_DIR / LOG_CHECKPOINT_FILE


def encode(state: LogState) -> bytes:
    """``state`` as checkpoint bytes, including :attr:`LogState.last_record`; deterministic.

    Raises:
        ValueError: ``state`` is damaged, has a torn record pending, or lacks its last record.
    """
    if not _writable(state):
        raise ValueError("a checkpoint is of a whole, undamaged view past the log's first record")
    merged_ids = [seg for group in state.merged.values() for seg in group]
    parts = [
        _HEADER.pack(
            _MAGIC,
            state.position,
            state.records,
            state.invalid,
            state.evicted,
            len(state.segments),
            len(state.retired),
            len(state.merged),
            len(merged_ids),
        ),
        state.last_record,
        b"".join(
            _SEGMENT.pack(
                s.seg, s.protected, s.episodes, s.steps, s.dropped, s.added_at, s.ordinal, s.generation
            )
            for s in state.segments
        ),
        *_retired_arrays(state),
        b"".join(state.merged),
        np.fromiter((len(g) for g in state.merged.values()), "<u4", len(state.merged)).tobytes(),
        b"".join(merged_ids),
    ]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def _retired_arrays(state: LogState) -> list[bytes]:
    """The retired segments as stored: sorted ids, the permutation back to retirement order,
    and the times in retirement order."""
    n = len(state.retired)
    ids = np.frombuffer(b"".join(state.retired), "S16", n)
    by_id = np.argsort(ids, kind="stable")
    order = np.empty(n, "<u4")
    order[by_id] = np.arange(n, dtype="<u4")
    times = np.fromiter(state.retired.values(), "<f8", n)
    return [ids[by_id].tobytes(), order.tobytes(), times.tobytes()]


def _writable(state: LogState) -> bool:
    """Whether ``state`` may be a checkpoint: no damage, no torn record pending, at least one
    record read, and the record it ends with kept."""
    return (
        state.damage is None
        and not state.torn
        and state.position >= RECORD_SIZE
        and len(state.last_record) == RECORD_SIZE
    )


def decode(data: bytes) -> LogState | str:
    """The state in checkpoint bytes ``data``, or why they are no checkpoint (all counts are
    checked against the size before anything is built)."""
    fixed = _HEADER.size + RECORD_SIZE + 4
    if len(data) < fixed or data[:8] != _MAGIC:
        return "it is not a checkpoint rlds writes"
    if struct.unpack_from("<I", data, len(data) - 4)[0] != zlib.crc32(memoryview(data)[:-4]):
        return "it fails its checksum"
    _, position, records, invalid, evicted, nseg, nret, nmerge, nids = _HEADER.unpack_from(data)
    counts = (position, records, invalid, evicted, nseg, nret, nmerge, nids)
    expected = fixed + nseg * _SEGMENT.size + nret * (_ID + 4 + 8) + nmerge * (_ID + 4) + nids * _ID
    if (
        min(counts) < 0
        or nmerge > MERGES_REMEMBERED
        or position < RECORD_SIZE
        or position % RECORD_SIZE
        or expected != len(data)
    ):
        return "its counts do not fit its size"
    at = _HEADER.size
    last_record = data[at : at + RECORD_SIZE]
    at += RECORD_SIZE
    segments = [
        SegmentEntry(seg, bool(protected), episodes, steps, dropped, added_at, ordinal, generation)
        for seg, protected, episodes, steps, dropped, added_at, ordinal, generation in _SEGMENT.iter_unpack(
            data[at : at + nseg * _SEGMENT.size]
        )
    ]
    at += nseg * _SEGMENT.size
    sorted_ids = np.frombuffer(data, "S16", nret, at)
    at += nret * _ID
    order = np.frombuffer(data, "<u4", nret, at)
    at += nret * 4
    times = np.frombuffer(data, "<f8", nret, at)
    at += nret * 8
    if nret and int(order.max()) >= nret:
        return "its counts do not fit its size"
    merge_ids = _ids(data, at, nmerge)
    at += nmerge * _ID
    sizes = np.frombuffer(data, "<u4", nmerge, at).tolist()
    at += nmerge * 4
    if sum(sizes) != nids:
        return "its counts do not fit its size"
    members = _ids(data, at, nids)
    merged: dict[bytes, tuple[bytes, ...]] = {}
    start = 0
    for seg, size in zip(merge_ids, sizes, strict=True):
        merged[seg] = tuple(members[start : start + size])
        start += size
    state = LogState(
        segments,
        evicted,
        RetiredSegments(sorted_ids=sorted_ids, order=order, times=times),
        position,
        records,
        invalid,
        merged=merged,
        last_record=last_record,
    )
    return state


def _ids(data: bytes, at: int, count: int) -> list[bytes]:
    # V16, not S16: its items are the 16 bytes whole (S16 drops trailing zero bytes)
    return list(np.frombuffer(data, "V16", count, at).tolist())


def read_checkpoint(directory: Path, until: int | None = None) -> LogState | None:
    """The checkpoint of the growing dataset at ``directory`` if usable (see the module
    docstring; position at most ``until``), else ``None``."""
    path = checkpoint_path(directory)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: cannot read the commit log's checkpoint (%s); the log is replayed whole", path, exc)
        return None
    got = decode(data)
    if isinstance(got, str):
        log.warning("%s: %s; the commit log is replayed whole", path, got)
        return None
    state = got
    if until is not None and state.position > until:
        return None
    try:
        with open(directory / COMMIT_LOG_FILE, "rb") as fh:
            found = os.pread(fh.fileno(), RECORD_SIZE, state.position - RECORD_SIZE)
    except OSError:
        return None  # no log (or a folder): the replay from the start reports it
    return state if found == state.last_record else None


def load_state(directory: Path, until: int | None = None, *, write: bool = True) -> LogState:
    """The view of the growing dataset at ``directory`` as of its log's end (or byte ``until``):
    the usable checkpoint, then the records after it. With ``write`` and no ``until``, a
    replay of :data:`CHECKPOINT_RECORDS` or more records writes a new checkpoint (best effort).

    Raises:
        CorruptDatasetError: As :meth:`LogState.follow`.
    """
    identity = version_identity(directory)
    checkpoint = read_checkpoint(directory, until)
    # one that is there but unusable is damage (a write is atomic): kept for verify_log to name,
    # never replaced by a fresh one that would hide it from inspect --check, compact and gc
    write = write and (checkpoint is not None or not checkpoint_path(directory).exists())
    state = checkpoint or LogState()
    start = state.position
    state.follow(directory / COMMIT_LOG_FILE, until=until)
    if write and until is None and state.position - start >= CHECKPOINT_RECORDS * RECORD_SIZE:
        try:
            write_checkpoint(directory, state, identity)
        except OSError as exc:
            log.debug("%s: checkpoint not written: %s", directory, exc)
    return state


def write_checkpoint(directory: Path, state: LogState, identity: tuple[int, int, int] | None) -> None:
    """Atomically write ``state`` (a replay, never a view whose retired segments were
    collected) as the checkpoint of the growing dataset at ``directory``. Nothing is written
    for a damaged view, a pending torn record, or a dataset replaced since the replay began
    (its :func:`~rlds_cli.cache.dataset.version_identity` no longer ``identity``)."""
    if not _writable(state):
        return
    data = encode(state)
    # named as a build (<name>.<pid>): a killed process's copy is collected with the builds
    tmp = directory / SEGMENT_BUILDS_DIR / f"log-state-{uuid.uuid4().hex[:12]}.{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if settings.fsync_enabled():
                os.fsync(fh.fileno())
        if version_identity(directory) == identity:
            os.replace(tmp, checkpoint_path(directory))
    finally:
        tmp.unlink(missing_ok=True)


def verify_log(directory: Path) -> LogState:
    """Replay the whole log of the growing dataset at ``directory`` and check its checkpoint
    against the replay; returns the view as of the log's end.

    Raises:
        CorruptDatasetError: The log is damaged, or the checkpoint is unreadable, fails its
            checksum, lies past the log's end, or differs from the replay at its position.
    """
    log_path = directory / COMMIT_LOG_FILE
    state = LogState()
    path = checkpoint_path(directory)
    data = b""
    try:
        data = path.read_bytes()
        got: LogState | str = decode(data)
    except FileNotFoundError:
        state.follow(log_path)
        return state
    except OSError as exc:
        got = f"it cannot be read ({exc.strerror or exc})"
    problem = got if isinstance(got, str) else None
    if not isinstance(got, str):
        state.follow(log_path, until=got.position)
        if state.position < got.position:
            problem = f"it is of byte {got.position} of the log, which ends at byte {state.position}"
        elif state.torn:
            problem = f"it is of byte {got.position} of the log, where torn records are pending"
        elif encode(state) != data:
            problem = "it differs from the log's replay at its position"
    if problem is not None:
        raise CorruptDatasetError(
            f"commit log checkpoint {path} is damaged: {problem}",
            hint=f"it is derived from {COMMIT_LOG_FILE}: if the log checks clean without it, remove it "
            f"(rlds writes a new one); otherwise {damage_hint(directory)}",
        )
    state.follow(log_path)
    return state


__all__ = [
    "CHECKPOINT_RECORDS",
    "checkpoint_path",
    "decode",
    "encode",
    "load_state",
    "read_checkpoint",
    "verify_log",
    "write_checkpoint",
]
