"""Fetch the files of one dataset into a download folder: locked, verified, published atomically.

For each file (several at once, in a bounded thread pool):

1. take the file's lock, so two processes fetching the same file download it once;
2. if the file is there and matches its known (or pinned) size and sha256: done (an unconfirmed
   file whose conversion failed is fetched again, see :mod:`rlds_cli.net.layout`);
3. else, offline: fail; online: stream each mirror in turn into its ``.part``, resuming
   what is there when the server proves it unchanged, with retries (see :mod:`rlds_cli.net.http`);
4. check size and sha256 of the ``.part``; a mismatch deletes it and tries the next mirror;
5. fsync, rename to the final name, fsync the folder, record the hash in ``hashes.json``.

Locks, partial downloads and ``hashes.json`` live in the folder's ``.rlds/`` (see
:mod:`rlds_cli.net.layout`), so they never collide with a downloaded file's name.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

from rlds_cli import settings
from rlds_cli._util.io import check_disk, fsync_dir, fsync_file, sha256_file
from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli._util.progress import DownloadProgress, ignore
from rlds_cli.errors import (
    ChecksumMismatchError,
    DownloadError,
    DownloadFailedError,
    OfflineError,
    RegistryFormatError,
)
from rlds_cli.net.http import HttpConfig, download_url, new_session
from rlds_cli.net.layout import (
    META_DIR,
    FileRecord,
    HashStore,
    discard_part,
    is_reserved,
    lock_path,
    mismatch_hint,
    must_refetch,
    part_path,
)


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch.

    Attributes:
        name: Path relative to the download folder (may hold ``/``).
        urls: Mirrors, tried in order.
        size: Size in bytes, when known.
        sha256: Hex digest, when known (else the first converted download's is pinned).
        hash_origin: Where ``sha256`` comes from (``"registry"``, ``"hub"``, ``"user"``).
    """

    name: str
    urls: tuple[str, ...]
    size: int | None = None
    sha256: str | None = None
    hash_origin: str = "registry"


@dataclass(frozen=True)
class FetchResult:
    """A verified local file.

    Attributes:
        name: As in :class:`RemoteFile`.
        path: Where it is.
        sha256: Its verified digest.
        size: Its size in bytes.
        url: The URL it came from (the recorded one when it was already there).
        action: ``"downloaded"`` or ``"cached"``.
        hash_origin: ``"registry"``, ``"hub"``, ``"user"`` or ``"recorded"``.
    """

    name: str
    path: Path
    sha256: str
    size: int
    url: str
    action: str
    hash_origin: str


def fetch_files(
    files: list[RemoteFile],
    directory: str | os.PathLike[str],
    *,
    force: bool = False,
    offline: bool | None = None,
    workers: int | None = None,
    progress: DownloadProgress | None = None,
    config: HttpConfig | None = None,
    pin: bool = True,
) -> list[FetchResult]:
    """Make every file of ``files`` present and verified under ``directory``.

    Args:
        files: What to fetch.
        directory: The download folder (created if needed).
        force: Download again even when a verified copy is there.
        offline: Never touch the network (default: ``RLDS_OFFLINE``).
        workers: Files fetched at once (default: ``RLDS_DOWNLOAD_WORKERS``, 4).
        progress: See :data:`~rlds_cli._util.progress.DownloadProgress`.
        config: Timeouts, retries and back-off (default: from the environment).
        pin: Make a first-seen hash binding at once. :func:`rlds_cli.sources.download.download`
            passes ``False`` and pins after the conversion succeeds, so a file that does not
            convert (a captive portal's HTML page) never becomes the trusted version.

    Returns:
        One :class:`FetchResult` per file, in the order of ``files``.

    Raises:
        OfflineError: Offline, and a file is missing or does not verify.
        ChecksumMismatchError: Every mirror served bytes of the wrong size or sha256.
        HTTPStatusError: A 4xx (other than 429) from the only or the last mirror.
        DownloadFailedError: Transient errors outlasted the retries on every mirror.
        DiskFullError: The files do not fit on the disk.
        RegistryFormatError: A file name lies in the bookkeeping folder ``.rlds/``.
    """
    for f in files:
        if is_reserved(f.name):
            raise RegistryFormatError(
                f"file name {f.name!r} is reserved: '{META_DIR}/' holds rlds' own bookkeeping in a "
                "download folder",
                hint="rename the file in its registry entry",
            )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    offline = settings.offline() if offline is None else offline
    config = config or HttpConfig()
    store = HashStore(folder)
    if not offline:
        _check_disk_for(files, folder, force)
    n = max(1, min(workers or settings.download_workers(), len(files) or 1))
    stop = threading.Event()
    report = progress or ignore

    def guarded(event: str, name: str, value: int) -> None:
        # called for every chunk: the way a failure elsewhere (or Ctrl-C) stops the other workers
        if stop.is_set():
            raise _Cancelled
        report(event, name, value)

    def one(file: RemoteFile) -> FetchResult:
        return _fetch_one(file, folder, store, force, offline, guarded, config, pin)

    if n == 1:
        return [one(f) for f in files]
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="rlds-download")
    futures = [pool.submit(one, f) for f in files]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)  # not in order: the first failure counts
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            stop.set()
            failed.result()  # raises it
        results = [f.result() for f in futures]
    except BaseException as exc:
        stop.set()  # running downloads stop at their next chunk, keeping their .part
        # an interruption does not wait for a worker blocked in a read of a stalled server (up to
        # the read timeout): the rlds entry point ends the process once it has said so
        pool.shutdown(wait=not isinstance(exc, KeyboardInterrupt), cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


class _Cancelled(Exception):
    """Raised inside a worker whose sibling failed, to stop it early."""


def _check_disk_for(files: list[RemoteFile], folder: Path, force: bool) -> None:
    """Fail before any byte moves when the known sizes cannot fit."""
    needed = 0
    for f in files:
        if f.size is None or (not force and (folder / f.name).is_file()):
            continue
        part = part_path(folder, f.name)
        needed += f.size - (part.stat().st_size if part.is_file() and not force else 0)
    check_disk(folder, needed, "the download")


def _fetch_one(
    file: RemoteFile,
    folder: Path,
    store: HashStore,
    force: bool,
    offline: bool,
    progress: DownloadProgress,
    config: HttpConfig,
    pin: bool,
) -> FetchResult:
    final = folder / file.name
    final.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(folder, file.name)
    part.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path(folder, file.name))  # its folder made on first use
    try:
        lock.acquire(timeout=0.2)
    except Timeout:
        progress("wait", file.name, 0)  # another process is fetching it: wait, then reuse it
        lock.acquire()
    try:
        return _fetch_locked(file, final, part, store, force, offline, progress, config, pin)
    finally:
        lock.release()


def _fetch_locked(
    file: RemoteFile,
    final: Path,
    part: Path,
    store: HashStore,
    force: bool,
    offline: bool,
    progress: DownloadProgress,
    config: HttpConfig,
    pin: bool,
) -> FetchResult:
    folder = store.directory
    expected = _expected(file, store.get(file.name))
    if force and not offline:  # offline, --force re-converts but cannot re-download
        # downloaded afresh: the file in place stays (readers, and the only good copy when the
        # download fails) until the new bytes verify and replace it in one rename
        discard_part(part)
        return _download(file, final, part, store, expected, progress, config, pin)
    record = store.get(file.name)
    if not offline and final.is_file() and must_refetch(file, record):
        final.unlink()  # it never converted and nothing vouches for it: fetch it afresh
        discard_part(part)
        if record is not None and record.url in file.urls:  # from the other mirrors first
            i = file.urls.index(record.url)
            file = replace(file, urls=(*file.urls[i + 1 :], *file.urls[:i], record.url))
    if final.is_file():
        done = _reuse(file, final, store, expected, progress, pin)
        if done is not None:
            return done
        if offline:
            raise OfflineError(
                f"{final} does not match its expected size or sha256"
                f"{' (' + _ORIGINS[expected.origin] + ')' if _ORIGINS[expected.origin] else ''} "
                "and offline mode is on",
                hint="run the command without --offline to download it again",
            )
        # not removed: a download replaces it once its bytes verify (a mistyped --sha256 or a
        # changed server must not take a good copy away, nor a concurrent reader's file)
    if offline:
        raise OfflineError(f"{file.name} is not downloaded (in {folder}) and offline mode is on")
    return _download(file, final, part, store, expected, progress, config, pin)


@dataclass(frozen=True)
class _Expected:
    sha256: str | None
    size: int | None
    origin: str


def _expected(file: RemoteFile, record: FileRecord | None) -> _Expected:
    """What the bytes must be: the registry's (or Hub's, or user's) hash, else the pinned one (a
    hash seen on a download that never converted binds nothing)."""
    if file.sha256:
        return _Expected(file.sha256.lower(), file.size, file.hash_origin)
    if record is not None and record.pinned:
        return _Expected(record.sha256, file.size if file.size is not None else record.size, "recorded")
    return _Expected(None, file.size, "none")


def _reuse(
    file: RemoteFile,
    final: Path,
    store: HashStore,
    expected: _Expected,
    progress: DownloadProgress,
    pin: bool,
) -> FetchResult | None:
    """The file already there, if it verifies (re-hashed only when it changed since last time)."""
    st = final.stat()
    record = store.get(file.name)
    fresh = record is not None and record.size == st.st_size and record.mtime_ns == st.st_mtime_ns
    if fresh and record is not None and expected.sha256 in (None, record.sha256):
        sha256 = record.sha256
    else:
        progress("verify", file.name, st.st_size)
        sha256 = sha256_file(final)
    if (expected.sha256 and sha256 != expected.sha256) or (
        expected.size is not None and st.st_size != expected.size
    ):
        return None
    url = record.url if record else (file.urls[0] if file.urls else "")
    origin = expected.origin if expected.sha256 else "recorded"
    if not fresh:
        pinned = (
            pin or bool(expected.sha256) or (record is not None and record.pinned and record.sha256 == sha256)
        )
        store.put(file.name, FileRecord(sha256, st.st_size, origin, url, st.st_mtime_ns, pinned=pinned))
    progress("cached", file.name, st.st_size)
    return FetchResult(file.name, final, sha256, st.st_size, url, "cached", origin)


def _download(
    file: RemoteFile,
    final: Path,
    part: Path,
    store: HashStore,
    expected: _Expected,
    progress: DownloadProgress,
    config: HttpConfig,
    pin: bool,
) -> FetchResult:
    failures: list[DownloadError | ChecksumMismatchError] = []
    for url in file.urls:
        # a .part left by an earlier process is resumed; if the result then fails verification,
        # the old bytes may be the cause, so that mirror gets one more try from byte 0
        tries = 2 if part.is_file() else 1
        for _ in range(tries):
            try:
                with new_session() as session:
                    download_url(
                        session, url, part, name=file.name, expected_size=expected.size, config=config,
                        progress=progress,
                    )  # fmt: skip
                return _publish(file, final, part, store, expected, url, progress, pin)
            except ChecksumMismatchError as exc:  # the .part is gone: a next try starts from 0
                failures.append(exc)
            except DownloadError as exc:  # retries exhausted, or a 4xx: next mirror
                failures.append(exc)
                break
    raise _combine(file, failures)


def _publish(
    file: RemoteFile,
    final: Path,
    part: Path,
    store: HashStore,
    expected: _Expected,
    url: str,
    progress: DownloadProgress,
    pin: bool,
) -> FetchResult:
    size = part.stat().st_size
    progress("verify", file.name, size)
    sha256 = sha256_file(part)
    problem = None
    if expected.size is not None and size != expected.size:
        problem = f"is {size:,} bytes, expected {expected.size:,}"
    elif expected.sha256 and sha256 != expected.sha256:
        problem = f"has sha256 {sha256}, expected {expected.sha256} ({_ORIGINS[expected.origin]})"
    if problem:
        discard_part(part)
        raise ChecksumMismatchError(
            f"{file.name} downloaded from {url} {problem}; the file was deleted",
            hint=mismatch_hint(expected.origin, store.path),
        )
    sync = settings.fsync_enabled()
    if sync:
        fsync_file(part)
    os.replace(part, final)
    discard_part(part)  # its validator record
    if sync:
        fsync_dir(final.parent)
    origin = expected.origin if expected.sha256 else "recorded"
    # a hash from an authority (or an already pinned one) binds at once; a first-seen one only
    # when the caller says so (after the file converted)
    pinned = pin or bool(expected.sha256)
    store.put(file.name, FileRecord(sha256, size, origin, url, final.stat().st_mtime_ns, pinned=pinned))
    progress("done", file.name, size)
    return FetchResult(file.name, final, sha256, size, url, "downloaded", origin)


_ORIGINS = {
    "registry": "from the registry",
    "hub": "from the Hugging Face LFS metadata",
    "user": "given with --sha256",
    "recorded": "recorded at the first download",
    "none": "",
}


def _combine(
    file: RemoteFile, failures: list[DownloadError | ChecksumMismatchError]
) -> DownloadError | ChecksumMismatchError:
    """One error for a file every mirror failed: the only one, else a summary."""
    if len(failures) == 1:
        return failures[0]
    lines = "; ".join(str(f) for f in failures)
    if all(isinstance(f, ChecksumMismatchError) for f in failures):
        # every mirror was checked against the same hash: the first one's hint fits them all
        return ChecksumMismatchError(
            f"every mirror of {file.name} failed verification: {lines}", hint=failures[0].hint
        )
    kinds = {type(f) for f in failures}
    if len(kinds) == 1 and issubclass(cls := kinds.pop(), DownloadFailedError):
        return cls(f"every mirror of {file.name} failed: {lines}")  # keeps its hint (e.g. --offline)
    # mirrors that failed each in its own way: each way's hint (a connection's is not a web page's)
    hints = list(dict.fromkeys(f.hint for f in failures if f.hint))
    return DownloadFailedError(f"every mirror of {file.name} failed: {lines}", hint=" / ".join(hints) or None)


def drop_raw_files(folder: Path, results: list[FetchResult]) -> None:
    """Delete downloaded files (``--no-keep-raw``); ``hashes.json`` stays, so a later download
    is still checked against the recorded hashes."""
    HashStore(folder).mark_dropped(r.name for r in results)  # first: verify then says why they are gone
    for r in results:
        r.path.unlink(missing_ok=True)
        discard_part(part_path(folder, r.name))
    for sub in sorted({r.path.parent for r in results}, key=lambda p: len(p.parts), reverse=True):
        if sub != folder and sub.is_dir() and not any(sub.iterdir()):
            shutil.rmtree(sub, ignore_errors=True)
