"""Ordered parallel map over source files, in worker processes, with a bounded window.

Results come back in input order, so converted arrays are byte-identical whatever the number of
workers; at most ``window`` results are in flight or waiting, bounding memory to about ``window``
times the largest unit (``docs/formats.md``). Used by the Roboset and AMAGO readers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from rlds_cli._util.cpus import usable_cpus

T = TypeVar("T")
R = TypeVar("R")

#: Below this many source bytes a pool costs more (process start, imports) than it saves.
MIN_PARALLEL_BYTES = 32 * 1024 * 1024


def default_workers(units: int, total_bytes: int) -> int:
    """Workers used when the caller did not say: the cores, but 1 for small sources."""
    if units < 2 or total_bytes < MIN_PARALLEL_BYTES:
        return 1
    return max(1, min(usable_cpus(), units))


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], workers: int, window: int | None = None
) -> Iterator[R]:
    """``map(fn, items)`` in ``workers`` processes, yielding results in input order.

    ``fn`` must be a module-level function (it is pickled). With ``workers <= 1`` everything
    runs in this process. Errors raised by ``fn`` reach the caller unchanged.
    """
    if workers <= 1:
        for item in items:
            yield fn(item)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # forkserver: never fork this process (it may hold HDF5 handles or a progress thread's locks)
    ctx = multiprocessing.get_context("forkserver")
    window = window or 2 * workers
    pending: deque[Any] = deque()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
