"""The ``zarr`` backend: the on-disk layout, the writer of its shards, and the backend itself.

One zarr v3 group at ``arrays/`` with one array per key, chunked along time in small chunks of
whole rows (about 16 KiB, so a random row decodes little; a row of a few KiB or more, a frame, is
a chunk of its own) grouped into shards (about 16 MiB per file; a smaller column is one shard of
just its chunks) and compressed with Blosc/LZ4 + byte shuffle (fast to decode, which matters more
for sampling than the last percent of ratio).

The builder's own shard encoder writes the shards (:class:`ZarrColumnWriter`), so an appended
column and one filled region by region by parallel writers are byte-identical; reading is
:mod:`rlds_cli.cache.backends.zarr.read`, the Blosc calls :mod:`rlds_cli.cache.backends.zarr.codec`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.cache.backends.base import Backend, ColumnWriter, RegionWriter, key_path
from rlds_cli.cache.backends.zarr.codec import blosc_function
from rlds_cli.cache.backends.zarr.read import ABSENT, ALL_CHUNKS_ATTR, ChunkReader, ZarrColumn, strict_store
from rlds_cli.cache.layout import ARRAYS_DIR
from rlds_cli.errors import CorruptDatasetError

ZARR_CHUNK_BYTES = 16 * 1024
#: A row of at least this many bytes (an image) is a chunk of its own: a uniform batch needs one
#: row of each chunk it reads, so a chunk of two 7 KB frames decoded twice the bytes asked for,
#: and chunks of one row are decoded straight into their place in the batch. Compression is
#: still per chunk (real 84x84 Atari frames: about 23x as one-frame chunks).
ZARR_ROW_CHUNK_BYTES = 4 * 1024
#: A column of at most this many (uncompressed) bytes is read whole into RAM when it is opened
#: (actions, rewards, flags): a random batch from it then costs what a memory map's costs (a
#: ``take``), not a chunk decode per row.
ZARR_IN_RAM_BYTES = 16 * 1024 * 1024
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
#: Chunks of each shard compressed first, as a sample, to decide whether the shard is worth
#: compressing at all (see :meth:`ZarrColumnWriter._shard_level`).
ZARR_SAMPLE_CHUNKS = 4
#: A shard is stored compressed only when its sample shrinks to at most this share of its size:
#: on data that does not compress (camera noise, random floats) LZ4 costs about 1 ms a MB to save
#: nothing, twice a memmap build's whole CPU; the chunks are then stored as Blosc's uncompressed
#: frames (level 0: a header and a copy), which every Blosc decoder reads.
ZARR_MIN_SAVING = 0.9


def zarr_chunk_rows(dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
    """Rows per chunk: whole rows, about :data:`ZARR_CHUNK_BYTES` of them, and one row for a row
    of :data:`ZARR_ROW_CHUNK_BYTES` or more (a row is never split across chunks)."""
    row_bytes = max(1, np.dtype(dtype).itemsize * int(np.prod(row_shape, dtype=np.int64)))
    if row_bytes >= ZARR_ROW_CHUNK_BYTES:
        return 1
    return int(max(1, min(ZARR_MAX_CHUNK_ROWS, ZARR_CHUNK_BYTES // row_bytes)))


def zarr_shard_rows(dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
    """Rows per shard: a whole number of chunks holding about :data:`ZARR_SHARD_BYTES` (0: no
    shards)."""
    if ZARR_SHARD_BYTES <= 0:
        return 0
    chunk = zarr_chunk_rows(dtype, row_shape)
    row_bytes = max(1, np.dtype(dtype).itemsize * int(np.prod(row_shape, dtype=np.int64)))
    return chunk * int(max(1, min(ZARR_MAX_CHUNKS_PER_SHARD, ZARR_SHARD_BYTES // (chunk * row_bytes))))


def zarr_fitted_shard_rows(dtype: np.dtype, row_shape: tuple[int, ...], rows: int) -> int:
    """Rows per shard of an array of ``rows`` rows: :func:`zarr_shard_rows`, or, when the whole
    array fits in one shard, just the whole chunks that hold it. A shard's index has an entry
    (16 bytes) for every chunk the shard could hold, stored or not: a 5,000-row column in a
    1,024-chunk shard carried 16 KiB of index for its 5 chunks, which made the zarr copy of the
    demo (8 columns) larger than the memmap one."""
    full = zarr_shard_rows(dtype, row_shape)
    if not full or rows <= 0 or rows >= full:
        return full
    chunk = zarr_chunk_rows(dtype, row_shape)
    return -(-rows // chunk) * chunk


class ZarrColumnWriter(ColumnWriter):
    """Stages rows in one fixed buffer of whole chunks (of a whole shard, for a sharded array)
    and writes it when full, so no chunk or shard is ever rewritten and the same buffer is
    reused for the whole build (no per-block concatenation, which kept growing the heap)."""

    #: Chunks staged before a write, for an array without shards.
    STAGE_CHUNKS = 8

    def __init__(
        self,
        array: Any,
        row_shape: tuple[int, ...],
        where: Path | None = None,
        refit: Callable[[int], Any] | None = None,
    ) -> None:
        self.array = array
        #: Makes the (still empty) array again with its shard fitted to a row count (see close).
        self._refit = refit
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
        from numcodecs import blosc

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
        index = np.full((per, 2), ABSENT, "<u8")  # chunks past the array's end: not stored
        encoder = _ChunkEncoder(rows, count)
        level = encoder.level()
        path = self._where / "c" / f"{s}{'/0' * len(self.row_shape)}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if level == 0 and self._write_stored_shard(path, rows, count, index, encoder):
            return
        # every chunk compressed straight into one buffer (Blosc adds at most 16 bytes a chunk)
        out = np.empty(count * (nbytes + blosc.MAX_OVERHEAD) + 16 * per + 4, np.uint8)
        dest = out.ctypes.data
        offset = 0
        for j in range(count):
            size = encoder.encode(j, out, offset, level, dest)
            if size <= 0:
                raise RuntimeError(f"Blosc could not compress chunk {j} of shard {s} ({size})")
            index[j] = (offset, size)
            offset += size
        table = index.tobytes()
        out[offset : offset + len(table)] = np.frombuffer(table, np.uint8)
        out[offset + len(table) : offset + len(table) + 4] = np.frombuffer(
            google_crc32c.value(table).to_bytes(4, "little"), np.uint8
        )
        with open(path, "wb") as fh:
            fh.write(out[: offset + len(table) + 4].data)

    @staticmethod
    def _write_stored_shard(
        path: Path, rows: np.ndarray, count: int, index: np.ndarray, encoder: _ChunkEncoder
    ) -> bool:
        """Write a shard whose chunks are stored uncompressed (Blosc level 0) without copying
        them: a stored chunk is a 16-byte Blosc header and the chunk's bytes, and equal chunks
        have equal headers, so the file is written from the header, views of the staged rows and
        the index (``os.writev``). On frames that do not compress the copy into an encode buffer
        was a sixth of a zarr build. Returns False (nothing written) if Blosc's header for the
        first chunk is not that of a stored chunk of this size."""
        import google_crc32c

        scratch = np.empty(encoder.room, np.uint8)
        size = encoder.encode(0, scratch, 0, 0)
        flat = rows.reshape(-1).view(np.uint8)
        stored = size == encoder.nbytes + _BLOSC_HEADER_BYTES and np.array_equal(
            scratch[_BLOSC_HEADER_BYTES:size], flat[: encoder.nbytes]
        )
        if not stored:
            return False
        header = scratch[:_BLOSC_HEADER_BYTES].tobytes()
        index[:count, 0] = np.arange(count, dtype=np.uint64) * np.uint64(size)
        index[:count, 1] = size
        table = index.tobytes()
        buffers: list[Any] = []
        for j in range(count):
            buffers += [header, flat[j * encoder.nbytes : (j + 1) * encoder.nbytes].data]
        buffers += [table, google_crc32c.value(table).to_bytes(4, "little")]
        with open(path, "wb") as fh:
            _writev_all(fh.fileno(), buffers)
        return True

    def close(self, *, fsync: bool) -> int:
        if self._refit is not None and self._where is not None and not self.rows and self._staged:
            # the whole column is staged and smaller than a shard: before its one shard is
            # written, give the array a shard of just the chunks it needs (a smaller index)
            self.array = self._refit(self._staged)
            self.stage_rows = int(self.array.shards[0])
        self._flush()
        self._stage = None
        if self._where is not None:  # the shards were written directly: give the array its shape
            self.array.resize((self.rows, *self.row_shape))
        # zarr's local store writes each chunk with a fresh file; durability of the whole
        # directory tree comes from the builder's final directory fsync.
        return self.rows


class _ZarrRegion(RegionWriter):
    """Rows of a preallocated zarr array, staged in memory and written at :meth:`close` as
    whole shards (by the builder's own shard encoder, so the files equal an appended build's)."""

    def __init__(self, array: Any, where: Path, start: int, stop: int) -> None:
        self._array, self._where, self._start = array, where, start
        self.rows = np.empty((stop - start, *array.shape[1:]), array.dtype)

    def close(self, *, fsync: bool) -> None:
        # durability comes from the commit's fsync of the whole tree, as for appended columns
        writer = ZarrColumnWriter(self._array, tuple(self._array.shape[1:]), self._where)
        if writer._where is None:  # no shards: zarr writes the (whole) chunks
            self._array[self._start : self._start + len(self.rows)] = self.rows
            return
        per = writer.stage_rows
        for offset in range(0, len(self.rows), per):
            writer._write_shard((self._start + offset) // per, self.rows[offset : offset + per])


#: Bytes of a Blosc (1.x) chunk header; a stored chunk is this header and the chunk's bytes.
_BLOSC_HEADER_BYTES = 16


def _writev_all(fd: int, buffers: list[Any]) -> None:
    """Write every buffer, in order, to ``fd`` (``os.writev`` in groups of at most IOV_MAX,
    going on after a partial write)."""
    limit = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
    pending = [memoryview(b).cast("B") for b in buffers]
    while pending:
        batch = pending[:limit]
        written = os.writev(fd, batch)
        done = 0
        while done < len(batch) and written >= len(batch[done]):
            written -= len(batch[done])
            done += 1
        pending = pending[done:]
        if written:  # a buffer written in part: the rest of it next
            pending[0] = pending[0][written:]


class _ChunkEncoder:
    """Blosc-encodes the equal chunks of one staged shard into a buffer: LZ4 with byte shuffle,
    or level 0 (stored). The ctypes path costs about 1 us a chunk; addresses are taken once."""

    def __init__(self, rows: np.ndarray, count: int) -> None:
        from numcodecs import blosc

        self.rows, self.count = rows, count
        self.nbytes = rows.nbytes // count
        self.room = self.nbytes + blosc.MAX_OVERHEAD
        self._fn = blosc_function("blosc_compress_ctx")
        self._src = rows.ctypes.data

    def encode(self, j: int, out: np.ndarray, offset: int, level: int, dest: int | None = None) -> int:
        """Chunk ``j`` into ``out[offset:]`` (``dest``: ``out``'s address, when the caller has
        it); returns the bytes written (<= 0: Blosc failed)."""
        shuffle = 1 if level else 0
        if self._fn is not None:
            where = (out.ctypes.data if dest is None else dest) + offset
            src = self._src + j * self.nbytes
            size: int = self._fn(
                level, shuffle, self.rows.itemsize, self.nbytes, src, where, self.room, _BLOSC_CNAME, 0, 1
            )
            return size
        from numcodecs import blosc

        cr = len(self.rows) // self.count
        encoded = blosc.compress(self.rows[j * cr : (j + 1) * cr], _BLOSC_CNAME, level, shuffle, 0)
        out[offset : offset + len(encoded)] = np.frombuffer(encoded, np.uint8)
        return len(encoded)

    def level(self) -> int:
        """:data:`_BLOSC_CLEVEL` when a sample of the chunks compresses to at most
        :data:`ZARR_MIN_SAVING` of their size, else 0 (stored as they are)."""
        spread = np.linspace(0, self.count - 1, min(self.count, ZARR_SAMPLE_CHUNKS))
        picks = np.unique(spread.astype(np.int64))
        scratch = np.empty(self.room, np.uint8)
        packed = sum(self.encode(int(j), scratch, 0, _BLOSC_CLEVEL) for j in picks)
        return _BLOSC_CLEVEL if 0 < packed <= ZARR_MIN_SAVING * self.nbytes * len(picks) else 0


def check_zarr_grid(
    array: Any,
    key: str,
    rows: int,
    row_shape: tuple[int, ...],
    missing: Callable[[tuple[int, ...]], str | None],
) -> str | None:
    """What is wrong with a zarr column's shape, or with its chunk (or shard) files: every cell of
    its grid is asked of ``missing`` (the local files, or a pushed files index), which says what
    is wrong with it; ``None`` when nothing is."""
    if tuple(array.shape) != (rows, *row_shape):
        return f"zarr array {key!r} has shape {tuple(array.shape)}, expected {(rows, *row_shape)}"
    if not array.attrs.get(ALL_CHUNKS_ATTR):
        return None  # written when all-zero chunks were left out: nothing to count
    files = getattr(array, "shards", None) or array.chunks  # one file per shard, if sharded
    grid = [-(-size // chunk) for size, chunk in zip(array.shape, files, strict=True)]
    return next((problem for index in np.ndindex(*grid) if (problem := missing(index))), None)


class ZarrBackend(Backend):
    """zarr v3 arrays, chunked along time, Blosc/LZ4-compressed."""

    name = "zarr"
    stable_once_open = False

    def _group(self, dataset_dir: Path, mode: Literal["r", "r+", "a", "w", "w-"]) -> Any:
        import zarr  # local import: zarr is only needed for this backend

        return zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode=mode)

    def _open_array(self, dataset_dir: Path, key: str) -> Any:
        import zarr

        key_path(dataset_dir, key, "")  # refuses a key that is no safe path
        array = zarr.open_group(store=strict_store(dataset_dir / ARRAYS_DIR), mode="r")[key]
        if not array.attrs.get(ALL_CHUNKS_ATTR):  # written before every chunk was
            array = zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode="r")[key]
        return array

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        array = self._create_array(dataset_dir, key, dtype, row_shape, 0)

        def refit(rows: int) -> Any:
            return self._create_array(dataset_dir, key, dtype, row_shape, 0, fit_rows=rows)

        return ZarrColumnWriter(array, tuple(row_shape), key_path(dataset_dir, key, ""), refit)

    def region_rows(self, dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
        # a region writes whole files: whole shards (each written once, by one writer), or
        # whole chunks of an array written without shards
        return zarr_shard_rows(dtype, row_shape) or zarr_chunk_rows(dtype, row_shape)

    def preallocate(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...], rows: int
    ) -> None:
        # nothing to reserve: compressed sizes are unknown before the data, and a full disk
        # met by a file write is an ordinary error (not a memory map's SIGBUS)
        self._create_array(dataset_dir, key, dtype, row_shape, rows)

    def open_region(self, dataset_dir: Path, key: str, start: int, stop: int) -> RegionWriter:
        import zarr

        key_path(dataset_dir, key, "")
        array: Any = zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode="r+")[key]
        # every chunk is written, as by create_column (the setting is not stored with the array)
        array = array.with_config({"write_empty_chunks": True})
        # the array's own files (a worker process may not share the writer's settings)
        align = int((getattr(array, "shards", None) or array.chunks)[0])
        total = int(array.shape[0])
        if not 0 <= start <= stop <= total:
            raise ValueError(f"rows {start}:{stop} are outside column {key!r} of {total} rows")
        if start % align or (stop % align and stop != total):
            raise ValueError(
                f"rows {start}:{stop} of column {key!r} are not aligned to its {align}-row shards"
            )
        return _ZarrRegion(array, key_path(dataset_dir, key, ""), start, stop)

    def check_preallocated(
        self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]
    ) -> str | None:
        # its files appear as regions are written: only the array itself can be checked
        try:
            array = self._open_array(dataset_dir, key)
        except (KeyError, FileNotFoundError):
            return f"zarr array {key!r} is missing under {dataset_dir / ARRAYS_DIR}"
        if tuple(array.shape) != (rows, *row_shape):
            return f"zarr array {key!r} has shape {tuple(array.shape)}, expected {(rows, *row_shape)}"
        return None

    def _create_array(
        self,
        dataset_dir: Path,
        key: str,
        dtype: np.dtype,
        row_shape: tuple[int, ...],
        rows: int,
        *,
        fit_rows: int | None = None,
    ) -> Any:
        """An array of ``rows`` rows (0: appended to), its shard fitted to ``fit_rows`` (default
        ``rows``), replacing the empty array made before when ``fit_rows`` is given."""
        from zarr.codecs import BloscCodec

        key_path(dataset_dir, key, "")  # refuses a key that is no safe path, before any write
        group = self._group(dataset_dir, "a")
        chunks = (zarr_chunk_rows(dtype, row_shape), *row_shape)
        shard_rows = zarr_fitted_shard_rows(dtype, row_shape, rows if fit_rows is None else fit_rows)
        return group.create_array(
            key,
            shape=(rows, *row_shape),
            chunks=chunks,
            shards=(shard_rows, *row_shape) if shard_rows else None,
            dtype=np.dtype(dtype),
            compressors=BloscCodec(cname="lz4", clevel=_BLOSC_CLEVEL, shuffle="shuffle"),  # = _BLOSC_CNAME
            fill_value=np.zeros((), dtype=dtype)[()],
            # every chunk is written, so that a missing chunk file reads as damage, never as
            # zeros (and writing skips comparing every chunk with the fill value)
            config={"write_empty_chunks": True},
            attributes={ALL_CHUNKS_ATTR: True},
            overwrite=fit_rows is not None,
        )

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        try:
            array = self._open_checked(dataset_dir, key)
        except CorruptDatasetError as exc:
            return exc.message
        base = key_path(dataset_dir, key, "") / "c"

        def missing(index: tuple[int, ...]) -> str | None:
            path = base.joinpath(*(str(i) for i in index)) if index else base
            return None if path.is_file() else f"zarr chunk {path} is missing"

        return check_zarr_grid(array, key, rows, row_shape, missing)

    def _open_checked(self, dataset_dir: Path, key: str) -> Any:
        """The zarr array of ``key``; a missing one, or one whose metadata zarr cannot parse, is
        :class:`CorruptDatasetError`."""
        key_path(dataset_dir, key, "")  # a key that is no safe path: InvalidKeyError, not damage
        try:
            return self._open_array(dataset_dir, key)
        except (KeyError, FileNotFoundError) as exc:
            raise CorruptDatasetError(
                f"zarr array {key!r} is missing under {dataset_dir / ARRAYS_DIR}"
            ) from exc
        except (ValueError, TypeError) as exc:  # zarr.json that zarr cannot parse: damage
            detail = str(exc).split("\n")[0]
            raise CorruptDatasetError(
                f"zarr array {key!r} under {dataset_dir / ARRAYS_DIR} is damaged: its metadata is unreadable "
                f"({type(exc).__name__}: {detail})"
            ) from exc

    def open_column(self, dataset_dir: Path, key: str) -> ZarrColumn | np.ndarray:
        """The column of ``key``: a :class:`ZarrColumn` reading its chunks, or, for a column of at
        most :data:`ZARR_IN_RAM_BYTES`, all of it read now as a read-only ndarray."""
        where = dataset_dir / ARRAYS_DIR / key
        array = self._open_checked(dataset_dir, key)
        strict = bool(array.attrs.get(ALL_CHUNKS_ATTR))
        column = ZarrColumn(array, where, ChunkReader.of(array, where, strict=strict))
        nbytes = column.dtype.itemsize * int(np.prod(column.shape, dtype=np.int64))
        if nbytes > ZARR_IN_RAM_BYTES:
            return column
        data = column[:]  # damage is CorruptDatasetError naming the array, as for any read
        data.flags.writeable = False  # as a read-only memory map: a snapshot, never written
        return data
