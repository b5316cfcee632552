"""Where the bytes of a zarr array come from (a :class:`ByteSource`): :class:`LocalFiles`
memory-maps the files of a cached array (the fast path: a chunk is decoded straight from the page
cache), and :class:`rlds_cli.remote.files.RemoteArrayFiles` reads an array on object storage,
either by ranged reads of just the chunks a read needs (``whole_files = False``: each shard's
index once, then the chunks' byte ranges, fetched together) or through a local cache of whole
files. Also the strict local store that refuses to read a missing chunk as fill values.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlds_cli.errors import CorruptDatasetError

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


class ByteSource(Protocol):
    """Where a :class:`_ChunkReader` finds the files of one array; ``rel`` is a path relative to
    the array's folder (``c/3/0/0``).

    A source with ``whole_files`` hands out whole files (:meth:`map`); one without reads byte
    ranges (:meth:`size`, :meth:`read_ranges`). ``remote`` is true for a source that is not a
    local folder (the reader then fetches what a read needs before decoding, never per chunk).
    """

    whole_files: bool
    remote: bool

    def describe(self, rel: str) -> str:
        """The file, for messages: a path, or a URL."""
        ...

    def map(self, rel: str) -> memoryview | None:
        """The whole file (read-only, e.g. memory-mapped), or ``None`` when it does not exist."""
        ...

    def prepare(self, rels: Sequence[str]) -> None:
        """Files about to be mapped: a remote source with a local cache fetches them together."""
        ...

    def size(self, rel: str) -> int | None:
        """The file's size in bytes, or ``None`` when it does not exist (ranged sources)."""
        ...

    def read_ranges(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        """Bytes ``[start, end)`` of each file (ranged sources); raises ``FileNotFoundError``
        naming a file that is gone."""
        ...


class LocalFiles:
    """The files of an array in a local folder, memory-mapped."""

    whole_files = True
    remote = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def describe(self, rel: str) -> str:
        return str(self.directory / rel)

    def map(self, rel: str) -> memoryview | None:
        try:
            with open(self.directory / rel, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    return memoryview(b"")  # mmap refuses an empty file
                return memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        except FileNotFoundError:
            return None

    def prepare(self, rels: Sequence[str]) -> None:
        return None

    def size(self, rel: str) -> int | None:
        try:
            return os.stat(self.directory / rel).st_size
        except FileNotFoundError:
            return None

    def read_ranges(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        out = []
        for rel, start, end in zip(rels, starts, ends, strict=True):
            with open(self.directory / rel, "rb") as fh:
                fh.seek(start)
                out.append(fh.read(end - start))
        return out


def _address(blob: bytes) -> int:
    """Where ``blob``'s bytes are in memory (valid while ``blob`` lives)."""
    return int(np.frombuffer(blob, np.uint8).ctypes.data) if blob else 0
