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
from tests.waits import HANG_SECONDS

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


#: A kill point: the ``k``-th step (an ``int``, counted from the start), or ``(m, j)``: the
#: ``j``-th step after the ``m``-th *landmark* (``j = 0``: the landmark itself; ``m = 0``: from
#: the start; a ``j`` past the next landmark means that landmark). Landmarks are the steps
#: whose number and order do not depend on timing (see :func:`is_landmark`): zarr writes a
#: column's files from several threads at once, so the number of its small steps (a parent
#: folder made by one task or another) varies from run to run, and a point counted from the
#: start would land elsewhere in each run; counted from a landmark it does not.
Point = int | tuple[int, int]


def is_landmark(name: str, first: str) -> bool:
    """Whether a step (its name, the base name of its first path) is a landmark: an fsync, a
    rename, an exchange, a commit-log append, or a ``replace`` other than zarr's own of a
    ``.partial`` file."""
    return name in ("fsync", "rename", "exchange_paths", "append") or (
        name == "replace" and not first.endswith(".partial")
    )


def _first(args: tuple[Any, ...]) -> str:
    return os.path.basename(str(args[0])).replace(" ", "_") if args else "-"


def _run_child(
    operation: Callable[[], Any], kill_before: Point | None, wfd: int, trace: bool = False
) -> None:
    """The forked child: run ``operation``, counting steps (``trace``: and reporting each
    one); never returns."""
    import threading

    count = landmarks = since = 0  # steps; landmarks; steps since the last landmark
    lock = threading.Lock()  # the fsync pool's threads step at once

    def on_step(name: str, args: tuple[Any, ...]) -> None:
        nonlocal count, landmarks, since
        with lock:
            count += 1
            first = _first(args)
            if trace:
                os.write(wfd, f"step {name} {first}\n".encode())
            if is_landmark(name, first):
                landmarks, since = landmarks + 1, 0
                # the landmark itself, or the one that came before the j-th step after the last
                kill = kill_before == (landmarks, 0) or (
                    isinstance(kill_before, tuple) and kill_before[0] == landmarks - 1 and kill_before[1] > 0
                )
            else:
                since += 1
                kill = kill_before == (landmarks, since)
            if kill or kill_before == count:
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


# A child that hangs is caught by this bound; one that is only slow must never trip it (a CI run
# on two busy cores once took over 60 s for a child that takes ~2 s on a quiet machine).
CHILD_TIMEOUT = 180.0


def _fork(
    operation: Callable[[], Any],
    kill_before: Point | None,
    timeout: float = CHILD_TIMEOUT,
    trace: bool = False,
) -> tuple[int, str]:
    """Run ``operation`` in a forked child; returns its exit code and its report line(s)."""
    import select
    import time

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        _run_child(operation, kill_before, wfd, trace)
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


def trace_steps(operation: Callable[[], Any]) -> list[tuple[str, str]]:
    """Run ``operation`` to the end in a child and return each of its steps, in order, as
    ``(name, the base name of its first path)``: ``steps[k - 1]`` is what :func:`kill_at`
    ``(operation, k)`` kills before."""
    code, report = _fork(operation, None, trace=True)
    lines = report.splitlines()
    assert code == 0, f"the operation failed without any fault injected:\n{report}"
    steps = [(line.split()[1], line.split()[2]) for line in lines if line.startswith("step ")]
    assert lines[-1] == f"done {len(steps)}", report[-500:]
    return steps


def sample_steps(steps: list[tuple[str, str]], *, every: int) -> list[Point]:
    """Kill points for an operation with many steps (from :func:`trace_steps`), as
    :data:`Point` s that land on the same kind of step in every run: the first and the last
    step; before and just after every landmark that publishes something (all but fsyncs);
    the first and a middle fsync of every run of fsyncs (a wave); and about every
    ``every``-th step besides (the zarr backend's many small writes into a private build
    folder, which all leave the same kind of state: a build that no reader looks at)."""
    names = [name for name, _ in steps]
    total = len(steps)
    points: set[Point] = {(0, 1) if not is_landmark(*steps[0]) else (1, 0)}
    landmark_of = []  # for each step: (the landmarks up to it, its steps since the last one)
    m = j = 0
    for name, first in steps:
        if is_landmark(name, first):
            m, j = m + 1, 0
        else:
            j += 1
        landmark_of.append((m, j))
    for k, (name, first) in enumerate(steps, start=1):
        m = landmark_of[k - 1][0]
        if is_landmark(name, first) and name != "fsync":
            points |= {(m, 0), landmark_of[k] if k < total else (m, 0)}
        if name == "fsync" and (k == 1 or names[k - 2] != "fsync"):
            end = k
            while end < total and names[end] == "fsync":
                end += 1
            points |= {(m, 0), landmark_of[(k + end) // 2 - 1]}
    points |= {landmark_of[k - 1] for k in range(1, total + 1, every)}
    points.add(landmark_of[-1])
    return sorted(points)  # type: ignore[type-var]


#: The zarr variants of the kill tests kill at every ``ZARR_EVERY``-th step, the first and the
#: last, and around each publishing step and in each fsync wave (:func:`sample_steps`), not at
#: every step: a zarr commit has ~190 steps (a three-run compaction ~770, a dataset's publish
#: ~250), most of them zarr's own small writes (mkdir, a .partial file replaced) inside the
#: private build folder, which all leave a build that no reader looks at. Every step of each
#: test took minutes on 2 cores (~0.5 s a kill); the sample takes 5-40 s. memmap's steps are
#: all tried.
ZARR_EVERY = 50


def kill_points(operation: Callable[[], object], storage: str) -> list[Point]:
    """Every step of ``operation`` (memmap), or a sample of them (zarr: see :data:`ZARR_EVERY`)."""
    if storage == "memmap":
        every: list[Point] = list(range(1, count_steps(operation) + 1))
        return every
    return sample_steps(trace_steps(operation), every=ZARR_EVERY)


def kill_at(operation: Callable[[], Any], step: Point) -> str | None:
    """Run ``operation`` in a child killed just before its ``step``-th step (or a
    :data:`Point` of another form); returns the step that was killed (for messages), or
    ``None`` when the operation has fewer steps and ran to its end."""
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


__all__ = [
    "KILLED",
    "Point",
    "count_steps",
    "is_landmark",
    "kill_at",
    "sample_steps",
    "snapshot",
    "trace_steps",
]


def assert_finishes_forked(target: Callable[..., Any], *args: Any, timeout: float = HANG_SECONDS) -> None:
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
