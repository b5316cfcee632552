"""Finding the bytes of a zarr array's chunks: the shard files (mapped once), their indexes
(checksum verified), the addresses of one-row chunks in mapped shards, and the byte ranges a
ranged (remote) source fetches; :class:`~rlds_cli.cache.zarr_chunks._ChunkReader` decodes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.zarr_blosc import _decompressor
from rlds_cli.cache.zarr_source import ByteSource, LocalFiles, MissingChunkError

#: A shard index's entry for a chunk that is not stored.
_ABSENT = 2**64 - 1


class _ShardIndex:
    """Where each chunk of one zarr array is stored (see :class:`_ChunkReader` for the layouts):
    a shard is mapped once and its index kept, since the shard files of a published dataset never
    change (a rebuild replaces the whole directory, which the dataset checks after every read)."""

    def __init__(
        self, array: Any, source: ByteSource, *, strict: bool, chunk_rows: int, shard_rows: int
    ) -> None:
        self.source = source
        #: The local folder of the array (``None`` for a remote source).
        self.directory = source.directory if isinstance(source, LocalFiles) else None
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
        self._shards: dict[int, tuple[memoryview | None, int, list[list[int]]] | None] = {}
        #: Chunk bytes are fetched by ranges before a read decodes them (a remote source
        #: without a file cache); :meth:`decode_to` then never reads on its own.
        self._ranged = not source.whole_files
        #: Whole files come from far away: fetch every file a read needs together, first.
        self._prefetch = source.remote and source.whole_files
        #: Sharded chunks with the ctypes decoder: each chunk's address in its mapped shard (0:
        #: shard not mapped yet, -1: not stored), headers checked when the shard is mapped, so a
        #: read is a loop of bare decoder calls (8 bytes a chunk), no lookups per chunk.
        self._addr: np.ndarray | None = None
        if self.per_shard and _decompressor() is not None and not self._ranged:
            self._addr = np.zeros(-(-self.rows // chunk_rows), np.int64)
        #: The chunks the last gather decoded (sorted ids, their rows): the loader reads
        #: ``observation`` at rows ``r`` then ``next/observation`` at ``r + 1``, mostly in the same
        #: chunks. Replaced whole (never changed in place), so threads may share it.
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ finding a chunk's bytes

    def _rel(self, i: int) -> str:
        """Chunk (or shard) file ``i``, relative to the array's folder."""
        return f"c/{i}{self._suffix}"

    def _path(self, i: int) -> str:
        """Chunk (or shard) file ``i`` as messages name it (a path, or a URL)."""
        return self.source.describe(self._rel(i))

    def _missing(self, what: str) -> None:
        """A chunk that is not there: damage when every chunk was written, else fill values."""
        if self.strict:
            raise MissingChunkError(f"zarr chunk {what} is missing")

    @property
    def _index_bytes(self) -> int:
        return 16 * self.per_shard + 4

    def _parse_index(self, s: int, raw: memoryview | bytes, size: int) -> np.ndarray:
        """Shard ``s``'s index, ``[offset, length]`` per chunk, from its last bytes ``raw`` (the
        checksum and every entry checked against the file's ``size``)."""
        import google_crc32c  # zarr's own dependency for its crc32c codec

        index_bytes = self._index_bytes
        if size < index_bytes or len(raw) != index_bytes:
            raise ValueError(f"shard {self._path(s)} has {size} bytes, less than its index")
        if google_crc32c.value(bytes(raw[:-4])) != int.from_bytes(raw[-4:], "little"):
            raise ValueError(f"the index of shard {self._path(s)} fails its checksum")
        index = np.frombuffer(raw[:-4], "<u8").reshape(self.per_shard, 2)
        stored = index[:, 0] != _ABSENT
        if np.any(index[stored, 0] + index[stored, 1] > size - index_bytes):
            raise ValueError(f"the index of shard {self._path(s)} points past its end")
        return index

    def _shard(self, s: int) -> tuple[memoryview | None, int, list[list[int]]] | None:
        """Shard ``s``'s bytes (mapped; ``None`` for a ranged source), their address, and its
        index, ``[offset, length]`` per chunk; ``None`` when its file is absent."""
        if s in self._shards:
            return self._shards[s]
        if self._ranged:
            self._load_indexes([s])
            return self._shards[s]
        data = self.source.map(self._rel(s))
        if data is None:
            self._missing(self._path(s))
            self._shards[s] = None
            return None
        size = len(data)
        index = self._parse_index(s, data[max(0, size - self._index_bytes) :], size)
        address = int(np.frombuffer(data, np.uint8).ctypes.data)  # the mapping lives with `data`
        if self._addr is not None:
            self._note_addresses(s, data, address, index, size - self._index_bytes)
        entry = (data, address, index.tolist())  # Python ints: one lookup per chunk
        self._shards[s] = entry
        return entry

    def _load_indexes(self, shards: Sequence[int]) -> None:
        """The indexes of ``shards`` (ranged source), fetched together: the last bytes of each."""
        todo, sizes = [], []
        for s in dict.fromkeys(shards):
            if s in self._shards:
                continue
            size = self.source.size(self._rel(s))
            if size is None:
                self._missing(self._path(s))
                self._shards[s] = None
                continue
            todo.append(s)
            sizes.append(size)
        if not todo:
            return
        n = self._index_bytes
        tails = self.source.read_ranges(
            [self._rel(s) for s in todo], [max(0, size - n) for size in sizes], sizes
        )
        for s, size, raw in zip(todo, sizes, tails, strict=True):
            self._shards[s] = (None, 0, self._parse_index(s, raw, size).tolist())

    def _fetch(self, chunks: np.ndarray) -> list[bytes | None]:
        """The stored bytes of each of ``chunks`` (ranged source; ``None``: not stored), fetched
        in one request batch after the shard indexes they need."""
        ps = self.per_shard
        ids = chunks.tolist()
        rels: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        which: list[int] = []
        if ps:
            self._load_indexes(sorted({i // ps for i in ids}))
            for k, i in enumerate(ids):
                s, j = divmod(i, ps)
                shard = self._shards[s]
                if shard is None:
                    continue
                offset, length = shard[2][j]
                if offset == _ABSENT:
                    self._missing(f"{j} of shard {self._path(s)}")
                    continue
                rels.append(self._rel(s))
                starts.append(offset)
                ends.append(offset + length)
                which.append(k)
        else:
            for k, i in enumerate(ids):
                size = self.source.size(self._rel(i))
                if size is None:
                    self._missing(self._path(i))
                    continue
                rels.append(self._rel(i))
                starts.append(0)
                ends.append(size)
                which.append(k)
        out: list[bytes | None] = [None] * len(ids)
        if rels:
            for k, blob in zip(which, self.source.read_ranges(rels, starts, ends), strict=True):
                out[k] = blob
        return out

    def _map_shards(self, shards: np.ndarray) -> None:
        """Map every one of ``shards`` not mapped yet, their files prepared together."""
        todo = [int(s) for s in shards.tolist() if int(s) not in self._shards]
        if todo:
            self.source.prepare([self._rel(s) for s in todo])
            for s in todo:
                self._shard(s)

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

    def _chunk_file(self, i: int) -> bytes | memoryview | None:
        """The bytes of chunk file ``i`` (unsharded layout), ``None`` when it is absent."""
        if self.directory is None:
            return self.source.map(self._rel(i))
        try:
            with open(self.directory / self._rel(i), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def _addresses(self, chunks: np.ndarray) -> np.ndarray | None:
        """The addresses of ``chunks`` (see :attr:`_addr`), mapping their shards first; ``None``
        without the table or when one is not stored (the slow path raises or fills for it)."""
        if self._addr is None:
            return None
        addr = self._addr[chunks]
        if not addr.all():
            self._map_shards(np.unique(chunks[addr == 0] // self.per_shard))
            addr = self._addr[chunks]
        return addr if bool((addr > 0).all()) else None
