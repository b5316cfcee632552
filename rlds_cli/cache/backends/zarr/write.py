"""The ``zarr`` backend: the on-disk layout, the writer of its shards, and the backend itself.

One zarr v3 group at ``arrays/`` with one array per key, chunked along time in chunks of whole
rows (about 16 KiB; a row of 4 KiB or more is its own chunk), grouped into shards (about 16 MiB
per file; a smaller column is one shard of just its chunks), compressed with Blosc/LZ4 + byte
shuffle (chosen for decode speed).

Shards are written by this module's own encoder (:class:`ZarrColumnWriter`), so appended and
region-written columns are byte-identical. Reading: :mod:`rlds_cli.cache.backends.zarr.read`;
Blosc calls: :mod:`rlds_cli.cache.backends.zarr.codec`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.cache.backends.base import Backend, ColumnWriter, RegionWriter, key_path
from rlds_cli.cache.backends.zarr.codec import blosc_function
from rlds_cli.cache.backends.zarr.read import (
    ABSENT,
    ALL_CHUNKS_ATTR,
    ChunkReader,
    ZarrColumn,
    all_chunks_written,
    strict_store,
)
from rlds_cli.cache.layout import ARRAYS_DIR
from rlds_cli.errors import CorruptDatasetError

#: Uncompressed bytes per chunk (at least one row): a random row decodes its whole chunk (512 KiB
#: chunks decoded 130 MB for a 5 MB batch of 256 (3, 84, 84) frames).
ZARR_CHUNK_BYTES = 16 * 1024
#: A row of at least this many bytes (an image) is a chunk of its own, so random reads decode
#: only the rows asked for, straight into the batch (84x84 Atari frames still compress ~23x).
ZARR_ROW_CHUNK_BYTES = 4 * 1024
#: A column of at most this many uncompressed bytes is read whole into RAM when opened, so
#: random batches cost a ``take``, not a chunk decode per row.
ZARR_IN_RAM_BYTES = 16 * 1024 * 1024
#: Uncompressed bytes per zarr shard (one file of many chunks; unsharded, 200k frames were
#: 70,000 files). 0 writes no shards (one file per chunk).
ZARR_SHARD_BYTES = 16 * 1024 * 1024
#: The most rows in one chunk (a random scalar read decodes at most 8 KiB of int64).
ZARR_MAX_CHUNK_ROWS = 1024
#: The most chunks in one shard: the index (16 bytes a chunk) is read and checksummed whole at
#: first open; uncapped, a bool column's shard index was 256 KiB.
ZARR_MAX_CHUNKS_PER_SHARD = 1024
#: Blosc settings of every chunk: LZ4, level 5, byte shuffle.
_BLOSC_CNAME, _BLOSC_CLEVEL = b"lz4", 5
#: Chunks of each shard compressed as a sample to decide whether to compress it
#: (:meth:`_ChunkEncoder.level`).
ZARR_SAMPLE_CHUNKS = 4
#: A shard is compressed only when its sample shrinks to at most this share; otherwise its
#: chunks are stored at Blosc level 0 (header + copy), readable by any Blosc decoder. LZ4 on
#: incompressible data costs ~1 ms a MB, twice a memmap build's CPU.
ZARR_MIN_SAVING = 0.9


def zarr_chunk_rows(dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
    """Rows per chunk: about :data:`ZARR_CHUNK_BYTES` of whole rows, or 1 for rows of
    :data:`ZARR_ROW_CHUNK_BYTES` or more."""
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
    """Rows per shard of an array of ``rows`` rows: :func:`zarr_shard_rows`, or, when the array
    fits in one shard, just its whole chunks (the index has 16 bytes per possible chunk)."""
    full = zarr_shard_rows(dtype, row_shape)
    if not full or rows <= 0 or rows >= full:
        return full
    chunk = zarr_chunk_rows(dtype, row_shape)
    return -(-rows // chunk) * chunk


class ZarrColumnWriter(ColumnWriter):
    """Stages rows in one reused buffer of whole chunks (a whole shard, if sharded) and writes
    it when full, so no chunk or shard is ever rewritten."""

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
        """Encode and write shard ``s`` in zarr's ``sharding_indexed`` layout: the chunks
        (``bytes`` + Blosc), then ``(offset, length)`` per chunk as little-endian uint64 and its
        crc32c. One Blosc call per chunk (zarr's writer cost 3x a memmap build's CPU)."""
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
        """Write a shard of Blosc level-0 chunks without copying them: one shared 16-byte header,
        views of the staged rows and the index, via ``os.writev`` (the copy was a sixth of a
        zarr build). Returns ``False``, writing nothing, if Blosc's first chunk is not a plain
        stored chunk."""
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
            # the whole column fits one shard: refit it to just its chunks (a smaller index)
            self.array = self._refit(self._staged)
            self.stage_rows = int(self.array.shards[0])
        self._flush()
        self._stage = None
        if self._where is not None:  # the shards were written directly: give the array its shape
            self.array.resize((self.rows, *self.row_shape))
        # durability comes from the builder's final fsync of the tree
        return self.rows


class _ZarrRegion(RegionWriter):
    """Rows of a preallocated zarr array, staged in memory and written at :meth:`close` as whole
    shards (files identical to an appended build's)."""

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
    """Write every buffer, in order, to ``fd`` (``os.writev`` in IOV_MAX groups, resuming after
    partial writes)."""
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
    """Blosc-encodes the equal-size chunks of one staged shard: LZ4 with byte shuffle, or level 0
    (stored); ~1 us a chunk through ctypes."""

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
    """The problem with a zarr column's shape or its chunk (or shard) files, each grid cell
    checked by ``missing`` (local files, or a pushed files index); ``None`` when none."""
    if tuple(array.shape) != (rows, *row_shape):
        return f"zarr array {key!r} has shape {tuple(array.shape)}, expected {(rows, *row_shape)}"
    try:
        if not all_chunks_written(dict(array.attrs), f"of array {key!r}"):
            return None  # all-zero chunks may be absent: nothing to count
    except CorruptDatasetError as exc:
        return exc.message
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
        if not all_chunks_written(dict(array.attrs), dataset_dir / ARRAYS_DIR / key / "zarr.json"):
            # an older rlds's: absent chunks read as fill values
            array = zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode="r")[key]
        return array

    def create_column(
        self,
        dataset_dir: Path,
        key: str,
        dtype: np.dtype,
        row_shape: tuple[int, ...],
        rows: int | None = None,
    ) -> ColumnWriter:
        array = self._create_array(dataset_dir, key, dtype, row_shape, 0)

        def refit(rows: int) -> Any:
            return self._create_array(dataset_dir, key, dtype, row_shape, 0, fit_rows=rows)

        return ZarrColumnWriter(array, tuple(row_shape), key_path(dataset_dir, key, ""), refit)

    def region_rows(self, dtype: np.dtype, row_shape: tuple[int, ...]) -> int:
        # a region writes whole files: shards, or chunks when unsharded
        return zarr_shard_rows(dtype, row_shape) or zarr_chunk_rows(dtype, row_shape)

    def preallocate(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...], rows: int
    ) -> None:
        # nothing to reserve: sizes are unknown, and a full disk is an ordinary write error
        self._create_array(dataset_dir, key, dtype, row_shape, rows)

    def open_region(self, dataset_dir: Path, key: str, start: int, stop: int) -> RegionWriter:
        import zarr

        key_path(dataset_dir, key, "")
        array: Any = zarr.open_group(str(dataset_dir / ARRAYS_DIR), mode="r+")[key]
        # every chunk is written, as by create_column (the setting is not stored with the array)
        array = array.with_config({"write_empty_chunks": True})
        # aligned to the array's own files (a worker may not share the writer's settings)
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
        ``rows``); with ``fit_rows``, it replaces the empty array."""
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
            # every chunk written: a missing chunk file is damage, never zeros
            config={"write_empty_chunks": True},
            attributes={ALL_CHUNKS_ATTR: True},
            overwrite=fit_rows is not None,
        )

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        try:
            array = self._open_checked(dataset_dir, key)
        except CorruptDatasetError as exc:
            return exc.message
        for group in (dataset_dir / ARRAYS_DIR / key).parents:  # the groups holding it
            if not group.is_relative_to(dataset_dir / ARRAYS_DIR):
                break
            problem = _group_problem(group / "zarr.json")
            if problem is not None:
                return problem
        base = key_path(dataset_dir, key, "") / "c"
        reader = ChunkReader.of(array, dataset_dir / ARRAYS_DIR / key, strict=True)

        def missing(index: tuple[int, ...]) -> str | None:
            path = base.joinpath(*(str(i) for i in index)) if index else base
            if not path.is_file():
                return f"zarr chunk {path} is missing"
            # a shard cut short (or its index damaged) is no file at its full size
            return reader.shard_problem(index[0]) if reader is not None and index else None

        return check_zarr_grid(array, key, rows, row_shape, missing)

    def _open_checked(self, dataset_dir: Path, key: str) -> Any:
        """The zarr array of ``key``; raises :class:`CorruptDatasetError` if missing or its
        metadata is unparseable."""
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
        """The column of ``key``: a :class:`ZarrColumn`, or, up to :data:`ZARR_IN_RAM_BYTES`, a
        read-only ndarray read now."""
        where = dataset_dir / ARRAYS_DIR / key
        array = self._open_checked(dataset_dir, key)
        strict = all_chunks_written(dict(array.attrs), where / "zarr.json")
        column = ZarrColumn(array, where, ChunkReader.of(array, where, strict=strict))
        nbytes = column.dtype.itemsize * int(np.prod(column.shape, dtype=np.int64))
        if nbytes > ZARR_IN_RAM_BYTES:
            return column
        data = column[:]  # damage is CorruptDatasetError naming the array, as for any read
        data.flags.writeable = False  # like a read-only memory map
        return data


def _group_problem(path: Path) -> str | None:
    """What is wrong with a zarr group's metadata file as rlds writes it (exactly ``zarr_format``
    3, ``node_type`` group and an ``attributes`` object), or ``None``. rlds reads its arrays
    without it; other zarr readers open the dataset through it, so damage there is damage too."""
    try:
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        return f"zarr group metadata {path} is missing"
    except (OSError, ValueError) as exc:
        return f"zarr group metadata {path} is damaged: {exc}"
    if not (
        isinstance(meta, dict)
        and set(meta) == {"zarr_format", "node_type", "attributes"}
        and meta["zarr_format"] == 3
        and meta["node_type"] == "group"
        and isinstance(meta["attributes"], dict)
    ):
        return f"zarr group metadata {path} is damaged: not a zarr v3 group's"
    return None
