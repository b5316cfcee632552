"""Row-wise comparison of arrays, for the checks that ``next/obs[t] == obs[t + 1]``, and the
insertion of episodes' final observations into a block of rows (the flat layout).

Readers and ``rlds inspect --check`` run this over every byte of a pixel dataset. Rows are compared
as 8-byte words, an eighth of an element-wise compare's cost (1.3 GB of frames: 0.8 s element-wise).
Differing bytes mean differing values only for integers, so for other kinds (``-0.0 == 0.0``, NaN
payloads) rows whose bytes differ are compared again by value.
"""

from __future__ import annotations

import numpy as np

#: dtype kinds whose values are equal exactly when their bytes are (integers; for the others,
#: e.g. a structured dtype with float fields, rows whose bytes differ are compared by value)
_BYTES_ARE_VALUES = frozenset("iu")


def rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each row of ``a`` equals the same row of ``b`` (first axis = rows), exactly, with
    NaN equal to NaN. Both have the same shape; a bool per row."""
    n = len(a)
    size = int(np.prod(a.shape[1:], dtype=np.int64))
    if n == 0 or size == 0 or _same_view(a, b):
        return np.ones(n, bool)
    a2, b2 = a.reshape(n, size), b.reshape(n, size)
    if a2.dtype != b2.dtype or a2.dtype.hasobject:
        return _values_equal(a2, b2)
    same = _bytes_equal(a2, b2)
    if a2.dtype.kind not in _BYTES_ARE_VALUES:
        differ = np.flatnonzero(~same)
        if len(differ):
            same[differ] = _values_equal(a2[differ], b2[differ])
    return same


def _same_view(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the same bytes seen the same way (address, shape, strides,
    dtype), hence equal: a recorded episode's ``observation`` and ``next/observation`` can be."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    ia, ib = a.__array_interface__, b.__array_interface__
    return bool(
        ia["data"][0] == ib["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
    )


#: Words compared at a time by :func:`_bytes_equal`: a 64 KiB bool temporary (a block-sized one
#: cost a tenth of a small conversion's page faults).
_CHUNK_WORDS = 1 << 16


def _bytes_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise equality of the bytes of two 2-D arrays of one dtype, in the widest unsigned words
    that divide a row. Differing words are found with a flat compare and only their rows marked
    (a per-row ``.all(axis=1)`` is 6x slower for low-dim rows), unless many words differ.
    """
    n = len(a)
    row_bytes = a.shape[1] * a.dtype.itemsize
    word = next(w for w in (8, 4, 2, 1) if row_bytes % w == 0)
    as_words = np.dtype(f"u{word}")
    aw = np.ascontiguousarray(a).view(np.uint8).reshape(n, row_bytes).view(as_words)
    bw = np.ascontiguousarray(b).view(np.uint8).reshape(n, row_bytes).view(as_words)
    same = np.ones(n, bool)
    step = max(1, _CHUNK_WORDS // aw.shape[1])
    for start in range(0, n, step):  # small temporaries: memory the allocator reuses, no faults
        differ = aw[start : start + step] != bw[start : start + step]
        count = np.count_nonzero(differ)
        if count > len(differ):  # many rows differ: the per-row reduction costs less
            same[start : start + step] = ~differ.any(axis=1)
        elif count:
            same[start + np.flatnonzero(differ.reshape(-1)) // differ.shape[1]] = False
    return same


def _values_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise equality of values, NaN equal to NaN."""
    same = a == b
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        same |= np.isnan(a) & np.isnan(b)
    return np.asarray(same.all(axis=1))


#: Up to this many inserted rows per source row, :func:`insert_rows` copies slices in a loop
#: (one ``memcpy`` per episode); above it, ``np.insert``'s one masked copy costs less.
_SLICE_INSERT_RATIO = 1 / 64


def insert_rows(rows: np.ndarray, ends: np.ndarray, finals: np.ndarray) -> np.ndarray:
    """``np.insert(rows, ends + 1, finals, axis=0)``: ``finals[i]`` placed after row
    ``ends[i]`` (``ends`` sorted, unique, inside ``rows``), the flat layout of a block whose
    episodes end at ``ends``. With few episodes per block it copies slices (``np.insert``'s
    masked copy is 4x slower for a block of low-dim rows)."""
    k = len(ends)
    if k > 256 and k > len(rows) * _SLICE_INSERT_RATIO:
        return np.insert(rows, ends + 1, finals, axis=0)
    out = np.empty((len(rows) + k, *rows.shape[1:]), dtype=rows.dtype)  # as np.insert: finals cast to it
    prev = 0
    for i, stop in enumerate((np.asarray(ends, dtype=np.int64) + 1).tolist()):
        out[prev + i : stop + i] = rows[prev:stop]
        out[stop + i] = finals[i]
        prev = stop
    out[prev + k :] = rows[prev:]
    return out
