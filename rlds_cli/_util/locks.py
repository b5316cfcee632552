"""File locks between processes: :class:`FileLock` on a lock file, :func:`lock_fd` on an open file;
:func:`pid_alive`, whether the process a lock or a reservation names still runs.

On POSIX both are ``fcntl.flock(LOCK_EX)``, as ``filelock.FileLock`` takes (never truncating or
removing the file), so processes using either exclude each other. ``filelock`` is not imported
there: it costs ~16 ms with rlds loaded, a sixth of converting a 100k-step low-dim dataset. On
Windows :class:`FileLock` takes ``filelock``'s lock and :func:`lock_fd` locks nothing.

:class:`FileLock` has the part of ``filelock.FileLock``'s interface rlds uses: ``acquire``
(``timeout`` seconds, ``-1`` forever, ``0`` one attempt; polling), ``release``, a context manager.
It is reentrant per object, not per thread: give each thread its own object. A lock not taken in
time raises :class:`Timeout` on every platform.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["POLL_SECONDS", "FileLock", "Timeout", "is_timeout", "lock_fd", "lock_fd_within", "unlock_fd"]

#: Seconds between two attempts while waiting for a lock held elsewhere (filelock's default).
POLL_SECONDS = 0.05


class Timeout(TimeoutError):
    """The lock file ``lock_file`` could not be locked in time (held by another process)."""

    def __init__(self, lock_file: str) -> None:
        super().__init__(f"The file lock '{lock_file}' could not be acquired.")
        self.lock_file = lock_file


def lock_fd(fd: int) -> None:
    """Take an exclusive lock of the open file ``fd``, waiting for it (``flock``; where there is
    no ``fcntl``, nothing is locked)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def lock_fd_within(fd: int, seconds: float) -> bool:
    """:func:`lock_fd`, waiting at most ``seconds`` (polling); whether it was taken (``True``
    where there is no ``fcntl``). Raises the ``OSError`` of a lock that cannot be had at all (an
    exclusive lock of a read-only file where ``flock`` is emulated, on NFS)."""
    if fcntl is None:
        return True

    def attempt() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    return _wait_for(attempt, seconds, POLL_SECONDS / 5)


def _wait_for(attempt: Callable[[], bool], seconds: float | None, poll: float) -> bool:
    """Call ``attempt`` every ``poll`` seconds until it returns true (``True``) or ``seconds``
    have passed (``False``; ``None``: for ever)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not attempt():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll if deadline is None else min(poll, max(0.0, deadline - time.monotonic())))
    return True


def unlock_fd(fd: int) -> None:
    """Release :func:`lock_fd` (or :class:`FileLock`'s ``flock``) of ``fd``."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)


class FileLock:
    """An exclusive lock of ``lock_file`` (see the module).

    Args:
        lock_file: The lock file (created, mode 0644, with its folder when missing; never
            truncated or removed).
        timeout: Default seconds :meth:`acquire` waits (``-1``: forever, ``0``: one attempt).
    """

    def __init__(self, lock_file: str | os.PathLike[str], timeout: float = -1) -> None:
        self._count = 0
        self._fd: int | None = None  # POSIX: the descriptor holding the flock
        self._owner = 0  # the process that took it: a forked child's copy never releases it
        self._portable: Any = None  # elsewhere: filelock's lock
        self.lock_file = os.fspath(lock_file)
        self.timeout = timeout

    @property
    def is_locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._count > 0

    def _try(self) -> bool:
        """One attempt, without waiting: whether the lock was taken."""
        if fcntl is None:  # pragma: no cover - Windows
            return self._try_portable()
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.lock_file, flags, 0o644)
        except FileNotFoundError:  # its folder is made on first use, as filelock does
            os.makedirs(os.path.dirname(self.lock_file) or ".", exist_ok=True)
            fd = os.open(self.lock_file, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._owner = fd, os.getpid()
        return True

    def _try_portable(self) -> bool:  # pragma: no cover - Windows
        import filelock

        if self._portable is None:
            self._portable = filelock.FileLock(self.lock_file)
        try:
            self._portable.acquire(timeout=0)
        except filelock.Timeout:
            return False
        return True

    def acquire(self, timeout: float | None = None) -> FileLock:
        """Take the lock, waiting up to ``timeout`` seconds (``None``: the constructor's).

        Raises:
            Timeout: Another process holds it past the timeout.
        """
        if self._count:
            self._count += 1
            return self
        wait = self.timeout if timeout is None else timeout
        if not _wait_for(self._try, wait if wait >= 0 else None, POLL_SECONDS):
            raise Timeout(self.lock_file)
        self._count = 1
        return self

    def release(self, force: bool = False) -> None:
        """Release one hold (``force``: all of them); the lock goes with the last."""
        if not self._count:
            return
        self._count = 0 if force else self._count - 1
        if self._count > 0:
            return
        self._count = 0
        if self._fd is None:  # pragma: no cover - Windows
            self._portable.release()
            return
        fd, self._fd = self._fd, None
        try:
            # the descriptor a forked child inherited shares the parent's lock: closing it there
            # leaves the lock to the parent, unlocking it would free the parent's
            if self._owner == os.getpid():
                unlock_fd(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release(force=True)


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock timeout: :class:`Timeout`, or ``filelock``'s (from a lock a
    caller made with ``filelock`` itself and handed to rlds)."""
    if isinstance(exc, Timeout):
        return True
    portable = sys.modules.get("filelock")  # not imported: no filelock lock can have timed out
    return portable is not None and isinstance(exc, portable.Timeout)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's process too; a zombie, killed
    and not yet reaped by its parent, does not: it holds nothing and does nothing more)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone (or a number no process has)
        return False
    except PermissionError:
        return True
    try:  # Linux: the state after the name in /proc/PID/stat ("Z": a zombie)
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:  # no /proc (macOS), or gone meanwhile
        return True
