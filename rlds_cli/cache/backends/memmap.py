"""The ``memmap`` backend: one plain ``.npy`` file per key under ``arrays/``.

Files are uncompressed and C-contiguous, openable by ``numpy.load(path, mmap_mode="r")``. Rows
are appended as they stream in; the header (:data:`NPY_HEADER_BYTES`) is patched with the final
row count at close. A preallocated column is a writable memory map filled region by region.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from tokenize import TokenError
from typing import IO, TYPE_CHECKING

import numpy as np

from rlds_cli._util.io import in_background
from rlds_cli.cache.backends.base import Backend, ColumnWriter, RegionWriter, key_path
from rlds_cli.errors import CorruptDatasetError, DiskFullError

if TYPE_CHECKING:
    from concurrent.futures import Future

_NPY_MAGIC = b"\x93NUMPY\x01\x00"
#: Bytes reserved for the .npy preamble + header; a multiple of 64 so the data stays aligned.
NPY_HEADER_BYTES = 256


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` header padded to exactly :data:`NPY_HEADER_BYTES` bytes."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    body_len = NPY_HEADER_BYTES - len(_NPY_MAGIC) - 2
    if len(text) + 1 > body_len:
        raise ValueError(f"npy header too long for shape {shape} and dtype {dtype}")
    body = text.ljust(body_len - 1) + "\n"
    return _NPY_MAGIC + body_len.to_bytes(2, "little") + body.encode("latin1")


#: What numpy raises on a damaged ``.npy`` header: its parser tokenizes and evaluates the text.
_HEADER_ERRORS = (ValueError, SyntaxError, TokenError, EOFError, OverflowError, TypeError, KeyError)


#: The exact version 1 header numpy writes for a plain array (``descr`` a simple type or a list of
#: named fields, ``fortran_order``, ``shape``, space-padded to a newline).
_FIELD = rb"\('[a-z_]+', '[<>|=][a-z]\d{1,2}'\)"  # one named field of a plain type
_PLAIN_HEADER = re.compile(
    rb"\{'descr': ('[<>|=][a-z]\d{1,2}'|\[" + _FIELD + rb"(?:, " + _FIELD + rb")*\]), "
    rb"'fortran_order': (False|True), 'shape': \(((?:\d+, ?)*\d*)\), \} *\n"
)
#: Parsed field-list dtypes by header text (episode indexes are read at every refresh)
_FIELD_DTYPES: dict[bytes, np.dtype] = {}


def _plain_header(fh: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """``(shape, fortran_order, dtype)`` of the ``.npy`` file open at its start, if its header
    matches :data:`_PLAIN_HEADER`; else ``None`` (numpy's parser, ~10x slower at 60 us a file)."""
    lead = fh.read(10)
    if len(lead) < 10 or lead[:8] != b"\x93NUMPY\x01\x00":
        return None
    match = _PLAIN_HEADER.fullmatch(fh.read(int.from_bytes(lead[8:10], "little")))
    if match is None:
        return None
    shape = tuple(int(d) for d in match[3].split(b",") if d.strip())
    descr = match[1]
    if descr.startswith(b"'"):
        return shape, match[2] == b"True", np.dtype(descr[1:-1].decode())
    dtype = _FIELD_DTYPES.get(descr)
    if dtype is None:
        fields = re.findall(rb"\('([a-z_]+)', '([^']+)'\)", descr)
        dtype = np.dtype([(name.decode(), code.decode()) for name, code in fields])
        if len(_FIELD_DTYPES) < 64:
            _FIELD_DTYPES[descr] = dtype
    return shape, match[2] == b"True", dtype


def load_npy(path: Path, *, mmap: bool, what: str = "array file") -> np.ndarray:
    """The plain ``.npy`` array at ``path``, memory-mapped read-only or read whole.

    The header is checked against the file's size before any data is mapped or read. ``what``
    names the file in messages.

    Raises:
        CorruptDatasetError: A damaged header, an object or Fortran array, or a short file.
        FileNotFoundError: The file is missing.
    """
    fmt = np.lib.format
    with open(path, "rb") as fh:
        try:
            fast = _plain_header(fh)
            if fast is not None:
                shape, fortran, dtype = fast
            else:
                fh.seek(0)
                major, _ = fmt.read_magic(fh)
                read_header = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
                shape, fortran, dtype = read_header(fh)
        except _HEADER_ERRORS as exc:
            detail = "pickled objects" if "pickle" in str(exc) else str(exc).split("\n")[0]
            raise CorruptDatasetError(
                f"{what} {path} is unreadable: its header is damaged ({detail})"
            ) from exc
        offset, size = fh.tell(), os.fstat(fh.fileno()).st_size
        if dtype.hasobject or fortran:
            raise CorruptDatasetError(f"{what} {path} is unreadable: not a plain numeric .npy array")
        count = int(np.prod(shape, dtype=np.int64)) if all(d >= 0 for d in shape) else -1
        if count < 0 or offset + dtype.itemsize * count > size:
            raise CorruptDatasetError(
                f"{what} {path} is damaged: its header promises shape {shape} {dtype}, more than "
                f"its {size} bytes"
            )
        try:
            if not mmap:
                return np.fromfile(fh, dtype=dtype, count=count).reshape(shape)
            # the checked file, not the path again (a replaced dataset has another file there)
            return np.memmap(fh, dtype=dtype, shape=shape, mode="r", offset=offset)
        except ValueError as exc:  # shorter than its header says after all (cut meanwhile)
            raise CorruptDatasetError(f"{what} {path} is damaged: {exc}") from exc


#: Bytes before a block that :func:`release_pages` releases with it (see there).
RELEASE_MARGIN = 2 * 1024 * 1024


def release_pages(rows: np.ndarray) -> bool:
    """Drop the pages under ``rows`` (a view of a read-only memory map) from this process's
    resident set; they stay in the page cache. A block-by-block scan then holds one block of
    memory (without it, 3.2 GiB after scanning a 50M-step low-dim dataset).

    Returns:
        Whether pages were released (``False``: ``rows`` is empty or not in a read-only map,
        or the platform has no ``MADV_DONTNEED``).
    """
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None or rows.size == 0:
        return False
    # only a read-only map: dropping the pages of a copy-on-write one ("c") drops its changes
    readonly, base = isinstance(rows, np.memmap) and rows.mode == "r", rows.base
    while isinstance(base, np.ndarray):  # a view's base is the array it views; a map's, its mmap
        readonly = readonly or (isinstance(base, np.memmap) and base.mode == "r")
        base = base.base
    if not readonly or not isinstance(base, mmap.mmap):
        return False
    origin = np.frombuffer(base, np.uint8).__array_interface__["data"][0]
    low, high = np.lib.array_utils.byte_bounds(rows)
    # from RELEASE_MARGIN before the rows: Linux's fault-around maps up to 2 MiB around a fault
    first = max(0, low - origin - RELEASE_MARGIN)
    first -= first % mmap.PAGESIZE  # madvise starts at a page boundary
    try:
        base.madvise(advice, first, high - origin - first)
    except OSError:  # a kernel that refuses the advice: the pages just stay
        return False
    return True


def save_npz(file: str | os.PathLike[str] | IO[bytes], arrays: Mapping[str, np.ndarray]) -> None:
    """An uncompressed ``.npz`` of ``arrays``, in ``np.savez``'s zip layout, accepting any names
    (``np.savez`` mistakes arrays named ``allow_pickle`` or ``file`` for its arguments)."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:  # as np.savez does (gh-10776)
                np.lib.format.write_array(fh, np.asanyarray(value), allow_pickle=True)


#: Bytes a column writes before :meth:`NpyColumnWriter.write_behind` starts an ``fdatasync``
#: (a 1M-step conversion's closing fsync took 0.28 s of 1.75 s; docs/benchmarks.md).
WRITE_BEHIND_BYTES = 8 << 20


class NpyColumnWriter(ColumnWriter):
    """Streams rows into a ``.npy`` file; the header is patched on close."""

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(row_shape)
        self.rows = 0
        self._unsynced = 0  # bytes appended since the last write-behind began
        self._syncing: Future[None] | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._fh.write(npy_header(self.dtype, (0, *self.row_shape)))

    def append(self, rows: np.ndarray) -> None:
        data = np.ascontiguousarray(rows, dtype=self.dtype)
        if data.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path.name}: rows of shape {data.shape[1:]}, expected {self.row_shape}")
        if data.size == 0:  # an empty block: nothing to write (its buffer cannot be cast to bytes)
            return
        self._fh.write(data.data.cast("B"))  # the array's buffer, as bytes
        self.rows += data.shape[0]
        self._unsynced += data.nbytes

    def write_behind(self) -> None:
        if self._unsynced < WRITE_BEHIND_BYTES or (self._syncing is not None and not self._syncing.done()):
            return
        self._wait_behind()
        self._fh.flush()
        self._unsynced = 0
        self._syncing = in_background(os.fdatasync, self._fh.fileno())

    def _wait_behind(self) -> None:
        """Wait for the write-behind under way, re-raising its error."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            syncing.result()

    def abort(self) -> None:
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            syncing.exception()  # waits (the descriptor it syncs is closed next); the build failed
        with contextlib.suppress(OSError):  # its last flush may fail as the build did
            self._fh.close()

    def close(self, *, fsync: bool) -> int:
        self._wait_behind()  # before the file closes: its descriptor is the one being synced
        self._fh.seek(0)
        self._fh.write(npy_header(self.dtype, (self.rows, *self.row_shape)))
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())
        self._fh.close()
        return self.rows


def reserve(fd: int, size: int, path: Path) -> None:
    """Allocate ``size`` bytes of the open file ``fd`` on disk, or raise :class:`DiskFullError`
    (a full disk met through a memory map is a silent SIGBUS). A no-op where unsupported."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise DiskFullError(
                f"not enough disk space for {path} ({size:,} bytes)",
                hint="free some space (e.g. 'rlds gc', 'rlds rm'), or set RLDS_HOME to a larger disk",
            ) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


class _ArrayRegion(RegionWriter):
    """A region that is a slice of a writable memory map: written in place."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def close(self, *, fsync: bool) -> None:
        if fsync and isinstance(self.rows, np.memmap):
            self.rows.flush()
        del self.rows  # unmapped once the last slice of the map goes


class MemmapBackend(Backend):
    """One plain ``.npy`` file per key, opened as a read-only memory map."""

    name = "memmap"
    stable_once_open = True

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        return NpyColumnWriter(key_path(dataset_dir, key, ".npy"), dtype, row_shape)

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        try:
            column = self.open_column(dataset_dir, key)
        except CorruptDatasetError as exc:
            return exc.message
        if column.shape != (rows, *row_shape):
            return f"array file of {key!r} has shape {column.shape}, expected {(rows, *row_shape)}"
        return None

    def preallocate(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...], rows: int
    ) -> None:
        path = key_path(dataset_dir, key, ".npy")
        path.parent.mkdir(parents=True, exist_ok=True)
        size = self.preallocated_bytes(dtype, row_shape, rows)
        with open(path, "wb") as fh:
            fh.write(npy_header(np.dtype(dtype), (rows, *row_shape)))
            fh.truncate(size)
            fh.flush()
            if size > NPY_HEADER_BYTES:
                reserve(fh.fileno(), size, path)

    def preallocated_bytes(self, dtype: np.dtype, row_shape: tuple[int, ...], rows: int) -> int:
        return NPY_HEADER_BYTES + rows * np.dtype(dtype).itemsize * int(np.prod(row_shape, dtype=np.int64))

    def open_region(self, dataset_dir: Path, key: str, start: int, stop: int) -> RegionWriter:
        column = np.load(key_path(dataset_dir, key, ".npy"), mmap_mode="r+", allow_pickle=False)
        if not 0 <= start <= stop <= len(column):
            raise ValueError(f"rows {start}:{stop} are outside column {key!r} of {len(column)} rows")
        return _ArrayRegion(column[start:stop])

    def open_column(self, dataset_dir: Path, key: str) -> np.ndarray:
        path = key_path(dataset_dir, key, ".npy")
        try:
            return load_npy(path, mmap=True)
        except FileNotFoundError:
            raise CorruptDatasetError(f"array file {path} is missing") from None

    def read_column(self, dataset_dir: Path, key: str, stop: int) -> np.ndarray:
        # a plain read: a memmap costs 4x for the small segments a refresh reads whole
        path = key_path(dataset_dir, key, ".npy")
        try:
            rows = load_npy(path, mmap=False)
        except FileNotFoundError:
            raise CorruptDatasetError(f"array file {path} is missing") from None
        if len(rows) < stop:
            raise CorruptDatasetError(f"array file {path} holds {len(rows)} rows, {stop} expected")
        return rows[:stop]
