"""HDF5 reading shared by the HDF5-based readers: small h5py helpers, the untrusted-file checks,
and gzip-compressed rows inflated on several threads.

h5py runs every call under one global lock, so chunks inflate one at a time; D4RL writes every
array with ``compression='gzip'`` and h5py's automatic chunks (one column per chunk), and
inflating is most of a conversion's time (docs/benchmarks.md, "the first download").
:class:`ChunkRows` reads a row range's compressed chunks from the file itself (addresses from
HDF5's chunk index, read once per dataset; ``os.pread`` releases the GIL, where
``read_direct_chunk`` cost 90 us a chunk under h5py's lock), inflates them with libdeflate
(:func:`inflate`, GIL released) and places them in the output, on a thread pool.

It serves only datasets it reproduces exactly (:func:`inflatable`): chunked, deflate as the only
filter (or byte shuffle then deflate, h5py's ``shuffle=True``), a plain numeric dtype, every chunk of
the range allocated; anything else is read by h5py.
A chunk that does not inflate to its full size raises :class:`ChunkDamageError` (an ``OSError``):
HDF5 itself does not check that size, and h5py returns such a chunk's rows from uninitialised memory,
so a reader never falls back to h5py for it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from deflate import DeflateError, zlib_decompress

from rlds_cli._util.cpus import usable_cpus
from rlds_cli.errors import SourceFormatError, SourceNotFoundError, SourceNotReadableError
from rlds_cli.formats import untrusted

_T = TypeVar("_T")

#: File name suffixes of HDF5 sources.
HDF5_SUFFIXES = (".hdf5", ".h5")
#: Arrays at most this many elements go into the manifest as JSON; larger ones into an npz.
SMALL_ARRAY_ELEMENTS = 16
#: Deepest group nesting accepted in a source file (real files nest a few levels).
MAX_DEPTH = 64


#: The hint for a source file found damaged.
_REDOWNLOAD = "re-download the file ('rlds download ID --force')"


def is_hdf5_name(path: Path) -> bool:
    """Whether ``path`` is named like an HDF5 file (and is no folder)."""
    return path.name.lower().endswith(HDF5_SUFFIXES) and not path.is_dir()


def hdf5_top_keys(path: Path) -> tuple[str, ...] | None:
    """The names at the root of an HDF5 file, or ``None`` when it will not open (for the format
    sniffers; cached per file version)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _top_keys(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _top_keys(path: str, mtime_ns: int, size: int) -> tuple[str, ...] | None:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return tuple(f.keys())
    except (OSError, RuntimeError):  # RuntimeError: damaged metadata (a checksum)
        return None


def open_hdf5(path: Path, *, check_datasets: bool = True) -> Any:
    """Open an HDF5 file read-only (h5py's errors as one-line rlds errors) and check it with
    :func:`check_tree` before any data is read.

    Args:
        path: The file.
        check_datasets: Also check every dataset's storage up front. A reader that opens thousands
            of small datasets (Minari) passes ``False`` and calls :func:`check_dataset` on each one
            it reads, rather than opening each twice.
    """
    import h5py

    if not path.exists():
        raise SourceNotFoundError(f"source file {path} does not exist")
    try:
        f = h5py.File(path, "r")
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read source file {path}: permission denied") from exc
    except OSError as exc:
        if "unable to lock file" in str(exc):  # HDF5's own lock: a writer has the file open
            raise SourceNotReadableError(
                f"{path} is open for writing in another process (HDF5's file lock): {_first_line(exc)}",
                hint="let the writer finish and close it; to read it while it is open (at your own risk), "
                "set HDF5_USE_FILE_LOCKING=FALSE",
            ) from None
        raise SourceFormatError(
            f"cannot open {path} as HDF5 (truncated or corrupt?): {_first_line(exc)}",
            hint=f"{_REDOWNLOAD} or check that it is HDF5",
        ) from exc
    try:
        _small_metadata_cache(f)
        check_tree(f, path, check_datasets=check_datasets)
    except BaseException:
        f.close()
        raise
    return f


#: The most HDF5's metadata cache of a source file holds. HDF5's default (32 MiB, grown as
#: objects are visited) kept ~50 KB a demo of a robomimic file of 3,000 demos alive (a peak of
#: 193 MB, never returned); 4 MiB: 73 MB, in the same time (one pass, in file order).
METADATA_CACHE_BYTES = 4 << 20


def _small_metadata_cache(f: Any) -> None:
    """Hold the open file ``f``'s HDF5 metadata cache to :data:`METADATA_CACHE_BYTES`."""
    config = f.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = min(config.initial_size, METADATA_CACHE_BYTES)
    config.min_size = min(config.min_size, METADATA_CACHE_BYTES)
    config.max_size = METADATA_CACHE_BYTES
    f.id.set_mdc_config(config)


def check_tree(f: Any, path: Path, *, check_datasets: bool = True) -> None:
    """Refuse an HDF5 file that would make rlds read anything but its own bytes, or far more data than
    it holds (:mod:`rlds_cli.formats.untrusted`). Every link is visited once, without reading data:

    * external, soft and user-defined links are refused (every object reached by hard links only);
    * an object reached by two hard links (a cycle) is refused;
    * groups nested deeper than :data:`MAX_DEPTH` are refused;
    * with ``check_datasets``, every dataset is checked by :func:`check_dataset`.

    Raises:
        UnsafeSourceError: Naming the file, the HDF5 path and what it points at.
    """
    from h5py import h5d, h5l

    problems: list[str] = []
    not_text: list[bytes] = []
    seen: dict[int, bytes] = {}  # object address -> the first link that reached it
    hard = h5l.TYPE_HARD

    # the visitor only records: an exception inside it surfaces as SystemError, and a non-None
    # return stops the visit
    def link(name: bytes, info: Any) -> int | None:
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:  # h5py hands such a name out as bytes, which no reader expects
            not_text.append(name)
            return 1
        if info.type == hard:
            first = seen.setdefault(info.u, name)
            if first != name:
                problems.append(
                    f"{_text(name)!r} links to the same object as {_text(first)!r} (linked twice: a cycle?)"
                )
            elif name.count(b"/") >= MAX_DEPTH:
                problems.append(f"{_text(name)[:80]!r}... is nested more than {MAX_DEPTH} groups deep")
        elif info.type == h5l.TYPE_EXTERNAL:
            target_file, target = f.id.links.get_val(name)
            problems.append(
                f"{_text(name)!r} is an external link (to {_text(target)!r} in {_text(target_file)})"
            )
        elif info.type == h5l.TYPE_SOFT:
            problems.append(f"{_text(name)!r} is a soft link (to {_text(f.id.links.get_val(name))!r})")
        else:
            problems.append(f"{_text(name)!r} is a user-defined link (type {info.type})")
        return 1 if problems else None

    try:
        f.id.links.visit(link, info=True)
    except RuntimeError as exc:  # h5py's error for damaged metadata (a checksum, a link table)
        raise SourceFormatError(
            f"{path} is damaged: HDF5 cannot walk its groups ({_first_line(exc)})",
            hint=_REDOWNLOAD,
        ) from None
    if not_text:
        raise SourceFormatError(
            f"{path}: the HDF5 name {not_text[0]!r} is not UTF-8 text",
            hint="rename it in the file (h5py: f.move(OLD, NEW)) with a name of UTF-8 text",
        )
    if problems:
        raise untrusted.UnsafeSourceError(
            f"{path}: {problems[0]}; rlds reads only data stored in the file itself, reached by hard links"
        )
    if check_datasets:
        total = 0
        for name in seen.values():
            try:
                dsid = h5d.open(f.id, name)
            except (ValueError, TypeError):  # an object h5py has no dataset class for
                continue
            except (KeyError, RuntimeError) as exc:  # KeyError: also damaged metadata (a dataspace)
                if "not a dataset" in str(exc):  # a group, or a named datatype
                    continue
                raise SourceFormatError(
                    f"{path} is damaged: HDF5 cannot open {_text(name)!r} ({_first_line(exc)})",
                    hint=_REDOWNLOAD,
                ) from None
            total += check_dataset(path, _text(name), dsid)
        # many sparse datasets, each under the floor, are a bomb together
        untrusted.check_declared(path, None, total, os.path.getsize(path))


def check_dataset(
    path: Path, name: str, dsid: Any, shape: tuple[int, ...] | None = None, dtype: Any = None
) -> int:
    """Refuse one HDF5 dataset (an ``h5py.h5d.DatasetID``) whose data is not in the file (external raw
    storage, a virtual layout mapping other files), whose declared size is far over its stored bytes
    (:func:`untrusted.check_declared`), or that lies past the end of the file.

    ``shape`` and ``dtype`` may be passed when the caller has them (each costs an HDF5 call).
    Returns the bytes it declares.

    Raises:
        UnsafeSourceError: Naming the file and the dataset.
    """
    from h5py import h5d

    shape = dsid.shape if shape is None else shape
    try:
        dtype = dsid.dtype if dtype is None else dtype
    except (TypeError, ValueError) as exc:  # an HDF5 type with no numpy equivalent
        raise SourceFormatError(
            f"{path}: dataset {name!r} has an HDF5 type that numpy cannot hold ({_first_line(exc)})"
        ) from exc
    declared = untrusted.declared_bytes(shape or (), dtype)
    problem = None
    try:
        stored = int(dsid.get_storage_size())
        offset = dsid.get_offset()
        if offset is not None:  # contiguous data inside this file (the cheap, common case)
            # a small array is harmless even if its header lies (the read then fails cleanly)
            if declared > untrusted.RATIO_FLOOR_BYTES and offset + stored > os.path.getsize(path):
                problem = f"claims {stored:,} bytes at offset {offset:,}, past the end of the file"
        else:  # chunked, compact, external or virtual: look at the layout
            plist = dsid.get_create_plist()
            if plist.get_layout() == h5d.CHUNKED:
                untrusted.check_chunks(path, name, plist.get_chunk(), dtype, declared)
                _check_filters(path, name, plist)
            if plist.get_layout() == h5d.VIRTUAL:
                problem, stored = _virtual_problem(dsid, plist)
            elif plist.get_external_count() > 0:
                problem = f"keeps its data in an external file ({_text(plist.get_external(0)[0])})"
    except (RuntimeError, OSError) as exc:  # h5py on a damaged header: "bad coordinate offset"
        raise read_error(path, name, exc) from exc
    if problem is not None:
        raise untrusted.UnsafeSourceError(
            f"{path}: dataset {name!r} {problem}; rlds reads only data stored in the file itself"
        )
    untrusted.check_declared(path, name, declared, stored)
    return declared


def unwritten_chunks(dataset: Any) -> tuple[int, int]:
    """``(missing, expected)``: the chunks of an h5py dataset never written, which HDF5 reads as its
    fill value (a contiguous dataset counts as one chunk; an empty one has none)."""
    if dataset.size == 0:
        return 0, 0
    if dataset.chunks is None:
        return int(dataset.id.get_storage_size() == 0), 1
    expected = math.prod(-(-n // c) for n, c in zip(dataset.shape, dataset.chunks, strict=True))
    return max(0, expected - int(dataset.id.get_num_chunks())), expected


def _check_filters(path: Path, name: str, plist: Any) -> None:
    """Refuse a dataset compressed with an HDF5 filter this h5py cannot apply (blosc, zstd, lz4,
    bitshuffle: ``hdf5plugin``'s), before a read fails and blames the file; ``hdf5plugin`` is
    loaded first where it is installed (importing it registers its filters)."""
    from h5py import h5z

    for i in range(plist.get_nfilters()):
        code, _, _, label = plist.get_filter(i)
        if h5z.filter_avail(code):
            continue
        with contextlib.suppress(ImportError):
            import hdf5plugin  # type: ignore[import-not-found]  # noqa: F401  # registers its filters
        if h5z.filter_avail(code):
            continue
        shown = _text(label) or "unnamed"
        raise SourceFormatError(
            f"{path}: dataset {name!r} is compressed with HDF5 filter {code} ({shown}), which is not "
            "installed (the file is not damaged)",
            hint="pip install hdf5plugin (rlds loads it), or recompress the file with gzip "
            "(h5repack -f GZIP=4 IN OUT)",
        )


def _virtual_problem(dsid: Any, plist: Any) -> tuple[str | None, int]:
    """What is wrong with a virtual dataset (``None``: nothing), and the bytes its distinct sources
    store. Only sources in its own file (``.``, as h5py writes; D4RL's CARLA files) that are not
    virtual themselves are allowed (a chain may map itself: HDF5 then recurses until the process
    dies); a mapping repeating one small source or left mostly to the fill value counts as a bomb."""
    import h5py
    from h5py import h5d

    sources: set[bytes] = set()
    for i in range(plist.get_virtual_count()):
        name = plist.get_virtual_filename(i)
        if name != ".":
            return f"is a virtual dataset mapping data of another file ({name})", 0
        sources.add(plist.get_virtual_dsetname(i).encode())
    fid = h5py.h5i.get_file_id(dsid)
    stored = 0
    for source in sorted(sources):
        try:
            sid = h5d.open(fid, source)
        except (KeyError, ValueError):  # a missing source reads as the fill value: stores nothing
            continue
        if sid.get_create_plist().get_layout() == h5d.VIRTUAL:
            shown = _text(source)
            what = "itself (a cycle)" if sid == dsid else f"{shown!r}, itself virtual (a chain may cycle)"
            return f"is a virtual dataset mapping {what}", 0
        stored += int(sid.get_storage_size())
    return None, stored


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def damage_named(path: Path) -> Iterator[None]:
    """Turn h5py's ``RuntimeError`` for damaged metadata (a checksum, a link table, an attribute
    message) met in the body into one :class:`SourceFormatError` naming ``path``."""
    try:
        yield
    except RuntimeError as exc:
        raise SourceFormatError(
            f"{path} is damaged: HDF5 cannot read its structure ({_first_line(exc)})",
            hint=_REDOWNLOAD,
        ) from None


def read_error(path: Path, key: str, exc: BaseException) -> SourceFormatError:
    """The error for an HDF5 read that fails midway (a damaged or truncated file)."""
    return SourceFormatError(
        f"{path}: reading {key!r} failed (file truncated or corrupt?): {_first_line(exc)}",
        hint=_REDOWNLOAD,
    )


def to_jsonable(value: Any) -> Any:
    """Decode an HDF5 scalar/attribute into something ``json.dumps`` accepts: what JSON has no
    type for (complex numbers, object references) is kept as its text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":
            return value.tolist()
        return [to_jsonable(v) for v in value.ravel().tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return str(value)


def collect_metadata(group: Any, prefix: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Walk an HDF5 group: attributes, scalars and small arrays into ``meta``, larger arrays into
    ``arrays``, keyed by ``/``-joined paths below ``prefix``."""
    import h5py

    for attr, value in group.attrs.items():
        meta[f"{prefix}@{attr}" if prefix else f"@{attr}"] = to_jsonable(value)

    def visit(name: str, obj: Any) -> None:
        path = f"{prefix}/{name}" if prefix else name
        for attr, value in obj.attrs.items():
            meta[f"{path}@{attr}"] = to_jsonable(value)
        if isinstance(obj, h5py.Dataset):
            untrusted.check_side_array(group.file.filename, path, obj.shape or (), obj.dtype)
            if obj.shape == () or obj.size <= SMALL_ARRAY_ELEMENTS or obj.dtype.kind in "SOU":
                meta[path] = to_jsonable(obj[()])
            else:
                arrays[path] = np.asarray(obj[()])

    group.visititems(visit)


class ChunkDamageError(OSError):
    """A stored chunk that does not hold its rows: its bytes do not inflate, inflate to another size,
    or lie past the end of the file."""


def inflate(raw: bytes, size: int) -> bytearray:
    """The ``size`` bytes a zlib stream (HDF5's deflate filter) holds, inflated by libdeflate (1.3-1.7x
    zlib's rate; releases the GIL; never more than ``size``). Raises :class:`ChunkDamageError` on a
    damaged stream."""
    try:
        return zlib_decompress(raw, size)
    except DeflateError as exc:
        raise ChunkDamageError(f"the compressed bytes do not inflate to {size} bytes ({exc})") from exc


#: Dtype kinds served: bool, signed and unsigned integers, floats (fixed size, any byte order).
INFLATABLE_KINDS = frozenset("biuf")
#: HDF5's filter id for deflate (``H5Z_FILTER_DEFLATE``).
DEFLATE_FILTER = 1


#: HDF5's filter id for byte shuffle (``H5Z_FILTER_SHUFFLE``).
SHUFFLE_FILTER = 2
#: The filter pipelines :class:`ChunkRows` undoes, in the order they were applied when writing.
INFLATABLE_PIPELINES = frozenset({(DEFLATE_FILTER,), (SHUFFLE_FILTER, DEFLATE_FILTER)})


def _pipeline(dataset: Any) -> tuple[int, ...]:
    """The filter ids of ``dataset``'s pipeline, in the order they were applied when writing."""
    plist = dataset.id.get_create_plist()
    return tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))


def inflatable(dataset: Any) -> bool:
    """Whether :class:`ChunkRows` reads ``dataset`` (an ``h5py.Dataset``) exactly: chunked, deflate as
    its only filter or byte shuffle then deflate, a fixed-size numeric dtype, not virtual, and
    stored as that numpy type's own bytes (HDF5 converts others on read: a 24-bit precision
    integer, a bfloat16, whose bytes viewed as numpy's type are other numbers)."""
    from h5py import h5t

    try:
        if dataset.chunks is None or dataset.is_virtual or dataset.dtype.kind not in INFLATABLE_KINDS:
            return False
        if dataset.dtype.fields is not None or dataset.dtype.subdtype is not None or not dataset.shape:
            return False
        if not dataset.id.get_type().equal(h5t.py_create(dataset.dtype)):
            return False
        return _pipeline(dataset) in INFLATABLE_PIPELINES
    except (AttributeError, OSError, RuntimeError, ValueError):  # not an h5py dataset: the .npz facade
        return False


def default_threads() -> int:
    """Inflating threads: the usable cores (at most 8; inflating a 60 KiB chunk takes ~0.2 ms)."""
    return max(1, min(usable_cpus(), 8))


@dataclass(frozen=True)
class _Stored:
    """Where one chunk's bytes lie in the file, and the filters applied to them (in order; a chunk's
    filter mask may skip some of its dataset's)."""

    address: int
    size: int
    filters: tuple[int, ...]


@dataclass(frozen=True)
class _Pending:
    """A chunk inflated ahead of its read: item ``index`` of what a prefetch task returns."""

    job: Future[list[np.ndarray]]
    index: int

    def result(self) -> np.ndarray:
        return self.job.result()[self.index]


@dataclass
class _Layout:
    """What reading one dataset's chunks needs, looked up once (each h5py property is a call under its
    lock): file, chunk shape, dtype, chunk index."""

    dataset: Any  # held, so that the id() it is filed under is never reused
    name: str
    fd: int
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    index: dict[tuple[int, ...], _Stored]
    kept_row: int = -1  # the first row of the last chunk row read, and those chunks, decoded
    kept: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict)
    # chunks being inflated ahead of their read (prefetch), by offset
    ahead: dict[tuple[int, ...], _Pending] = field(default_factory=dict)

    def offsets(self, start: int, stop: int) -> Iterator[tuple[int, ...]]:
        """The offsets of the chunks that hold rows ``start:stop``, in order."""
        inner = [range(0, n, c) for n, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        for row in range(start // self.chunks[0] * self.chunks[0], stop, self.chunks[0]):
            for rest in itertools.product(*inner):
                yield (row, *rest)

    def source(self, offset: tuple[int, ...]) -> tuple[int, _Stored, tuple[int, ...], np.dtype, str]:
        """The arguments of :func:`_load` for the chunk at ``offset``."""
        stored = self.index.get(offset)
        if stored is None:
            raise OSError(f"chunk {offset} of {self.name} is not allocated")
        return self.fd, stored, self.chunks, self.dtype, f"chunk {offset} of {self.name}"


def read_rows(
    reader: ChunkRows, dataset: Any, start: int, stop: int, out: np.ndarray | None = None, *, inflated: bool
) -> np.ndarray:
    """Rows ``start:stop`` of an h5py ``dataset`` (into ``out`` when given): by ``reader`` where it
    serves the dataset (``inflated``: :func:`inflatable`), else, and for a chunk it does not serve
    (sparse: the fill value), by h5py.

    Raises:
        ChunkDamageError: A chunk does not hold its rows (h5py would return them from uninitialised
            memory).
        OSError, RuntimeError: h5py's, for damage it finds.
    """
    if inflated:
        try:
            return reader.read(dataset, start, stop, out)
        except ChunkDamageError:
            raise
        except (OSError, RuntimeError, ValueError):
            pass  # a sparse chunk, or an index it cannot walk: h5py reads the fill value or names it
    if out is None:
        return np.asarray(dataset[start:stop])
    dataset.read_direct(out, np.s_[start:stop], np.s_[0 : stop - start])
    return out


class ChunkRows:
    """Reads row ranges of :func:`inflatable` datasets, inflating chunks on ``threads`` threads (1:
    inline). Keeps each dataset's last row of chunks decoded, so a block's one-row lookahead is not
    inflated twice; :meth:`prefetch` starts on the next block's chunks. Not thread-safe; :meth:`close`
    stops the threads and closes the files."""

    def __init__(self, threads: int | None = None) -> None:
        threads = default_threads() if threads is None else threads
        self._threads = threads
        self._pool: Executor | None = ThreadPoolExecutor(threads, "rlds-inflate") if threads > 1 else None
        self._files: dict[str, int] = {}  # descriptors of the HDF5 files read, by file name
        self._layouts: dict[int, _Layout] = {}  # by id() of the h5py dataset

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._layouts.clear()

    def forget(self, datasets: Iterable[Any]) -> None:
        """Drop what is held for ``datasets`` (their chunk index and decoded chunks): a reader that
        moves on to other datasets (robomimic's next demo) keeps memory bounded."""
        for dataset in datasets:
            layout = self._layouts.pop(id(dataset), None)
            for pending in layout.ahead.values() if layout is not None else ():
                pending.job.cancel()

    def prefetch(self, dataset: Any, start: int, stop: int) -> None:
        """Begin inflating the chunks that rows ``start:stop`` of ``dataset`` need, for the following
        :meth:`read` (nothing when inline). A chunk that cannot be read is left for that :meth:`read`."""
        if self._pool is None or stop <= start:
            return
        layout = self._layout(dataset)
        wanted: list[tuple[tuple[int, ...], tuple[Any, ...]]] = []
        for offset in layout.offsets(start, stop):
            if offset not in layout.ahead and not (offset[0] == layout.kept_row and offset in layout.kept):
                try:
                    wanted.append((offset, layout.source(offset)))
                except OSError:
                    break
        for group in self._groups(wanted):
            job = self._pool.submit(_load_group, [source for _, source in group])
            for index, (offset, _) in enumerate(group):
                layout.ahead[offset] = _Pending(job, index)

    def read(self, dataset: Any, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` of ``dataset`` (an :func:`inflatable` h5py dataset), into ``out``
        (a C-contiguous array of the rows' shape and the dataset's dtype) when given.

        Raises:
            OSError: A chunk is not allocated (its rows are the fill value: read them with h5py),
                or does not inflate to its size (damage).
        """
        layout = self._layout(dataset)
        if out is None:
            out = np.empty((max(0, stop - start), *layout.shape[1:]), layout.dtype)
        if stop <= start:
            return out
        last_row = (stop - 1) // layout.chunks[0] * layout.chunks[0]
        placing: list[tuple[tuple[int, ...], _Source]] = []
        for offset in layout.offsets(start, stop):
            source: _Source
            if offset[0] == layout.kept_row and offset in layout.kept:
                source = layout.kept[offset]
            else:
                source = layout.ahead.pop(offset, None) or layout.source(offset)
            placing.append((offset, source))
        if self._pool is None:
            placed = _fill_group(placing, out, start, stop)
        else:  # read, inflated and placed on the threads, a few tasks per call (each costs ~20 us)
            pool = self._pool
            jobs = [pool.submit(_fill_group, group, out, start, stop) for group in self._groups(placing)]
            placed = [data for job in jobs for data in job.result()]
        offsets = [offset for offset, _ in placing]
        kept = {offset: data for offset, data in zip(offsets, placed, strict=True) if offset[0] == last_row}
        layout.kept_row, layout.kept = last_row, kept
        return out

    def _groups(self, items: list[_T]) -> list[list[_T]]:
        """``items`` in consecutive groups, two a thread (few tasks, and the threads kept even)."""
        tasks = 2 * self._threads
        size = max(1, -(-len(items) // tasks))
        return [items[i : i + size] for i in range(0, len(items), size)]

    def _layout(self, dataset: Any) -> _Layout:
        """``dataset``'s :class:`_Layout`, its chunk index read on first use."""
        layout = self._layouts.get(id(dataset))
        if layout is not None:
            return layout
        filename, name = dataset.file.filename, dataset.name
        if filename not in self._files:
            self._files[filename] = os.open(filename, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        index: dict[tuple[int, ...], _Stored] = {}
        pipeline = _pipeline(dataset)

        def add(info: Any) -> None:
            applied = tuple(f for i, f in enumerate(pipeline) if not info.filter_mask >> i & 1)
            index[tuple(info.chunk_offset)] = _Stored(info.byte_offset, info.size, applied)

        try:
            if hasattr(dataset.id, "chunk_iter"):  # HDF5 >= 1.14: the whole index in one call
                dataset.id.chunk_iter(add)
            else:
                for i in range(dataset.id.get_num_chunks()):
                    add(dataset.id.get_chunk_info(i))
        except RuntimeError as exc:
            raise OSError(f"the chunk index of {name}: {exc}") from exc
        if index:  # the addresses are the file's own bytes (no user block, no split driver)
            offset, first = next(iter(index.items()))
            if (
                os.pread(self._files[filename], first.size, first.address)
                != dataset.id.read_direct_chunk(offset)[1]
            ):
                raise OSError(f"the chunks of {name} are not where its index says")
        layout = _Layout(
            dataset,
            name,
            self._files[filename],
            tuple(dataset.shape),
            tuple(dataset.chunks),
            dataset.dtype,
            index,
        )
        self._layouts[id(dataset)] = layout
        return layout


def _load(fd: int, stored: _Stored, chunks: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """A chunk's array from its stored bytes (inflated, then unshuffled, where those filters were
    applied to them)."""
    raw = os.pread(fd, stored.size, stored.address)
    size = int(np.prod(chunks)) * dtype.itemsize
    if len(raw) != stored.size:
        raise ChunkDamageError(f"{what}: the file ends inside it")
    try:
        data = inflate(raw, size) if DEFLATE_FILTER in stored.filters else raw
    except ChunkDamageError as exc:
        raise ChunkDamageError(f"{what}: {exc}") from None
    if len(data) != size:
        raise ChunkDamageError(f"{what} holds {len(data)} bytes, not {size}")
    flat = np.frombuffer(data, np.uint8)
    if SHUFFLE_FILTER in stored.filters and dtype.itemsize > 1:  # byte k of every item, then byte k+1
        flat = flat.reshape(dtype.itemsize, -1).T.copy()
    return flat.view(dtype).reshape(chunks)


def _load_group(sources: list[tuple[Any, ...]]) -> list[np.ndarray]:
    """:func:`_load` of each of ``sources``, in order."""
    return [_load(*source) for source in sources]


#: Where a chunk read comes from: kept decoded, inflated ahead, or the arguments of :func:`_load`.
_Source = np.ndarray | _Pending | tuple[Any, ...]


def _fill_group(
    placing: list[tuple[tuple[int, ...], _Source]], out: np.ndarray, start: int, stop: int
) -> list[np.ndarray]:
    """Each chunk of ``placing`` (offset, source) placed in ``out``; their arrays, in order."""
    placed = []
    for offset, source in placing:
        if isinstance(source, np.ndarray):
            data = source
        else:
            data = source.result() if isinstance(source, _Pending) else _load(*source)
        _place(out, data, offset, start, stop)
        placed.append(data)
    return placed


def _place(out: np.ndarray, chunk: np.ndarray, offset: tuple[int, ...], start: int, stop: int) -> None:
    """Copy the rows ``start:stop`` part of ``chunk`` (at ``offset``) into ``out``; an edge chunk's
    padding is cut."""
    row = offset[0]
    lo, hi = max(start, row), min(stop, row + chunk.shape[0])
    inner = tuple(
        slice(o, min(o + c, n)) for o, c, n in zip(offset[1:], chunk.shape[1:], out.shape[1:], strict=True)
    )
    part = tuple(slice(0, s.stop - s.start) for s in inner)
    out[(slice(lo - start, hi - start), *inner)] = chunk[(slice(lo - row, hi - row), *part)]
