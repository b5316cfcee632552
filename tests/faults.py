"""Fault injection: run an operation in a forked child and kill it at its k-th step.

A *step* is one call that changes what is on disk or makes it durable: ``os.replace``,
``os.rename``, ``os.unlink``/``os.remove``, ``os.rmdir``, ``os.mkdir``, ``os.fsync``,
``os.posix_fallocate``, the cache's atomic exchange and the append of a commit-log record.
:func:`count_steps` runs the operation to the end and counts them; :func:`kill_at` runs it
again and ends the process with ``os._exit(137)`` (no cleanup, no ``finally``, no
``atexit``: what SIGKILL does) just before step ``k``. Tests enumerate ``k = 1 .. count`` and
check what each kill leaves, so every bad moment of publish, resume and cleanup is tried, not
only random ones.

The child is forked, so it starts in microseconds with everything the test imported; the
operation must not need threads started before the fork.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import rlds_cli.cache.commit_log as commit_log
import rlds_cli.cache.root as cache_root

KILLED = 137
_OS_STEPS = ("replace", "rename", "unlink", "remove", "rmdir", "mkdir", "fsync", "posix_fallocate")


@contextmanager
def _stepping(on_step: Callable[[str, tuple[Any, ...]], None]) -> Iterator[None]:
    """Call ``on_step(name, args)`` before every step (in this process only)."""
    saved: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def stepped(*args: Any, **kwargs: Any) -> Any:
            on_step(name, args)
            return real(*args, **kwargs)

        saved.append((owner, name, real))
        setattr(owner, name, stepped)

    for name in _OS_STEPS:
        if hasattr(os, name):
            wrap(os, name)
    wrap(cache_root, "exchange_paths")
    wrap(commit_log, "append")  # a growing dataset's commit: one O_APPEND write of a record
    try:
        yield
    finally:
        for owner, name, real in reversed(saved):
            setattr(owner, name, real)


def _run_child(operation: Callable[[], Any], kill_before: int | None, wfd: int) -> None:
    """The forked child: run ``operation``, counting steps; never returns."""
    count = 0

    def on_step(name: str, args: tuple[Any, ...]) -> None:
        nonlocal count
        count += 1
        if kill_before is not None and count == kill_before:
            os.write(wfd, f"killed {count} {name} {args[:2]!r}\n".encode())
            os._exit(KILLED)

    try:
        with _stepping(on_step):
            operation()
    except BaseException:
        os.write(wfd, f"error {count}\n{traceback.format_exc()}".encode())
        os._exit(1)
    os.write(wfd, f"done {count}\n".encode())
    os._exit(0)


def _fork(operation: Callable[[], Any], kill_before: int | None, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``operation`` in a forked child; returns its exit code and its report line(s)."""
    import select
    import time

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        _run_child(operation, kill_before, wfd)
    os.close(wfd)
    # the child holds the pipe's only write end: its end of file is the child's exit, so the
    # parent sleeps until then (and drains the pipe, which a long report could otherwise fill)
    deadline = time.monotonic() + timeout
    received = bytearray()
    try:
        while True:
            ready, _, _ = select.select([rfd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise AssertionError(f"the child did not finish in {timeout} s (kill_before={kill_before})")
            data = os.read(rfd, 65536)
            if not data:
                break
            received += data
    finally:
        os.close(rfd)
    _, status = os.waitpid(pid, 0)
    report = received.decode()
    return os.waitstatus_to_exitcode(status), report


def count_steps(operation: Callable[[], Any]) -> int:
    """Run ``operation`` to the end in a child and return its number of steps."""
    code, report = _fork(operation, None)
    assert code == 0, f"the operation failed without any fault injected:\n{report}"
    return int(report.split()[1])


def kill_at(operation: Callable[[], Any], step: int) -> str | None:
    """Run ``operation`` in a child killed just before its ``step``-th step; returns the step
    that was killed (for messages), or ``None`` when the operation has fewer steps and ran to
    its end."""
    code, report = _fork(operation, step)
    if code == 0:
        return None
    assert code == KILLED, f"expected a kill before step {step}, got exit {code}:\n{report}"
    return report.strip()


def snapshot(path: os.PathLike[str] | str) -> dict[str, bytes]:
    """Every regular file under ``path`` with its bytes (for before/after comparisons)."""
    out: dict[str, bytes] = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = fh.read()
    return out


__all__ = ["KILLED", "count_steps", "kill_at", "snapshot"]


def assert_finishes_forked(target: Callable[..., Any], *args: Any, timeout: float = 60.0) -> None:
    """Run ``target(*args)`` in a forked child, which must end within ``timeout`` seconds (a
    hang is killed, and fails) with exit code 0: what a fork must not break (a helper thread's
    pool or queued work inherited without its threads)."""
    import multiprocessing as mp

    child = mp.get_context("fork").Process(target=target, args=args)
    child.start()
    child.join(timeout)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung, f"the forked child still ran after {timeout} s (a hang)"
    assert child.exitcode == 0, f"the forked child exited with {child.exitcode}"
