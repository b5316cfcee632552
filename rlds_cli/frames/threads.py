"""The threads that encode and decode frames: one pool per process, as many threads as CPUs
the process may use. The codecs release the GIL (:mod:`rlds_cli.frames.codecs`), so a batch's
frames decode on every core at once; the threads take runs of a few frames from one queue (a
future per frame cost more than a small frame's decode)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli._util.cpus import usable_cpus
from rlds_cli.frames.codecs import DEFAULT_JPEG_QUALITY, FrameFormat, decode_into, encode

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

#: Fewer frames than this are decoded on the calling thread: handing them over costs more.
INLINE_FRAMES = 4

_pool: ThreadPoolExecutor | None = None
_workers = 0
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child (a DataLoader worker): the pool object was inherited but none of its
    threads, and the lock may have been held by a thread the child does not have."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _threads() -> tuple[ThreadPoolExecutor, int]:
    """The process's frame pool and its size."""
    global _pool, _workers
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor  # here: a reader of no frame needs none

            _workers = usable_cpus()
            _pool = ThreadPoolExecutor(_workers, thread_name_prefix="rlds-frames")
        return _pool, _workers


def run_split(count: int, work: Callable[[int, int], None]) -> None:
    """Call ``work(start, stop)`` over ``[0, count)`` in runs of a few items that every thread
    (the calling one too) takes in turn from one queue, so a thread that drew cheap items takes
    more (two fixed halves left a core idle at the end of every block: frames differ in cost);
    returns when every run is done (the first error raised by any run is raised)."""
    pool, workers = _threads()
    helpers = min(workers, count // INLINE_FRAMES) - 1 if count >= 2 * INLINE_FRAMES else 0
    if helpers <= 0:
        work(0, count)
        return
    step = max(INLINE_FRAMES, count // (8 * (helpers + 1)))
    runs = iter(range(0, count, step))  # next() on it is atomic: each run is taken once

    def take() -> None:
        for start in runs:
            work(start, min(start + step, count))

    futures = [pool.submit(take) for _ in range(helpers)]
    try:
        take()
    finally:
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def decode_many(
    frame_bytes: Callable[[int], Any], count: int, fmt: FrameFormat, out: np.ndarray, places: Any = None
) -> None:
    """Decode frames ``frame_bytes(0) .. frame_bytes(count - 1)`` into ``out[0] .. out[count - 1]``
    (``out``: ``(rows, *fmt.shape)`` uint8), or into ``out[places[i]]`` when ``places`` is given,
    on every thread.

    Raises:
        FrameError: A frame that does not decode to ``fmt`` (the first met; its position is
            the ``index`` attribute of the error).
    """

    def share(start: int, stop: int) -> None:
        for i in range(start, stop):
            try:
                decode_into(frame_bytes(i), fmt, out[i if places is None else places[i]])
            except Exception as exc:
                exc.index = i  # type: ignore[attr-defined]
                raise

    run_split(count, share)


def encode_many(frames: np.ndarray, fmt: FrameFormat, quality: int = DEFAULT_JPEG_QUALITY) -> list[bytes]:
    """Each frame of ``frames`` (``(n, *fmt.shape)`` uint8) encoded with ``fmt.codec``, in order,
    on every thread."""
    encoded: list[bytes] = [b""] * len(frames)

    def share(start: int, stop: int) -> None:
        for i in range(start, stop):
            encoded[i] = encode(frames[i], fmt, quality)

    run_split(len(frames), share)
    return encoded
