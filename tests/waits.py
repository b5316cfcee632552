"""Waits in tests end on what they wait for, never on how fast the machine is.

A test waits for an event, a queue item or a process to end; :data:`HANG_SECONDS` bounds such a
wait only so that a hang (a deadlock, a child that never reports) fails the test instead of the
run. It is far past what any run that makes progress needs, on the slowest machine: a slow
machine makes a test slower, never red. A wait that is meant to time out (``assert not
event.wait(0.3)``: nothing happens meanwhile) is no hang guard and keeps its short bound.
"""

from __future__ import annotations

import queue as queue_module
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

#: The bound of every wait that should succeed: a hang guard, not an expectation of speed.
HANG_SECONDS = 900.0


def collect(results: Any, procs: Sequence[BaseProcess], count: int) -> list[Any]:
    """``count`` items of ``results`` (a ``multiprocessing`` queue that ``procs`` fill), in the
    order they come.

    Waits as long as the processes run. Fails at once when one of them has ended with a non-zero
    exit code, or when all have ended and an item is still missing (a child that died never
    reports: waiting on would only wait for the guard); and after :data:`HANG_SECONDS` in all.
    """
    items: list[Any] = []
    deadline = time.monotonic() + HANG_SECONDS
    while len(items) < count:
        try:
            items.append(results.get(timeout=1.0))
            continue
        except queue_module.Empty:
            pass
        failed = [(p.name, p.exitcode) for p in procs if p.exitcode not in (None, 0)]
        assert not failed, f"processes ended with an error before reporting: {failed}"
        if all(p.exitcode is not None for p in procs):
            try:  # a child's items reach the pipe before it exits: one last look
                items.append(results.get(timeout=1.0))
                continue
            except queue_module.Empty:
                missing = count - len(items)
                raise AssertionError(f"every process ended, {missing} of {count} reports missing") from None
        assert time.monotonic() < deadline, f"a hang: {len(items)} of {count} reports in {HANG_SECONDS:.0f} s"
    return items


def join_all(procs: Sequence[BaseProcess]) -> None:
    """Join ``procs`` (a hang bounded by :data:`HANG_SECONDS`) and check each exited with 0."""
    for p in procs:
        p.join(HANG_SECONDS)
        assert p.exitcode == 0, f"{p.name} exited {p.exitcode}"


#: The bound of :func:`settles`: resources another thread closes after the call that frees them
#: (torch's queues close their pipes on feeder threads) are gone long before it; a leak never is.
SETTLE_SECONDS = 120.0


def settles(leftover: Any, seconds: float = SETTLE_SECONDS) -> Any:
    """``leftover()`` once it is empty (falsy), or its last value after ``seconds``: for checks that
    something was released, where the release finishes on another thread."""
    deadline = time.monotonic() + seconds
    found = leftover()
    while found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = leftover()
    return found
