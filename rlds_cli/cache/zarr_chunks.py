"""Reading zarr arrays that this package wrote: whole chunks straight from their (shard) files,
decoded with Blosc on threads, into the caller's batch (where the bytes are:
:mod:`rlds_cli.cache.zarr_shards`; where they come from: :mod:`rlds_cli.cache.zarr_source`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.zarr_blosc import COMPILED_MIN_CHUNKS, _decompressor, compiled_decode, run_split
from rlds_cli.cache.zarr_shards import _ABSENT, _ShardIndex
from rlds_cli.cache.zarr_source import ByteSource, LocalFiles, _address


class _ChunkReader(_ShardIndex):
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

    # ------------------------------------------------------------------ reads

    def _undecodable(self, i: int) -> ValueError:
        return ValueError(f"chunk {i} of {self.source.describe('c')} does not decode")

    def _decode_all(self, chunks: np.ndarray, targets: np.ndarray) -> None:
        """Decode each of ``chunks`` to the address in ``targets`` (:attr:`chunk_nbytes` bytes
        each, in buffers the caller keeps alive), split across the decoding threads.

        When every chunk is in a mapped shard and stored (:meth:`_addresses`), the per-chunk work
        is one bare decoder call on two integers: every lookup was done once for the batch, in
        numpy; with numba (the ``fast`` extra) a read of many chunks loops over those calls in
        compiled code, without the GIL (:mod:`rlds_cli.cache._blosc_numba`). Otherwise (no
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
            fn = _decompressor()
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
