"""Batch output arrays reused once nothing references them: gathers that do not page-fault.

Why: a batch of pixel rows is megabytes (256 gray 84x84 frames: 1.8 MB a key). glibc serves
allocations that large with ``mmap`` and gives them back with ``munmap`` when the batch dies (or
trims its heap top back to the kernel), so every new batch touches fresh pages: one page fault
per 4 KiB, ~900 a batch of 256 gray frames, which made such a batch cost 3-4x in a fresh process
what it costs once the allocator's thresholds have grown, and the cost per frame jump once a
batch passes glibc's largest dynamic threshold (32 MiB). Reusing the output arrays keeps their
pages mapped; changing ``mallopt`` thresholds instead would change the whole process's allocator
behaviour behind the user's back.

Lifetime rule: **a buffer is handed out again only when no Python object references it any
more**, i.e. once every array, view and tensor (``torch.from_numpy`` keeps its array) of the batch
that used it is gone. A batch the caller keeps (a list of batches, a replay of old batches) is
therefore never overwritten: while all pooled buffers are held, a gather allocates a new array
(what it did without the pool). The test is CPython's reference count of the pool's own array,
which every view of it holds (numpy views keep their base). Memory: up to
:data:`MAX_BUFFERS` buffers per pool stay allocated between batches (as many as were held at the
same time, at most), and are freed with the pool's owner.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np

#: Outputs smaller than this are allocated as usual: glibc serves them from its heap without
#: faults once its dynamic mmap threshold has grown past them (measured: a batch of 32 gray
#: 84x84 frames, 225 KB a key, faults no more after its first batch; 128 frames, 900 KB, ~200
#: faults a batch), and the pool's few microseconds would cost more than they save.
MIN_BYTES = 256 * 1024
#: Buffers a pool keeps: one per large key (image keys, their next/ keys) per batch held at once
#: (the loop's, the one being made, prefetched ones): 3 cameras x 2 x 4 batches fit.
MAX_BUFFERS = 32
# references to a free buffer seen by sys.getrefcount in _take: the pool's list, the local
# variable and getrefcount's own argument
_FREE_REFS = 3


class BufferPool:
    """Reusable output arrays for a gather (see the module for the lifetime rule).

    Args:
        min_bytes: Outputs below this size are plain new arrays.
        max_buffers: Buffers kept at most.
        size_classes: New buffers are a power of two bytes, and an output takes the smallest
            free buffer it fits in: outputs of nearly one size (a scan's temporaries, a few
            bytes apart from key to key) share buffers, and a small one leaves a large one to
            the output that needs it. ``False`` (a loader's batches, one size a key): buffers
            of the outputs' sizes, the first free one that fits.
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
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``: a view of a free pooled
        buffer when the array is at least :attr:`min_bytes`, else (or when every buffer is held)
        a new array. The caller must write every element."""
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

    ``checked``: the caller has made sure every row is in ``[0, len(column))`` (e.g. with
    :func:`in_range` on the step indices they derive from), so no check is made here. Otherwise
    the rows are checked (out-of-range rows raise ``IndexError``, as ``take`` does; negative rows
    are read as ``take`` reads them). The check is not ``take``'s own because ``take(..., out=)``
    in its default ``mode="raise"`` gathers into a temporary array first (a second allocation of
    the batch's size: the faults this avoids) and copies that into ``out``.
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
