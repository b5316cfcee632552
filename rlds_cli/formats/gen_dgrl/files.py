"""Gen-DGRL's files: the layout, ``sniff``, ``source_files``, the level seed in the collector's file
names, and reading them (an archive as a stream, a trajectory file into its dict of arrays).

The released archives (``<game>.tar.xz`` at ``dl.fbaipublicfiles.com/DGRL/Procgen/...``) hold one
file per trajectory, which TorchRL reads with ``np.load(member, allow_pickle=True).tolist()``: a
``.npy`` of a **pickled dict** (``np.save(f, dict)``, a 0-d object array). The gen_dgrl collector
writes ``np.savez_compressed`` episodes named
``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}.npz``. Both are read, in an archive or as loose
files. Keys: ``observations`` ``(T + 1, 3, 64, 64)``, ``actions`` ``(T, 1)``, ``rewards``
``(T, 1)``, ``dones`` ``(T,)``.

**Reading.** A trajectory file (an archive member's bytes or a loose file) is a ``.npy`` of a
pickled dict (read by :mod:`rlds_cli.formats.untrusted` unless ``allow_pickle``) or an ``.npz``
(each array streamed and checked)."""

from __future__ import annotations

import io
import lzma
import re
import tarfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

import numpy as np

from rlds_cli.errors import RldsError, SourceFormatError, SourceNotReadableError
from rlds_cli.formats.archives import TAR_SUFFIXES, Limits, UnsafeArchiveError
from rlds_cli.formats.folders import folder_files
from rlds_cli.formats.npz_util import NpyStream, npz_keys, open_npz
from rlds_cli.formats.untrusted import UnsafeSourceError, require_rows, unpickle

REQUIRED_KEYS = ("observations", "actions", "rewards", "dones")
#: Trajectory files, loose or inside an archive.
TRAJECTORY_SUFFIXES = (".npy", ".npz")
#: How far into a pickled ``.npy`` sniffing looks for the ``observations`` key.
_SNIFF_BYTES = 256 << 10
#: Largest first ``.npz`` member sniffing reads to see its keys.
_SNIFF_NPZ_BYTES = 64 << 20
#: The collector's file names: ``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}``.
_COLLECTOR_NAME = re.compile(r"^[^_]+_(?P<index>\d+)_(?P<length>\d+)_(?P<seed>-?\d+)_[^_]+$")
TRAJECTORY_KEYS = "observations, actions, rewards and dones"


# ----------------------------------------------------------------------------- detection


def is_tar(path: Path) -> bool:
    return path.name.lower().endswith(TAR_SUFFIXES)


def _sniff_npy(fh: IO[bytes]) -> bool:
    """A 0-d object array (a pickled object) whose pickle names ``observations`` early on."""
    version = np.lib.format.read_magic(fh)
    read_header = (
        np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read_header(fh)
    return bool(dtype.hasobject) and shape == () and b"observations" in fh.read(_SNIFF_BYTES)


def _sniff_npz(zf: zipfile.ZipFile) -> bool:
    """The four trajectory keys, and no ``terminals`` (that is OGBench's or D4RL's layout)."""
    keys = set(npz_keys(zf))
    return set(REQUIRED_KEYS) <= keys and "terminals" not in keys


def _sniff_tar(path: Path) -> bool:
    """Peek at the first file member only (directories before it are skipped)."""
    from rlds_cli.formats.archives import decompressing_reader

    with (
        open(path, "rb") as raw,
        decompressing_reader(raw) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tf,
    ):
        for seen, member in enumerate(tf):
            if member.isdir() and seen < 64:
                continue
            name = member.name.lower()
            fh = tf.extractfile(member) if member.isfile() else None
            if fh is None:
                return False
            if name.endswith(".npy"):
                return _sniff_npy(fh)
            if name.endswith(".npz") and member.size <= _SNIFF_NPZ_BYTES:
                with zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
                    return _sniff_npz(zf)
            return False
    return False


def _sniff_file(path: Path) -> bool:
    name = path.name.lower()
    if is_tar(path):
        return _sniff_tar(path)
    if name.endswith(".npy"):
        with open(path, "rb") as fh:
            return _sniff_npy(fh)
    if name.endswith(".npz"):
        with zipfile.ZipFile(path) as zf:
            return _sniff_npz(zf)
    return False


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "a Gen-DGRL (Procgen) .tar.xz of per-trajectory .npy (pickled dict) or .npz files with "
    "observations, actions, rewards and dones"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Gen-DGRL source: a tar archive whose first file is a trajectory ``.npy``
    (pickled dict) or ``.npz``, such a loose file, or a folder of them (judged by its first
    trajectory file). Reads one member or file header; never raises."""
    try:
        if path.is_dir():
            files = source_files([path])
            return bool(files) and _sniff_file(files[0])
        return path.is_file() and _sniff_file(path)
    except Exception:  # any other format's file: not ours
        return False


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a Gen-DGRL conversion reads: each archive or file given, and a folder's
    ``.npy``/``.npz`` files in sorted path order."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += folder_files(p, lambda q: q.suffix.lower() in TRAJECTORY_SUFFIXES)
        else:
            out.append(p)
    return out


def level_seed(name: str) -> int:
    """The level seed of a collector file name (``..._{level_seed}_{return}``), else -1."""
    match = _COLLECTOR_NAME.match(PurePosixPath(name).stem)
    return int(match["seed"]) if match else -1


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
