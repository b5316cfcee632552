"""Zarr columns: numpy-style first-axis reads of a zarr array this package wrote, through
:class:`~rlds_cli.cache.zarr_chunks._ChunkReader` where the layout allows; damage of any kind is
:class:`~rlds_cli.errors.CorruptDatasetError` naming the array (see
:mod:`rlds_cli.cache.zarr_backend` for the layout and the writer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.zarr_chunks import _ChunkReader
from rlds_cli.errors import CorruptDatasetError, RldsError


class ZarrColumn:
    """Read-only view of a zarr array with numpy-style first-axis indexing; damaged chunks
    (missing, truncated, garbage) raise :class:`CorruptDatasetError` naming the array.

    Integer-array and slice reads of the layouts this package writes go through
    :class:`_ChunkReader` (each needed chunk read and decoded once, in threads); anything else is
    zarr's own indexing."""

    def __init__(self, array: Any, where: Path | str, reader: _ChunkReader | None = None) -> None:
        self._array = array
        self._where = where
        self._reader = reader
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        #: Rows per chunk (a shard's rows, for a sharded array): a scan that reads whole ones
        #: decodes each chunk once.
        shards = getattr(array, "shards", None)
        self.chunk_rows = int(shards[0]) if shards else int(array.chunks[0])

    @property
    def one_row_chunks(self) -> bool:
        """Each row is a chunk of its own, read by the chunk reader (frames): a read of rows
        ``r`` and ``r + 1`` together decodes their common rows once (see
        :class:`~rlds_cli.cache.reader.TedReader`)."""
        return self._reader is not None and self._reader.chunk_rows == 1

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        try:
            reader = self._reader
            if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
                if index.size == 0:
                    return np.empty((*index.shape, *self.shape[1:]), self.dtype)
                if reader is None:
                    rows = self._array.oindex[index.ravel()]
                    return np.asarray(rows).reshape(index.shape + self.shape[1:])
                flat = index.reshape(-1).astype(np.int64, copy=False)
                n = self.shape[0]
                if int(flat.min()) < -n or int(flat.max()) >= n:
                    raise IndexError(f"row index out of range for {self._where} with {n} rows")
                flat = np.where(flat < 0, flat + n, flat)
                return reader.gather(flat).reshape(index.shape + self.shape[1:])
            if reader is not None and isinstance(index, slice):
                start, stop, step = index.indices(self.shape[0])
                if step == 1:
                    return reader.range(start, stop)
                return reader.gather(np.arange(start, stop, step, dtype=np.int64))
            if reader is not None and isinstance(index, int | np.integer):
                n = self.shape[0]
                if not -n <= index < n:
                    raise IndexError(f"row {index} out of range for {self._where} with {n} rows")
                return reader.gather(np.array([int(index) % n], np.int64))[0]
            return np.asarray(self._array[index])
        except RldsError:  # damage named already, or a remote store that cannot be reached
            raise
        # codec or store damage; a garbage Blosc header can also make the codec raise SystemError
        # (a negative size) or MemoryError (a huge one)
        except (ValueError, RuntimeError, TypeError, OSError, EOFError, SystemError, MemoryError) as exc:
            raise CorruptDatasetError(
                f"zarr array {self._where} is damaged: {type(exc).__name__}: {exc}"
            ) from exc

    def read_into(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (int64, any shape, in range ``[0, len)``) into ``out`` (C-contiguous, of
        shape ``rows.shape + row shape`` and this dtype): chunks of one row decode straight into
        it (a frame-stack block), no intermediate batch."""
        if self._reader is None or rows.size == 0:
            out[...] = self[rows]
            return out
        flat = rows.reshape(-1)
        if not out.flags.c_contiguous:
            out[...] = self[rows]
            return out
        try:
            self._reader.gather(flat, out.reshape(len(flat), *self.shape[1:]))
        except RldsError:
            raise
        except (ValueError, RuntimeError, TypeError, OSError, EOFError, SystemError, MemoryError) as exc:
            raise CorruptDatasetError(
                f"zarr array {self._where} is damaged: {type(exc).__name__}: {exc}"
            ) from exc
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self[slice(None)]
        return data.astype(dtype) if dtype is not None else data
