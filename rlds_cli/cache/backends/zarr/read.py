"""Reading zarr arrays that this package wrote: columns, the chunk reader, and where its bytes come from.

:class:`ZarrColumn` gives numpy-style first-axis reads (damage of any kind is
:class:`~rlds_cli.errors.CorruptDatasetError` naming the array) through a :class:`ChunkReader`,
which reads whole chunks straight from their (shard) files and decodes them with Blosc on threads
into the caller's batch (:mod:`rlds_cli.cache.backends.zarr.codec`).

Where the bytes come from is a :class:`ByteSource`: :class:`LocalFiles` memory-maps the files of a
cached array (the fast path: a chunk is decoded straight from the page cache), and
:class:`rlds_cli.remote.files.RemoteArrayFiles` reads an array on object storage, either by ranged
reads of just the chunks a read needs (``whole_files = False``: each shard's index once, then the
chunks' byte ranges, fetched together) or through a local cache of whole files. The layout and
the writer: :mod:`rlds_cli.cache.backends.zarr.write`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlds_cli.cache.backends.zarr.codec import COMPILED_MIN_CHUNKS, compiled_decode, decompressor, run_split
from rlds_cli.errors import CorruptDatasetError, RldsError

# -------------------------------------------------------------------- where the bytes come from


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


def strict_store(path: Path) -> Any:
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
    """Where a :class:`ChunkReader` finds the files of one array; ``rel`` is a path relative to
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


# -------------------------------------------------------------------------- where each chunk is


#: A shard index's entry for a chunk that is not stored.
ABSENT = 2**64 - 1


class _ShardIndex:
    """Where each chunk of one zarr array is stored (see :class:`ChunkReader` for the layouts):
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
        if self.per_shard and decompressor() is not None and not self._ranged:
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
        stored = index[:, 0] != ABSENT
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
        which, rels, starts, ends = self.chunk_ranges(chunks)
        out: list[bytes | None] = [None] * len(chunks)
        if rels:
            for k, blob in zip(which, self.source.read_ranges(rels, starts, ends), strict=True):
                out[k] = blob
        return out

    def row_ranges(self, rows: np.ndarray) -> tuple[list[str], list[int], list[int]]:
        """The byte ranges (file, start, end) holding ``rows`` (ranged source): what a read of
        them will fetch, for a caller that fetches ahead (the shard indexes are loaded first)."""
        _, rels, starts, ends = self.chunk_ranges(np.unique(np.asarray(rows, np.int64) // self.chunk_rows))
        return rels, starts, ends

    def chunk_ranges(self, chunks: np.ndarray) -> tuple[list[int], list[str], list[int], list[int]]:
        """Where each stored one of ``chunks`` is: its position in ``chunks``, file, start, end
        (ranged source; the shard indexes they need loaded first, together)."""
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
                if offset == ABSENT:
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
        return which, rels, starts, ends

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
        stored = offsets != ABSENT
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


# ------------------------------------------------------------------------------ decoding chunks


class ChunkReader(_ShardIndex):
    """Reads whole chunks of one zarr array straight from its files and decodes them with
    Blosc, without zarr's per-chunk machinery (which cost 70% of a random read).

    Only the layouts this package writes are read this way: chunks of whole rows, encoded
    ``bytes`` (little-endian) + ``blosc``, either one file per chunk (datasets written before
    sharding) or inside shards (``sharding_indexed``, index at the end, ``bytes`` + ``crc32c``).
    :meth:`of` returns ``None`` for anything else, which zarr then reads.

    A shard is mapped once (memory-mapped, from a local folder or a remote source's file cache)
    and its index (checksum verified) kept: the shard files of a published dataset never change
    (a rebuild replaces the whole directory, which the dataset checks after every zarr read). A
    ranged source (object storage, no file cache) keeps only the shard indexes; each read fetches
    the byte ranges of the chunks it needs, all at once, then decodes them the same way.
    """

    @classmethod
    def of(cls, array: Any, directory: Path | ByteSource, *, strict: bool) -> ChunkReader | None:
        """A reader for ``array`` (stored under the folder ``directory``, or read from a
        :class:`ByteSource`), or ``None`` when its layout is not one this reader knows."""
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

        source: ByteSource = LocalFiles(directory) if isinstance(directory, Path) else directory
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
            return cls(array, source, strict=strict, chunk_rows=inner[0], shard_rows=outer[0])
        if plain(meta.codecs) and outer[1:] == shape[1:]:
            return cls(array, source, strict=strict, chunk_rows=outer[0], shard_rows=0)
        return None

    def _decode_blob(self, i: int, blob: bytes | None, dest: np.ndarray) -> None:
        """Decode chunk ``i`` from its fetched bytes (``None``: not stored, fill values)."""
        if blob is None:
            dest.view(self.dtype)[...] = self.fill
            return
        self._check_header(i, blob[:16], len(blob))
        fn = decompressor()
        if fn is not None:
            done = fn(_address(blob), dest.ctypes.data, self.chunk_nbytes, 1)
        else:
            from numcodecs import blosc

            blosc.decompress(blob, dest)
            done = self.chunk_nbytes
        if done != self.chunk_nbytes:
            raise ValueError(f"chunk {i} of {self.source.describe('c')} does not decode ({done})")

    def _decoder(self, chunks: np.ndarray) -> Callable[[int, int, np.ndarray], None]:
        """``decode(k, i, dest)``: decode chunk ``i`` (``chunks[k]``) into ``dest``. For a remote
        source, what ``chunks`` need is fetched here, before any decoding starts."""
        if self._ranged:
            blobs = self._fetch(chunks)
            return lambda k, i, dest: self._decode_blob(i, blobs[k], dest)
        if self._prefetch and self.per_shard:
            self._map_shards(np.unique(chunks // self.per_shard))
        elif self._prefetch:
            self.source.prepare([self._rel(int(i)) for i in chunks])
        return lambda k, i, dest: self.decode_to(i, dest)

    def decode_to(self, i: int, dest: np.ndarray) -> None:
        """Decode chunk ``i`` into ``dest`` (C-contiguous, :attr:`chunk_nbytes` bytes); a chunk
        that is not stored gives the fill value (or raises, see :meth:`_missing`)."""
        if self._ranged:  # one chunk on its own (reads fetch their chunks together, first)
            self._decode_blob(i, self._fetch(np.array([i], np.int64))[0], dest)
            return
        fn = decompressor()
        if self.per_shard:
            s, j = divmod(i, self.per_shard)
            shard = self._shards.get(s) or self._shard(s)
            if shard is not None and shard[0] is not None:
                offset, length = shard[2][j]
                if offset != ABSENT:
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
            encoded = self._chunk_file(i)
            if encoded is None:
                self._missing(self._path(i))
            else:
                self._check_header(i, encoded[:16], len(encoded))
                from numcodecs import blosc

                blosc.decompress(encoded, dest)
                return
        dest.view(self.dtype)[...] = self.fill

    # ------------------------------------------------------------------ reads

    def _undecodable(self, i: int) -> ValueError:
        return ValueError(f"chunk {i} of {self.source.describe('c')} does not decode")

    def _decode_all(self, chunks: np.ndarray, targets: np.ndarray) -> None:
        """Decode each of ``chunks`` to the address in ``targets`` (:attr:`chunk_nbytes` bytes
        each, in buffers the caller keeps alive), split across the decoding threads.

        When every chunk is in a mapped shard and stored (:meth:`_addresses`), the per-chunk work
        is one bare decoder call on two integers: every lookup was done once for the batch, in
        numpy; with numba a read of many chunks loops over those calls in
        compiled code, without the GIL (:mod:`rlds_cli.cache.backends.zarr.compiled`). Otherwise (no
        shards, a remote source, a chunk not stored) each chunk is decoded by
        :meth:`decode_to`, which finds it, fills it or raises."""
        addr = self._addresses(chunks)
        nbytes = self.chunk_nbytes
        compiled = compiled_decode() if addr is not None and len(chunks) >= COMPILED_MIN_CHUNKS else None
        if addr is not None and compiled is not None:  # the loop in machine code, without the GIL
            dest_addr = np.asarray(targets, np.int64)

            def loop(a: int, b: int) -> None:
                k = compiled(addr, dest_addr, nbytes, a, b)
                if k >= 0:
                    raise self._undecodable(int(chunks[k]))

            run_split(len(chunks), loop)
            return
        if addr is not None:
            fn = decompressor()
            sources, dests = addr.tolist(), targets.tolist()

            def bare(a: int, b: int) -> None:
                for k in range(a, b):
                    if fn(sources[k], dests[k], nbytes, 1) != nbytes:
                        raise self._undecodable(int(chunks[k]))

            run_split(len(chunks), bare)
            return
        decode = self._decoder(chunks) if self.source.remote else None
        dests = targets.tolist()

        def one_by_one(a: int, b: int) -> None:
            for k in range(a, b):
                # a view of the target bytes (the caller's buffer lives until the read returns)
                dest = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(dests[k]))
                if decode is not None:
                    decode(k, int(chunks[k]), dest)
                else:
                    self.decode_to(int(chunks[k]), dest)

        run_split(len(chunks), one_by_one)

    def gather(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (1-D, in range) as a new array, or in ``out`` (C-contiguous, of the
        rows' shape and dtype): each needed chunk decoded once, and not at all when the previous
        gather decoded it."""
        cr = self.chunk_rows
        if cr == 1:
            return self._gather_rows(rows, out)
        if out is not None:
            out[...] = self.gather(rows)
            return out
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
        self._decode_all(fresh, stage.ctypes.data + np.arange(len(fresh), dtype=np.int64) * self.chunk_nbytes)
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

    def _gather_rows(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """:meth:`gather` for chunks of one row (pixels): each decodes straight into its place in
        the output, no staging copy; a row asked for twice is decoded once and copied."""
        if out is None:
            out = np.empty((len(rows), *self.row_shape), self.dtype)
        if len(rows) < 2 or bool((rows[1:] > rows[:-1]).all()):  # distinct already (sorted)
            self._decode_all(rows, out.ctypes.data + np.arange(len(rows), dtype=np.int64) * self.chunk_nbytes)
            return out
        needed, first, where = np.unique(rows, return_index=True, return_inverse=True)
        self._decode_all(needed, out.ctypes.data + first.astype(np.int64) * self.chunk_nbytes)
        if len(needed) < len(rows):
            source = first[where.reshape(-1)]
            copies = np.flatnonzero(source != np.arange(len(rows)))
            out[copies] = out[source[copies]]
        return out

    def range(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` (in range) as a new array: whole chunks decode in place, a
        chunk cut by either end through a spare chunk."""
        out = np.empty((max(0, stop - start), *self.row_shape), self.dtype)
        if stop <= start:
            return out
        cr, nbytes = self.chunk_rows, self.chunk_nbytes
        first, last = start // cr, (stop - 1) // cr
        chunks = np.arange(first, last + 1, dtype=np.int64)
        row_bytes = nbytes // cr
        # the chunks cut by an end go to spare buffers, then their wanted rows are copied out
        cut = [i for i in dict.fromkeys((first, last)) if start > i * cr or stop < (i + 1) * cr]
        spare = np.empty((len(cut), nbytes), np.uint8)
        targets = out.ctypes.data + (chunks * cr - start) * row_bytes
        for n, i in enumerate(cut):
            targets[i - first] = spare.ctypes.data + n * nbytes
        self._decode_all(chunks, targets)
        for n, i in enumerate(cut):
            lo, hi = max(start, i * cr), min(stop, (i + 1) * cr)
            whole = spare[n].view(self.dtype).reshape(cr, *self.row_shape)
            out[lo - start : hi - start] = whole[lo - i * cr : hi - i * cr]
        return out


# -------------------------------------------------------------------------------------- columns


class ZarrColumn:
    """Read-only view of a zarr array with numpy-style first-axis indexing; damaged chunks
    (missing, truncated, garbage) raise :class:`CorruptDatasetError` naming the array.

    Integer-array and slice reads of the layouts this package writes go through
    :class:`ChunkReader` (each needed chunk read and decoded once, in threads); anything else is
    zarr's own indexing."""

    def __init__(self, array: Any, where: Path | str, reader: ChunkReader | None = None) -> None:
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
