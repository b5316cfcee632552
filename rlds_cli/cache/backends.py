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
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np

from rlds_cli.errors import CorruptDatasetError, InvalidKeyError

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

    @abstractmethod
    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        """Check that every file of a column is there, at its full size, without reading its
        data; returns what is wrong, or ``None``."""


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


def save_npz(file: str | os.PathLike[str] | IO[bytes], arrays: Mapping[str, np.ndarray]) -> None:
    """An uncompressed ``.npz`` of ``arrays``, like ``np.savez(file, **arrays)`` (the same zip
    layout) but for any names: ``np.savez`` takes an array named ``allow_pickle`` or ``file`` as
    its own argument (the first vanished from the file, the second raised ``TypeError``)."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:  # as np.savez does (gh-10776)
                np.lib.format.write_array(fh, np.asanyarray(value), allow_pickle=True)


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
        self._fh.write(data.data.cast("B"))  # the array's buffer, as bytes
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
    """Where the column ``key`` lives under ``dataset_dir``: the one place a key becomes a path.

    Keys come from sources and manifests, both untrusted: a key that breaks the strict grammar
    (``..``, an absolute path, an empty part, other characters, too long; see
    :func:`rlds_cli.formats.keys.key_problem`) is refused before any file is opened, so no key
    can name a file outside ``arrays/`` (nor another dataset's arrays).

    Raises:
        InvalidKeyError: The key breaks the grammar.
    """
    from rlds_cli.formats.keys import key_problem  # local: keeps the cache importable on its own

    problem = key_problem(key)
    if problem is not None:
        raise InvalidKeyError(f"array key {key!r} under {dataset_dir} cannot be a file name: {problem}")
    return dataset_dir / ARRAYS_DIR / f"{key}{suffix}"


class MemmapBackend(Backend):
    """One plain ``.npy`` file per key, opened as a read-only memory map."""

    name = "memmap"
    stable_once_open = True

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        return NpyColumnWriter(_key_path(dataset_dir, key, ".npy"), dtype, row_shape)

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        try:
            column = self.open_column(dataset_dir, key)
        except CorruptDatasetError as exc:
            return exc.message
        if column.shape != (rows, *row_shape):
            return f"array file of {key!r} has shape {column.shape}, expected {(rows, *row_shape)}"
        return None

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


#: Array attribute: every chunk of the array was written (even one equal to the fill value),
#: so a chunk file that is missing is damage, not zeros. Arrays written before it was set may
#: omit all-zero chunks and are read as zarr reads them.
ALL_CHUNKS_ATTR = "rlds_all_chunks_written"


class MissingChunkError(CorruptDatasetError):
    """A chunk file of a zarr array that wrote every chunk is gone."""


def _is_chunk_key(key: str) -> bool:
    """``arrays/<key>/c/0/1`` style keys (zarr v3's default chunk key encoding)."""
    parts = key.split("/")
    return "c" in parts and all(p.isdigit() for p in parts[len(parts) - parts[::-1].index("c") :])


def _strict_store(path: Path) -> Any:
    """A read-only local zarr store that refuses to pass off a missing chunk as fill values."""
    from zarr.storage import LocalStore

    class ChunkRequiredStore(LocalStore):
        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            data = await super().get(key, prototype, byte_range)
            if data is None and _is_chunk_key(key):
                raise MissingChunkError(f"zarr chunk {self.root / key} is missing")
            return data

    return ChunkRequiredStore(path, read_only=True)


class ZarrColumn:
    """Read-only view of a zarr array with numpy-style first-axis indexing; damaged chunks
    (missing, truncated, garbage) raise :class:`CorruptDatasetError` naming the array."""

    def __init__(self, array: Any, where: Path) -> None:
        self._array = array
        self._where = where
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        #: Rows per chunk: a scan that reads whole chunks decodes each one once.
        self.chunk_rows = int(array.chunks[0])

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        try:
            if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
                if index.size == 0:
                    return np.empty((0, *self.shape[1:]), self.dtype)
                rows = self._array.oindex[index.ravel()]
                return np.asarray(rows).reshape(index.shape + self.shape[1:])
            return np.asarray(self._array[index])
        except CorruptDatasetError:
            raise
        except (ValueError, RuntimeError, TypeError, OSError, EOFError) as exc:  # codec or store damage
            raise CorruptDatasetError(
                f"zarr array {self._where} is damaged: {type(exc).__name__}: {exc}"
            ) from exc

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self[slice(None)]
        return data.astype(dtype) if dtype is not None else data


class ZarrBackend(Backend):
    """zarr v3 arrays, chunked along time, Blosc/LZ4-compressed."""

    name = "zarr"
    stable_once_open = False

    def _group(self, dataset_dir: Path, mode: Literal["r", "r+", "a", "w", "w-"]) -> Any:
        import zarr  # local import: zarr is only needed for this backend

        return zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode=mode)

    def _open_array(self, dataset_dir: Path, key: str) -> Any:
        import zarr

        _key_path(dataset_dir, key, "")  # refuses a key that is no safe path
        array = zarr.open_group(store=_strict_store(dataset_dir / ARRAYS_DIR), mode="r")[key]
        if not array.attrs.get(ALL_CHUNKS_ATTR):  # written before every chunk was
            array = zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode="r")[key]
        return array

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        from zarr.codecs import BloscCodec

        _key_path(dataset_dir, key, "")  # refuses a key that is no safe path, before any write
        group = self._group(dataset_dir, "a")
        chunks = (zarr_chunk_rows(dtype, row_shape), *row_shape)
        array = group.create_array(
            key,
            shape=(0, *row_shape),
            chunks=chunks,
            dtype=np.dtype(dtype),
            compressors=BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
            fill_value=np.zeros((), dtype=dtype)[()],
            # every chunk is written, so that a missing chunk file reads as damage, never as
            # zeros (and writing skips comparing every chunk with the fill value)
            config={"write_empty_chunks": True},
            attributes={ALL_CHUNKS_ATTR: True},
        )
        return ZarrColumnWriter(array, tuple(row_shape))

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        try:
            array = self.open_column(dataset_dir, key)._array
        except CorruptDatasetError as exc:
            return exc.message
        if tuple(array.shape) != (rows, *row_shape):
            return f"zarr array {key!r} has shape {tuple(array.shape)}, expected {(rows, *row_shape)}"
        if not array.attrs.get(ALL_CHUNKS_ATTR):
            return None  # written when all-zero chunks were left out: nothing to count
        grid = [-(-size // chunk) for size, chunk in zip(array.shape, array.chunks, strict=True)]
        base = _key_path(dataset_dir, key, "") / "c"
        for index in np.ndindex(*grid):
            path = base.joinpath(*(str(i) for i in index)) if index else base
            if not path.is_file():
                return f"zarr chunk {path} is missing"
        return None

    def open_column(self, dataset_dir: Path, key: str) -> ZarrColumn:
        try:
            return ZarrColumn(self._open_array(dataset_dir, key), dataset_dir / ARRAYS_DIR / key)
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
