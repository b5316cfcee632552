"""The storage backend interface: how one column (one TED key) is written and read on disk.

:func:`key_path` is where a key's files live.

The two implementations are :mod:`rlds_cli.cache.backends.memmap` and
:mod:`rlds_cli.cache.backends.zarr`; :mod:`rlds_cli.cache.backends` names them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.layout import ARRAYS_DIR
from rlds_cli.cache.ted import key_problem
from rlds_cli.errors import InvalidKeyError


class ColumnWriter(ABC):
    """Appends rows of one key during a build."""

    @abstractmethod
    def append(self, rows: np.ndarray) -> None:
        """Append rows (first axis = time) of the column's dtype and row shape."""

    @abstractmethod
    def close(self, *, fsync: bool) -> int:
        """Finish the column and return its row count."""

    def write_behind(self) -> None:  # noqa: B027 (optional: zarr writes each chunk to a new file)
        """Start flushing the rows appended so far in the background (a hint; the closing fsync
        is the guarantee)."""

    def abort(self) -> None:  # noqa: B027 (optional: a writer that holds nothing open)
        """End a column that will not be published: release open files and threads, dropping
        errors of unfinished writes."""


class RegionWriter(ABC):
    """Rows ``[start, stop)`` of a preallocated column, written by one writer: fill
    :attr:`rows` (a writable array of the region's shape), then :meth:`close`."""

    rows: np.ndarray

    @abstractmethod
    def close(self, *, fsync: bool) -> None:
        """Store the rows (``fsync``: make them durable now)."""


class Backend(ABC):
    """A way of storing columns in a dataset directory."""

    name: str
    #: Whether an opened column keeps reading the files it opened (``True``: a memory map) or
    #: reads by path at every access (``False``: zarr), which sees a replaced directory.
    stable_once_open: bool

    @abstractmethod
    def create_column(
        self,
        dataset_dir: Path,
        key: str,
        dtype: np.dtype,
        row_shape: tuple[int, ...],
        rows: int | None = None,
    ) -> ColumnWriter:
        """Start a new column for ``key`` inside a build directory. ``rows``: the rows it will
        hold, where the caller knows them (a backend may then write at the disk's rate; exactly
        that many must be appended)."""

    @abstractmethod
    def open_column(self, dataset_dir: Path, key: str) -> Any:
        """Open a column read-only. The result supports ``len``, ``shape``, ``dtype``, slices
        and integer-array indexing along the first axis, returning numpy arrays."""

    def read_column(self, dataset_dir: Path, key: str, stop: int) -> np.ndarray:
        """Rows ``[0, stop)`` of a stored column, read into RAM (cheaper than :meth:`open_column`
        for small columns read whole)."""
        return np.array(self.open_column(dataset_dir, key)[:stop])

    @abstractmethod
    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        """Check that every file of a column exists at full size, without reading data; returns
        the problem, or ``None``."""

    def region_rows(self, dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
        """The row multiple a region of :meth:`open_region` must start at (and end at, unless at
        the column's end), so two regions never write the same file."""
        return 1

    @abstractmethod
    def preallocate(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...], rows: int
    ) -> None:
        """Create column ``key`` with ``rows`` rows, to be written by :meth:`open_region`.

        Raises:
            DiskFullError: The disk cannot hold the column (where the backend can tell).
        """

    def preallocated_bytes(self, dtype: np.dtype, row_shape: tuple[int, ...], rows: int) -> int:
        """Disk bytes :meth:`preallocate` takes at once (0: files grow as regions are written)."""
        return 0

    @abstractmethod
    def open_region(self, dataset_dir: Path, key: str, start: int, stop: int) -> RegionWriter:
        """Rows ``[start, stop)`` of a preallocated column, for writing (see :meth:`region_rows`).

        Raises:
            ValueError: The region is not aligned, or outside the column.
        """

    def check_preallocated(
        self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]
    ) -> str | None:
        """Check a preallocated column is still there at full size (for a resumed job); returns
        the problem, or ``None``."""
        return self.check_column(dataset_dir, key, rows, row_shape)


# ----------------------------------------------------------------------------- memmap


def key_path(dataset_dir: Path, key: str, suffix: str) -> Path:
    """The path of column ``key`` under ``dataset_dir``.

    Keys are untrusted: one breaking the grammar of :func:`rlds_cli.cache.ted.key_problem`
    (``..``, absolute, empty part, other characters, too long) is refused before any file is
    opened, so no key names a file outside ``arrays/``.

    Raises:
        InvalidKeyError: The key breaks the grammar.
    """
    problem = key_problem(key)
    if problem is not None:
        raise InvalidKeyError(f"array key {key!r} under {dataset_dir} cannot be a file name: {problem}")
    return dataset_dir / ARRAYS_DIR / f"{key}{suffix}"
