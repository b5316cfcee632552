"""Safe extraction of source archives (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``).

An archive from the internet is untrusted input. Every member is checked before a byte of it
is written:

* its path must stay inside the destination: no absolute paths, no ``..`` parts, no drive
  letters or backslash tricks;
* symbolic links, hard links, devices and FIFOs are refused outright (a link could point
  outside the destination, or at a file written later);
* the total unpacked size, the number of members and (for zip) each member's compression ratio
  are limited, and sizes are counted while copying (a header may lie), so a zip bomb stops at the
  limit instead of filling the disk.

Tar archives are read as a stream (``tarfile`` mode ``r|*``), so a ``.tar.gz`` is inflated once,
front to back. The caller owns the destination directory and removes it after conversion.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from rlds_cli.errors import SourceFormatError

_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What an archive may unpack to.

    Attributes:
        max_total_bytes: Sum of all members' sizes (default 256 GiB, or ``$RLDS_ARCHIVE_MAX_BYTES``).
        max_members: Number of members.
        max_ratio: Largest uncompressed/compressed ratio of one zip member (zip bombs exceed
            1000; real data rarely 100).
    """

    max_total_bytes: int = field(
        default_factory=lambda: int(os.environ.get("RLDS_ARCHIVE_MAX_BYTES", 256 << 30))
    )
    max_members: int = 1_000_000
    max_ratio: float = 1000.0


class UnsafeArchiveError(SourceFormatError):
    """An archive member that would escape the destination, a link, or a size over the limits."""

    default_hint = "the archive is unsafe or damaged; get it from a trusted source"


def archive_kind(path: Path) -> str | None:
    """``"zip"``, ``"tar"`` or ``None`` from the file name."""
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar", ".tar.gz", ".tgz")):
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
    def __init__(self, archive: Path, limits: Limits) -> None:
        self.archive, self.limits = archive, limits
        self.bytes = 0
        self.members = 0

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


def _copy(src: IO[bytes], target: Path, budget: _Budget, name: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "xb") as out:
        while chunk := src.read(_COPY_CHUNK):
            budget.add(len(chunk), name)
            out.write(chunk)


def _extract_zip(archive: Path, dest: Path, limits: Limits) -> None:
    budget = _Budget(archive, limits)
    try:
        zf = zipfile.ZipFile(archive)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SourceFormatError(
            f"cannot open {archive} as a zip archive (truncated or corrupt?): {exc}"
        ) from exc
    with zf:
        infos = zf.infolist()
        for info in infos:  # check every name first: nothing is written for a bad archive
            budget.member()
            safe_member_path(archive, info.filename, dest)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise UnsafeArchiveError(f"{archive}: member {info.filename!r} is a symbolic link; refused")
            if info.compress_size and info.file_size / info.compress_size > limits.max_ratio:
                raise UnsafeArchiveError(
                    f"{archive}: member {info.filename!r} has compression ratio "
                    f"{info.file_size / info.compress_size:.0f} (over {limits.max_ratio:.0f}); "
                    "refusing (zip bomb?)"
                )
        if sum(i.file_size for i in infos) > limits.max_total_bytes:
            raise UnsafeArchiveError(
                f"{archive}: declares {sum(i.file_size for i in infos):,} unpacked bytes, over the limit of "
                f"{limits.max_total_bytes:,}; refusing (zip bomb?)",
                hint="raise the limit with RLDS_ARCHIVE_MAX_BYTES if the archive is trusted",
            )
        for info in infos:
            target = safe_member_path(archive, info.filename, dest)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            try:
                with zf.open(info) as src:
                    _copy(src, target, budget, info.filename)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                if isinstance(exc, FileExistsError):
                    raise UnsafeArchiveError(f"{archive}: member {info.filename!r} appears twice") from exc
                raise SourceFormatError(
                    f"{archive}: member {info.filename!r} is damaged (truncated or corrupt?): {exc}"
                ) from exc


def _extract_tar(archive: Path, dest: Path, limits: Limits) -> None:
    budget = _Budget(archive, limits)
    try:
        tf = tarfile.open(archive, mode="r|*")  # noqa: SIM115 - a stream, read once front to back
    except (OSError, tarfile.TarError) as exc:
        raise SourceFormatError(
            f"cannot open {archive} as a tar archive (truncated or corrupt?): {exc}"
        ) from exc
    try:
        with tf:
            for member in tf:
                budget.member()
                target = safe_member_path(archive, member.name, dest)
                if member.issym() or member.islnk():
                    raise UnsafeArchiveError(
                        f"{archive}: member {member.name!r} is a link (to {member.linkname!r}); refused"
                    )
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
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
                except FileExistsError as exc:
                    raise UnsafeArchiveError(f"{archive}: member {member.name!r} appears twice") from exc
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, SourceFormatError):
            raise
        raise SourceFormatError(f"{archive}: damaged tar archive (truncated or corrupt?): {exc}") from exc


def extract_archive(archive: Path, dest: Path, limits: Limits | None = None) -> Path:
    """Unpack ``archive`` into the empty directory ``dest`` after checking every member.

    Args:
        archive: A ``.zip``, ``.tar``, ``.tar.gz`` or ``.tgz`` file.
        dest: An existing, empty directory (the caller removes it afterwards).
        limits: Size limits (default :class:`Limits`).

    Returns:
        The directory to convert: ``dest``, or its only child directory when the archive
        wraps everything in one top-level folder.

    Raises:
        UnsafeArchiveError: A member escapes ``dest``, is a link or device, or the sizes exceed
            the limits. Nothing outside ``dest`` is ever written.
        SourceFormatError: The archive is damaged.
    """
    limits = limits or Limits()
    kind = archive_kind(archive)
    try:
        if kind == "zip":
            _extract_zip(archive, dest, limits)
        elif kind == "tar":
            _extract_tar(archive, dest, limits)
        else:
            raise SourceFormatError(f"{archive}: not a .zip, .tar, .tar.gz or .tgz archive")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        raise
    children = [c for c in dest.iterdir() if not c.name.startswith((".", "__MACOSX"))]
    if not children:
        raise SourceFormatError(f"{archive} is empty")
    # one top-level folder (or one file): convert that, as if it had been given directly
    return children[0] if len(children) == 1 else dest
