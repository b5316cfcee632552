"""The inter-process lock of a dataset name, without importing ``filelock`` on POSIX.

Why: ``import filelock`` costs ~16 ms in a process that has rlds loaded (its asyncio, lease and
descriptor machinery), a sixth of converting a 100k-step low-dim dataset, paid by every
conversion and every write. On POSIX the lock is ``fcntl.flock(LOCK_EX)`` on the name's lock file,
exactly what ``filelock.FileLock`` takes (it uses ``flock`` too, and never truncates or deletes the
file), so processes using either class exclude each other. Elsewhere (Windows), ``filelock`` is
used as before.

:class:`FileLock` keeps the part of ``filelock.FileLock``'s interface rlds uses: ``acquire``
(waiting up to ``timeout`` seconds, ``-1`` forever, polling), ``release``, a context manager,
reentrant within one object. A lock that cannot be taken in time raises :class:`Timeout`.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: Seconds between two attempts while waiting for a lock held elsewhere (filelock's default).
POLL_SECONDS = 0.05


class Timeout(TimeoutError):
    """The lock file ``lock_file`` could not be locked in time (held by another process)."""

    def __init__(self, lock_file: str) -> None:
        super().__init__(f"The file lock '{lock_file}' could not be acquired.")
        self.lock_file = lock_file


class FileLock:
    """An exclusive ``flock`` on ``lock_file`` (see the module).

    Args:
        lock_file: The lock file (created, mode 0644, when missing; never truncated or removed).
        timeout: Default seconds :meth:`acquire` waits (``-1``: forever, ``0``: one attempt).
    """

    def __init__(self, lock_file: str | os.PathLike[str], timeout: float = -1) -> None:
        self.lock_file = os.fspath(lock_file)
        self.timeout = timeout
        self._fd: int | None = None
        self._count = 0

    @property
    def is_locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def _try(self) -> bool:
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
        self._fd = fd
        return True

    def acquire(self, timeout: float | None = None) -> FileLock:
        """Take the lock, waiting up to ``timeout`` seconds (``None``: the constructor's).

        Raises:
            Timeout: Another process holds it past the timeout.
        """
        if self._fd is not None:
            self._count += 1
            return self
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait if wait >= 0 else None
        while not self._try():
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(self.lock_file)
            time.sleep(
                POLL_SECONDS if deadline is None else min(POLL_SECONDS, max(0.0, deadline - time.monotonic()))
            )
        self._count = 1
        return self

    def release(self, force: bool = False) -> None:
        """Release one hold (``force``: all of them); the lock goes with the last."""
        if self._fd is None:
            return
        self._count = 0 if force else self._count - 1
        if self._count <= 0:
            fd, self._fd, self._count = self._fd, None, 0
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
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


def file_lock(lock_file: str | os.PathLike[str], timeout: float = -1) -> Any:
    """A lock on ``lock_file``: this module's :class:`FileLock` on POSIX, ``filelock``'s elsewhere
    (whose ``Timeout`` the callers then see: test with :func:`is_timeout`)."""
    if fcntl is not None:
        return FileLock(lock_file, timeout)
    from filelock import FileLock as PortableLock  # pragma: no cover - Windows

    return PortableLock(os.fspath(lock_file), timeout=timeout)  # pragma: no cover


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock timeout: this module's :class:`Timeout`, or ``filelock``'s (from
    a lock a caller made with ``filelock`` itself, or :func:`file_lock`'s off POSIX)."""
    if isinstance(exc, Timeout):
        return True
    portable = sys.modules.get("filelock")  # not imported: no filelock lock can have timed out
    return portable is not None and isinstance(exc, portable.Timeout)
