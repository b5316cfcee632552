"""The small segments at the end of a growing dataset, read from one array in RAM.

Each commit is a segment of its own, so while writers append, the newest part of a growing
dataset is many small segments. Gathering rows spread over hundreds of files costs a ``take``
per file; a :class:`TailRun` copies each small segment's rows once (a segment never changes)
into one growing array per key, so the whole tail is one ``take``. A refresh appends the new
segments' rows (amortized: the array doubles) and drops evicted ones from the front (an offset;
the live rows are copied to a fresh array when more than half of it is dead), so following a
dataset costs the new rows, not the dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A segment at most this many rows (and this many bytes) long is read into the tail.
SMALL_ROWS = 16_384
SMALL_BYTES = 4 << 20


class TailRun:
    """One key's rows of a run of consecutive small segments, in one array.

    Args:
        row_shape: The per-row shape; ``dtype``: the dtype.
    """

    def __init__(self, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._row_shape = row_shape
        self._dtype = np.dtype(dtype)
        self._buffer = np.empty((0, *row_shape), self._dtype)
        self._used = 0
        self._segments: list[bytes] = []
        self._starts: list[int] = []  # each segment's first row in the buffer

    def view(self, tail: Any) -> np.ndarray:
        """The live rows of the segments ``tail.ids`` (in order; the first ``tail.first_skip``
        rows of the first one skipped; ``tail.read(i)`` reads segment ``i``'s rows), as a
        read-only view of the buffer, reusing what is there already."""
        ids = list(tail.ids)
        if not ids:
            return self._buffer[:0]
        keep = self._reusable(ids)
        if keep is None:  # a fresh buffer: older views keep reading the old one
            self._buffer = np.empty((0, *self._row_shape), self._dtype)
            self._segments, self._starts, self._used = [], [], 0
            keep = 0
        else:
            # drop the segments before ids[0] (evicted or compacted away): an offset
            drop = self._segments.index(ids[0]) if self._segments else 0
            self._segments, self._starts = self._segments[drop:], self._starts[drop:]
            keep = len(self._segments)
        self._append(ids[keep:], [tail.read(i) for i in range(keep, len(ids))])
        out = self._buffer[self._starts[0] + tail.first_skip : self._used]
        out.flags.writeable = False
        return out

    def _reusable(self, ids: list[bytes]) -> int | None:
        """``None`` unless ``ids`` is the buffer's segments minus a prefix, plus new ones."""
        if not self._segments:
            return 0
        try:
            at = self._segments.index(ids[0])
        except ValueError:
            return None
        held = self._segments[at:]
        return len(held) if ids[: len(held)] == held else None

    def _append(self, ids: list[bytes], rows: list[np.ndarray]) -> None:
        base = self._starts[0] if self._starts else 0
        live = self._used - base
        need = live + sum(len(r) for r in rows)
        if need > len(self._buffer) - base or base > len(self._buffer) // 2:
            fresh = np.empty((max(need * 2, 1024), *self._row_shape), self._dtype)
            fresh[:live] = self._buffer[base : self._used]
            self._buffer = fresh
            self._starts = [s - base for s in self._starts]
            self._used = live
        for seg, part in zip(ids, rows, strict=True):
            self._segments.append(seg)
            self._starts.append(self._used)
            self._buffer[self._used : self._used + len(part)] = part
            self._used += len(part)
