"""tests/waits.py: a wait for processes ends on their reports or on their failure, never on a
fixed time a slow machine could exceed."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from typing import Any

import pytest

from tests.waits import HANG_SECONDS, collect, join_all, settles

_fork = mp.get_context("fork")


def _report_after(out: Any, item: int, delay: float) -> None:
    time.sleep(delay)
    out.put(item)


def _fail() -> None:
    sys.exit(3)


def _exit_quietly() -> None:
    pass


def test_reports_are_collected_as_they_come() -> None:
    out = _fork.Queue()
    procs = [_fork.Process(target=_report_after, args=(out, i, 0.3 * i)) for i in range(3)]
    for p in procs:
        p.start()
    assert sorted(collect(out, procs, 3)) == [0, 1, 2]
    join_all(procs)


def test_a_process_that_fails_ends_the_wait_at_once() -> None:
    out = _fork.Queue()
    procs = [_fork.Process(target=_fail), _fork.Process(target=_report_after, args=(out, 1, HANG_SECONDS))]
    for p in procs:
        p.start()
    try:
        with pytest.raises(AssertionError, match=r"ended with an error before reporting: \[\('[^']+', 3\)\]"):
            collect(out, procs, 2)  # not after the other one's HANG_SECONDS
    finally:
        procs[1].kill()
        procs[1].join()


def test_processes_that_end_without_reporting_end_the_wait() -> None:
    out = _fork.Queue()
    procs = [_fork.Process(target=_exit_quietly) for _ in range(2)]
    for p in procs:
        p.start()
    with pytest.raises(AssertionError, match="every process ended, 2 of 2 reports missing"):
        collect(out, procs, 2)


def test_join_all_names_a_process_that_failed() -> None:
    p = _fork.Process(target=_fail, name="the-failing-one")
    p.start()
    with pytest.raises(AssertionError, match="the-failing-one exited 3"):
        join_all([p])


def test_settles_waits_for_a_release_on_another_thread() -> None:
    import threading

    held = {"fd"}
    threading.Timer(0.2, held.clear).start()
    assert settles(lambda: set(held)) == set()


def test_settles_returns_what_is_still_held_after_its_bound() -> None:
    assert settles(lambda: {"leaked"}, seconds=0.1) == {"leaked"}
