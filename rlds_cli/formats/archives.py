"""Safe extraction of source archives (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2``,
``.tar.xz``/``.txz``).

Archives are untrusted input; every member is checked before a byte of it is written:

* its path stays inside the destination: no absolute paths, ``..`` parts, drive letters or
  backslash tricks;
* symbolic and hard links, devices and FIFOs are refused;
* the same limits hold for every archive type, measured while extracting (bytes counted as
  written, so a lying header does not help; extraction stops at the chunk that crosses a limit):
  total unpacked size, number of members, and ratio of bytes unpacked to archive bytes read
  (decompression bombs). A zip member whose declared ratio is over :attr:`Limits.max_ratio` is
  refused before anything is written;
* zip members must be stored or deflated: Python inflates bzip2 and LZMA members without an
  output bound.

Tar archives are read as one stream, front to back; the compression (gzip, bzip2, xz) is found
from the first bytes and undone with a bounded-output reader. On any error the destination is
emptied before the error is raised.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rlds_cli import settings
from rlds_cli.errors import RldsError, SourceFormatError, SourceNotReadableError, from_os_error

_COPY_CHUNK = 1 << 20
#: File name endings of the tar archives rlds unpacks (any compression is found from the bytes).
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
#: Every archive name ending rlds unpacks.
ARCHIVE_SUFFIXES = (".zip", *TAR_SUFFIXES)
#: Bytes unpacked before the ratio rule applies: a small archive of zeros is harmless.
RATIO_FLOOR_BYTES = 64 << 20
#: Default largest ratio of bytes unpacked to archive bytes read (``RLDS_ARCHIVE_MAX_RATIO``).
DEFAULT_MAX_TOTAL_RATIO = 200.0


@dataclass(frozen=True)
class Limits:
    """What an archive may unpack to.

    Attributes:
        max_total_bytes: Sum of all members' sizes (default 256 GiB, or ``$RLDS_ARCHIVE_MAX_BYTES``).
        max_members: Number of members.
        max_ratio: Largest uncompressed/compressed ratio one zip member may declare in its header
            (zip bombs exceed 1000; real data rarely 100).
        max_total_ratio: Largest ratio of bytes unpacked so far to archive bytes read so far,
            measured while extracting, for every archive type (default 200, or
            ``$RLDS_ARCHIVE_MAX_RATIO``).
        ratio_floor_bytes: Bytes unpacked before ``max_total_ratio`` applies (default 64 MiB).
    """

    max_total_bytes: int = field(default_factory=lambda: settings.archive_max_bytes())
    max_members: int = 1_000_000
    max_ratio: float = 1000.0
    max_total_ratio: float = field(
        default_factory=lambda: settings.archive_max_ratio(DEFAULT_MAX_TOTAL_RATIO)
    )
    ratio_floor_bytes: int = field(default_factory=lambda: RATIO_FLOOR_BYTES)


class UnsafeArchiveError(SourceFormatError):
    """An archive member that would escape the destination, a link, or a size over the limits."""

    default_hint = "the archive is unsafe or damaged; get it from a trusted source"


def archive_kind(path: Path) -> str | None:
    """``"zip"``, ``"tar"`` or ``None`` from the file name."""
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith(TAR_SUFFIXES):
        return "tar"
    return None


def safe_member_path(archive: Path, name: str, dest: Path) -> Path:
    """Where member ``name`` goes under ``dest``; raises if it would land outside."""
    if "\\" in name or "\x00" in name:
        raise UnsafeArchiveError(f"{archive}: member {name!r} has a backslash or NUL in its name")
    pure = PurePosixPath(name)
    if pure.is_absolute() or name.startswith("/"):
        raise UnsafeArchiveError(f"{archive}: member {name!r} has an absolute path")
    if any(part == ".." for part in pure.parts):
        raise UnsafeArchiveError(f"{archive}: member {name!r} escapes the destination ('..')")
    if pure.parts and ":" in pure.parts[0]:
        raise UnsafeArchiveError(f"{archive}: member {name!r} has a drive-letter path")
    target = (dest / pure).resolve()
    root = dest.resolve()
    if target != root and root not in target.parents:
        raise UnsafeArchiveError(f"{archive}: member {name!r} escapes the destination")
    return target


class _Budget:
    """Counts members and unpacked bytes against the limits while extracting; ``consumed`` returns the
    archive bytes read so far.
    """

    def __init__(self, archive: Path, limits: Limits, consumed: Callable[[], int]) -> None:
        self.archive, self.limits, self.consumed = archive, limits, consumed
        self.bytes = 0
        self.members = 0
        self.files = 0

    def member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(f"{self.archive}: more than {self.limits.max_members} members")

    def add(self, n: int, name: str) -> None:
        self.bytes += n
        if self.bytes > self.limits.max_total_bytes:
            raise UnsafeArchiveError(
                f"{self.archive}: unpacks to more than {self.limits.max_total_bytes:,} bytes (at {name!r}); "
                "refusing (zip bomb?)",
                hint="raise the limit with RLDS_ARCHIVE_MAX_BYTES if the archive is trusted",
            )
        if self.bytes > self.limits.ratio_floor_bytes:
            read = max(self.consumed(), 1)
            if self.bytes > self.limits.max_total_ratio * read:
                raise UnsafeArchiveError(
                    f"{self.archive}: unpacks {self.bytes:,} bytes from {read:,} bytes of archive "
                    f"(ratio over {self.limits.max_total_ratio:g}, at {name!r}); refusing "
                    "(a decompression bomb?)",
                    hint="raise the ratio limit with RLDS_ARCHIVE_MAX_RATIO if the archive is trusted",
                )


def _copy(src: IO[bytes], target: Path, budget: _Budget, name: str) -> None:
    """Copy one member, counting its bytes; a failed write (full disk, no permission) raises the rlds
    error for it, never a damaged-archive error."""
    budget.files += 1
    out = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        out = open(target, "xb")  # noqa: SIM115 - closed below
        while chunk := src.read(_COPY_CHUNK):
            budget.add(len(chunk), name)  # before the write: a chunk over a limit is never written
            try:
                out.write(chunk)
            except OSError as exc:
                raise (from_os_error(exc) or exc) from exc
    except _CLASHES:
        raise
    except OSError as exc:
        if out is None:  # creating the target failed: the destination's fault, not the archive's
            raise (from_os_error(exc) or exc) from exc
        raise
    finally:
        if out is not None:
            out.close()


def _clash(archive: Path, name: str, target: Path, dest: Path, folder: bool = False) -> UnsafeArchiveError:
    """The error for member ``name`` (a ``folder``, else a file) whose ``target`` under ``dest``
    clashes with an earlier member: the same path twice, a path under a file, or one path as a
    file and a folder."""
    dest = Path(os.path.realpath(dest))  # the target is resolved (a root reached by a link)
    for parent in reversed(target.relative_to(dest).parents[:-1]):
        if (dest / parent).exists() and not (dest / parent).is_dir():
            return UnsafeArchiveError(
                f"{archive}: member {name!r} lies under {parent.as_posix()!r}, which the archive "
                "holds as a file"
            )
    if target.is_dir() != folder:
        return UnsafeArchiveError(f"{archive}: member {name!r} is a file and a folder")
    return UnsafeArchiveError(f"{archive}: member {name!r} appears twice")


_CLASHES = (FileExistsError, NotADirectoryError, IsADirectoryError)


def _open_archive_file(archive: Path) -> IO[bytes]:
    try:
        return open(archive, "rb")
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read archive {archive}: permission denied") from exc


def _extract_zip(archive: Path, dest: Path, limits: Limits) -> int:
    done_compressed = 0  # compressed bytes of the members before the current one, and it
    budget = _Budget(archive, limits, lambda: done_compressed)
    raw = _open_archive_file(archive)
    try:
        zf = zipfile.ZipFile(raw)
    except (OSError, zipfile.BadZipFile) as exc:
        raw.close()
        raise SourceFormatError(
            f"cannot open {archive} as a zip archive (truncated or corrupt?): {exc}"
        ) from exc
    with raw, zf:
        infos = zf.infolist()
        for info in infos:  # check every name first: nothing is written for a bad archive
            budget.member()
            safe_member_path(archive, info.filename, dest)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise UnsafeArchiveError(f"{archive}: member {info.filename!r} is a symbolic link; refused")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) and not info.is_dir():
                raise UnsafeArchiveError(
                    f"{archive}: member {info.filename!r} uses compression method {info.compress_type} "
                    "(only stored and deflated members are read: others inflate without a bound)",
                    hint="re-pack the archive with the default (deflate) compression",
                )
            if info.compress_size and info.file_size / info.compress_size > limits.max_ratio:
                raise UnsafeArchiveError(
                    f"{archive}: member {info.filename!r} has compression ratio "
                    f"{info.file_size / info.compress_size:.0f} (over {limits.max_ratio:.0f}); "
                    "refusing (zip bomb?)"
                )
        _refuse_overlaps(archive, infos)
        if sum(i.file_size for i in infos) > limits.max_total_bytes:
            raise UnsafeArchiveError(
                f"{archive}: declares {sum(i.file_size for i in infos):,} unpacked bytes, over the limit of "
                f"{limits.max_total_bytes:,}; refusing (zip bomb?)",
                hint="raise the limit with RLDS_ARCHIVE_MAX_BYTES if the archive is trusted",
            )
        for info in infos:
            target = safe_member_path(archive, info.filename, dest)
            if info.is_dir():
                try:
                    target.mkdir(parents=True, exist_ok=True)
                except _CLASHES:
                    raise _clash(archive, info.filename, target, dest, folder=True) from None
                continue
            done_compressed += info.compress_size
            try:
                with zf.open(info) as src:
                    _copy(src, target, budget, info.filename)
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
                if isinstance(exc, RldsError):  # a full disk, an unwritable destination
                    raise
                if isinstance(exc, _CLASHES):
                    raise _clash(archive, info.filename, target, dest) from None
                raise SourceFormatError(
                    f"{archive}: member {info.filename!r} is damaged (truncated or corrupt?): {exc}"
                ) from exc
    return budget.files


def _refuse_overlaps(archive: Path, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse members whose records overlap in the file: each member's compressed bytes counted
    once against the ratio limit stood for many (a 217 KB zip unpacked to 842 MB). Python's own
    check came in 3.11.8 and 3.12.2 (CVE-2024-0450). A record is at least its 30-byte header, its
    name and its compressed data (the local extra field can only add to it)."""
    for a, b in itertools.pairwise(sorted(infos, key=lambda i: i.header_offset)):
        name = a.orig_filename.encode("utf-8" if a.flag_bits & 0x800 else "cp437", errors="replace")
        if a.header_offset + 30 + len(name) + a.compress_size > b.header_offset:
            raise UnsafeArchiveError(
                f"{archive}: members {a.filename!r} and {b.filename!r} overlap in the file (their "
                "bytes would be inflated again for each); refusing (zip bomb?)"
            )


def decompressing_reader(raw: IO[bytes]) -> IO[bytes] | gzip.GzipFile:
    """``raw`` itself, or a reader undoing its gzip, bzip2 or xz compression (found from the magic
    bytes) that inflates only as much as each read asks for."""
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


def _extract_tar(archive: Path, dest: Path, limits: Limits) -> int:
    raw = _open_archive_file(archive)
    budget = _Budget(archive, limits, raw.tell)
    try:
        stream: Any = decompressing_reader(raw)
        # a stream, read once front to back, already decompressed (so "r|", not "r|*")
        tf = tarfile.open(fileobj=stream, mode="r|")  # noqa: SIM115 - closed below
        with raw, stream, tf:
            for member in tf:
                budget.member()
                target = safe_member_path(archive, member.name, dest)
                if member.issym() or member.islnk():
                    raise UnsafeArchiveError(
                        f"{archive}: member {member.name!r} is a link (to {member.linkname!r}); refused"
                    )
                if member.isdir():
                    try:
                        target.mkdir(parents=True, exist_ok=True)
                    except _CLASHES:
                        raise _clash(archive, member.name, target, dest, folder=True) from None
                    continue
                if not member.isfile():
                    raise UnsafeArchiveError(
                        f"{archive}: member {member.name!r} is a device or FIFO; refused"
                    )
                if budget.bytes + member.size > limits.max_total_bytes:
                    budget.add(member.size, member.name)  # raises before anything is written
                src = tf.extractfile(member)
                if src is None:  # pragma: no cover - regular files always have data
                    continue
                try:
                    _copy(src, target, budget, member.name)
                except _CLASHES:
                    raise _clash(archive, member.name, target, dest) from None
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
        raw.close()
        if isinstance(exc, RldsError):  # a full disk, an unwritable destination, an unsafe member
            raise
        raise SourceFormatError(f"{archive}: damaged tar archive (truncated or corrupt?): {exc}") from exc
    except BaseException:
        raw.close()
        raise
    return budget.files


def extract_archive(archive: Path, dest: Path, limits: Limits | None = None) -> Path:
    """Unpack ``archive`` into the empty directory ``dest`` after checking every member.

    Args:
        archive: A ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2`` or
            ``.tar.xz``/``.txz`` file.
        dest: An existing, empty directory (the caller removes it afterwards).
        limits: Size limits (default :class:`Limits`).

    Returns:
        The directory to convert: ``dest``, or its only child directory when the archive
        wraps everything in one top-level folder.

    Raises:
        UnsafeArchiveError: A member escapes ``dest``, is a link or device, or the sizes exceed
            the limits. Nothing outside ``dest`` is ever written, and ``dest`` is left empty.
        SourceFormatError: The archive is damaged, or holds no file.
    """
    limits = limits or Limits()
    kind = archive_kind(archive)
    try:
        if kind == "zip":
            files = _extract_zip(archive, dest, limits)
        elif kind == "tar":
            files = _extract_tar(archive, dest, limits)
        else:
            raise SourceFormatError(f"{archive}: not a {', '.join(ARCHIVE_SUFFIXES)} archive")
        if files == 0:
            raise SourceFormatError(
                f"{archive} holds no files (only folders, or nothing)",
                hint="check that the archive holds the dataset's files",
            )
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        raise
    children = [c for c in dest.iterdir() if not c.name.startswith((".", "__MACOSX"))]
    if not children:
        raise SourceFormatError(f"{archive} is empty")
    # one top-level folder (or one file): convert that, as if it had been given directly
    return children[0] if len(children) == 1 else dest
