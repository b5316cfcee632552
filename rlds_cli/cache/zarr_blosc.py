"""Decoding zarr chunks: the Blosc functions of the c-blosc that numcodecs bundles, called
through ctypes, and the process's pool of decoding threads (see :mod:`rlds_cli.cache.zarr_chunks`).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a read needs threads: preprocess workers import this module
    from concurrent.futures import ThreadPoolExecutor

#: Most threads that decode the chunks of one read (they release the GIL in Blosc).
ZARR_READ_THREADS = 4
#: Chunks a read needs before it is split across threads (below that, threads cost more).
_POOL_MIN_CHUNKS = 32
_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_pool_lock = threading.Lock()


def _read_pool() -> ThreadPoolExecutor | None:
    """The process's chunk-decoding threads (``None`` on one CPU). Made again after a fork: a
    forked child (a DataLoader worker) inherits the pool object but none of its threads."""
    from concurrent.futures import ThreadPoolExecutor

    global _pool, _pool_pid
    threads = min(ZARR_READ_THREADS, os.cpu_count() or 1)
    if threads < 2:
        return None
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="rlds-zarr")
            _pool_pid = os.getpid()
        return _pool


def _blosc_function(name: str) -> Any:
    """``blosc_decompress_ctx`` / ``blosc_compress_ctx`` of the c-blosc that numcodecs bundles,
    called through ctypes: about 1 us a call against 10 for numcodecs' functions (whose checks
    and wrapping outweigh the coding of a small chunk), ctypes releases the GIL around it (so
    decoding threads run in parallel), and it writes where it is told (no copy). ``None`` when the
    symbol is not exported; the callers then use numcodecs' functions."""
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


def _decompressor() -> Any:
    return _blosc_function("blosc_decompress_ctx")
