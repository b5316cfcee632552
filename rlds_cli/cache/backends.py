"""Storage backends: how one column (one TED key) is written and read on disk.

Two backends share one small interface, so the builder and the reader never care which is
in use:

* ``memmap`` (default): one ``.npy`` file per key under ``arrays/`` (``arrays/next/reward.npy``),
  uncompressed and C-contiguous, that plain ``numpy.load(path, mmap_mode="r")`` opens. Rows
  are appended as they stream in; the header is written with room to spare and patched with
  the final row count when the column is closed.
* ``zarr``: one zarr v3 group at ``arrays/`` with one array per key, chunked along time and
  compressed with Blosc/LZ4 + byte shuffle (fast to decode, which matters more for sampling
  than the last percent of ratio).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import CorruptDatasetError

ARRAYS_DIR = "arrays"


class ColumnWriter(ABC):
    """Appends rows of one key during a build."""

    @abstractmethod
    def append(self, rows: np.ndarray) -> None:
        """Append rows (first axis = time) of the column's dtype and row shape."""

    @abstractmethod
    def close(self, *, fsync: bool) -> int:
        """Finish the column and return its row count."""


class Backend(ABC):
    """A way of storing columns in a dataset directory."""

    name: str
    #: Whether an opened column keeps reading the files it opened (``True``: a memory map) or
    #: reads by path at every access (``False``: zarr chunks), which matters when the dataset
    #: directory is replaced under a reader.
    stable_once_open: bool

    @abstractmethod
    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        """Start a new column for ``key`` inside a build directory."""

    @abstractmethod
    def open_column(self, dataset_dir: Path, key: str) -> Any:
        """Open a column read-only. The result supports ``len``, ``shape``, ``dtype``, slices
        and integer-array indexing along the first axis, returning numpy arrays."""


# ----------------------------------------------------------------------------- memmap

_NPY_MAGIC = b"\x93NUMPY\x01\x00"
#: Bytes reserved for the .npy preamble + header; a multiple of 64 so the data stays aligned.
NPY_HEADER_BYTES = 256


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` header padded to exactly :data:`NPY_HEADER_BYTES` bytes."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    body_len = NPY_HEADER_BYTES - len(_NPY_MAGIC) - 2
    if len(text) + 1 > body_len:
        raise ValueError(f"npy header too long for shape {shape} and dtype {dtype}")
    body = text.ljust(body_len - 1) + "\n"
    return _NPY_MAGIC + body_len.to_bytes(2, "little") + body.encode("latin1")


class NpyColumnWriter(ColumnWriter):
    """Streams rows into a ``.npy`` file; the header is patched on close."""

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(row_shape)
        self.rows = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._fh.write(npy_header(self.dtype, (0, *self.row_shape)))

    def append(self, rows: np.ndarray) -> None:
        data = np.ascontiguousarray(rows, dtype=self.dtype)
        if data.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path.name}: rows of shape {data.shape[1:]}, expected {self.row_shape}")
        self._fh.write(memoryview(data).cast("B"))
        self.rows += data.shape[0]

    def close(self, *, fsync: bool) -> int:
        self._fh.seek(0)
        self._fh.write(npy_header(self.dtype, (self.rows, *self.row_shape)))
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())
        self._fh.close()
        return self.rows


def _key_path(dataset_dir: Path, key: str, suffix: str) -> Path:
    return dataset_dir / ARRAYS_DIR / f"{key}{suffix}"


class MemmapBackend(Backend):
    """One plain ``.npy`` file per key, opened as a read-only memory map."""

    name = "memmap"
    stable_once_open = True

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        return NpyColumnWriter(_key_path(dataset_dir, key, ".npy"), dtype, row_shape)

    def open_column(self, dataset_dir: Path, key: str) -> np.ndarray:
        path = _key_path(dataset_dir, key, ".npy")
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise CorruptDatasetError(f"array file {path} is missing") from None
        except ValueError as exc:  # a header that promises more bytes than the file has
            raise CorruptDatasetError(f"array file {path} is damaged: {exc}") from exc


# ----------------------------------------------------------------------------- zarr

#: Uncompressed bytes per zarr chunk: small enough that a random read decodes little.
ZARR_CHUNK_BYTES = 512 * 1024


def zarr_chunk_rows(dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
    """Rows per chunk so that one chunk holds about :data:`ZARR_CHUNK_BYTES`."""
    row_bytes = max(1, np.dtype(dtype).itemsize * int(np.prod(row_shape, dtype=np.int64)))
    return int(max(1, min(1 << 16, ZARR_CHUNK_BYTES // row_bytes)))


class ZarrColumnWriter(ColumnWriter):
    """Stages rows in one fixed buffer of whole chunks and writes it when full, so no chunk is
    ever rewritten and the same buffer is reused for the whole build (no per-block
    concatenation, which kept growing the heap)."""

    #: Chunks staged before a write.
    STAGE_CHUNKS = 8

    def __init__(self, array: Any, row_shape: tuple[int, ...]) -> None:
        self.array = array
        self.row_shape = row_shape
        self.chunk_rows = int(array.chunks[0])
        self.rows = 0
        self._stage: np.ndarray | None = None  # allocated on the first append
        self._staged = 0

    def append(self, rows: np.ndarray) -> None:
        data = np.asarray(rows, dtype=self.array.dtype)
        if data.shape[1:] != self.row_shape:
            raise ValueError(f"{self.array.path}: rows of shape {data.shape[1:]}, expected {self.row_shape}")
        if self._stage is None:
            self._stage = np.empty((self.STAGE_CHUNKS * self.chunk_rows, *self.row_shape), self.array.dtype)
        done = 0
        while done < data.shape[0]:
            take = min(self._stage.shape[0] - self._staged, data.shape[0] - done)
            self._stage[self._staged : self._staged + take] = data[done : done + take]
            self._staged += take
            done += take
            if self._staged == self._stage.shape[0]:
                self._flush()

    def _flush(self) -> None:
        if not self._staged or self._stage is None:
            return
        start = self.rows
        self.array.resize((start + self._staged, *self.row_shape))
        self.array[start : start + self._staged] = self._stage[: self._staged]
        self.rows += self._staged
        self._staged = 0

    def close(self, *, fsync: bool) -> int:
        self._flush()
        self._stage = None
        # zarr's local store writes each chunk with a fresh file; durability of the whole
        # directory tree comes from the builder's final directory fsync.
        return self.rows


class ZarrColumn:
    """Read-only view of a zarr array with numpy-style first-axis indexing."""

    def __init__(self, array: Any) -> None:
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
            if index.size == 0:
                return np.empty((0, *self.shape[1:]), self.dtype)
            return np.asarray(self._array.oindex[index.ravel()]).reshape(index.shape + self.shape[1:])
        return np.asarray(self._array[index])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._array[...])
        return data.astype(dtype) if dtype is not None else data


class ZarrBackend(Backend):
    """zarr v3 arrays, chunked along time, Blosc/LZ4-compressed."""

    name = "zarr"
    stable_once_open = False

    def _group(self, dataset_dir: Path, mode: str) -> Any:
        import zarr  # local import: zarr is only needed for this backend

        return zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode=mode)

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        from zarr.codecs import BloscCodec

        group = self._group(dataset_dir, "a")
        chunks = (zarr_chunk_rows(dtype, row_shape), *row_shape)
        array = group.create_array(
            key,
            shape=(0, *row_shape),
            chunks=chunks,
            dtype=np.dtype(dtype),
            compressors=BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
            fill_value=np.zeros((), dtype=dtype)[()],
        )
        return ZarrColumnWriter(array, tuple(row_shape))

    def open_column(self, dataset_dir: Path, key: str) -> ZarrColumn:
        try:
            return ZarrColumn(self._group(dataset_dir, "r")[key])
        except (KeyError, FileNotFoundError) as exc:
            raise CorruptDatasetError(
                f"zarr array {key!r} is missing under {dataset_dir / ARRAYS_DIR}"
            ) from exc


BACKENDS: dict[str, Backend] = {b.name: b for b in (MemmapBackend(), ZarrBackend())}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``memmap`` or ``zarr``)."""
    try:
        return BACKENDS[name]
    except KeyError:
        from rlds_cli.errors import CacheError

        raise CacheError(
            f"unknown storage backend {name!r}", hint=f"use one of: {', '.join(BACKENDS)}"
        ) from None
