"""Reading zarr arrays that this package wrote: columns, the chunk reader, and where its bytes come from.

:class:`ZarrColumn` gives numpy-style first-axis reads (any damage is
:class:`~rlds_cli.errors.CorruptDatasetError` naming the array) through a :class:`ChunkReader`,
which decodes whole chunks from their (shard) files with Blosc on threads into the caller's
batch. Bytes come from a :class:`ByteSource`: :class:`LocalFiles` (memory-mapped) or
:class:`rlds_cli.remote.files.RemoteArrayFiles` (ranged reads of the needed chunks, or a local
cache of whole files). Layout and writer: :mod:`rlds_cli.cache.backends.zarr.write`.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlds_cli.cache.backends.zarr.codec import COMPILED_MIN_CHUNKS, compiled_decode, decompressor, run_split
from rlds_cli.errors import CorruptDatasetError, RldsError

# -------------------------------------------------------------------- where the bytes come from


#: Array attribute: every chunk was written (even all-fill ones), so a missing chunk file is
#: damage, not zeros. Arrays without it may omit all-zero chunks (read as fill values).
ALL_CHUNKS_ATTR = "rlds_all_chunks_written"


def all_chunks_written(attributes: Any, where: object) -> bool:
    """Whether a zarr array of the cache wrote every chunk (its attributes hold :data:`ALL_CHUNKS_ATTR`).

    rlds writes exactly ``{ALL_CHUNKS_ATTR: true}`` (an rlds before 2026-11-23: no attribute). Any
    other attributes are damage: one flipped byte in the name would let a missing chunk read as zeros.

    Raises:
        CorruptDatasetError: The attributes are neither (naming ``where``, the array's metadata).
    """
    if attributes == {ALL_CHUNKS_ATTR: True}:
        return True
    if attributes in ({}, None):
        return False
    raise CorruptDatasetError(
        f"zarr metadata {where} is damaged: its attributes are {json.dumps(attributes, default=str)[:120]}, "
        f"where rlds writes {{{ALL_CHUNKS_ATTR!r}: true}}"
    )


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
    """Where a :class:`ChunkReader` finds the files of one array; ``rel`` is relative to the
    array's folder (``c/3/0/0``).

    With ``whole_files``, files come whole (:meth:`map`); without, as byte ranges (:meth:`size`,
    :meth:`read_ranges`). With ``remote``, a read fetches what it needs before decoding.
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
    """Where each chunk of one zarr array is stored (layouts: :class:`ChunkReader`). Each shard
    is mapped and its index parsed once: published shard files never change."""

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
        #: Chunk bytes are fetched by ranges before decoding (remote source, no file cache).
        self._ranged = not source.whole_files
        #: Whole files come from far away: fetch every file a read needs together, first.
        self._prefetch = source.remote and source.whole_files
        #: Each chunk's address in its mapped shard (0: not mapped yet, -1: not stored), headers
        #: checked at mapping, so a read needs no per-chunk lookups (sharded, ctypes decoder).
        self._addr: np.ndarray | None = None
        if self.per_shard and decompressor() is not None and not self._ranged:
            self._addr = np.zeros(-(-self.rows // chunk_rows), np.int64)
        #: The chunks the last gather decoded (sorted ids, their rows), reused by the next
        #: (``observation`` then ``next/observation`` hit the same chunks). Replaced whole, never
        #: changed in place, so threads may share it.
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
        """Shard ``s``'s index, ``[offset, length]`` per chunk, from its last bytes ``raw``;
        checksum and entries checked against the file's ``size`` (``ValueError``)."""
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

    def shard_problem(self, s: int) -> str | None:
        """What is wrong with shard ``s``'s file: shorter than its index, an index failing its
        checksum or pointing past the file's end; ``None`` when it is sound, or absent, or the
        array has no shards (what a check of the files reads, without decoding a chunk)."""
        if not self.per_shard:
            return None
        try:
            self._shard(s)
        except MissingChunkError:
            return None  # absent: the caller counts files
        except (ValueError, CorruptDatasetError) as exc:
            return str(exc)
        return None

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
        in one batch."""
        which, rels, starts, ends = self.chunk_ranges(chunks)
        out: list[bytes | None] = [None] * len(chunks)
        if rels:
            for k, blob in zip(which, self.source.read_ranges(rels, starts, ends), strict=True):
                out[k] = blob
        return out

    def row_ranges(self, rows: np.ndarray) -> tuple[list[str], list[int], list[int]]:
        """The byte ranges (files, starts, ends) a read of ``rows`` will fetch (ranged source),
        for callers that fetch ahead."""
        _, rels, starts, ends = self.chunk_ranges(np.unique(np.asarray(rows, np.int64) // self.chunk_rows))
        return rels, starts, ends

    def chunk_ranges(self, chunks: np.ndarray) -> tuple[list[int], list[str], list[int], list[int]]:
        """For each stored chunk of ``chunks``: its position in ``chunks``, file, start, end
        (ranged source)."""
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
        """Refuse (``ValueError``) a chunk whose 16-byte Blosc header does not say
        :attr:`chunk_nbytes` decoded bytes (nbytes, bytes 4-8) from exactly ``length`` stored
        (cbytes, bytes 12-16), before decoding."""
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
        """The addresses of ``chunks`` (:attr:`_addr`), mapping their shards first; ``None``
        without the table or when a chunk is not stored."""
        if self._addr is None:
            return None
        addr = self._addr[chunks]
        if not addr.all():
            self._map_shards(np.unique(chunks[addr == 0] // self.per_shard))
            addr = self._addr[chunks]
        return addr if bool((addr > 0).all()) else None


# ------------------------------------------------------------------------------ decoding chunks


class ChunkReader(_ShardIndex):
    """Reads whole chunks of one zarr array from its files and decodes them with Blosc,
    bypassing zarr's per-chunk machinery (70% of a random read).

    Handles only the layouts this package writes: whole-row chunks encoded ``bytes``
    (little-endian) + ``blosc``, one file per chunk (unsharded) or in shards
    (``sharding_indexed``, index at the end, ``bytes`` + ``crc32c``); :meth:`of` returns ``None``
    for anything else. A ranged source keeps only shard indexes and fetches each read's chunk
    ranges at once.
    """

    @classmethod
    def of(cls, array: Any, directory: Path | ByteSource, *, strict: bool) -> ChunkReader | None:
        """A reader for ``array`` (under folder ``directory``, or from a :class:`ByteSource`),
        or ``None`` for a layout it does not handle."""
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
        """``decode(k, i, dest)``: decode chunk ``i`` (``chunks[k]``) into ``dest``; a remote
        source's bytes are fetched here first."""
        if self._ranged:
            blobs = self._fetch(chunks)
            return lambda k, i, dest: self._decode_blob(i, blobs[k], dest)
        if self._prefetch and self.per_shard:
            self._map_shards(np.unique(chunks // self.per_shard))
        elif self._prefetch:
            self.source.prepare([self._rel(int(i)) for i in chunks])
        return lambda k, i, dest: self.decode_to(i, dest)

    def decode_to(self, i: int, dest: np.ndarray) -> None:
        """Decode chunk ``i`` into ``dest`` (C-contiguous, :attr:`chunk_nbytes` bytes); an
        absent chunk gives the fill value (or raises, :meth:`_missing`)."""
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
        each, buffers kept alive by the caller), split across the decoding threads.

        With every chunk's address known (:meth:`_addresses`), each is one bare decoder call,
        in compiled code without the GIL for many chunks
        (:mod:`rlds_cli.cache.backends.zarr.compiled`); otherwise :meth:`decode_to` per chunk."""
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
        """Rows ``rows`` (1-D, in range) as a new array, or into ``out`` (C-contiguous): each
        needed chunk decoded once, or reused from the previous gather."""
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
        """:meth:`gather` for one-row chunks: each decodes straight into the output; repeated
        rows are decoded once and copied."""
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
        """Rows ``[start, stop)`` (in range) as a new array; whole chunks decode in place."""
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

    Integer, integer-array and slice reads go through :class:`ChunkReader` where it handles the
    layout; anything else is zarr's own indexing."""

    def __init__(self, array: Any, where: Path | str, reader: ChunkReader | None = None) -> None:
        self._array = array
        self._where = where
        self._reader = reader
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        #: Rows per chunk (per shard, if sharded): scans reading whole ones decode each once.
        shards = getattr(array, "shards", None)
        self.chunk_rows = int(shards[0]) if shards else int(array.chunks[0])

    @property
    def one_row_chunks(self) -> bool:
        """Whether each row is its own chunk, read by the chunk reader (frames; see
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
        """Rows ``rows`` (int64, any shape, in ``[0, len)``) into ``out`` (C-contiguous, shape
        ``rows.shape + row shape``, this dtype), decoded straight into it where possible."""
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
