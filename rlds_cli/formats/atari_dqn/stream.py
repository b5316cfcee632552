"""A gzip'd ``.npy`` file of Dopamine's, inflated front to back in bounded memory (zlib, CRC and
sizes checked), never held whole."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rlds_cli.errors import RldsError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats.atari_dqn.plan import READ_BYTES, REDOWNLOAD_HINT, SKIP_BYTES
from rlds_cli.formats.untrusted import check_declared, declared_bytes, describe_dtype, require_shape

#: One .npy header parsed at a time: numpy uses ``ast.literal_eval``, and CPython 3.11 keeps the AST
#: recursion depth per interpreter (python/cpython gh-95185, gh-106905), so two threads parsing at
#: once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in CI, 3.11.7).
_HEADER_LOCK = threading.Lock()


class GzipStream:
    """The bytes of a gzip file, inflated on demand by zlib (which checks each member's CRC and length);
    multi-member files (``cat a.gz b.gz``) are read through."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._inflate = zlib.decompressobj(31)
        self._tail = b""
        self.pos = 0

    def chunk(self, want: int) -> bytes:
        """Up to ``want`` inflated bytes; ``b""`` only at the end of the stream."""
        while True:
            if self._inflate.eof:
                rest = self._inflate.unused_data or self._file.read(READ_BYTES)
                if not rest:
                    return b""
                self._inflate = zlib.decompressobj(31)  # a next member
                self._tail = rest
            data = self._tail or self._file.read(READ_BYTES)
            out = self._inflate.decompress(data, want)
            self._tail = self._inflate.unconsumed_tail
            if out:
                self.pos += len(out)
                return out
            if not data and not self._inflate.eof:
                raise EOFError("the gzip stream ends early (the file is truncated)")

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes, all that is left when negative (``np.lib.format`` reads a header
        with this)."""
        if size < 0:
            size = 1 << 62
        parts = []
        while size > 0:
            part = self.chunk(size)
            if not part:
                break
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def readinto(self, view: memoryview) -> int:
        """Fill ``view``; the bytes written (fewer only at the end of the stream)."""
        got = 0
        while got < len(view):
            part = self.chunk(len(view) - got)
            if not part:
                break
            view[got : got + len(part)] = part
            got += len(part)
        return got

    def discard(self, size: int) -> int:
        """Inflate and drop ``size`` bytes; the bytes dropped."""
        left = size
        while left > 0:
            part = self.chunk(min(left, SKIP_BYTES))
            if not part:
                break
            left -= len(part)
        return size - left

    def close(self) -> None:
        self._file.close()


class GzipNpy:
    """The rows of one gzip'd ``.npy`` file, read front to back.

    Attributes:
        shape: The array's shape as its header declares it.
        dtype: Its dtype.
        rows: ``shape[0]`` (1 for a 0-d array).
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        try:
            self._stream = GzipStream(path)
        except FileNotFoundError:
            raise SourceNotFoundError(f"{path} does not exist", hint=REDOWNLOAD_HINT) from None
        except OSError as exc:
            raise SourceFormatError(f"cannot open {path}: {exc}") from None
        try:
            with self._guard("not a gzip'd .npy file"), _HEADER_LOCK:
                version = np.lib.format.read_magic(self._stream)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(self._stream)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(self._stream)
                else:
                    raise ValueError(f".npy format version {version[0]}.{version[1]}, not 1.0 or 2.0")
            self.shape = require_shape(path, name, shape)
            self.dtype = np.dtype(dtype)
            if fortran and len(self.shape) > 1:
                raise SourceFormatError(
                    f"{path}: {name!r} is stored in Fortran (column) order; its rows cannot be streamed",
                    hint=REDOWNLOAD_HINT,
                )
            self.rows = self.shape[0] if self.shape else 1
            self._row_shape = self.shape[1:]
            self.row_bytes = declared_bytes(self._row_shape, self.dtype)
            self._check_sizes()
        except BaseException:
            self.close()
            raise
        self.pos = 0

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Errors of the gzip or .npy layer as one line naming the file."""
        try:
            yield
        except RldsError:
            raise
        except (OSError, EOFError, zlib.error, ValueError, SyntaxError) as exc:
            hint = REDOWNLOAD_HINT
            if what.startswith("not a gzip'd") and "magic string" in str(exc):
                hint = "Dopamine writes each array with np.save (never a pickle); " + REDOWNLOAD_HINT
            raise SourceFormatError(f"{self.path}: {what}: {exc}", hint=hint) from None

    def _check_sizes(self) -> None:
        """Before any row is read: the gzip trailer's length (mod 2**32) must match the header's (a
        truncated download fails here), and the declared bytes must be backed by the compressed bytes
        (no decompression bomb)."""
        data = declared_bytes(self.shape, self.dtype)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            f.seek(max(size - 4, 0))
            isize = int.from_bytes(f.read(4), "little")
        if isize != (self._stream.pos + data) % (1 << 32):
            raise SourceFormatError(
                f"{self.path}: the gzip trailer says it holds {isize:,} bytes (mod 2**32) but its .npy "
                f"header declares {self._stream.pos + data:,} (shape {self.shape}, {self.dtype}): "
                "truncated or damaged",
                hint=REDOWNLOAD_HINT,
            )
        check_declared(self.path, self.name, data, size, how="compresses into")

    def read(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows (fewer at the end), in native byte order."""
        rows = max(0, min(rows, self.rows - self.pos))
        out = np.empty((rows, *self._row_shape), self.dtype)
        view = out.reshape(-1).view(np.uint8).data
        with self._guard(f"reading rows {self.pos:,} to {self.pos + rows:,} of {self.name!r}"):
            got = self._stream.readinto(view)
            if got < len(view):
                raise EOFError(
                    f"the data ends after {self.pos + got // max(self.row_bytes, 1):,} of {self.rows:,} rows"
                )
        self.pos += rows
        return out if self.dtype.isnative else out.astype(self.dtype.newbyteorder("="))

    def read_all(self) -> np.ndarray:
        """The whole array (for the small ``add_count`` and ``invalid_range`` files)."""
        if not self.shape:
            return self.read(1).reshape(())
        return self.read(self.rows)

    def skip(self, rows: int) -> None:
        """Inflate and drop the next ``rows`` rows."""
        rows = max(0, min(rows, self.rows - self.pos))
        with self._guard(f"skipping to row {self.pos + rows:,} of {self.name!r}"):
            got = self._stream.discard(rows * self.row_bytes)
            if got < rows * self.row_bytes:
                raise EOFError(f"the data ends after {self.pos + got // max(self.row_bytes, 1):,} rows")
        self.pos += rows

    def finish(self) -> None:
        """Read to the end of the file, so that zlib checks its CRC and length."""
        self.skip(self.rows - self.pos)
        with self._guard(f"checking the end of {self.name!r}"):
            if self._stream.chunk(1):
                raise ValueError(f"it holds data after the {self.rows:,} rows its header declares")

    def close(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.close()


def check_store(stream: GzipNpy, name: str) -> None:
    """Dopamine's store signature: frames ``(C, H, W[, C])`` uint8, the rest ``(C,)`` numbers."""
    shape, dtype, where = stream.shape, stream.dtype, stream.path
    if name == "observation":
        if dtype != np.uint8 or len(shape) not in (3, 4):
            raise SourceFormatError(
                f"{where}: 'observation' is {kind_of(dtype)} of shape {shape}; Atari DQN frames are uint8 "
                "(rows, 84, 84)",
                hint="this reader reads Dopamine's Atari replay logs: uint8 frames, one per row",
            )
        return
    kinds, want = {
        "action": ("iu", "integers"),
        "reward": ("iuf", "numbers"),
        "terminal": ("biu", "0/1 flags"),
    }[name]
    if len(shape) != 1 or dtype.kind not in kinds:
        raise SourceFormatError(
            f"{where}: {name!r} is {kind_of(dtype)} of shape {shape}; Dopamine stores one value per row here "
            f"({want}, shape (rows,))",
            hint=REDOWNLOAD_HINT,
        )


def kind_of(dtype: np.dtype) -> str:
    return f"{dtype}" if dtype.kind in "biufc" and dtype.fields is None else describe_dtype(dtype)
