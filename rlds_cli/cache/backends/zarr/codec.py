"""The Blosc codec of zarr chunks.

numcodecs' bundled c-blosc called through ctypes (encoder and decoder), the process's decoding
thread pool, and access to the compiled loop of :mod:`rlds_cli.cache.backends.zarr.compiled`
(used by :class:`rlds_cli.cache.backends.zarr.read.ChunkReader`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli import settings
from rlds_cli._util.cpus import usable_cpus

if TYPE_CHECKING:  # imported when a read needs threads: preprocess workers import this module
    from concurrent.futures import ThreadPoolExecutor

#: Most threads that decode the chunks of one read (they release the GIL in Blosc).
ZARR_READ_THREADS = 4
#: Chunks a read needs before it is split across threads (below that, threads cost more).
_POOL_MIN_CHUNKS = 32
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
#: Threads a read uses, counted once (``None``: not yet; counting costs a small read's time).
_threads: int | None = None


def read_threads() -> int:
    """Threads that decode the chunks of one read, the caller's included (1: no pool)."""
    global _threads
    if _threads is None:
        _threads = max(1, min(ZARR_READ_THREADS, usable_cpus()))
    return _threads


def _forget_pool() -> None:
    """After a fork: drop the inherited pool (its threads are not), so the next read makes one."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _read_pool() -> ThreadPoolExecutor | None:
    """The process's chunk-decoding threads besides the caller's (``None`` on one CPU)."""
    global _pool
    if read_threads() < 2:
        return None
    pool = _pool
    if pool is not None:
        return pool
    from concurrent.futures import ThreadPoolExecutor

    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(read_threads() - 1, thread_name_prefix="rlds-zarr")
        return _pool


def run_split(count: int, work: Callable[[int, int], None]) -> None:
    """``work(a, b)`` over ``[0, count)``: one call for a small read, else one contiguous part
    per decoding thread, the caller doing the last. Re-raises a thread's error after all end."""
    pool = _read_pool() if count >= _POOL_MIN_CHUNKS else None
    if pool is None:
        work(0, count)
        return
    parts = min(read_threads(), count)
    bounds = [count * p // parts for p in range(parts + 1)]
    futures = [pool.submit(work, bounds[p], bounds[p + 1]) for p in range(parts - 1)]
    try:
        work(bounds[-2], bounds[-1])
    finally:
        for future in futures:
            future.result()  # re-raises a decoding thread's error here (after all have ended)


def blosc_function(name: str) -> Any:
    """``blosc_decompress_ctx`` / ``blosc_compress_ctx`` of numcodecs' c-blosc through ctypes:
    ~1 us a call against 10 for numcodecs', GIL released, no copy. ``None`` when the symbol is
    not exported (callers use numcodecs then)."""
    if name in _BLOSC_FUNCTIONS:
        return _BLOSC_FUNCTIONS[name]
    import ctypes

    from numcodecs import blosc

    c = ctypes
    signatures = {
        # (src, dest, destsize, numinternalthreads) -> bytes decoded, or < 0
        "blosc_decompress_ctx": [c.c_void_p, c.c_void_p, c.c_size_t, c.c_int],
        # (clevel, doshuffle, typesize, nbytes, src, dest, destsize, compressor, blocksize,
        #  numinternalthreads) -> bytes written, 0 when they do not fit, < 0 on error
        "blosc_compress_ctx": [
            c.c_int, c.c_int, c.c_size_t, c.c_size_t, c.c_void_p, c.c_void_p, c.c_size_t,
            c.c_char_p, c.c_size_t, c.c_int,
        ],
    }  # fmt: skip
    try:
        fn = getattr(ctypes.CDLL(blosc.__file__), name)
        fn.argtypes = signatures[name]
        fn.restype = ctypes.c_int
    except (OSError, AttributeError):
        fn = None
    _BLOSC_FUNCTIONS[name] = fn
    return fn


_BLOSC_FUNCTIONS: dict[str, Any] = {}


def decompressor() -> Any:
    """``blosc_decompress_ctx`` through ctypes (see :func:`blosc_function`), or ``None``."""
    return blosc_function("blosc_decompress_ctx")


#: Chunks a read needs before it takes the compiled loop (importing numba costs ~0.3 s once).
COMPILED_MIN_CHUNKS = _POOL_MIN_CHUNKS
#: The compiled decode loop bound to the decoder (``False``: not looked up yet; ``None``: none).
_compiled: Any = False


def compiled_decode() -> Callable[[np.ndarray, np.ndarray, int, int, int], int] | None:
    """``decode(sources, dests, nbytes, a, b)`` bound to the decoder
    (:func:`~rlds_cli.cache.backends.zarr.compiled.decode_range`); ``None`` without numba, with
    ``RLDS_NUMBA=0``, or without the decoder symbol."""
    global _compiled
    if _compiled is False:
        found = None
        fn = decompressor()
        if fn is not None and settings.numba_enabled():
            try:
                from rlds_cli.cache.backends.zarr.compiled import decode_range
            except ImportError:
                pass
            else:
                import ctypes
                import functools

                address = ctypes.cast(fn, ctypes.c_void_p).value
                if address:
                    found = functools.partial(decode_range, address)
        _compiled = found
    return _compiled
