"""Rows of gzip-compressed HDF5 datasets, inflated on several threads.

h5py runs every call under one global lock, so a file's chunks inflate one at a time, on one
core, whatever the reader does. D4RL's generators write every array with
``compression='gzip'`` and h5py's automatic chunk shape ((15,625, 1) for a (10**6, 17) float32
array: one column per chunk), and inflating is most of a conversion's time (docs/benchmarks.md,
"the first download"). :class:`ChunkRows` reads the compressed bytes of the chunks a row range
needs from the file itself (each chunk's address and size from HDF5's chunk index, read once per
dataset; ``os.pread`` releases the GIL, where ``read_direct_chunk`` cost 90 us a chunk under
h5py's lock) and inflates them with :func:`zlib.decompress` (which releases the GIL too), both on
a thread pool, then places each chunk's part in the output.

It serves only the datasets it reproduces exactly (:func:`inflatable`): chunked, one deflate
filter and nothing else, a plain numeric dtype, every chunk of the range allocated. Anything else
(shuffle, fletcher32, other codecs, a sparse chunk, a virtual dataset) is read by h5py as before.
A chunk that does not inflate to its full size is damage: the same ``OSError`` h5py raises.
"""

from __future__ import annotations

import itertools
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Dtype kinds served: bool, signed and unsigned integers, floats (fixed size, any byte order).
INFLATABLE_KINDS = frozenset("biuf")
#: HDF5's filter id for deflate (``H5Z_FILTER_DEFLATE``).
DEFLATE_FILTER = 1


def inflatable(dataset: Any) -> bool:
    """Whether :class:`ChunkRows` reads ``dataset`` (an ``h5py.Dataset``) exactly: chunked, with
    deflate as its only filter, a fixed-size numeric dtype, not virtual."""
    try:
        if dataset.chunks is None or dataset.is_virtual or dataset.dtype.kind not in INFLATABLE_KINDS:
            return False
        if dataset.dtype.fields is not None or dataset.dtype.subdtype is not None or not dataset.shape:
            return False
        plist = dataset.id.get_create_plist()
        return bool(plist.get_nfilters() == 1 and plist.get_filter(0)[0] == DEFLATE_FILTER)
    except (AttributeError, OSError, RuntimeError, ValueError):  # not an h5py dataset: the .npz facade
        return False


def default_threads() -> int:
    """Inflating threads: the usable cores (at most 8; inflating a 60 KiB chunk takes ~0.2 ms)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 8))


@dataclass(frozen=True)
class _Stored:
    """Where one chunk's bytes lie in the file, and whether deflate was applied to them."""

    address: int
    size: int
    deflated: bool


class ChunkRows:
    """Reads row ranges of :func:`inflatable` datasets, inflating their chunks on ``threads``
    threads (1: inline). Keeps the chunks of each dataset's last row of chunks, decoded, so a
    block's one row of lookahead is not inflated twice; :meth:`prefetch` begins inflating the next
    block's chunks while the caller works on this one. Not thread-safe; :meth:`close` stops the
    threads and closes the files."""

    def __init__(self, threads: int | None = None) -> None:
        threads = default_threads() if threads is None else threads
        self._pool: Executor | None = ThreadPoolExecutor(threads, "rlds-inflate") if threads > 1 else None
        self._files: dict[str, int] = {}  # descriptors of the HDF5 files read, by file name
        self._index: dict[str, dict[tuple[int, ...], _Stored]] = {}  # each dataset's chunks
        # per dataset name: the first row of its last chunk row, and those chunks by offset
        self._kept: dict[str, tuple[int, dict[tuple[int, ...], np.ndarray]]] = {}
        # chunks being inflated ahead of their read (prefetch), by dataset name and offset
        self._ahead: dict[str, dict[tuple[int, ...], Future[np.ndarray] | np.ndarray]] = {}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._index.clear()
        self._kept.clear()
        self._ahead.clear()

    def prefetch(self, dataset: Any, start: int, stop: int) -> None:
        """Begin inflating the chunks rows ``start:stop`` of ``dataset`` need, for the
        :meth:`read` that follows (memory: those chunks, decoded). Inline (one thread): nothing.
        A chunk that cannot be read is left for that :meth:`read` to report."""
        if self._pool is None or stop <= start:
            return
        ahead = self._ahead.setdefault(dataset.name, {})
        kept_row, kept = self._kept.get(dataset.name, (-1, {}))
        for offset in _offsets(dataset, start, stop):
            if offset not in ahead and not (offset[0] == kept_row and offset in kept):
                try:
                    ahead[offset] = self._inflate(dataset, offset)
                except OSError:
                    return

    def read(self, dataset: Any, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` of ``dataset`` (an :func:`inflatable` h5py dataset), into ``out``
        (a C-contiguous array of the rows' shape and the dataset's dtype) when given.

        Raises:
            OSError: A chunk is not allocated (its rows are the fill value: read them with h5py),
                or does not inflate to its size (damage).
        """
        shape, chunks = dataset.shape, dataset.chunks
        if out is None:
            out = np.empty((max(0, stop - start), *shape[1:]), dataset.dtype)
        if stop <= start:
            return out
        name = dataset.name
        kept_row, kept = self._kept.get(name, (-1, {}))
        ahead = self._ahead.pop(name, {})
        pending: list[tuple[tuple[int, ...], Future[np.ndarray] | np.ndarray]] = []
        for offset in _offsets(dataset, start, stop):
            if offset[0] == kept_row and offset in kept:
                pending.append((offset, kept[offset]))
            elif offset in ahead:
                pending.append((offset, ahead.pop(offset)))
            else:
                pending.append((offset, self._inflate(dataset, offset)))
        last_row = (stop - 1) // chunks[0] * chunks[0]
        new_kept: dict[tuple[int, ...], np.ndarray] = {}
        for offset, job in pending:
            data = job.result() if isinstance(job, Future) else job
            if offset[0] == last_row:
                new_kept[offset] = data
            _place(out, data, offset, start, stop, shape)
        self._kept[name] = (last_row, new_kept)
        if ahead:  # chunks prefetched past this read: still ahead of the next one
            self._ahead[name] = ahead
        return out

    def _inflate(self, dataset: Any, offset: tuple[int, ...]) -> Future[np.ndarray] | np.ndarray:
        """The chunk at ``offset``, decoded: read and inflated on the pool (or here)."""
        stored = self._chunks(dataset).get(offset)
        if stored is None:
            raise OSError(f"chunk {offset} of {dataset.name} is not allocated")
        fd = self._files[dataset.file.filename]
        args = (fd, stored, dataset.chunks, dataset.dtype, f"chunk {offset} of {dataset.name}")
        return self._pool.submit(_load, *args) if self._pool is not None else _load(*args)

    def _chunks(self, dataset: Any) -> dict[tuple[int, ...], _Stored]:
        """``dataset``'s chunk index (read once): every allocated chunk's place in the file."""
        index = self._index.get(dataset.name)
        if index is not None:
            return index
        filename = dataset.file.filename
        if filename not in self._files:
            self._files[filename] = os.open(filename, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        index = {}

        def add(info: Any) -> None:
            index[tuple(info.chunk_offset)] = _Stored(info.byte_offset, info.size, not info.filter_mask & 1)

        try:
            if hasattr(dataset.id, "chunk_iter"):  # HDF5 >= 1.14: the whole index in one call
                dataset.id.chunk_iter(add)
            else:
                for i in range(dataset.id.get_num_chunks()):
                    add(dataset.id.get_chunk_info(i))
        except RuntimeError as exc:
            raise OSError(f"the chunk index of {dataset.name}: {exc}") from exc
        if index:  # the addresses are the file's own bytes (no user block, no split driver)
            offset, first = next(iter(index.items()))
            if (
                os.pread(self._files[filename], first.size, first.address)
                != dataset.id.read_direct_chunk(offset)[1]
            ):
                raise OSError(f"the chunks of {dataset.name} are not where its index says")
        self._index[dataset.name] = index
        return index


def _offsets(dataset: Any, start: int, stop: int) -> Iterator[tuple[int, ...]]:
    """The offsets of the chunks that hold rows ``start:stop`` of ``dataset``, in order."""
    chunks = dataset.chunks
    inner = [range(0, n, c) for n, c in zip(dataset.shape[1:], chunks[1:], strict=True)]
    for row in range(start // chunks[0] * chunks[0], stop, chunks[0]):
        for rest in itertools.product(*inner):
            yield (row, *rest)


def _load(fd: int, stored: _Stored, chunks: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """A chunk's array from its stored bytes (inflated where deflate was applied to them)."""
    raw = os.pread(fd, stored.size, stored.address)
    size = int(np.prod(chunks)) * dtype.itemsize
    if len(raw) != stored.size:
        raise OSError(f"{what}: the file ends inside it")
    data = zlib.decompress(raw, 15, size) if stored.deflated else raw
    if len(data) != size:
        raise OSError(f"{what} holds {len(data)} bytes, not {size}")
    return np.frombuffer(data, dtype).reshape(chunks)


def _place(
    out: np.ndarray, chunk: np.ndarray, offset: tuple[int, ...], start: int, stop: int, shape: tuple[int, ...]
) -> None:
    """Copy the part of ``chunk`` (at ``offset`` in a dataset of ``shape``) that lies in rows
    ``start:stop`` into ``out`` (those rows). An edge chunk is stored whole: its padding is cut."""
    row = offset[0]
    lo, hi = max(start, row), min(stop, row + chunk.shape[0])
    inner = tuple(
        slice(o, min(o + c, n)) for o, c, n in zip(offset[1:], chunk.shape[1:], shape[1:], strict=True)
    )
    part = tuple(slice(0, s.stop - s.start) for s in inner)
    out[(slice(lo - start, hi - start), *inner)] = chunk[(slice(lo - row, hi - row), *part)]
