"""The zarr backend of a dataset read where it was pushed: its columns read through
:class:`~rlds_cli.remote.files.RemoteFiles` by the cached datasets' chunk reader, every write
refused (see :mod:`rlds_cli.remote.reader`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.backends import Backend, ColumnWriter, RegionWriter, check_zarr_grid
from rlds_cli.cache.backends.zarr.read import ALL_CHUNKS_ATTR, ChunkReader, MissingChunkError, ZarrColumn
from rlds_cli.cache.layout import ARRAYS_DIR
from rlds_cli.cache.ted import key_problem
from rlds_cli.errors import (
    CorruptDatasetError,
    InvalidKeyError,
    RemoteError,
)
from rlds_cli.remote.files import RemoteArrayFiles, RemoteFiles
from rlds_cli.remote.store import INDEX_FILE


class RemoteNotReadableError(RemoteError, ValueError):
    """A dataset at a URL that cannot be read where it lies (a memmap dataset, a view)."""

    default_hint = "pull it into the cache first: rlds pull URL"


def _metadata_store(files: RemoteFiles, prefix: str, meta: bytes, strict: bool) -> Any:
    """A read-only zarr store of one remote array: its checked ``zarr.json`` in memory, chunks
    by ranged reads (what zarr itself reads, for a layout the chunk reader does not know)."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    class RemoteArrayStore(MemoryStore):
        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            if key == "zarr.json":
                return await super().get(key, prototype, byte_range)
            rel = f"{prefix}/{key}"
            size = files.size(rel)
            if size is None:
                if strict and "/c/" in f"/{key}":
                    raise MissingChunkError(f"zarr chunk {files.where(rel)} is missing")
                return None
            start, end = 0, size
            if isinstance(byte_range, RangeByteRequest):
                start, end = byte_range.start, min(byte_range.end, size)
            elif isinstance(byte_range, OffsetByteRequest):
                start = byte_range.offset
            elif isinstance(byte_range, SuffixByteRequest):
                start = max(0, size - byte_range.suffix)
            data = files.read_ranges([rel], [start], [end])[0]
            return (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    proto = default_buffer_prototype()
    return RemoteArrayStore({"zarr.json": proto.buffer.from_bytes(meta)}, read_only=True)


class _CheckedColumn(ZarrColumn):
    """A remote zarr column whose whole-array reads (``np.asarray(column)``, what ``in_memory``
    loading does) are checked against replacement like every dataset read."""

    def __init__(self, array: Any, where: str, reader: ChunkReader | None, check: Any) -> None:
        super().__init__(array, where, reader)
        self._check = check

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = super().__array__(dtype, copy)
        self._check()
        return data


class RemoteZarrBackend(Backend):
    """The zarr backend of one remote dataset: columns read through :class:`RemoteFiles`."""

    name = "zarr"
    stable_once_open = False

    def __init__(self, files: RemoteFiles, check: Any) -> None:
        self.files = files
        self._check = check

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        raise self._read_only()

    def preallocate(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...], rows: int
    ) -> None:
        raise self._read_only()

    def open_region(self, dataset_dir: Path, key: str, start: int, stop: int) -> RegionWriter:
        raise self._read_only()

    def _read_only(self) -> RemoteNotReadableError:
        return RemoteNotReadableError(
            f"{self.files.url} is read-only: rlds writes datasets into the cache, then pushes them",
            hint="build it locally, then rlds push NAME URL",
        )

    def open_column(self, dataset_dir: Path, key: str) -> ZarrColumn:
        import zarr

        problem = key_problem(key)
        if problem is not None:
            raise InvalidKeyError(f"array key {key!r} of {self.files.url} cannot be a file name: {problem}")
        prefix = f"{ARRAYS_DIR}/{key}"
        meta = self.files.read_file(f"{prefix}/zarr.json")
        if meta is None:
            raise CorruptDatasetError(f"zarr array {key!r} is missing under {self.files.where(ARRAYS_DIR)}")
        try:
            strict = bool(json.loads(meta).get("attributes", {}).get(ALL_CHUNKS_ATTR))
            array = zarr.open_array(
                store=_metadata_store(self.files, prefix, meta, strict), mode="r", zarr_format=3
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptDatasetError(
                f"zarr metadata {self.files.where(prefix + '/zarr.json')} is unreadable: {exc}"
            ) from None
        reader = ChunkReader.of(array, RemoteArrayFiles(self.files, prefix), strict=strict)
        return _CheckedColumn(array, self.files.where(prefix), reader, self._check)

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        """The column's shape, and every chunk (or shard) file of its grid in the pushed index
        (whether each one is at the URL is checked by :meth:`RemoteDataset.check_files`)."""
        try:
            array = self.open_column(dataset_dir, key)._array
        except CorruptDatasetError as exc:
            return exc.message

        def missing(index: tuple[int, ...]) -> str | None:
            rel = "/".join([ARRAYS_DIR, key, "c", *(str(i) for i in index)])
            if rel in self.files.index.files:
                return None
            return f"zarr chunk {self.files.where(rel)} is missing (not in {INDEX_FILE})"

        return check_zarr_grid(array, key, rows, row_shape, missing)
