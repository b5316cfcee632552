"""A Gen-DGRL archive read as a stream, and one trajectory file read into its dict of arrays.

A trajectory file (an archive member's bytes or a loose file) is a ``.npy`` of a pickled dict
(read by :mod:`rlds_cli.formats.untrusted` unless ``allow_pickle``) or an ``.npz`` (each array
streamed and checked).
"""

from __future__ import annotations

import io
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

import numpy as np

from rlds_cli.errors import RldsError, SourceFormatError, SourceNotReadableError
from rlds_cli.formats.archives import Limits, UnsafeArchiveError
from rlds_cli.formats.gen_dgrl.files import REQUIRED_KEYS, TRAJECTORY_KEYS, TRAJECTORY_SUFFIXES
from rlds_cli.formats.npz_util import NpyStream, npz_keys, open_npz
from rlds_cli.formats.untrusted import UnsafeSourceError, require_rows, unpickle

#: Largest trajectory member or loose ``.npy`` read (held in memory while decoded). A 1,000-step
#: Procgen episode (the time limit) of float32 frames is about 50 MB.
MAX_MEMBER_BYTES = 1 << 30


def _load_npy(data: bytes, where: str, allow_pickle: bool) -> Any:
    """A ``.npy`` holding a pickled object (``np.save(f, dict)``) -> the object."""
    fh = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fh)
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read_header(fh)
    except (ValueError, EOFError, OSError) as exc:
        raise SourceFormatError(f"{where}: not a readable .npy file (truncated or corrupt?): {exc}") from exc
    if not dtype.hasobject or shape != ():
        raise SourceFormatError(
            f"{where}: holds an array of shape {tuple(shape)} ({dtype}), not a pickled dict of one "
            f"trajectory ({TRAJECTORY_KEYS})",
            hint="Gen-DGRL .npy files are written by np.save(f, {'observations': ..., ...})",
        )
    obj = unpickle(fh, where, allow_pickle)
    # numpy pickles the 0-d object array itself; its one element is the dict (TorchRL's .tolist())
    return obj.item() if isinstance(obj, np.ndarray) and obj.shape == () and obj.dtype.hasobject else obj


def _load_npz(zf: zipfile.ZipFile, where: str) -> dict[str, np.ndarray | None]:
    """Every array of an ``.npz`` (streamed and checked by :class:`NpyStream`)."""
    for info in zf.infolist():
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # Python inflates bzip2 and LZMA members without an output bound
            raise UnsafeSourceError(
                f"{where}: array {info.filename!r} uses zip compression method {info.compress_type} (only "
                "stored and deflated arrays are read, as np.savez and np.savez_compressed write them)"
            )
    keys = npz_keys(zf)
    out: dict[str, np.ndarray | None] = {k: None for k in keys if k not in REQUIRED_KEYS}  # not stored
    label = cast(Path, where)  # NpyStream only prints it
    for key in (k for k in REQUIRED_KEYS if k in keys):
        stream = NpyStream(zf, key, label)
        try:
            require_rows(where, key, stream.shape)
            out[key] = stream.read(stream.shape[0])
        finally:
            stream.close()
    return out


def _npz_from_bytes(data: bytes, where: str) -> dict[str, np.ndarray | None]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise SourceFormatError(
            f"{where}: not a readable .npz (zip) file (truncated or corrupt?): {exc}"
        ) from exc
    with zf:
        return _load_npz(zf, where)


def decode_member(kind: str, data: bytes, where: str, allow_pickle: bool) -> Any:
    return _load_npy(data, where, allow_pickle) if kind == ".npy" else _npz_from_bytes(data, where)


def read_loose(path: Path, allow_pickle: bool) -> Any:
    """A loose trajectory file -> its dict of arrays."""
    kind = path.suffix.lower()
    if kind == ".npz":
        zf = open_npz(path)
        with zf:
            return _load_npz(zf, str(path))
    size = path.stat().st_size
    if size > MAX_MEMBER_BYTES:
        raise UnsafeSourceError(
            f"{path}: {size:,} bytes, over the {MAX_MEMBER_BYTES:,} a trajectory file may take "
            "(it is read whole)"
        )
    try:
        data = path.read_bytes()
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read source file {path}: permission denied") from exc
    return _load_npy(data, str(path), allow_pickle)


#: Bytes read from an archive at a time, each counted against the archive limits before the next.
_CHUNK = 1 << 20


class TarTrajectories:
    """The trajectory members of one tar archive, read front to back as a stream.

    Every member is checked as :mod:`rlds_cli.formats.archives` checks it (same :class:`Limits` and
    member rules), then read into memory in chunks (at most :data:`MAX_MEMBER_BYTES`); nothing is
    written to disk. Every byte read counts against the total limit; the bytes kept (arrays as
    cached, frames as uint8) plus skipped members' bytes count against the ratio to archive bytes
    read. Kept rather than read bytes, because float32 Procgen frames are four times their uint8
    size and xz packs them very tightly.
    """

    def __init__(self, archive: Path, allow_pickle: bool) -> None:
        self.archive, self.allow_pickle = archive, allow_pickle
        self.limits = Limits()
        self.unpacked = 0  # member bytes read
        self.taken = 0  # bytes kept of trajectories, plus skipped members' bytes
        self.members = 0
        self.ignored: list[str] = []
        self.consumed = 0  # archive bytes read so far (progress, and the ratio)

    def _refuse(self, name: str, why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"{self.archive}: member {name!r} {why}; refused")

    def _check(self, member: tarfile.TarInfo, seen: set[str]) -> None:
        """Refuse what the unpacker refuses: escaping names, links, devices, duplicates, sizes."""
        name = member.name
        self.members += 1
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(f"{self.archive}: more than {self.limits.max_members} members")
        pure = PurePosixPath(name)
        if "\\" in name or "\x00" in name:
            raise self._refuse(name, "has a backslash or NUL in its name")
        if pure.is_absolute():
            raise self._refuse(name, "has an absolute path")
        if ".." in pure.parts:
            raise self._refuse(name, "escapes the archive ('..')")
        if pure.parts and ":" in pure.parts[0]:
            raise self._refuse(name, "has a drive-letter path")
        if member.issym() or member.islnk():
            raise self._refuse(name, f"is a link (to {member.linkname!r})")
        if not (member.isfile() or member.isdir()):
            raise self._refuse(name, "is a device or FIFO")
        if member.isfile():
            if name in seen:
                raise self._refuse(name, "appears twice")
            seen.add(name)
            if member.size > MAX_MEMBER_BYTES:
                raise self._refuse(
                    name,
                    f"declares {member.size:,} bytes, over the {MAX_MEMBER_BYTES:,} a trajectory may take",
                )

    def _unpack(self, n: int, name: str) -> None:
        """Member bytes read so far against the archive's total limit."""
        self.unpacked += n
        if self.unpacked > self.limits.max_total_bytes:
            raise UnsafeArchiveError(
                f"{self.archive}: unpacks to more than {self.limits.max_total_bytes:,} bytes (at {name!r}); "
                "refusing (a decompression bomb?)",
                hint="raise the limit with RLDS_ARCHIVE_MAX_BYTES if the archive is trusted",
            )

    def take(self, n: int, name: str) -> None:
        """Count ``n`` bytes taken from the archive (kept, or skipped) against the ratio limit."""
        self.taken += n
        if self.taken > self.limits.ratio_floor_bytes:
            read = max(self.consumed, 1)
            if self.taken > self.limits.max_total_ratio * read:
                raise UnsafeArchiveError(
                    f"{self.archive}: yields {self.taken:,} bytes from {read:,} bytes of archive (ratio "
                    f"over {self.limits.max_total_ratio:g}, at {name!r}); refusing (a decompression bomb?)",
                    hint="raise the ratio limit with RLDS_ARCHIVE_MAX_RATIO if the archive is trusted",
                )

    def _read(self, fh: IO[bytes], member: tarfile.TarInfo, raw: IO[bytes], keep: bool) -> bytes:
        parts = []
        while chunk := fh.read(_CHUNK):
            self._unpack(len(chunk), member.name)
            self.consumed = raw.tell()
            if keep:
                parts.append(chunk)
            else:  # a skipped member yields nothing: all of it counts against the ratio
                self.take(len(chunk), member.name)
        if keep and sum(len(p) for p in parts) != member.size:
            raise tarfile.ReadError(f"member {member.name!r} ended early")
        return b"".join(parts)

    def __iter__(self) -> Iterator[tuple[str, str, Any]]:
        """``(where, member name, decoded object)`` per trajectory member, in archive order."""
        from rlds_cli.formats.archives import decompressing_reader

        try:
            raw = open(self.archive, "rb")  # noqa: SIM115 - closed below
        except PermissionError as exc:
            raise SourceNotReadableError(f"cannot read archive {self.archive}: permission denied") from exc
        seen: set[str] = set()
        try:
            with raw, decompressing_reader(raw) as stream, tarfile.open(fileobj=stream, mode="r|") as tf:
                for member in tf:
                    self._check(member, seen)
                    self.consumed = raw.tell()
                    if member.isdir():
                        continue
                    kind = PurePosixPath(member.name).suffix.lower()
                    keep = kind in TRAJECTORY_SUFFIXES
                    fh = tf.extractfile(member)
                    data = self._read(fh, member, raw, keep) if fh is not None else b""
                    self.consumed = raw.tell()
                    if not keep:
                        self.ignored.append(member.name)
                        continue
                    where = f"{self.archive}: member {member.name!r}"
                    yield where, member.name, decode_member(kind, data, where, self.allow_pickle)
        except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
            if isinstance(exc, RldsError):
                raise
            raise SourceFormatError(
                f"{self.archive}: damaged tar archive (truncated or corrupt?): {exc}"
            ) from exc
