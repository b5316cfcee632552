"""Reading zarr arrays that this package wrote: whole chunks straight from their (shard) files,
decoded with Blosc on threads, into the caller's batch; damage of any kind is
:class:`~rlds_cli.errors.CorruptDatasetError` naming the array (see :mod:`rlds_cli.cache.backends`
for the layout and the writer).

Where the bytes come from is a :class:`ByteSource`: :class:`LocalFiles` memory-maps the files of
a cached array (the fast path: a chunk is decoded straight from the page cache), and
:class:`rlds_cli.remote.files.RemoteArrayFiles` reads an array on object storage, either by
ranged reads of just the chunks a read needs (``whole_files = False``: each shard's index once,
then the chunks' byte ranges, fetched together) or through a local cache of whole files.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlds_cli.errors import CorruptDatasetError, RldsError

if TYPE_CHECKING:  # imported when a read needs threads: preprocess workers import this module
    from concurrent.futures import ThreadPoolExecutor

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


class _ChunkReader:
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
        #: Sharded one-row chunks (pixels) with the ctypes decoder: each chunk's address in its
        #: mapped shard (0: shard not mapped yet, -1: not stored), headers checked when the shard
        #: is mapped, so a gather is a loop of bare decoder calls (8 bytes a row).
        self._addr: np.ndarray | None = None
        if self.per_shard and chunk_rows == 1 and _decompressor() is not None and not self._ranged:
            self._addr = np.zeros(-(-self.rows // chunk_rows), np.int64)
        #: The chunks the last gather decoded (sorted ids, their rows): the loader reads
        #: ``observation`` at rows ``r`` then ``next/observation`` at ``r + 1``, mostly in the same
        #: chunks. Replaced whole (never changed in place), so threads may share it.
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of(cls, array: Any, directory: Path | ByteSource, *, strict: bool) -> _ChunkReader | None:
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

    def _decode_blob(self, i: int, blob: bytes | None, dest: np.ndarray) -> None:
        """Decode chunk ``i`` from its fetched bytes (``None``: not stored, fill values)."""
        if blob is None:
            dest.view(self.dtype)[...] = self.fill
            return
        self._check_header(i, blob[:16], len(blob))
        fn = _decompressor()
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

    def decode_to(self, i: int, dest: np.ndarray) -> None:
        """Decode chunk ``i`` into ``dest`` (C-contiguous, :attr:`chunk_nbytes` bytes); a chunk
        that is not stored gives the fill value (or raises, see :meth:`_missing`)."""
        if self._ranged:  # one chunk on its own (reads fetch their chunks together, first)
            self._decode_blob(i, self._fetch(np.array([i], np.int64))[0], dest)
            return
        fn = _decompressor()
        if self.per_shard:
            s, j = divmod(i, self.per_shard)
            shard = self._shards.get(s) or self._shard(s)
            if shard is not None and shard[0] is not None:
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
            encoded = self._chunk_file(i)
            if encoded is None:
                self._missing(self._path(i))
            else:
                self._check_header(i, encoded[:16], len(encoded))
                from numcodecs import blosc

                blosc.decompress(encoded, dest)
                return
        dest.view(self.dtype)[...] = self.fill

    def _chunk_file(self, i: int) -> bytes | memoryview | None:
        """The bytes of chunk file ``i`` (unsharded layout), ``None`` when it is absent."""
        if self.directory is None:
            return self.source.map(self._rel(i))
        try:
            with open(self.directory / self._rel(i), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

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
        if self.source.remote:
            decode = self._decoder(fresh)

            def work(positions: range) -> None:
                for k in positions:
                    decode(k, int(fresh[k]), stage[k])

        else:

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
            self._map_shards(np.unique(chunks[addr == 0] // self.per_shard))
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

        elif self.source.remote:
            decode = self._decoder(needed)

            def work(positions: range) -> None:
                for k in positions:
                    decode(k, int(needed[k]), flat[first[k]])

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
        decode = self._decoder(chunks) if self.source.remote else lambda k, i, dest: self.decode_to(i, dest)

        def work(positions: range) -> None:
            spare: np.ndarray | None = None
            for k in positions:
                i = int(chunks[k])
                lo, hi = max(start, i * cr), min(stop, (i + 1) * cr)
                if hi - lo == cr:  # the whole chunk is wanted: decode it straight into the output
                    decode(k, i, flat[lo - start : hi - start].reshape(-1))
                    continue
                if spare is None:
                    spare = np.empty(self.chunk_nbytes, np.uint8)
                decode(k, i, spare)
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

    def __init__(self, array: Any, where: Path | str, reader: _ChunkReader | None = None) -> None:
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
        except RldsError:  # damage named already, or a remote store that cannot be reached
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
