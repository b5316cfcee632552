"""fsyncs issued together: a build made durable in waves, from a process-wide thread pool.

Concurrent fsyncs share journal commits: a dozen in a row took 20 ms, issued together 3 ms. The
pool is made once per process and again in a forked child (which inherits no threads). Once the
interpreter is exiting, paths are synced one by one in the waiting thread.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlds_cli._util.io import fsync_dir, fsync_file

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

#: Threads that fsync at once.
FSYNC_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _fsync_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor  # not for readers, who never sync

            _pool = ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="rlds-fsync")
        return _pool


def in_background(sync: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``sync(*args)`` (an fsync) on the process's fsync threads."""
    return _fsync_pool().submit(sync, *args)


def tree_paths(root: Path) -> tuple[list[Path], list[Path]]:
    """The files (symlinks left out) and the folders under ``root``, ``root`` the last folder,
    deepest first."""
    paths = sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    files = [p for p in paths if p.is_file() and not p.is_symlink()]
    return files, [*(p for p in paths if p.is_dir()), root]


def start_fsyncs(files: list[Path], folders: list[Path]) -> Callable[[], None]:
    """Begin fsyncing all ``files`` and ``folders`` at once, unordered; returns a wait that
    raises the first error once all have ended (two paths or fewer are synced inline)."""
    if len(files) + len(folders) <= 2:
        for path in files:
            fsync_file(path)
        for path in folders:
            fsync_dir(path)
        return _nothing
    pool = _fsync_pool()
    waits: list[Callable[[], Any]] = []
    for sync, path in [*((fsync_file, p) for p in files), *((fsync_dir, p) for p in folders)]:
        try:
            waits.append(pool.submit(sync, path).result)
        except RuntimeError:  # interpreter exiting: an atexit commit after concurrent.futures'
            # exit hook, which takes no new work
            waits.append(functools.partial(sync, path))  # synced by the wait, in this thread

    def wait() -> None:
        error: BaseException | None = None
        for result in waits:
            try:
                result()
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error

    return wait


def fsync_wave(files: list[Path], folders: list[Path]) -> None:
    """fsync every one of ``files`` and ``folders`` at once (see :func:`start_fsyncs`)."""
    start_fsyncs(files, folders)()


def fsync_tree(root: Path) -> None:
    """Make a finished build durable before its manifest commits it: all files, then all
    folders (``root`` included), each wave issued at once."""
    files, folders = tree_paths(root)
    fsync_wave(files, [])
    fsync_wave([], folders)


def _nothing() -> None:
    return None
