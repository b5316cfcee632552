"""The file locks of rlds_cli/_util/locks.py: FileLock excludes filelock's own locks on the same
file (both flock), in this process and in another one, and lock_fd's; it is reentrant within one
object; a timeout is a Timeout that is_timeout recognises, as is filelock's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from filelock import FileLock as PortableLock
from filelock import Timeout as PortableTimeout

from rlds_cli._util.locks import FileLock, Timeout, is_timeout, lock_fd, unlock_fd
from tests.waits import HANG_SECONDS

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the flock lock is POSIX's")


def test_excludes_filelock_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with PortableLock(str(path), timeout=0):
        with pytest.raises(Timeout) as caught:
            FileLock(path, timeout=0).acquire()
        assert is_timeout(caught.value) and str(path) in str(caught.value)
    with FileLock(path, timeout=0):
        with pytest.raises(PortableTimeout) as other:
            PortableLock(str(path), timeout=0).acquire()
        assert is_timeout(other.value)
    with PortableLock(str(path), timeout=0):  # both released: free again
        pass


def test_reentrant_and_released_by_the_last_hold(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = FileLock(path, timeout=0)
    with lock:
        with lock:
            assert lock.is_locked
        assert lock.is_locked  # one hold left
        with pytest.raises(Timeout):
            FileLock(path, timeout=0).acquire()
    assert not lock.is_locked
    FileLock(path, timeout=0).acquire().release()


def test_waits_for_another_process(tmp_path: Path) -> None:
    """Held by another process: a short timeout fails; once that process exits, it is taken."""
    path = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from filelock import FileLock
                with FileLock({str(path)!r}):
                    print("held", flush=True)
                    sys.stdin.readline()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(Timeout):
            FileLock(path).acquire(timeout=0.1)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(HANG_SECONDS)
    FileLock(path).acquire(timeout=HANG_SECONDS).release()


def test_other_errors_are_not_timeouts() -> None:
    assert not is_timeout(OSError("disk"))
    assert not is_timeout(TimeoutError("a socket's"))


def test_a_lock_in_a_folder_not_made_yet_makes_it(tmp_path: Path) -> None:
    """As filelock does: ``rlds gc`` on a cache with no ``locks/`` folder yet takes its locks."""
    path = tmp_path / "locks" / "deeper" / "x.lock"
    with FileLock(path, timeout=0) as lock:
        assert lock.is_locked and path.is_file()
        with pytest.raises(PortableTimeout):
            PortableLock(str(path), timeout=0).acquire()


def test_an_open_file_lock_excludes_the_lock_file_lock(tmp_path: Path) -> None:
    """The commit log's lock of its open file (lock_fd) and FileLock on the same file exclude
    each other; unlock_fd frees it."""
    import fcntl  # here: the module is collected on Windows too, where it is skipped

    path = tmp_path / "commits.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        lock_fd(fd)
        with pytest.raises(Timeout):
            FileLock(path, timeout=0).acquire()
        unlock_fd(fd)
        with FileLock(path, timeout=0):
            other = os.open(path, os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):  # what lock_fd would wait for
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
    finally:
        os.close(fd)


def test_a_forked_child_s_copy_never_releases_the_parent_s_lock(tmp_path: Path) -> None:
    """The child's descriptor shares the parent's flock: its copy of the lock going away (a
    DataLoader worker replacing it) freed the parent's lock for every other process."""
    lock = FileLock(tmp_path / "l.lock")
    lock.acquire()
    pid = os.fork()
    if pid == 0:  # the child: drop its copy, as garbage collection does
        lock.release(force=True)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    with pytest.raises(Timeout):
        FileLock(tmp_path / "l.lock").acquire(timeout=0)  # another object: another open file
    lock.release()
    FileLock(tmp_path / "l.lock").acquire(timeout=0).release()


def test_a_killed_child_not_yet_reaped_is_not_alive() -> None:
    """A zombie holds nothing: a reservation it named is reclaimed at once (a read waited
    120 s on one, then blamed 'another process')."""
    from rlds_cli._util.locks import pid_alive

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        import time

        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:  # exiting: a zombie within ms
            time.sleep(0.01)
        assert not pid_alive(pid)
        assert os.waitpid(pid, os.WNOHANG)[0] == pid  # it was a zombie, reaped only now
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    assert pid_alive(os.getpid())
