"""Segments of a growing dataset that its commit log does not name, and what they can be.

A writer renames a sealed segment into ``segments/``, then appends its log record
(:mod:`rlds_cli.write.segments`); killed between the two, it leaves one unnamed leftover, which
``rlds compact`` removes once the writer no longer runs. A log that lost records (emptied, cut,
restored from an old copy) also leaves unnamed segments, which are committed data. Since a dead
writer leaves at most one, several of one writer, or several beside an empty log, mean lost
records (:func:`unnamed`): ``rlds compact`` keeps them and ``rlds inspect --check`` reports it.
"""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path
from typing import Any

from rlds_cli._util.locks import pid_alive
from rlds_cli.cache.commit_log import LogState
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    MANIFEST_FILE,
    SEGMENT_BUILDS_DIR,
    segment_folders,
)
from rlds_cli.cache.manifest import manifest_json


def segment_writer(path: Path) -> tuple[str, int] | None:
    """``(host, pid)`` from a segment manifest's ``source.writer``, or ``None`` when unreadable."""
    try:
        file = path / MANIFEST_FILE
        writer = manifest_json(file.read_bytes(), file)["source"]["writer"]
        host, pid = writer["host"], writer["pid"]
    except (OSError, KeyError, TypeError):  # CorruptDatasetError is an OSError
        return None
    if not isinstance(host, str) or not str(pid).isdigit():
        return None
    return host, int(pid)


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
    """The segment folders of ``directory`` named by neither the log (followed to its end) nor
    ``views``, whose writer no longer runs; and why they look like lost records (``None``: each
    can be a leftover).

    Raises:
        CorruptDatasetError: The log is damaged.
    """
    # followed on from the furthest view: a full replay grows with history (0.4 s at 100k commits)
    latest = max(views, key=lambda v: v.position).copy() if views else LogState()
    latest.follow(directory / COMMIT_LOG_FILE)
    found: list[Path] = []
    writers: Counter[Any] = Counter()
    for path in segment_folders(directory):
        try:
            seg = bytes.fromhex(path.name)
        except ValueError:  # not a segment rlds named: no record can name it
            seg = b""
        if any(state.names(seg) for state in (latest, *views)):
            continue
        writer = segment_writer(path)  # read once: whether it runs, and whose it is
        if _running(writer):
            continue
        found.append(path)
        # a segment that does not say its writer counts as a writer of its own
        writers[writer if writer is not None else path.name] += 1
    return found, _lost_records(latest, found, writers)


def _lost_records(state: LogState, paths: list[Path], writers: Counter[Any]) -> str | None:
    """Why ``paths`` look like records the log lost rather than leftovers, or ``None``."""
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
