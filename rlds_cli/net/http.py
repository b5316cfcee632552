"""One URL into one ``.part`` file: streaming, Range resume, retries with back-off."""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlds_cli import settings
from rlds_cli.errors import DownloadFailedError, HTTPStatusError, InsufficientDiskSpaceError, RldsError
from rlds_cli.net.progress import DownloadProgress, ignore
from rlds_cli.net.retry import backoff_delay, is_retryable_status, parse_retry_after

logger = logging.getLogger(__name__)

CHUNK = 1024 * 1024
#: Head room kept free on the disk besides the file itself.
DISK_MARGIN = 64 * 1024 * 1024
USER_AGENT = "rlds-cli (+https://github.com/; offline-RL dataset manager)"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")


@dataclass
class HttpConfig:
    """Network knobs, read from the environment at call time (see :mod:`rlds_cli.settings`)."""

    timeout: tuple[float, float] = field(default_factory=settings.http_timeout)
    retries: int = field(default_factory=settings.http_retries)
    base_delay: float = field(default_factory=settings.retry_base_delay)
    sleep: Callable[[float], None] = time.sleep


class _Transient(Exception):
    """An error worth retrying: connection trouble, a timeout, 429 or 5xx.

    Attributes:
        retry_after: The server's ``Retry-After``, in seconds.
        received: Bytes that arrived before the error (progress resets the retry budget).
    """

    def __init__(self, reason: str, retry_after: float | None = None, received: int = 0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.received = received


def new_session() -> Any:
    """A ``requests.Session`` with rlds' User-Agent (imported here: keeps ``rlds --help`` fast)."""
    import requests

    session = requests.Session()
    session.headers["User-Agent"] = USER_AGENT
    return session


def download_url(
    session: Any,
    url: str,
    part: Path,
    *,
    name: str,
    expected_size: int | None,
    config: HttpConfig,
    progress: DownloadProgress = ignore,
) -> int:
    """Bring ``part`` to the complete content of ``url``, resuming what is already there.

    Returns:
        The number of bytes in ``part``.

    Raises:
        HTTPStatusError: A 4xx other than 429 (retrying will not help).
        DownloadFailedError: Still failing after ``config.retries`` retries.
        InsufficientDiskSpaceError: The rest of the file does not fit on the disk.
    """
    failures = 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        if expected_size is not None and have == expected_size:
            return have
        if expected_size is not None and have > expected_size:
            part.unlink()  # longer than the file can be: start over
            have = 0
        try:
            size = _one_request(session, url, part, have, name, expected_size, config, progress)
        except _Transient as exc:
            # a retry budget per stall, not per file: any progress makes the next failure the first
            failures = 1 if exc.received else failures + 1
            if failures > config.retries:
                raise DownloadFailedError(
                    f"GET {url} failed {failures} times in a row; last error: {exc}"
                ) from None
            progress("retry", name, failures)
            delay = backoff_delay(failures, config.base_delay, exc.retry_after)
            logger.warning("GET %s: %s; retry %d/%d in %.1f s", url, exc, failures, config.retries, delay)
            config.sleep(delay)
            continue
        if size is not None:
            return size
        # None: the part was found complete-or-wrong after a 416 and reset; look again


def _one_request(
    session: Any,
    url: str,
    part: Path,
    have: int,
    name: str,
    expected_size: int | None,
    config: HttpConfig,
    progress: DownloadProgress,
) -> int | None:
    """One GET. Returns the final size when the body ended cleanly, ``None`` to loop again."""
    import requests
    import urllib3

    errors = (
        requests.ConnectionError,
        requests.Timeout,
        requests.exceptions.ChunkedEncodingError,
        urllib3.exceptions.HTTPError,  # raised by raw reads: cut connections, read timeouts
        ConnectionError,
        TimeoutError,
    )
    received = [0]
    try:
        return _get(session, url, part, have, name, expected_size, config, progress, received)
    except errors as exc:
        if isinstance(exc, RldsError):
            raise
        raise _Transient(_describe(exc), None, received[0]) from exc


def _get(
    session: Any,
    url: str,
    part: Path,
    have: int,
    name: str,
    expected_size: int | None,
    config: HttpConfig,
    progress: DownloadProgress,
    received: list[int],
) -> int | None:
    # identity: sizes and hashes are of the stored bytes, not of a gzip-decoded stream
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with session.get(url, headers=headers, stream=True, timeout=config.timeout) as resp:
        status = resp.status_code
        if status == 416 and have:
            return _range_not_satisfiable(resp, part, have, expected_size)
        if is_retryable_status(status):
            raise _Transient(
                f"HTTP {status} {resp.reason or ''}".strip(),
                parse_retry_after(resp.headers.get("Retry-After")),
            )
        if status >= 400:
            raise HTTPStatusError(
                f"GET {url} answered HTTP {status} {resp.reason or ''}".strip(), url=url, status=status
            )
        start, total = _response_span(resp, have)
        if start != have:
            # 200 to a Range request (or a 206 for other bytes): the server restarts the file
            progress("reset", name, 0)
            have = 0
        _check_disk(part.parent, (total or expected_size or 0) - have)
        progress("start", name, total or expected_size or 0)
        if have:
            logger.info("resuming %s at byte %d", url, have)
            progress("resume", name, have)
        with open(part, "r+b" if have else "wb") as fh:
            fh.seek(have)
            fh.truncate()
            for chunk in _chunks(resp):
                fh.write(chunk)
                received[0] += len(chunk)
                progress("advance", name, len(chunk))
        size = have + received[0]
        # a body shorter than announced (or than the registry's size) is a cut connection
        expected = total if total is not None else expected_size
        if expected is not None and size < expected:
            raise _Transient(f"connection closed after {size:,} of {expected:,} bytes", None, received[0])
        return size


def _chunks(resp: Any) -> Iterator[bytes]:
    """The body as it arrives, undecoded. ``read1`` returns what is there (up to CHUNK), so a
    cut connection loses no byte that reached us; ``iter_content`` would drop a partial chunk."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 < 2
        yield from resp.iter_content(CHUNK)
        return
    while chunk := read1(CHUNK):
        yield chunk


def _range_not_satisfiable(resp: Any, part: Path, have: int, expected_size: int | None) -> int | None:
    """416 to ``Range: bytes=have-``: complete if the file is exactly ``have`` long, else restart."""
    m = _UNSATISFIED_RANGE.search(resp.headers.get("Content-Range", ""))
    total = int(m.group(1)) if m else expected_size
    if total == have:
        return have
    part.unlink(missing_ok=True)
    return None


def _response_span(resp: Any, have: int) -> tuple[int, int | None]:
    """(first byte, total size) of a 200/206 response; the total is ``None`` when unknown."""
    if resp.status_code == 206:
        m = _CONTENT_RANGE.search(resp.headers.get("Content-Range", ""))
        if m:
            total = None if m.group(3) == "*" else int(m.group(3))
            return int(m.group(1)), total
        return -1, None  # a 206 we cannot place: restart from 0
    length = resp.headers.get("Content-Length")
    return 0, int(length) if length and length.isdigit() else None


def _check_disk(directory: Path, needed: int) -> None:
    if needed <= 0:
        return
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_MARGIN:
        raise InsufficientDiskSpaceError(
            f"not enough disk space in {directory}: {needed:,} bytes to download, "
            f"{free:,} bytes free (and {DISK_MARGIN // 2**20} MiB kept spare)"
        )


def _describe(exc: BaseException) -> str:
    """A short reason: urllib3 nests the cause ("[Errno 111] Connection refused", "Read timed
    out") inside a long pool/URL preamble that the message already names."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text) or re.search(
        r"(Read timed out|Connection broken)", text
    )
    return f"{type(exc).__name__}: {m.group(1) if m else text}"[:300]


def fsync_file(path: Path) -> None:
    """Flush a file's bytes to disk (skipped when ``RLDS_FSYNC=0``)."""
    if not settings.fsync_enabled():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
