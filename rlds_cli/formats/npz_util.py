"""``.npz`` files read without loading whole arrays: members row by row, and an h5py-like view of a
file.

``np.load`` of a compressed ``.npz`` inflates each array whole (tens of GB for a visual OGBench
file). :class:`NpyStream` reads one member's ``.npy`` header, then inflates rows on demand through
:mod:`zipfile`'s streaming reader: memory is one block per key. :class:`NpzAsH5` lets the D4RL
reader read the D4RL layout from ``.npz`` (what ``rlds export --to npz`` writes)."""

from __future__ import annotations

import functools
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from rlds_cli.errors import SourceFormatError, SourceNotFoundError, SourceNotReadableError
from rlds_cli.formats import untrusted


def open_npz(path: Path) -> zipfile.ZipFile:
    """Open an ``.npz`` file, turning zip errors into one-line rlds errors."""
    if not path.exists():
        raise SourceNotFoundError(f"source file {path} does not exist")
    try:
        return zipfile.ZipFile(path)
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read source file {path}: permission denied") from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise SourceFormatError(
            f"cannot open {path} as .npz (truncated or corrupt?): {exc}",
            hint="re-download the file or check that it is an .npz",
        ) from exc


def npz_names(path: Path) -> tuple[str, ...] | None:
    """The member names of an ``.npz`` file (``.npy`` left off), or ``None`` when it is no readable
    zip (for the format sniffers; cached per file version)."""
    if not path.name.lower().endswith(".npz"):
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return None if path.is_dir() else _names(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _names(path: str, mtime_ns: int, size: int) -> tuple[str, ...] | None:
    try:
        with zipfile.ZipFile(path) as z:
            return tuple(n[:-4] if n.endswith(".npy") else n for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return None


def npz_keys(zf: zipfile.ZipFile) -> list[str]:
    """Array names in an ``.npz`` (member names without ``.npy``)."""
    return [n[:-4] for n in zf.namelist() if n.endswith(".npy")]


class NpyStream:
    """Sequential row reader for one array inside an ``.npz``.

    Attributes:
        shape: The array's full shape.
        dtype: Its dtype.
    """

    def __init__(self, zf: zipfile.ZipFile, key: str, path: Path) -> None:
        self.key, self.path = key, path
        try:
            self._fh: Any = zf.open(f"{key}.npy")
            version = np.lib.format.read_magic(self._fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(self._fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(self._fh)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise self._error(exc) from exc
        if dtype.hasobject:
            raise SourceFormatError(
                f"{path}: array {key!r} holds Python objects (pickled); rlds reads numeric arrays only"
            )
        self.shape, self.dtype = untrusted.require_shape(path, key, shape), np.dtype(dtype)
        # untrusted: the header's shape must be backed by the member's (compressed) bytes before
        # a row is read or a buffer allocated
        info = zf.getinfo(f"{key}.npy")
        declared = untrusted.declared_bytes(self.shape, self.dtype)
        if declared > info.file_size:
            raise SourceFormatError(
                f"{path}: array {key!r} declares {declared:,} bytes (shape {self.shape}) but its member "
                f"holds {info.file_size:,} (truncated or corrupt?)",
                hint="re-download the file",
            )
        untrusted.check_declared(path, key, info.file_size, info.compress_size, how="compresses into")
        self._whole: np.ndarray | None = None
        if fortran and len(shape) > 1:  # rare: rows are not contiguous, read it whole
            self._whole = self._read_bytes(int(np.prod(shape)) * dtype.itemsize).reshape(shape, order="F")
        self._row_elems = int(np.prod(self.shape[1:], dtype=np.int64)) if self.shape else 1
        self.pos = 0

    def _error(self, exc: BaseException) -> SourceFormatError:
        return SourceFormatError(
            f"{self.path}: reading array {self.key!r} failed (truncated or corrupt?): {exc}",
            hint="re-download the file",
        )

    def _read_bytes(self, nbytes: int) -> np.ndarray:
        buf = bytearray(nbytes)
        view = memoryview(buf)
        got = 0
        try:
            while got < nbytes:
                n = self._fh.readinto(view[got:])
                if not n:
                    raise EOFError(f"ended after {got} of {nbytes} bytes")
                got += n
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise self._error(exc) from exc
        return np.frombuffer(buf, dtype=self.dtype)

    def read(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows (fewer at the end)."""
        rows = max(0, min(rows, self.shape[0] - self.pos))
        if self._whole is not None:
            out = self._whole[self.pos : self.pos + rows]
        else:
            flat = self._read_bytes(rows * self._row_elems * self.dtype.itemsize)
            out = flat.reshape(rows, *self.shape[1:])
        self.pos += rows
        if self.pos == self.shape[0]:
            self.finish()
        return out

    def finish(self) -> None:
        """Read to the member's end, which makes zipfile check its CRC."""
        try:
            self._fh.read()
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        self._fh.close()


class NpzColumn:
    """One ``.npz`` member read forward in row ranges; a range may start at most where the previous one
    did (the reader's one-row lookahead), anything earlier reopens the member."""

    attrs: ClassVar[Mapping[str, Any]] = MappingProxyType({})  # npz members have no attributes

    def __init__(self, zf: zipfile.ZipFile, key: str, path: Path) -> None:
        self._zf, self.key, self.path = zf, key, path
        self._open()
        self.shape, self.dtype = self._stream.shape, self._stream.dtype
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.ndim = len(self.shape)

    def _open(self) -> None:
        self._stream = NpyStream(self._zf, self.key, self.path)
        self._buf_start = 0
        self._buf = np.empty((0, *self._stream.shape[1:]), self._stream.dtype) if self._stream.shape else None

    def __getitem__(self, index: Any) -> np.ndarray:
        if index == () or index is Ellipsis or not self.shape:
            return self._whole()
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("NpzColumn supports contiguous row slices only")
        start, stop, _ = index.indices(self.shape[0])
        if start < self._buf_start:
            self._open()
        assert self._buf is not None
        drop = min(start - self._buf_start, len(self._buf))
        self._buf, self._buf_start = self._buf[drop:], self._buf_start + drop
        while self._stream.pos < start:  # skip forward
            self._stream.read(min(start - self._stream.pos, 1 << 16))
            self._buf_start = self._stream.pos
        if self._stream.pos < stop:
            self._buf = np.concatenate([self._buf, self._stream.read(stop - self._stream.pos)])
        return self._buf[start - self._buf_start : stop - self._buf_start]

    def _whole(self) -> np.ndarray:
        stream = NpyStream(self._zf, self.key, self.path)
        data = stream.read(stream.shape[0]) if stream.shape else stream._read_bytes(stream.dtype.itemsize)[0]
        stream.close()
        return data


class NpzAsH5:
    """The parts of ``h5py.File`` the D4RL reader uses, over an ``.npz`` (keys may contain ``/``)."""

    attrs: ClassVar[Mapping[str, Any]] = MappingProxyType({})  # npz members have no attributes

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zf = open_npz(path)
        self._keys = npz_keys(self._zf)
        self._columns: dict[str, NpzColumn] = {}

    def get(self, key: str) -> NpzColumn | None:
        if key not in self._keys:
            return None
        if key not in self._columns:
            self._columns[key] = NpzColumn(self._zf, key, self.path)
        return self._columns[key]

    def __getitem__(self, key: str) -> NpzColumn:
        column = self.get(key)
        if column is None:
            raise KeyError(key)
        return column

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def keys(self) -> list[str]:
        return sorted({k.split("/", 1)[0] for k in self._keys})

    def visititems(self, fn: Callable[[str, Any], None]) -> None:
        for key in sorted(self._keys):
            fn(key, self[key])

    def close(self) -> None:
        self._zf.close()
