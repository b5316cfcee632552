"""The ``memmap`` backend: one plain ``.npy`` file per key under ``arrays/``.

Files are uncompressed and C-contiguous, openable by ``numpy.load(path, mmap_mode="r")``. Rows
are appended as they stream in; the header (:data:`NPY_HEADER_BYTES`) is patched with the final
row count at close. A column whose size is known when it starts (a writer's commit, a compaction)
and is at least :data:`DIRECT_MIN_BYTES` is written by :class:`NpyConcatenation`, around the page
cache. A preallocated column is a writable memory map filled region by region.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import threading
import zipfile
from collections.abc import Callable, Mapping
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
        return shape, match[2] == b"True", _written_as(descr[1:-1].decode())
    dtype = _FIELD_DTYPES.get(descr)
    if dtype is None:
        fields = re.findall(rb"\('([a-z_]+)', '([^']+)'\)", descr)
        dtype = np.dtype([(name.decode(), _written_as(code.decode())) for name, code in fields])
        if len(_FIELD_DTYPES) < 64:
            _FIELD_DTYPES[descr] = dtype
    return shape, match[2] == b"True", dtype


def _written_as(code: str) -> np.dtype:
    """The dtype of type code ``code`` as numpy writes one (``<f4``, ``|u1``): another spelling
    of the same type (``=f4``) is no header numpy wrote, so a changed byte (``ValueError``)."""
    dtype = np.dtype(code)
    if dtype.str != code:
        raise ValueError(f"its type code {code!r} is not as numpy writes it ({dtype.str!r})")
    return dtype


def _checked_header(fh: IO[bytes], path: Path, what: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` of the plain ``.npy`` file open at its start, checked
    against the file's size (see :func:`load_npy`)."""
    fmt = np.lib.format
    try:
        fast = _plain_header(fh)
        if fast is not None:
            shape, fortran, dtype = fast
        else:
            fh.seek(0)
            version = fmt.read_magic(fh)
            if version not in ((1, 0), (2, 0), (3, 0)):  # the versions numpy writes
                raise ValueError(f"format version {version[0]}.{version[1]} is none numpy writes")
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
            _same_descr(fh, version, dtype)
    except _HEADER_ERRORS as exc:
        detail = "pickled objects" if "pickle" in str(exc) else str(exc).split("\n")[0]
        raise CorruptDatasetError(f"{what} {path} is unreadable: its header is damaged ({detail})") from exc
    offset, size = fh.tell(), os.fstat(fh.fileno()).st_size
    if dtype.hasobject or fortran:
        raise CorruptDatasetError(f"{what} {path} is unreadable: not a plain numeric .npy array")
    count = int(np.prod(shape, dtype=np.int64)) if all(d >= 0 for d in shape) else -1
    if count < 0 or offset + dtype.itemsize * count > size:
        raise CorruptDatasetError(
            f"{what} {path} is damaged: its header promises shape {shape} {dtype}, more than its {size} bytes"
        )
    if offset + dtype.itemsize * count < size:  # rlds writes none: bytes appended, or a header changed
        raise CorruptDatasetError(
            f"{what} {path} is damaged: {size - offset - dtype.itemsize * count} bytes follow the shape "
            f"{shape} {dtype} its header promises"
        )
    return tuple(shape), dtype, offset


def _same_descr(fh: IO[bytes], version: tuple[int, int], dtype: np.dtype) -> None:
    """Refuse (``ValueError``) a header whose ``descr`` is not what numpy writes for ``dtype``
    (``'=f4'`` for ``'<f4'``: one bit changed, the same array read); ``fh`` is left where it was."""
    import ast

    at = fh.tell()
    try:
        fh.seek(8)
        width = 2 if version == (1, 0) else 4
        text = fh.read(int.from_bytes(fh.read(width), "little"))
        header = ast.literal_eval(text.decode("utf-8" if version == (3, 0) else "latin1"))
    finally:
        fh.seek(at)
    written = header.get("descr") if isinstance(header, dict) else None
    if written != np.lib.format.dtype_to_descr(dtype):
        raise ValueError(f"its dtype {written!r} is not as numpy writes it")


def load_npy(path: Path, *, mmap: bool, what: str = "array file") -> np.ndarray:
    """The plain ``.npy`` array at ``path``, memory-mapped read-only or read whole.

    The header is checked against the file's size before any data is mapped or read. ``what``
    names the file in messages.

    Raises:
        CorruptDatasetError: A damaged header, an object or Fortran array, or a file shorter or
            longer than its header says.
        FileNotFoundError: The file is missing.
    """
    with open(path, "rb") as fh:
        shape, dtype, offset = _checked_header(fh, path, what)
        count = int(np.prod(shape, dtype=np.int64))
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


def _rows_as_bytes(
    rows: np.ndarray, dtype: np.dtype, row_shape: tuple[int, ...], path: Path
) -> memoryview | None:
    """The bytes of ``rows`` (first axis = time) as ``dtype``, C order, for the file at ``path``
    whose rows have ``row_shape``; ``None`` for no rows (an empty buffer cannot be cast)."""
    data = np.ascontiguousarray(rows, dtype=dtype)
    if data.shape[1:] != row_shape:
        raise ValueError(f"{path.name}: rows of shape {data.shape[1:]}, expected {row_shape}")
    return data.data.cast("B") if data.size else None


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
        data = _rows_as_bytes(rows, self.dtype, self.row_shape, self.path)
        if data is None:
            return
        self._fh.write(data)
        self.rows += len(rows)
        self._unsynced += len(data)

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


class NpySource:
    """A plain ``.npy`` file open for :meth:`NpyConcatenation.copy`: its header checked as
    :func:`load_npy` checks it, its bytes read through its own descriptor (never remapped).

    Raises:
        CorruptDatasetError: As :func:`load_npy`.
        FileNotFoundError: The file is missing.
    """

    def __init__(self, path: Path, what: str = "array file") -> None:
        self.path = path
        self._fh = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        try:
            self.shape, self.dtype, self.offset = _checked_header(self._fh, path, what)
        except BaseException:
            self._fh.close()
            raise

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))

    def fileno(self) -> int:
        return self._fh.fileno()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> NpySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Bytes of one buffer of :class:`NpyConcatenation` (a multiple of every disk's block size).
CONCAT_BUFFER_BYTES = 8 << 20
#: Buffers an :class:`NpyConcatenation` fills while earlier ones are written.
CONCAT_BUFFERS = 4
#: Files of at least this many bytes are written with ``O_DIRECT`` (a commit's camera frames, a
#: compaction's columns); smaller ones through the page cache, where the learner following the
#: view finds them. Through the page cache, long runs of frame appends wrote at the kernel's
#: writeback rate, 0.3-0.6 GB/s on this VM's disk, against 1.8 GB/s direct (docs/benchmarks.md).
DIRECT_MIN_BYTES = 1 << 20
#: The alignment ``O_DIRECT`` asks of offsets and lengths (4 KiB covers 512-byte disks too).
_DIRECT_ALIGN = 4096


class NpyConcatenation(ColumnWriter):
    """A new ``.npy`` file of a known number of rows, written at the disk's rate from rows in
    memory (:meth:`append`: a writer's commit) or row ranges of other ``.npy`` files, each read
    once (:meth:`copy`: compaction).

    The file (header included) is assembled in page-aligned buffers (filled by copies or by
    ``preadv`` from the sources); the first and the last are written on the caller's thread,
    those between on the I/O threads while the next buffer fills.
    Files of at least :data:`DIRECT_MIN_BYTES` are written with ``O_DIRECT`` where the
    filesystem takes it: no copy into the page cache, no dirty pages for the kernel's writeback
    to pile up and throttle, so the copy runs at the disk's own write rate. Every byte read is
    handed to the caller's hooks (digests) before its buffer is written. Exactly the rows given
    at creation must be added: :meth:`close` refuses a short file.
    """

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...], rows: int) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(row_shape)
        self.rows = rows
        self.size = NPY_HEADER_BYTES + rows * self.dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        # no more buffer than the file needs; buffers are reused (a fresh one's page faults cost
        # more than the copy into it)
        self._capacity = min(CONCAT_BUFFER_BYTES, -(-self.size // _DIRECT_ALIGN) * _DIRECT_ALIGN)
        self._buffers = _take_buffers(min(CONCAT_BUFFERS, -(-self.size // self._capacity)), self._capacity)
        self._writes: list[Future[None] | None] = [None] * len(self._buffers)
        self._current = 0  # the buffer being filled
        self._fill = 0  # its bytes filled
        self._offset = 0  # the file offset of its first byte
        self._proven = False  # whether a write went through (the first is made on this thread)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._direct = self.size >= DIRECT_MIN_BYTES and hasattr(os, "O_DIRECT")
        header = npy_header(self.dtype, (rows, *self.row_shape))
        self._fd = self._open()
        self._put(header)

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        if self._direct:
            try:
                return os.open(self.path, flags | os.O_TRUNC | os.O_DIRECT, 0o644)
            except OSError as exc:  # a filesystem without O_DIRECT (tmpfs): through the page cache
                if exc.errno != errno.EINVAL:
                    raise
                self._direct = False
        return os.open(self.path, flags | os.O_TRUNC, 0o644)

    def _put(self, data: bytes) -> None:
        view = memoryview(self._buffers[self._current])
        view[self._fill : self._fill + len(data)] = data
        self._fill += len(data)

    def copy(
        self,
        source: NpySource,
        start: int,
        stop: int,
        seen: Callable[[memoryview], None],
        copied: Callable[[memoryview], None],
    ) -> None:
        """Read rows ``[0, stop)`` of ``source`` once: every byte goes to ``seen`` (in order),
        those of rows ``[start, stop)`` also to ``copied`` and to the file."""
        row_bytes = source.row_bytes
        if (
            source.dtype != self.dtype
            or tuple(source.shape[1:]) != self.row_shape
            or not 0 <= start <= stop <= source.shape[0]
        ):
            what = f"rows {start}:{stop} of {source.dtype} {source.shape}"
            raise ValueError(f"{source.path}: {what} do not fit {self.path.name}")
        position, live = source.offset, source.offset + start * row_bytes
        end = source.offset + stop * row_bytes
        scratch = None
        while position < live:  # rows before the live ones: checked, not copied
            scratch = scratch if scratch is not None else bytearray(min(CONCAT_BUFFER_BYTES, live - position))
            got = self._read(source, memoryview(scratch)[: min(len(scratch), live - position)], position)
            seen(got)
            position += len(got)
        while position < end:
            if self._fill == self._capacity:
                self._write_current()
            room = memoryview(self._buffers[self._current])[
                self._fill : self._fill + min(self._capacity - self._fill, end - position)
            ]
            got = self._read(source, room, position)
            seen(got)
            copied(got)
            self._fill += len(got)
            position += len(got)

    def append(self, rows: np.ndarray) -> None:
        """Add rows held in memory (of the file's dtype and row shape) after those so far."""
        view = _rows_as_bytes(rows, self.dtype, self.row_shape, self.path)
        position = 0
        while view is not None and position < len(view):
            if self._fill == self._capacity:
                self._write_current()
            size = min(self._capacity - self._fill, len(view) - position)
            self._buffers[self._current][self._fill : self._fill + size] = view[position : position + size]
            self._fill += size
            position += size

    @staticmethod
    def _read(source: NpySource, into: memoryview, position: int) -> memoryview:
        got = os.preadv(source.fileno(), [into], position)
        if got <= 0:  # cut since its header was checked
            raise CorruptDatasetError(f"array file {source.path} is damaged: it ends at byte {position}")
        return into[:got]

    def _write_current(self) -> None:
        """Hand the full current buffer to the I/O threads (the file's first, write it here);
        move to the next one (waiting for its last write)."""
        index, offset, length = self._current, self._offset, self._fill
        if self._proven:
            try:
                self._writes[index] = in_background(self._write, index, offset, length)
            except RuntimeError:  # interpreter exiting (an atexit commit): written here
                self._write(index, offset, length)
        else:
            self._write_here(index, offset, length)
        self._offset += length
        self._current = (index + 1) % len(self._buffers)
        self._fill = 0
        self._wait(self._current)

    def _wait(self, index: int) -> None:
        write, self._writes[index] = self._writes[index], None
        if write is not None:
            write.result()

    def _write_here(self, index: int, offset: int, length: int) -> None:
        """A write on the caller's thread. The file's first is made so: a filesystem that opens a
        file with ``O_DIRECT`` but refuses its writes (some FUSE ones) has the file written through
        the page cache instead."""
        if self._proven:
            self._write(index, offset, length)
            return
        try:
            self._write(index, offset, length)
        except OSError as exc:
            if not (self._direct and exc.errno == errno.EINVAL):
                raise
            os.close(self._fd)
            self._fd = -1
            self._direct = False
            self._fd = self._open()  # nothing is written yet: opened again, through the page cache
            self._write(index, offset, length)
        self._proven = True

    def _write(self, index: int, offset: int, length: int) -> None:
        view = memoryview(self._buffers[index])
        if self._direct:  # whole aligned blocks; the last is cut back to size at close
            length = -(-length // _DIRECT_ALIGN) * _DIRECT_ALIGN
        done = 0
        while done < length:
            done += os.pwrite(self._fd, view[done:length], offset + done)

    def close(self, *, fsync: bool) -> int:
        """Write the last buffer, check the size, and sync (``fsync``); returns the rows. On an
        error the file is closed as by :meth:`abort`."""
        try:
            for index in range(len(self._buffers)):
                self._wait(index)
            if self._fill:  # the last buffer on this thread: it would only wait for a helper's
                self._write_here(self._current, self._offset, self._fill)
                self._offset += self._fill
                self._fill = 0
            if self._offset != self.size:
                raise ValueError(f"{self.path.name}: {self._offset} bytes copied, {self.size} expected")
            if self._direct:
                os.ftruncate(self._fd, self.size)  # the last block's padding
            if fsync:
                os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        self._fd = -1
        _give_back(self._buffers)
        self._buffers = []
        return self.rows

    def abort(self) -> None:
        """Stop: wait for the writes under way (their errors dropped: the build failed) and
        close the file, which the caller removes."""
        for write in self._writes:
            if write is not None:
                write.exception()
        self._writes = [None] * len(self._buffers)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        _give_back(self._buffers)
        self._buffers = []


#: Buffers of :class:`NpyConcatenation` kept for the next one (at most :data:`CONCAT_BUFFERS`).
_spare_buffers: list[mmap.mmap] = []
_spare_lock = threading.Lock()


def _take_buffers(count: int, size: int) -> list[mmap.mmap]:
    """``count`` page-aligned buffers of at least ``size`` bytes, spare ones first."""
    with _spare_lock:
        taken = [_spare_buffers.pop() for _ in range(min(count, len(_spare_buffers)))]
    kept = [buffer for buffer in taken if len(buffer) >= size]
    for buffer in taken:
        if len(buffer) < size:
            buffer.close()
    # private: a forked child's buffers are its own copy (a shared map would be the parent's pages)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    return kept + [
        mmap.mmap(-1, max(size, CONCAT_BUFFER_BYTES), flags=flags) for _ in range(count - len(kept))
    ]


def _give_back(buffers: list[mmap.mmap]) -> None:
    with _spare_lock:
        while buffers and len(_spare_buffers) < CONCAT_BUFFERS:
            _spare_buffers.append(buffers.pop())
    for buffer in buffers:
        with contextlib.suppress(BufferError):  # a view of it still held (a traceback): freed when it goes
            buffer.close()


def _forget_spares_in_child() -> None:
    """A forked child starts with its own lock (the parent's may have been held by a thread)."""
    global _spare_lock
    _spare_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spares_in_child)


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
        self,
        dataset_dir: Path,
        key: str,
        dtype: np.dtype,
        row_shape: tuple[int, ...],
        rows: int | None = None,
    ) -> ColumnWriter:
        path = key_path(dataset_dir, key, ".npy")
        if rows is not None and np.dtype(dtype).itemsize * rows * int(np.prod(row_shape)) >= DIRECT_MIN_BYTES:
            return NpyConcatenation(path, dtype, row_shape, rows)
        return NpyColumnWriter(path, dtype, row_shape)

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
