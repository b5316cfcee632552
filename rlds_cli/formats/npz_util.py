"""Reading ``.npz`` members row by row, without loading whole arrays.

``np.load`` of a compressed ``.npz`` inflates each array entirely (a visual OGBench file would
need tens of GB). :class:`NpyStream` reads the ``.npy`` header of one member and then inflates
rows on demand through :mod:`zipfile`'s streaming reader, so memory is one block per key.
"""

from __future__ import annotations

import functools
import zipfile
import zlib
from pathlib import Path
from typing import Any

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
    """The member names of an ``.npz`` file (``.npy`` left off), or ``None`` when it is no
    readable zip: what the format sniffers look at (remembered per file version, as several
    sniffers ask in turn)."""
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
        # untrusted input: the header's shape must be backed by the member's bytes, and those by
        # its compressed bytes, before a row is read or a buffer allocated
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
