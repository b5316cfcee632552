"""Batch output arrays reused once nothing references them: gathers that do not page-fault.

glibc serves megabyte allocations (256 gray 84x84 frames: 1.8 MB a key) with ``mmap`` and
returns them on free, so each new batch page-faults every 4 KiB (~900 faults, 3-4x the cost in a
fresh process). Reusing output arrays keeps their pages mapped without changing the process's
``mallopt`` thresholds.

Lifetime rule: **a buffer is handed out again only when no Python object references it**
(every array, view and tensor of its batch is gone; the test is CPython's reference count of
the pool's array). A batch the caller keeps is never overwritten: with all buffers held, a
gather allocates a new array. Up to :data:`MAX_BUFFERS` buffers per pool stay allocated until
the pool is freed.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np

#: Outputs smaller than this are allocated as usual (glibc's heap serves 225 KB without faults
#: after the first batch; 900 KB still faulted ~200 times a batch).
MIN_BYTES = 256 * 1024
#: Buffers a pool keeps: one per large key per batch held at once (3 cameras x 2 x 4 batches).
MAX_BUFFERS = 32
# references to a free buffer seen by sys.getrefcount in _take: the pool's list, the local
# variable and getrefcount's own argument
_FREE_REFS = 3


class BufferPool:
    """Reusable output arrays for a gather (see the module for the lifetime rule).

    Args:
        min_bytes: Outputs below this size are plain new arrays.
        max_buffers: Buffers kept at most.
        size_classes: Buffers are powers of two bytes and an output takes the smallest free
            one that fits (for a scan's near-equal temporaries); ``False``: exact sizes, first
            fit (a loader's batches, one size a key).
    """

    def __init__(
        self, min_bytes: int = MIN_BYTES, max_buffers: int = MAX_BUFFERS, *, size_classes: bool = False
    ) -> None:
        self.min_bytes = int(min_bytes)
        self.max_buffers = int(max_buffers)
        self.size_classes = size_classes
        self._buffers: list[np.ndarray] = []  # 1-D uint8, each owning its memory
        self._lock = threading.Lock()  # a prefetch thread and the caller may gather at once

    def __len__(self) -> int:
        return len(self._buffers)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array: a view of a free pooled buffer from
        :attr:`min_bytes` up, else a new array. The caller must write every element."""
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * math.prod(shape)  # math.prod: np.prod costs ~3 us a call
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        with self._lock:
            # the array is made under the lock: from then on it holds the buffer (refcount up)
            return np.ndarray(shape, dtype, self._take(nbytes))

    def _take(self, nbytes: int) -> np.ndarray:
        buffers = self._buffers
        small = -1  # a free buffer too small for this request: replaced if the pool is full
        best: np.ndarray | None = None  # with size classes: the smallest free buffer that fits
        for i in range(len(buffers)):  # not enumerate: its reused result tuple holds a reference
            buf = buffers[i]
            if sys.getrefcount(buf) == _FREE_REFS:
                if buf.nbytes >= nbytes:
                    if not self.size_classes:
                        return buf
                    if best is None or buf.nbytes < best.nbytes:
                        best = buf
                else:
                    small = i
        if best is not None:
            return best
        new = np.empty(1 << (nbytes - 1).bit_length() if self.size_classes else nbytes, np.uint8)
        if len(buffers) < self.max_buffers:
            buffers.append(new)
        elif small >= 0:
            buffers[small] = new  # batches grew: the larger buffer serves both sizes from now on
        return new


def in_range(idx: np.ndarray, n: int) -> bool:
    """Whether every index of ``idx`` is in ``[0, n)`` (what :func:`gather_into` may assume)."""
    return not idx.size or (int(idx.min()) >= 0 and int(idx.max()) < n)


def gather_into(
    column: np.ndarray, rows: np.ndarray, pool: BufferPool | None, *, checked: bool = False
) -> np.ndarray:
    """``column.take(rows, axis=0)`` into an array from ``pool`` when it is large enough to pool.

    ``checked``: every row is known to be in ``[0, len(column))``, so none is checked here.
    Otherwise out-of-range rows raise ``IndexError`` and negative rows read as ``take`` reads
    them. (``take(..., out=)`` in ``mode="raise"`` would allocate a temporary of the batch's
    size.)
    """
    if pool is None or column.itemsize * rows.size * math.prod(column.shape[1:]) < pool.min_bytes:
        return column.take(rows, axis=0)
    if not checked and not in_range(rows, len(column)):
        if rows.size and (int(rows.min()) < -len(column) or int(rows.max()) >= len(column)):
            raise IndexError(f"index out of bounds for a column of {len(column)} rows")
        return column.take(rows, axis=0)  # negative rows: the rare case, without the pool
    out = pool.empty(rows.shape + column.shape[1:], column.dtype)
    column.take(rows, axis=0, out=out, mode="clip")  # in range: "clip" clips nothing
    return out
