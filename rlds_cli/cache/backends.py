"""Storage backends: how one column (one TED key) is written and read on disk.

Two backends share one small interface, so the builder and the reader never care which is
in use:

* ``memmap`` (default): one ``.npy`` file per key under ``arrays/`` (``arrays/next/reward.npy``),
  uncompressed and C-contiguous, that plain ``numpy.load(path, mmap_mode="r")`` opens. Rows
  are appended as they stream in; the header is written with room to spare and patched with
  the final row count when the column is closed.
* ``zarr``: one zarr v3 group at ``arrays/`` with one array per key, chunked along time in
  small chunks (about 64 KiB, so a random row decodes little) grouped into shards (about 16 MiB
  per file) and compressed with Blosc/LZ4 + byte shuffle (fast to decode, which matters more
  for sampling than the last percent of ratio). Datasets written before sharding (512 KiB
  chunks, one file each) keep reading.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np

from rlds_cli.errors import CorruptDatasetError, InvalidKeyError

if TYPE_CHECKING:  # imported when a read needs threads: preprocess workers import this module
    from concurrent.futures import ThreadPoolExecutor

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

#: Uncompressed bytes per zarr chunk of a newly written array (at least one row). A uniform
#: random batch needs one chunk per row and decodes all of it, at about 3 GB/s: with 512 KiB
#: chunks a batch of 256 (3, 84, 84) uint8 frames decoded 130 MB to use 5 MB; now a frame is a
#: chunk, decoded straight into the batch.
ZARR_CHUNK_BYTES = 16 * 1024
#: Uncompressed bytes per zarr shard (one file holding many chunks, see zarr's sharding codec):
#: small chunks without sharding would be one file each (70,000 files for 200k frames). 0 writes
#: no shards (one file per chunk, the layout before sharding).
ZARR_SHARD_BYTES = 16 * 1024 * 1024
#: The most rows in one chunk: a random read of a scalar column decodes at most 1,024 rows (8
#: KiB of int64) for the one it needs.
ZARR_MAX_CHUNK_ROWS = 1024
#: The most chunks in one shard. A shard's index takes 16 bytes a chunk and is read (and
#: checksummed) whole when the shard is first opened: without a cap, a bool column's shard
#: would index 16,384 chunks, 256 KiB of index even for a dataset of ten steps.
ZARR_MAX_CHUNKS_PER_SHARD = 1024
#: Blosc settings of every chunk: LZ4, level 5, byte shuffle.
_BLOSC_CNAME, _BLOSC_CLEVEL = b"lz4", 5


def zarr_chunk_rows(dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
    """Rows per chunk so that one chunk holds about :data:`ZARR_CHUNK_BYTES` (at least one row)."""
    row_bytes = max(1, np.dtype(dtype).itemsize * int(np.prod(row_shape, dtype=np.int64)))
    return int(max(1, min(ZARR_MAX_CHUNK_ROWS, ZARR_CHUNK_BYTES // row_bytes)))


def zarr_shard_rows(dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
    """Rows per shard: a whole number of chunks holding about :data:`ZARR_SHARD_BYTES` (0: no
    shards)."""
    if ZARR_SHARD_BYTES <= 0:
        return 0
    chunk = zarr_chunk_rows(dtype, row_shape)
    row_bytes = max(1, np.dtype(dtype).itemsize * int(np.prod(row_shape, dtype=np.int64)))
    return chunk * int(max(1, min(ZARR_MAX_CHUNKS_PER_SHARD, ZARR_SHARD_BYTES // (chunk * row_bytes))))


class ZarrColumnWriter(ColumnWriter):
    """Stages rows in one fixed buffer of whole chunks (of a whole shard, for a sharded array)
    and writes it when full, so no chunk or shard is ever rewritten and the same buffer is
    reused for the whole build (no per-block concatenation, which kept growing the heap)."""

    #: Chunks staged before a write, for an array without shards.
    STAGE_CHUNKS = 8

    def __init__(self, array: Any, row_shape: tuple[int, ...], where: Path | None = None) -> None:
        self.array = array
        self.row_shape = row_shape
        shards = getattr(array, "shards", None)
        # a write of whole shards: a shard is written once, never read back to merge
        self.stage_rows = int(shards[0]) if shards else self.STAGE_CHUNKS * int(array.chunks[0])
        #: Where the array's files go, when this writer encodes its shards itself (see _write_shard).
        self._where = where if shards else None
        self.rows = 0
        self._stage: np.ndarray | None = None  # allocated on the first append
        self._staged = 0

    def append(self, rows: np.ndarray) -> None:
        data = np.asarray(rows, dtype=self.array.dtype)
        if data.shape[1:] != self.row_shape:
            raise ValueError(f"{self.array.path}: rows of shape {data.shape[1:]}, expected {self.row_shape}")
        if self._stage is None:
            self._stage = np.empty((self.stage_rows, *self.row_shape), self.array.dtype)
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
        if self._where is not None:
            self._write_shard(start // self.stage_rows, self._stage[: self._staged])
        else:
            self.array.resize((start + self._staged, *self.row_shape))
            self.array[start : start + self._staged] = self._stage[: self._staged]
        self.rows += self._staged
        self._staged = 0

    def _write_shard(self, s: int, rows: np.ndarray) -> None:
        """Encode shard ``s`` as zarr's ``sharding_indexed`` codec lays it out (the chunks, each
        ``bytes`` + Blosc/LZ4, then the index of ``(offset, length)`` per chunk in little-endian
        uint64 and its crc32c) and write its file. zarr's own writer costs 3x the CPU of a
        memmap build in per-chunk machinery; this is one Blosc call per chunk."""
        import google_crc32c  # zarr's dependency for its crc32c codec
        from numcodecs import blosc  # type: ignore[import-untyped]

        assert self._where is not None
        cr = int(self.array.chunks[0])
        per = self.stage_rows // cr
        count = -(-len(rows) // cr)
        if len(rows) < count * cr:  # the array's last chunk is stored whole, padded with the fill
            whole = np.zeros((count * cr, *self.row_shape), self.array.dtype)
            whole[: len(rows)] = rows
            rows = whole
        rows = np.ascontiguousarray(rows)
        nbytes = rows.nbytes // count
        index = np.full((per, 2), _ABSENT, "<u8")  # chunks past the array's end: not stored
        # every chunk compressed straight into one buffer (Blosc adds at most 16 bytes a chunk)
        out = np.empty(count * (nbytes + blosc.MAX_OVERHEAD) + 16 * per + 4, np.uint8)
        fn = _blosc_function("blosc_compress_ctx")
        src, dest = rows.ctypes.data, out.ctypes.data
        offset = 0
        for j in range(count):
            if fn is not None:
                size = fn(
                    _BLOSC_CLEVEL, 1, rows.itemsize, nbytes, src + j * nbytes,
                    dest + offset, nbytes + blosc.MAX_OVERHEAD, _BLOSC_CNAME, 0, 1,
                )  # fmt: skip
                if size <= 0:
                    raise RuntimeError(f"Blosc could not compress chunk {j} of shard {s} ({size})")
            else:
                encoded = blosc.compress(rows[j * cr : (j + 1) * cr], _BLOSC_CNAME, _BLOSC_CLEVEL, 1, 0)
                size = len(encoded)
                out[offset : offset + size] = np.frombuffer(encoded, np.uint8)
            index[j] = (offset, size)
            offset += size
        table = index.tobytes()
        out[offset : offset + len(table)] = np.frombuffer(table, np.uint8)
        out[offset + len(table) : offset + len(table) + 4] = np.frombuffer(
            google_crc32c.value(table).to_bytes(4, "little"), np.uint8
        )
        path = self._where / "c" / f"{s}{'/0' * len(self.row_shape)}"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(out[: offset + len(table) + 4].data)

    def close(self, *, fsync: bool) -> int:
        self._flush()
        self._stage = None
        if self._where is not None:  # the shards were written directly: give the array its shape
            self.array.resize((self.rows, *self.row_shape))
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


#: A shard index's entry for a chunk that is not stored.
_ABSENT = 2**64 - 1


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


class _ChunkReader:
    """Reads whole chunks of one zarr array straight from its files and decodes them with
    Blosc, without zarr's per-chunk machinery (which cost 70% of a random read).

    Only the layouts this package writes are read this way: chunks of whole rows, encoded
    ``bytes`` (little-endian) + ``blosc``, either one file per chunk (datasets written before
    sharding) or inside shards (``sharding_indexed``, index at the end, ``bytes`` + ``crc32c``).
    :meth:`of` returns ``None`` for anything else, which zarr then reads.

    A shard is memory-mapped once and its index (checksum verified) kept: the shard files of a
    published dataset never change (a rebuild replaces the whole directory, which the dataset
    checks after every zarr read).
    """

    def __init__(
        self, array: Any, directory: Path, *, strict: bool, chunk_rows: int, shard_rows: int
    ) -> None:
        self.directory = directory
        self.strict = strict
        self.dtype = np.dtype(array.dtype)
        self.row_shape = tuple(int(n) for n in array.shape[1:])
        self.rows = int(array.shape[0])
        self.chunk_rows = chunk_rows
        #: Chunks per shard (0: no shards, one file per chunk).
        self.per_shard = shard_rows // chunk_rows if shard_rows else 0
        self.chunk_nbytes = chunk_rows * self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))
        self._suffix = "/0" * len(self.row_shape)  # chunk keys: c/<i>/0/0 (one chunk across a row)
        fill = array.metadata.fill_value
        self.fill = np.asarray(fill if fill is not None else 0, self.dtype)
        self._shards: dict[int, tuple[memoryview, int, list[list[int]]] | None] = {}
        #: Sharded one-row chunks (pixels) with the ctypes decoder: each chunk's address in its
        #: mapped shard (0: shard not mapped yet, -1: not stored), headers checked when the shard
        #: is mapped, so a gather is a loop of bare decoder calls (8 bytes a row).
        self._addr: np.ndarray | None = None
        if self.per_shard and chunk_rows == 1 and _decompressor() is not None:
            self._addr = np.zeros(-(-self.rows // chunk_rows), np.int64)
        #: The chunks the last gather decoded (sorted ids, their rows): the loader reads
        #: ``observation`` at rows ``r`` then ``next/observation`` at ``r + 1``, mostly in the same
        #: chunks. Replaced whole (never changed in place), so threads may share it.
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of(cls, array: Any, directory: Path, *, strict: bool) -> _ChunkReader | None:
        """A reader for ``array`` (stored under ``directory``), or ``None`` when its layout is not
        one this reader knows."""
        import sys

        from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
        from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding

        meta = array.metadata
        shape, dtype = tuple(array.shape), np.dtype(array.dtype)
        if (
            getattr(meta, "zarr_format", None) != 3
            or not isinstance(meta.chunk_key_encoding, DefaultChunkKeyEncoding)
            or meta.chunk_key_encoding.separator != "/"
            or len(shape) < 1
            or 0 in shape[1:]
            or dtype.kind not in "biuf"
            or (dtype.itemsize > 1 and (sys.byteorder != "little" or not dtype.isnative))
        ):
            return None

        def plain(codecs: Any) -> bool:
            return (
                len(codecs) == 2
                and isinstance(codecs[0], BytesCodec)
                and (codecs[0].endian is None or codecs[0].endian.value == "little")
                and isinstance(codecs[1], BloscCodec)
            )

        outer = tuple(meta.chunk_grid.chunk_shape)
        if len(meta.codecs) == 1 and isinstance(meta.codecs[0], ShardingCodec):
            sharding = meta.codecs[0]
            index = sharding.index_codecs
            inner = tuple(sharding.chunk_shape)
            if (
                not plain(sharding.codecs)
                or sharding.index_location.value != "end"
                or len(index) != 2
                or not isinstance(index[0], BytesCodec)
                or index[0].endian is None
                or index[0].endian.value != "little"
                or not isinstance(index[1], Crc32cCodec)
                or inner[1:] != shape[1:]
                or outer[1:] != shape[1:]
                or outer[0] % inner[0]
            ):
                return None
            return cls(array, directory, strict=strict, chunk_rows=inner[0], shard_rows=outer[0])
        if plain(meta.codecs) and outer[1:] == shape[1:]:
            return cls(array, directory, strict=strict, chunk_rows=outer[0], shard_rows=0)
        return None

    # ------------------------------------------------------------------ finding a chunk's bytes

    def _path(self, i: int) -> Path:
        return self.directory / "c" / f"{i}{self._suffix}"

    def _missing(self, what: str) -> None:
        """A chunk that is not there: damage when every chunk was written, else fill values."""
        if self.strict:
            raise MissingChunkError(f"zarr chunk {what} is missing")

    def _shard(self, s: int) -> tuple[memoryview, int, list[list[int]]] | None:
        """Shard ``s``'s bytes (memory-mapped), their address, and its index, ``[offset, length]``
        per chunk; ``None`` when its file is absent."""
        if s in self._shards:
            return self._shards[s]
        path = self._path(s)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                index_bytes = 16 * self.per_shard + 4
                if size < index_bytes:
                    raise ValueError(f"shard {path} has {size} bytes, less than its index")
                data = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        except FileNotFoundError:
            self._missing(str(path))
            self._shards[s] = None
            return None
        import google_crc32c  # zarr's own dependency for its crc32c codec

        raw = data[size - index_bytes :]
        if google_crc32c.value(bytes(raw[:-4])) != int.from_bytes(raw[-4:], "little"):
            raise ValueError(f"the index of shard {path} fails its checksum")
        index = np.frombuffer(raw[:-4], "<u8").reshape(self.per_shard, 2)
        stored = index[:, 0] != _ABSENT
        if np.any(index[stored, 0] + index[stored, 1] > size - index_bytes):
            raise ValueError(f"the index of shard {path} points past its end")
        address = int(np.frombuffer(data, np.uint8).ctypes.data)  # the mapping lives with `data`
        if self._addr is not None:
            self._note_addresses(s, data, address, index, size - index_bytes)
        entry = (data, address, index.tolist())  # Python ints: one lookup per chunk
        self._shards[s] = entry
        return entry

    def _note_addresses(self, s: int, data: memoryview, address: int, index: np.ndarray, body: int) -> None:
        """Check the Blosc header of every stored chunk of shard ``s`` at once (see
        :meth:`_check_header`) and record the chunks' addresses in :attr:`_addr`."""
        assert self._addr is not None
        first = s * self.per_shard
        count = min(self.per_shard, len(self._addr) - first)
        offsets, lengths = index[:count, 0], index[:count, 1]
        stored = offsets != _ABSENT
        at = offsets[stored].astype(np.int64)
        if len(at) and (int(lengths[stored].min()) < 16 or int(at.max()) + 16 > body):
            raise ValueError(f"shard {self._path(s)} holds a chunk too short for a Blosc header")
        raw = np.frombuffer(data, np.uint8)
        fields = raw[at[:, None] + np.arange(16)].view("<u4")  # (chunks, 4) header words
        if np.any(fields[:, 1] != self.chunk_nbytes) or np.any(fields[:, 3] != lengths[stored]):
            raise ValueError(f"shard {self._path(s)} holds a chunk that is not a Blosc buffer of its size")
        table = np.full(count, -1, np.int64)
        table[stored] = address + at
        self._addr[first : first + count] = table

    def _check_header(self, i: int, header: Any, length: int) -> None:
        """Blosc's 16-byte header: version, version, flags, typesize, then nbytes, blocksize,
        cbytes (little-endian uint32): the chunk must decode to :attr:`chunk_nbytes` bytes from
        exactly the ``length`` stored (a garbage chunk is refused before it is decoded)."""
        if (
            length < 16
            or int.from_bytes(header[4:8], "little") != self.chunk_nbytes
            or int.from_bytes(header[12:16], "little") != length
        ):
            raise ValueError(f"chunk {i} is not a Blosc buffer of {self.chunk_nbytes} bytes")

    def decode_to(self, i: int, dest: np.ndarray) -> None:
        """Decode chunk ``i`` into ``dest`` (C-contiguous, :attr:`chunk_nbytes` bytes); a chunk
        that is not stored gives the fill value (or raises, see :meth:`_missing`)."""
        fn = _decompressor()
        if self.per_shard:
            s, j = divmod(i, self.per_shard)
            shard = self._shards.get(s) or self._shard(s)
            if shard is not None:
                offset, length = shard[2][j]
                if offset != _ABSENT:
                    self._check_header(i, shard[0][offset : offset + 16], length)
                    if fn is not None:
                        done = fn(shard[1] + offset, dest.ctypes.data, self.chunk_nbytes, 1)
                    else:
                        from numcodecs import blosc

                        blosc.decompress(shard[0][offset : offset + length], dest)
                        done = self.chunk_nbytes
                    if done != self.chunk_nbytes:
                        raise ValueError(f"chunk {j} of shard {self._path(s)} does not decode ({done})")
                    return
                self._missing(f"{j} of shard {self._path(s)}")
        else:
            path = self._path(i)
            try:
                with open(path, "rb") as fh:
                    encoded = fh.read()
            except FileNotFoundError:
                self._missing(str(path))
            else:
                self._check_header(i, encoded[:16], len(encoded))
                from numcodecs import blosc

                blosc.decompress(encoded, dest)
                return
        dest.view(self.dtype)[...] = self.fill

    # ------------------------------------------------------------------ reads

    def _run(self, chunks: np.ndarray, work: Any) -> None:
        """``work(positions)`` over the positions of ``chunks``, split across the decoding threads
        when there are enough of them."""
        pool = _read_pool() if len(chunks) >= _POOL_MIN_CHUNKS else None
        if pool is None:
            work(range(len(chunks)))
            return
        parts = min(pool._max_workers, len(chunks))
        bounds = np.linspace(0, len(chunks), parts + 1).astype(int)
        futures = [pool.submit(work, range(a, b)) for a, b in itertools.pairwise(bounds)]
        for future in futures:
            future.result()  # re-raises a decoding thread's error here

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (1-D, in range) as a new array: each needed chunk decoded once, and not
        at all when the previous gather decoded it."""
        cr = self.chunk_rows
        if cr == 1:
            return self._gather_rows(rows)
        chunk = rows // cr
        offsets = rows - chunk * cr
        needed, where = np.unique(chunk, return_inverse=True)
        where = where.reshape(-1)
        last = self._last
        if last is not None and len(last[0]):
            at = np.minimum(np.searchsorted(last[0], needed), len(last[0]) - 1)
            hit = last[0][at] == needed
        else:
            at, hit = np.zeros(len(needed), np.int64), np.zeros(len(needed), bool)
        fresh = needed[~hit]
        stage = np.empty((len(fresh), self.chunk_nbytes), np.uint8)

        def work(positions: range) -> None:
            for k in positions:
                self.decode_to(int(fresh[k]), stage[k])

        self._run(fresh, work)
        decoded = stage.view(self.dtype).reshape(len(fresh) * cr, *self.row_shape)
        self._last = (fresh, decoded)
        if not hit.any():
            return decoded.take(where * cr + offsets, axis=0)
        out = np.empty((len(rows), *self.row_shape), self.dtype)
        reused = hit[where]
        new_at = np.cumsum(~hit) - 1  # position of each needed chunk among the fresh ones
        mine = np.flatnonzero(reused)
        out[mine] = last[1].take(at[where[mine]] * cr + offsets[mine], axis=0)  # type: ignore[index]
        other = np.flatnonzero(~reused)
        out[other] = decoded.take(new_at[where[other]] * cr + offsets[other], axis=0)
        return out

    def _addresses(self, chunks: np.ndarray) -> np.ndarray | None:
        """The addresses of ``chunks`` (see :attr:`_addr`), mapping their shards first; ``None``
        without the table or when one is not stored (the slow path raises or fills for it)."""
        if self._addr is None:
            return None
        addr = self._addr[chunks]
        if not addr.all():
            for s in np.unique(chunks[addr == 0] // self.per_shard).tolist():
                self._shard(int(s))
            addr = self._addr[chunks]
        return addr if bool((addr > 0).all()) else None

    def _gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`gather` for chunks of one row (pixels): each decodes straight into its place in
        the output, no staging copy; a row asked for twice is decoded once and copied."""
        out = np.empty((len(rows), *self.row_shape), self.dtype)
        needed, first, where = np.unique(rows, return_index=True, return_inverse=True)
        flat = out.reshape(len(rows), -1).view(np.uint8)
        addr = self._addresses(needed)
        if addr is not None:  # every chunk mapped and stored: bare decoder calls
            fn, nbytes = _decompressor(), self.chunk_nbytes
            sources = addr.tolist()
            targets = (out.ctypes.data + first * nbytes).tolist()

            def work(positions: range) -> None:
                for k in positions:
                    if fn(sources[k], targets[k], nbytes, 1) != nbytes:
                        raise ValueError(f"chunk {int(needed[k])} does not decode")

        else:

            def work(positions: range) -> None:
                for k in positions:
                    self.decode_to(int(needed[k]), flat[first[k]])

        self._run(needed, work)
        if len(needed) < len(rows):
            copies = np.flatnonzero(first[where.reshape(-1)] != np.arange(len(rows)))
            out[copies] = out[first[where.reshape(-1)[copies]]]
        return out

    def range(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` (in range) as a new array; whole chunks decode in place."""
        out = np.empty((max(0, stop - start), *self.row_shape), self.dtype)
        if stop <= start:
            return out
        cr = self.chunk_rows
        chunks = np.arange(start // cr, (stop - 1) // cr + 1)
        flat = out.reshape(len(out), -1).view(np.uint8)

        def work(positions: range) -> None:
            spare: np.ndarray | None = None
            for k in positions:
                i = int(chunks[k])
                lo, hi = max(start, i * cr), min(stop, (i + 1) * cr)
                if hi - lo == cr:  # the whole chunk is wanted: decode it straight into the output
                    self.decode_to(i, flat[lo - start : hi - start].reshape(-1))
                    continue
                if spare is None:
                    spare = np.empty(self.chunk_nbytes, np.uint8)
                self.decode_to(i, spare)
                whole = spare.view(self.dtype).reshape(cr, *self.row_shape)
                out[lo - start : hi - start] = whole[lo - i * cr : hi - i * cr]

        self._run(chunks, work)
        return out


class ZarrColumn:
    """Read-only view of a zarr array with numpy-style first-axis indexing; damaged chunks
    (missing, truncated, garbage) raise :class:`CorruptDatasetError` naming the array.

    Integer-array and slice reads of the layouts this package writes go through
    :class:`_ChunkReader` (each needed chunk read and decoded once, in threads); anything else is
    zarr's own indexing."""

    def __init__(self, array: Any, where: Path, reader: _ChunkReader | None = None) -> None:
        self._array = array
        self._where = where
        self._reader = reader
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        #: Rows per chunk (a shard's rows, for a sharded array): a scan that reads whole ones
        #: decodes each chunk once.
        shards = getattr(array, "shards", None)
        self.chunk_rows = int(shards[0]) if shards else int(array.chunks[0])

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
        except CorruptDatasetError:
            raise
        # codec or store damage; a garbage Blosc header can also make the codec raise SystemError
        # (a negative size) or MemoryError (a huge one)
        except (ValueError, RuntimeError, TypeError, OSError, EOFError, SystemError, MemoryError) as exc:
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
        shard_rows = zarr_shard_rows(dtype, row_shape)
        array = group.create_array(
            key,
            shape=(0, *row_shape),
            chunks=chunks,
            shards=(shard_rows, *row_shape) if shard_rows else None,
            dtype=np.dtype(dtype),
            compressors=BloscCodec(cname="lz4", clevel=_BLOSC_CLEVEL, shuffle="shuffle"),  # = _BLOSC_CNAME
            fill_value=np.zeros((), dtype=dtype)[()],
            # every chunk is written, so that a missing chunk file reads as damage, never as
            # zeros (and writing skips comparing every chunk with the fill value)
            config={"write_empty_chunks": True},
            attributes={ALL_CHUNKS_ATTR: True},
        )
        return ZarrColumnWriter(array, tuple(row_shape), _key_path(dataset_dir, key, ""))

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        try:
            array = self.open_column(dataset_dir, key)._array
        except CorruptDatasetError as exc:
            return exc.message
        if tuple(array.shape) != (rows, *row_shape):
            return f"zarr array {key!r} has shape {tuple(array.shape)}, expected {(rows, *row_shape)}"
        if not array.attrs.get(ALL_CHUNKS_ATTR):
            return None  # written when all-zero chunks were left out: nothing to count
        files = getattr(array, "shards", None) or array.chunks  # one file per shard, if sharded
        grid = [-(-size // chunk) for size, chunk in zip(array.shape, files, strict=True)]
        base = _key_path(dataset_dir, key, "") / "c"
        for index in np.ndindex(*grid):
            path = base.joinpath(*(str(i) for i in index)) if index else base
            if not path.is_file():
                return f"zarr chunk {path} is missing"
        return None

    def open_column(self, dataset_dir: Path, key: str) -> ZarrColumn:
        where = dataset_dir / ARRAYS_DIR / key
        try:
            array = self._open_array(dataset_dir, key)
            strict = bool(array.attrs.get(ALL_CHUNKS_ATTR))
            return ZarrColumn(array, where, _ChunkReader.of(array, where, strict=strict))
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
