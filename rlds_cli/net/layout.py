"""Download folders: where they live (``<root>/raw/<entry>/``, ``/`` in a name written as ``--``),
the files inside one (the names are :mod:`rlds_cli.cache.layout`'s), its ``hashes.json``, and
each ``.part``'s record (:class:`PartInfo`: the version of the file its bytes are of, and how many
of them are durable).

**hashes.json** (:class:`HashStore`): the sizes and sha256 of a download folder's files, and when
a first-seen hash is trusted. It lives at ``<root>/raw/<entry>/.rlds/hashes.json``, apart from the
downloaded files, so no downloaded name can collide with it. Each file's mtime is kept too: a file
verified and untouched since is not hashed again.

**Pinning.** A file whose sha256 comes from an authority (the registry, ``--sha256``, the Hugging
Face Hub) is checked against it, and nothing below applies. A file without one is trust on first
use: its first download's sha256 is recorded unpinned (``pinned=False``; it saves re-hashing but
is never enforced, so a captive portal's HTML page cannot become the trusted hash) and pinned once
the file converts (:meth:`HashStore.pin`); later downloads and ``rlds verify`` must match it. A
failed conversion marks that download's unpinned files (:func:`mark_failed`) and the next run
fetches them again (:func:`must_refetch`), so the same command succeeds once the server sends the
real file, with no file deleted by hand.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import json
import os
import posixpath
import re
import threading
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlds_cli import settings
from rlds_cli._util.io import atomic_write
from rlds_cli._util.locks import FileLock
from rlds_cli.cache.layout import (
    DOWNLOAD_LOCKS_DIR,
    HASHES_FILE,
    LISTING_FILE,
    LOCK_SUFFIX,
    META_DIR,
    PART_SUFFIX,
    PARTS_DIR,
)
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import CorruptDatasetError, RldsError, SourceError, UnknownFormatError

__all__ = [
    "META_DIR",
    "PART_SUFFIX",
    "is_reserved",
    "listing_path",
    "lock_path",
    "meta_dir",
    "part_info_path",
    "part_path",
    "raw_dir",
    "stored_listing",
    "url_dir",
    "url_file_name",
]


def raw_dir(cache: CacheRoot, key: str) -> Path:
    """The download folder of a registry entry (``key`` is its cache name)."""
    return cache.layout.download_dir(key)


def url_dir(cache: CacheRoot, url: str) -> Path:
    """The download folder of an ad-hoc URL: one per URL, so recorded hashes never collide."""
    return cache.layout.url_download_dir(url)


def url_file_name(url: str) -> str:
    """A safe local file name from a URL's last path segment.

    Raises:
        SourceError: ``url`` cannot be parsed (e.g. an unclosed ``[`` of an IPv6 host).
    """
    try:
        path = urllib.parse.urlsplit(url).path
    except ValueError as exc:
        raise SourceError(f"{url} is not a valid URL ({exc})", hint="check the URL") from None
    last = urllib.parse.unquote(path.rsplit("/", 1)[-1])
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", last).strip("._")
    return cleaned or "download"


def is_reserved(name: str) -> bool:
    """Whether a downloaded file's relative name would land in the bookkeeping folder (``./``
    and ``a/..`` parts resolved first: ``./.rlds/hashes.json`` wrote over the folder's hashes)."""
    # case-folded: .RLDS/ is .rlds/ on a case-insensitive disk (macOS, Windows)
    return posixpath.normpath(name.replace("\\", "/")).split("/", 1)[0].casefold() == META_DIR


def meta_dir(folder: Path) -> Path:
    """The bookkeeping folder of a download folder."""
    return folder / META_DIR


def part_path(folder: Path, name: str) -> Path:
    """Where the partial download of file ``name`` grows."""
    return meta_dir(folder) / PARTS_DIR / (name + PART_SUFFIX)


def part_info_path(part: Path) -> Path:
    """The validator record (URL, ETag / Last-Modified, size) of a partial download."""
    return part.with_name(part.name + ".json")


def lock_path(folder: Path, name: str) -> Path:
    """The lock taken while file ``name`` is fetched."""
    return meta_dir(folder) / DOWNLOAD_LOCKS_DIR / (name + LOCK_SUFFIX)


@contextmanager
def in_use(folder: Path) -> Iterator[None]:
    """Hold a lock of ``folder`` of its own while a download fetches and converts its files:
    ``rlds gc --raw`` leaves a folder alone while any of its locks is held (the files' own locks
    are released once fetched, before the conversion reads them)."""
    lock = meta_dir(folder) / DOWNLOAD_LOCKS_DIR / f"in-use.{os.getpid()}.{uuid.uuid4().hex[:8]}{LOCK_SUFFIX}"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock):
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)


def listing_path(folder: Path) -> Path:
    """Where a Hugging Face folder's file list is remembered."""
    return meta_dir(folder) / LISTING_FILE


def stored_listing(folder: Path) -> Path | None:
    """The remembered file list of a Hugging Face folder entry (``None`` if never fetched)."""
    path = listing_path(folder)
    return path if path.is_file() else None


if TYPE_CHECKING:
    from rlds_cli.net.fetch import RemoteFile


_THREAD_LOCK = threading.Lock()


def mismatch_hint(origin: str, hashes_file: Path | None = None) -> str | None:
    """The hint for a file whose bytes differ from the sha256 given by ``origin``; ``None`` keeps
    :class:`~rlds_cli.errors.ChecksumMismatchError`'s default (the registry's case).

    Args:
        origin: ``"user"``, ``"registry"``, ``"hub"`` or ``"recorded"``.
        hashes_file: The ``hashes.json`` holding a ``"recorded"`` hash (the hint names it:
            deleting it accepts a changed upstream file).
    """
    if origin == "user":
        return (
            "the file differs from the sha256 you gave: check the value passed to --sha256, or "
            "drop --sha256 to skip that check"
        )
    if origin == "hub":
        return (
            "the file does not match the Hugging Face Hub's own sha256 of it: run the command again; "
            "if it fails again, the file on the Hub is damaged: report it to the dataset's owners"
        )
    if origin == "recorded":
        where = str(hashes_file) if hashes_file is not None else f"the download folder's .rlds/{HASHES_FILE}"
        return (
            "the file differs from the sha256 pinned at its first download: run the command again "
            f"(a transfer error); if the file changed upstream on purpose, delete {where} to pin "
            "the new version at the next download"
        )
    return None


@dataclass
class FileRecord:
    """What rlds knows about one downloaded file.

    Attributes:
        sha256: Hex digest of the verified bytes.
        size: Size in bytes.
        origin: Where the hash came from: ``"registry"``, ``"hub"`` (Hugging Face LFS
            metadata), ``"user"`` (``--sha256``) or ``"recorded"`` (observed on first download).
        url: The URL the bytes came from.
        mtime_ns: The file's mtime when it was last verified.
        verified_at: UTC time of that verification.
        pinned: Whether later downloads must match this hash. A ``"recorded"`` hash is pinned
            only once the file converted; hashes from an authority are pinned at once.
        convert_failed: An unpinned file whose conversion failed: the next run fetches it
            again instead of reusing it (see the module docstring).
        dropped: Deleted after its conversion (``--no-keep-raw``): its absence is no loss.
    """

    sha256: str
    size: int
    origin: str
    url: str = ""
    mtime_ns: int = 0
    verified_at: str = ""
    pinned: bool = True
    convert_failed: bool = False
    dropped: bool = False


class HashStore:
    """The ``hashes.json`` of one download folder.

    Args:
        directory: The folder holding the raw files.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = meta_dir(directory) / HASHES_FILE

    def _lock(self) -> FileLock:
        return FileLock(str(self.path.with_name(f"{HASHES_FILE}.lock")))

    def exists(self) -> bool:
        """Whether any record was ever written for this folder."""
        return self.path.is_file()

    def read(self) -> dict[str, FileRecord]:
        """Every record, by file name (none before the first download); fields an rlds newer than
        this one records are left out.

        Raises:
            CorruptDatasetError: The file is damaged (it is written whole, by a rename): its
                records, the hashes later downloads are held to, are never taken for none.
        """
        return self._parse(self.path)

    @staticmethod
    def _parse(path: Path) -> dict[str, FileRecord]:
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CorruptDatasetError(f"{path} cannot be read: {exc.strerror or exc}") from None
        known = {f.name for f in fields(FileRecord)}
        try:
            data = json.loads(text)
            records = {
                str(k): FileRecord(**{a: b for a, b in v.items() if a in known})
                for k, v in data["files"].items()
            }
            if not all(isinstance(r.sha256, str) and type(r.size) is int for r in records.values()):
                raise TypeError("a record's sha256 or size")
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise CorruptDatasetError(
                f"{path} is damaged ({type(exc).__name__}): it holds the sha256 each file downloaded "
                "there was checked against",
                hint="restore it from a backup; or delete it, and the next download records the "
                "files' hashes afresh (checking them against no earlier download)",
            ) from None
        return records

    def get(self, name: str) -> FileRecord | None:
        """The record of one file, pinned or not."""
        return self.read().get(name)

    def put(self, name: str, record: FileRecord) -> None:
        """Add or replace one record (read-modify-write under a process and a thread lock)."""
        record.verified_at = record.verified_at or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self._update(lambda records: records.__setitem__(name, record))

    def pin(self, names: Iterable[str]) -> None:
        """Make the records of ``names`` binding for later downloads (after their conversion)."""
        wanted = set(names)
        if wanted and any(not r.pinned for n, r in self.read().items() if n in wanted):
            self._set(wanted, pinned=True, convert_failed=False)

    def mark_failed(self, names: Iterable[str]) -> None:
        """Record that the (unpinned) files ``names`` did not convert."""
        self._set(set(names), convert_failed=True)

    def mark_dropped(self, names: Iterable[str]) -> None:
        """Record that the files ``names`` were deleted after their conversion (``--no-keep-raw``)."""
        self._set(set(names), dropped=True)

    def _set(self, names: set[str], **fields: bool) -> None:
        """Set ``fields`` in the records of ``names`` (the others are left as they are)."""

        def change(records: dict[str, FileRecord]) -> None:
            for name in names & set(records):
                for attr, value in fields.items():
                    setattr(records[name], attr, value)

        self._update(change)

    def _update(self, change: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _THREAD_LOCK, self._lock():
            records = self.read()
            change(records)
            self._write(records)

    def _write(self, records: dict[str, FileRecord]) -> None:
        data: dict[str, Any] = {"files": {k: _as_json(v) for k, v in sorted(records.items())}}
        atomic_write(self.path, json.dumps(data, indent=2) + "\n")


def _as_json(record: FileRecord) -> dict[str, Any]:
    """A record as stored; ``convert_failed`` and ``dropped`` only when set, so an rlds that does not
    know those keys still reads the folder's other records."""
    data = asdict(record)
    for flag in ("convert_failed", "dropped"):
        if not data[flag]:
            del data[flag]
    return data


#: Said after a conversion error when downloaded files were marked for a fresh download.
REFETCH_HINT = (
    "the downloaded file is not trusted until it converts: run the same command again to fetch it "
    "afresh; if it fails the same way, open the URL in a browser (a login page or a broken server?)"
)


def must_refetch(file: RemoteFile, record: FileRecord | None) -> bool:
    """Whether the finished raw file of ``file`` must be fetched again instead of reused: no
    authority hash, its recorded hash unpinned, and its conversion failed."""
    return not file.sha256 and record is not None and not record.pinned and record.convert_failed


def mark_failed(folder: Path, names: Iterable[str]) -> list[str]:
    """Mark the unconfirmed records of ``names`` in ``folder`` as failed to convert (a pinned
    hash, or one from an authority, stays as it is). Returns the names marked."""
    store = HashStore(folder)
    records = store.read()
    marked = [n for n in names if n in records and not records[n].pinned and records[n].origin == "recorded"]
    if marked:
        store.mark_failed(marked)
    return marked


@contextmanager
def confirmed_by_conversion(folder: Path, names: Iterable[str]) -> Iterator[None]:
    """Around the conversion of ``names`` in ``folder``: pin their hashes on success; on a
    :class:`SourceError` or an unforeseen exception, mark the unpinned ones for a fresh download
    (and set the hint). Other rlds errors (a name taken, a full disk) and interruptions change
    nothing."""
    wanted = list(names)
    try:
        yield
    except RldsError as exc:
        if isinstance(exc, SourceError) and mark_failed(folder, wanted):
            # a format not told from the name or the bytes wants --format first: fetching the
            # file again (the whole of it) would fail the same way
            told = exc.hint if isinstance(exc, UnknownFormatError) and exc.hint else None
            exc.hint = f"{told}; if it still fails, {REFETCH_HINT}" if told else REFETCH_HINT
        raise
    except Exception:
        mark_failed(folder, wanted)
        raise
    HashStore(folder).pin(wanted)


@dataclass
class PartInfo:
    """What identifies the version of the file a ``.part`` holds bytes of.

    Attributes:
        url: The URL asked for (a ``.part`` is only resumed from the same URL).
        etag: The first response's strong ``ETag`` (weak ones cannot validate byte ranges).
        last_modified: Its ``Last-Modified``.
        size: The file's total size, when the server said.
        boot: The machine's boot id when the bytes were written (``None``: unknown).
        durable: Bytes of the ``.part`` fsynced (``None``: an older record, or fsync off).
    """

    url: str
    etag: str | None = None
    last_modified: str | None = None
    size: int | None = None
    boot: str | None = None
    durable: int | None = None

    @property
    def validator(self) -> str | None:
        """The ``If-Range`` value: the strong ETag, else the date; ``None`` when neither."""
        return self.etag or self.last_modified

    @classmethod
    def of(cls, resp: Any, url: str, size: int | None) -> PartInfo:
        """The validators of a response: its strong ``ETag``; its ``Last-Modified`` only where it
        is strong (RFC 9110 8.8.2.2: at least 60 s before the response's ``Date``; a file changed
        again within the second it was written has the same date, and a resume would splice)."""
        etag = (resp.headers.get("ETag") or "").strip()
        strong = etag if etag.startswith('"') else None  # W/"..." is weak, bare tokens are invalid
        modified = (resp.headers.get("Last-Modified") or "").strip() or None
        date = modified if _strong_date(modified, resp.headers.get("Date")) else None
        return cls(url, strong, date, size, boot_id(), 0 if settings.fsync_enabled() else None)

    def proves_same(self, resp: Any) -> bool:
        """Whether a 206 answering a resume carries the recorded validator (the ETag, else the
        Last-Modified date), so its bytes continue the same version. RFC 9110 (15.3.7) has a 206
        send what a 200 would; one without proves nothing (a server that ignores ``If-Range`` sent
        a replaced file's bytes, spliced onto the old ones). With no validator recorded: as
        :meth:`matches`."""
        if self.etag:
            return (resp.headers.get("ETag") or "").strip() == self.etag
        if self.last_modified:
            return (resp.headers.get("Last-Modified") or "").strip() == self.last_modified
        return self.matches(resp)

    def matches(self, resp: Any) -> bool:
        """Whether a response's validators, where it sends them, are the recorded ones."""
        etag = (resp.headers.get("ETag") or "").strip()
        if self.etag and etag and etag != self.etag:
            return False
        date = (resp.headers.get("Last-Modified") or "").strip()
        return not (not self.etag and self.last_modified and date and date != self.last_modified)


def _strong_date(modified: str | None, date: str | None) -> bool:
    """Whether ``Last-Modified`` is at least 60 s before the response's ``Date`` (both given)."""
    try:
        then, now = (
            email.utils.parsedate_to_datetime(modified or ""),
            email.utils.parsedate_to_datetime(date or ""),
        )
        return (now - then).total_seconds() >= 60
    except (TypeError, ValueError, IndexError):  # absent or malformed; naive vs aware dates
        return False


def boot_id() -> str | None:
    """This boot of the machine (Linux's ``boot_id``); ``None`` where the system does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def read_part_info(part: Path) -> PartInfo | None:
    """The validator record of a ``.part`` (``None`` when missing or unreadable)."""
    try:
        return PartInfo(**json.loads(part_info_path(part).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def write_part_info(part: Path, info: PartInfo) -> None:
    """Record (atomically) which version of the file a ``.part`` holds bytes of."""
    atomic_write(part_info_path(part), json.dumps(asdict(info)) + "\n")


def discard_part(part: Path) -> None:
    """Delete a partial download and its validator record."""
    part.unlink(missing_ok=True)
    part_info_path(part).unlink(missing_ok=True)


def mark_durable(fh: Any, part: Path, record: PartInfo, size: int) -> None:
    """fsync the first ``size`` bytes of ``part`` (open as ``fh``), then record them durable, of
    this boot."""
    fh.flush()
    os.fsync(fh.fileno())
    record.boot, record.durable = boot_id(), size
    atomic_write(part_info_path(part), json.dumps(asdict(record)) + "\n", fsync=True)
