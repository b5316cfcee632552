"""Segments of a growing dataset that its commit log does not name, and what they can be.

A writer renames a sealed segment into ``segments/`` and then appends its record to the log
(:mod:`rlds_cli.write.segments`). Killed between the two, it leaves one segment no record
names: a leftover that ``rlds compact`` removes once its writer no longer runs. The same
picture, a segment no record names, is what a log that lost records shows (emptied, cut short,
restored from an old copy): then the segments are committed data and removing them loses it.

What tells the two apart is that a writer has at most one commit between its rename and its
record at a time: a writer that no longer runs leaves at most one segment the log does not
name. Several of one writer, or several where the log holds no record at all, are records the
log lost (:func:`lost_records`); ``rlds compact`` then keeps them and ``rlds inspect --check``
reports it.
"""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from rlds_cli.cache.commit_log import LogState, plausibly_torn
from rlds_cli.cache.layout import COMMIT_LOG_FILE, MANIFEST_FILE, SEGMENT_BUILDS_DIR, SEGMENTS_DIR


def segment_writer(path: Path) -> tuple[str, int] | None:
    """The host and process that wrote a segment (its manifest's ``source.writer``), ``None``
    when the manifest does not say (unreadable, or another shape)."""
    try:
        writer = json.loads((path / MANIFEST_FILE).read_text())["source"]["writer"]
        host, pid = writer["host"], writer["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(host, str) or not str(pid).isdigit():
        return None
    return host, int(pid)


def writer_alive(path: Path) -> bool:
    """Whether the process writing ``path`` still runs on this host, so it is no leftover
    whatever its age (a writer stalled between its segment's rename and its log record, or a
    build in progress): a build is named ``<id>.<pid>``, a segment names its writer in its
    manifest. A trash folder, or a segment without a readable manifest, has no live writer."""
    if path.parent.name == SEGMENT_BUILDS_DIR:
        parts = path.name.split(".")
        if len(parts) != 2 or not parts[1].isdigit():
            return False
        pid = int(parts[1])
    else:
        writer = segment_writer(path)
        if writer is None or writer[0] != socket.gethostname():
            return False
        pid = writer[1]
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone (or a number no process has)
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def unnamed(directory: Path, *states: LogState) -> list[Path]:
    """The segment folders of ``directory`` that no state of ``states`` (logs followed to some
    position) names, whose writer no longer runs."""
    segments = directory / SEGMENTS_DIR
    found = []
    for path in sorted(segments.iterdir()) if segments.is_dir() else ():
        try:
            seg = bytes.fromhex(path.name)
        except ValueError:  # not a segment rlds named: no record can name it
            seg = b""
        if not any(state.names(seg) for state in states) and not writer_alive(path):
            found.append(path)
    return found


def log_damage(state: LogState) -> str | None:
    """Why a log's records that fail their check are not what crashes leave
    (:func:`~rlds_cli.cache.commit_log.plausibly_torn`), or ``None``."""
    if plausibly_torn(state):
        return None
    return (
        f"{COMMIT_LOG_FILE} looks damaged: {state.invalid} of its {state.invalid + state.records} "
        f"records fail their check, {state.garbled} of them not as a crash tears one"
    )


def lost_records(state: LogState, paths: list[Path]) -> str | None:
    """Why the segments ``paths`` (:func:`unnamed`) look like records the log lost rather than
    killed writers' leftovers, or ``None`` when each can be a leftover."""
    writers: Counter[Any] = Counter()
    for path in paths:
        writer = segment_writer(path)
        # a segment that does not say its writer counts as a writer of its own
        writers[writer if writer is not None else path.name] += 1
    if not writers:
        return None
    writer, count = writers.most_common(1)[0]
    if count > 1:
        host, pid = writer
        return (
            f"{COMMIT_LOG_FILE} does not name {count} segments written by process {pid} on "
            f"{host}, and a writer leaves at most one (killed between a segment and its record)"
        )
    if state.records == 0 and len(paths) > 1:
        return f"{COMMIT_LOG_FILE} holds no record, and {len(paths)} segments are on disk"
    return None
