"""A growing dataset's columns, made of its segments' columns.

:class:`ConcatColumn` reads one key over several segments end to end. :class:`TailRun` copies
the rows of the small trailing segments (one per commit) once into one RAM array per key, so
the tail is one ``take`` rather than one per file. A refresh appends new rows (the array
doubles), drops evicted ones from the front (an offset; compacted when over half is dead) and
maps merges of held segments onto their rows: following a dataset costs the new rows only.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ConcatColumn:
    """One stored key over several segments, end to end, with numpy-style first-axis reads
    (integer arrays of any shape, integers, slices).

    Args:
        parts: Per segment: ``(column getter, first row, stop row)`` in that segment's column.
        row_shape: The per-row shape; ``dtype``: the dtype.
    """

    def __init__(self, parts: list[tuple[Any, int, int]], row_shape: tuple[int, ...], dtype: Any) -> None:
        self._parts = parts
        self._opened: list[Any] = [None] * len(parts)
        sizes = np.array([stop - start for _, start, stop in parts], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        # global row -> row of its part's column: minus the part's offset, plus its first row
        self._shift = self.offsets[:-1] - np.array([start for _, start, _ in parts], np.int64)
        self.shape = (int(self.offsets[-1]), *row_shape)
        self.dtype = np.dtype(dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def _col(self, p: int) -> Any:
        col = self._opened[p]
        if col is None:
            getter, _, _ = self._parts[p]
            col = getter()
            if isinstance(col, np.memmap):  # a plain view: a memmap's takes make memmaps (3 us each)
                col = col.view(np.ndarray)
            self._opened[p] = col
        return col

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self[slice(None)]
        return data.astype(dtype) if dtype is not None else data

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step != 1:
                return self[np.arange(start, stop, step)]
            pieces = []
            for p in range(len(self._parts)):
                lo, hi = max(start, int(self.offsets[p])), min(stop, int(self.offsets[p + 1]))
                if lo < hi:
                    base = self._parts[p][1] - int(self.offsets[p])
                    pieces.append(np.asarray(self._col(p)[lo + base : hi + base]))
            if not pieces:
                return np.empty((0, *self.shape[1:]), self.dtype)
            return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        idx = np.asarray(index, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= self.shape[0]):
            raise IndexError(f"row index out of range for a column of {self.shape[0]} rows")
        which = np.searchsorted(self.offsets, flat, side="right") - 1
        rows = flat - self._shift[which]
        counts = np.bincount(which, minlength=len(self._parts))
        if flat.size and counts.max() == flat.size:  # one part: one take
            out = self._take(int(which[0]), rows)
            return out.reshape(*idx.shape, *self.shape[1:])
        out = np.empty((flat.size, *self.shape[1:]), self.dtype)
        # group the rows by part with one sort and one count, not one mask per part
        order = np.argsort(which, kind="stable")
        bounds = np.cumsum(counts).tolist()
        for p in np.flatnonzero(counts).tolist():
            sel = order[bounds[p] - int(counts[p]) : bounds[p]]
            out[sel] = self._take(p, rows[sel])
        return out.reshape(*idx.shape, *self.shape[1:])

    def _take(self, p: int, rows: np.ndarray) -> np.ndarray:
        col = self._col(p)
        return col.take(rows, axis=0) if isinstance(col, np.ndarray) else np.asarray(col[rows])

    @property
    def stored_format(self) -> Any:
        """The frame format every part stores its rows in, where each can give them as stored
        (:meth:`encoded_rows`); ``None`` otherwise (a part read into memory, or of another format)."""
        formats = [getattr(self._col(p), "stored_format", None) for p in range(len(self._parts))]
        return (
            formats[0] if formats and None not in formats and all(f == formats[0] for f in formats) else None
        )

    def encoded_rows(self, rows: np.ndarray) -> Any:
        """Rows ``rows`` as stored (image files, in order), where :attr:`stored_format` is not ``None``."""
        from rlds_cli.frames.codecs import EncodedFrames

        flat = np.asarray(rows, np.int64).reshape(-1)
        which = np.searchsorted(self.offsets, flat, side="right") - 1
        files: list[Any] = [None] * len(flat)
        fmt = None
        for p in np.unique(which).tolist():
            at = np.flatnonzero(which == p)
            part = self._col(p).encoded_rows(flat[at] - self._shift[p])
            fmt = part.format  # every part's (stored_format checked it): not worked out again per call
            for i, data in zip(at.tolist(), part.data, strict=True):
                files[i] = data
        return EncodedFrames(files, fmt if fmt is not None else self.stored_format)


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
        self._shrunk = False  # rows dropped from the end: the next append copies to a fresh array

    def view(self, tail: Any) -> np.ndarray:
        """The live rows of segments ``tail.ids`` as a read-only view of the buffer, reusing
        what it holds. ``tail`` also gives ``first_skip`` (rows skipped in the first segment),
        ``read(i)``, ``rows(i)`` and ``merged(seg)`` (see :meth:`_map_merges`)."""
        ids = list(tail.ids)
        if not ids:
            return self._buffer[:0]
        keep = self._reusable(ids, tail)
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

    def _reusable(self, ids: list[bytes], tail: Any) -> int | None:
        """``None`` unless ``ids`` is the buffer's segments minus a prefix, plus new ones (after
        :meth:`_map_merges`)."""
        if not self._segments:
            return 0
        self._map_merges(ids, tail)
        try:
            at = self._segments.index(ids[0])
        except ValueError:
            return None
        held = self._segments[at:]
        return len(held) if ids[: len(held)] == held else None

    def _map_merges(self, ids: list[bytes], tail: Any) -> None:
        """Where a segment of ``ids`` merges consecutive held segments (``tail.merged(seg)``),
        hold it in their place without reading: its rows are theirs minus leading evicted ones.
        A merge that also took newer segments replaces the buffer's end and is read whole.
        Merges of merges are followed."""
        held = set(self._segments)
        for i, seg in enumerate(ids):
            if seg in held:
                continue
            parts = self._expand(seg, tail, held)
            if parts is None:
                continue
            merged = set(parts)
            inside = [k for k, s in enumerate(self._segments) if s in merged]
            if not inside:
                continue
            a, b = inside[0], inside[-1]
            first = parts.index(self._segments[a])
            if self._segments[a : b + 1] != parts[first : first + b - a + 1]:
                continue  # not the same run, in order: read afresh
            if first + b - a + 1 < len(parts):  # it merged newer segments too
                if b != len(self._segments) - 1:
                    continue
                self._used = self._starts[a]
                del self._segments[a:], self._starts[a:]
                self._shrunk = True  # written anew into a fresh array: older views keep theirs
                return
            end = self._starts[b + 1] if b + 1 < len(self._starts) else self._used
            start = end - tail.rows(i)
            if start < self._starts[a]:
                continue
            self._segments[a : b + 1] = [seg]
            self._starts[a : b + 1] = [start]
            held = set(self._segments)

    @staticmethod
    def _expand(seg: bytes, tail: Any, held: set[bytes], depth: int = 0) -> list[bytes] | None:
        """The segments ``seg`` replaced, unheld merges among them expanded recursively;
        ``None`` where ``seg`` is no known merge."""
        parts = tail.merged(seg)
        if parts is None or depth > 8:
            return None
        out: list[bytes] = []
        for part in parts:
            inner = None if part in held else TailRun._expand(part, tail, held, depth + 1)
            out += [part] if inner is None else inner
        return out

    def _append(self, ids: list[bytes], rows: list[np.ndarray]) -> None:
        base = self._starts[0] if self._starts else 0
        live = self._used - base
        need = live + sum(len(r) for r in rows)
        if need > len(self._buffer) - base or base > len(self._buffer) // 2 or self._shrunk:
            self._shrunk = False
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
