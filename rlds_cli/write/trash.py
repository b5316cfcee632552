"""Folders deleted on a thread of their own: a writer's commit thread renames a retired segment
out of the dataset (one ``rename``) and goes on; the walk that deletes its files runs here.

Deleting a segment is a walk of its files (an ``unlink`` each, then an ``rmdir`` each folder):
on the commit thread it was 40% of a commit's time on a busy disk. Renamed first, a segment is
gone from every reader's sight at once, and its files can go whenever. A folder handed over but
not yet deleted when the process ends stays under ``building/`` with this process's id in its
name: ``rlds compact`` and ``rlds gc`` remove it as the build of a writer that no longer runs.
A forked child starts a thread of its own; what the parent handed over is the parent's.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
from pathlib import Path

_lock = threading.Lock()
_queue: queue.Queue[Path] | None = None
_pid = 0


def delete_later(path: Path) -> None:
    """Delete the folder ``path`` (already out of every reader's sight) on this process's
    deleting thread."""
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


__all__ = ["delete_later", "wait_deleted"]
