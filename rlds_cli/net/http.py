"""One URL into one ``.part`` file: streaming, guarded Range resume, checked redirects, retries
with back-off and a minimum-speed rule.

A resume never splices two versions of a file. The first response's validator (a strong ``ETag``,
else a ``Last-Modified`` at least 60 s before its ``Date``) is recorded beside the ``.part``
(:class:`PartInfo`); a resume sends it as ``If-Range``, so a server whose file changed answers
``200`` with the whole new file. A ``.part``
without a validator, or a ``206`` for other bytes than asked or with another validator or total
size, restarts the file from byte 0.

A machine crash can leave a ``.part`` whose last bytes never reached the disk (zeros or old
blocks, at the file's full length). The record names the boot it was written in and how many
bytes were fsynced (every :data:`DURABLE_BYTES`, with ``RLDS_FSYNC`` on); a ``.part`` of an
earlier boot resumes from that many bytes only. Within one boot (a killed process, a cut
connection) every byte on disk is the page cache's, and all are resumed.

Failed requests: when to retry and how long to wait, and a short reason for a person (a DNS
failure recognised through urllib3's wrapping, without urllib3's pool/URL preamble).
"""

from __future__ import annotations

import email.utils
import itertools
import logging
import random
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlds_cli import settings
from rlds_cli._util.io import check_disk
from rlds_cli._util.progress import DownloadProgress, ignore
from rlds_cli.errors import (
    DiskFullError,
    DownloadFailedError,
    DownloadTooSlowError,
    HostNotFoundError,
    HTTPStatusError,
    RedirectError,
    RldsError,
    ServerResponseError,
    is_disk_full,
)
from rlds_cli.net.layout import (
    PartInfo,
    boot_id,
    discard_part,
    mark_durable,
    read_part_info,
    write_part_info,
)

#: How many bytes a download writes between two fsyncs of its ``.part`` (what a machine crash may
#: cost a resume at most).
DURABLE_BYTES = 64 << 20


logger = logging.getLogger(__name__)


CHUNK = 1024 * 1024


USER_AGENT = "rlds-cli (+https://github.com/; offline-RL dataset manager)"


#: Resets of a ``.part`` (its bytes proved unusable) tolerated in one call before giving up.
MAX_RESTARTS = 3


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$")


_REDIRECTS = {301, 302, 303, 307, 308}


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the port spelt out, the host lowercased)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


@dataclass(frozen=True)
class OriginAuth:
    """An ``Authorization`` header sent to one origin (scheme, host and port) only, never to
    another (such as the storage host of a redirect's signed URL). Its ``repr`` never shows it.

    Attributes:
        origin: As :func:`origin_of` spells it.
        header: The header's value (``Bearer <token>``).
    """

    origin: str
    header: str = field(repr=False)

    def headers_for(self, url: str) -> dict[str, str]:
        """``{"Authorization": ...}`` when ``url`` is on :attr:`origin`, else ``{}``."""
        return {"Authorization": self.header} if origin_of(url) == self.origin else {}


@dataclass
class HttpConfig:
    """Network knobs, read from the environment at call time (see :mod:`rlds_cli.settings`).

    Attributes:
        timeout: (connect, read) timeouts in seconds.
        retries: Retries per mirror after a transient error.
        base_delay: First back-off delay in seconds.
        sleep: How to wait between retries (tests record instead).
        min_speed: Bytes per second a transfer must average over each ``speed_window``; a
            slower transfer is cut and retried (0 turns the rule off).
        speed_window: Seconds over which ``min_speed`` is measured.
        max_redirects: Redirects followed before giving up.
        clock: Monotonic seconds (tests may replace it).
        auth: Credentials sent with each request to their origin only (a Hub token), or
            ``None``.
    """

    timeout: tuple[float, float] = field(default_factory=settings.http_timeout)
    retries: int = field(default_factory=settings.http_retries)
    base_delay: float = field(default_factory=settings.retry_base_delay)
    sleep: Callable[[float], None] = time.sleep
    min_speed: float = field(default_factory=settings.http_min_speed)
    speed_window: float = field(default_factory=settings.http_speed_window)
    max_redirects: int = 10
    clock: Callable[[], float] = time.monotonic
    auth: OriginAuth | None = None


class _Transient(Exception):
    """An error worth retrying: connection trouble, a timeout, 429, 5xx or a too slow transfer.

    Attributes:
        retry_after: The server's ``Retry-After``, in seconds.
        received: Bytes that arrived before the error, less a window too slow (they reset the
            budget).
        too_slow: The transfer broke the minimum-speed rule.
    """

    def __init__(
        self, reason: str, retry_after: float | None = None, received: int = 0, too_slow: bool = False
    ) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.received = received
        self.too_slow = too_slow


def new_session() -> Any:
    """A ``requests.Session`` with rlds' User-Agent (imported here: keeps ``rlds --help`` fast)."""
    import requests

    session = requests.Session()
    session.headers["User-Agent"] = USER_AGENT
    return session


def open_url(session: Any, url: str, headers: dict[str, str], config: HttpConfig) -> Any:
    """GET ``url`` (streamed), following redirects one hop at a time.

    Only ``http``/``https`` targets are followed: a redirect to ``file://``, ``ftp://`` or any
    other scheme, a loop, or more than ``config.max_redirects`` hops is an error naming the chain.
    ``config.auth`` goes with each hop on its origin only.

    Raises:
        RedirectError: As above.
    """
    chain = [url]
    current = url
    while True:
        sent = {**headers, **config.auth.headers_for(current)} if config.auth else headers
        resp = session.get(current, headers=sent, stream=True, timeout=config.timeout, allow_redirects=False)
        location = resp.headers.get("Location")
        if resp.status_code not in _REDIRECTS or not location:
            return resp
        resp.close()
        target = urllib.parse.urljoin(current, location.strip())
        chain.append(target)
        shown = " -> ".join(chain)
        scheme = urllib.parse.urlsplit(target).scheme.lower()
        if scheme not in ("http", "https"):
            raise RedirectError(
                f"GET {url} was redirected to a {scheme or 'schemeless'}:// URL, which rlds never "
                f"follows: {shown}"
            )
        if target in chain[:-1]:
            raise RedirectError(f"GET {url} is a redirect loop: {shown}")
        if len(chain) - 1 > config.max_redirects:
            raise RedirectError(f"GET {url} was redirected more than {config.max_redirects} times: {shown}")
        current = target


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
    """Bring ``part`` to the complete content of ``url``, resuming what is already there when
    the server proves it is the same version of the file.

    Returns:
        The number of bytes in ``part``.

    Raises:
        HTTPStatusError: A 4xx other than 429 (retrying will not help).
        HostNotFoundError: The host name does not resolve (not retried).
        DownloadTooSlowError: Below the minimum speed through every retry.
        DownloadFailedError: Still failing after ``config.retries`` retries.
        RedirectError: A redirect loop, or to a non-HTTP URL.
        ServerResponseError: The server keeps sending bytes that cannot be placed.
        DiskFullError: The rest of the file does not fit on the disk.
    """
    budget = RetryBudget(config.retries, config.base_delay)
    restarts = 0
    while True:
        have = _resumable(part, url, name, progress)
        if expected_size is not None and have > expected_size:
            discard_part(part)  # longer than the file can be: start over
            have = 0
        if expected_size is not None and have == expected_size:
            return have
        try:
            size = _one_request(session, url, part, have, name, expected_size, config, progress)
        except _Transient as exc:
            delay = budget.next_delay(exc.retry_after, progressed=bool(exc.received), reached=size_of(part))
            if delay is None:
                cls = DownloadTooSlowError if exc.too_slow else DownloadFailedError
                raise cls(budget.give_up(f"GET {url}", exc)) from None
            n = budget.failures
            # logged once (the CLI shows it, without a source location); progress only counts
            logger.warning("GET %s: %s; retry %d/%d in %.1f s", url, exc, n, config.retries, delay)
            progress("retry", name, n)
            config.sleep(delay)
            continue
        if size is not None:
            return size
        restarts += 1  # None: the part was complete-or-wrong and reset; look again (bounded)
        if restarts > MAX_RESTARTS:
            raise ServerResponseError(
                f"GET {url}: the server answered {restarts} times with bytes that do not continue "
                f"the partial download of {name}; gave up"
            )


def _resumable(part: Path, url: str, name: str, progress: DownloadProgress) -> int:
    """Bytes of ``part`` that may be resumed: all when a validator of ``url`` was recorded for
    them, else none (and the ``.part`` is deleted)."""
    have = part.stat().st_size if part.is_file() else 0
    if not have:
        return 0
    info = read_part_info(part)
    if info is not None and info.url == url and info.validator:
        current = boot_id()  # unknown (not Linux): every byte is trusted, as before records had one
        if info.durable is not None and have > info.durable and current is not None and info.boot != current:
            # written before a machine crash: bytes past the last fsync may be zeros or old blocks
            logger.info("%s: resuming from the %d bytes fsynced before a restart", name, info.durable)
            with open(part, "r+b") as fh:
                fh.truncate(info.durable)
            return info.durable
        return have
    logger.info("%s: %d bytes on disk without a validator of %s; starting over", name, have, url)
    discard_part(part)
    progress("reset", name, 0)
    return 0


@dataclass
class _Tally:
    """Bytes received in one request, judged window by window by the minimum-speed rule.

    Only the body is judged, over whole windows, never bytes over the request's wall time (which
    includes connecting and the server's wait: at 1,024 B/s a 10-byte answer taking 10 ms would
    count as a trickle).
    """

    received: int = 0
    window_start: float = 0.0
    window_bytes: int = 0
    slow: bool = False  # the open window was judged below the minimum speed

    def start_window(self, now: float) -> None:
        self.window_start, self.window_bytes = now, 0

    def slow_speed(self, config: HttpConfig, now: float) -> float | None:
        """The open window's speed when it lasted a whole ``speed_window`` below ``min_speed``;
        else ``None`` (a whole window that passed opens the next)."""
        elapsed = now - self.window_start
        if config.min_speed <= 0 or elapsed < config.speed_window:
            return None
        speed = self.window_bytes / elapsed
        if speed >= config.min_speed:
            self.start_window(now)
            return None
        self.slow = True
        return speed

    def useful(self, config: HttpConfig) -> int:
        """The bytes received, less those of a window too slow (so a trickle does not reset the
        retry budget forever). A window ending in a stall is judged at the failure."""
        if not self.slow and self.received:
            self.slow_speed(config, config.clock())
        return self.received - self.window_bytes if self.slow else self.received


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
    tally = _Tally()
    # what a server (its redirect, its headers) or a URL can make requests refuse: not transient
    unusable = (requests.exceptions.InvalidURL, requests.exceptions.InvalidHeader, ValueError)
    try:
        return _get(session, url, part, have, name, expected_size, config, progress, tally)
    except _Transient as exc:
        exc.received = tally.useful(config)
        raise
    except unusable as exc:
        if isinstance(exc, RldsError):
            raise
        raise ServerResponseError(
            f"GET {url}: {describe_error(exc)}",
            hint="check the URL; if it is right, the server's answer (a redirect, a header) is broken",
        ) from None
    except errors as exc:
        if isinstance(exc, RldsError):
            raise
        if name_not_resolved(exc):
            # a name that does not resolve will not resolve a second later: offline, fail at once
            host = urllib.parse.urlsplit(url).hostname or url
            raise HostNotFoundError(
                f"GET {url}: cannot resolve the host name {host!r} ({describe_error(exc)})"
            ) from None
        raise _Transient(describe_error(exc), None, tally.useful(config)) from exc


def _get(
    session: Any,
    url: str,
    part: Path,
    have: int,
    name: str,
    expected_size: int | None,
    config: HttpConfig,
    progress: DownloadProgress,
    tally: _Tally,
) -> int | None:
    info = read_part_info(part) if have else None
    # identity: sizes and hashes are of the stored bytes, not of a gzip-decoded stream
    headers = {"Accept-Encoding": "identity"}
    if have and info is not None and info.validator:
        headers["Range"] = f"bytes={have}-"
        # the server sends the rest only if the file is still the version we have bytes of,
        # else the whole (new) file with 200
        headers["If-Range"] = info.validator
    with open_url(session, url, headers, config) as resp:
        status = resp.status_code
        if status == 416 and have:
            return _range_not_satisfiable(resp, part, have, info)
        if is_retryable_status(status):
            raise _Transient(
                f"HTTP {status} {resp.reason or ''}".strip(),
                parse_retry_after(resp.headers.get("Retry-After")),
            )
        if status >= 300:
            raise HTTPStatusError(
                f"GET {url} answered HTTP {status} {resp.reason or ''}".strip(), url=url, status=status
            )
        encoding = (resp.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity"):  # e.g. an object stored gzip-encoded: not the file's bytes
            raise ServerResponseError(
                f"GET {url} answered the file {name} {encoding}-encoded (Content-Encoding), though "
                "asked for its own bytes (identity); its size and sha256 would be of the encoding",
                hint="where no other mirror has the file, download it with a tool that decodes it "
                "(curl --compressed URL -o FILE), then 'rlds download FILE'",
            )
        limit: int | None = None
        new_info: PartInfo | None = None
        if status == 206:
            header = resp.headers.get("Content-Range", "")
            m = _CONTENT_RANGE.match(header)
            start, end = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
            total = None if not m or m.group(3) == "*" else int(m.group(3))
            same = info is None or (info.proves_same(resp) if have else info.matches(resp))
            changed = info is not None and (
                not same or (info.size is not None and total is not None and total != info.size)
            )
            if start != have or end < start or (total is not None and end >= total) or changed:
                if not have:
                    raise ServerResponseError(
                        f"GET {url} answered 206 with Content-Range {header!r} to a request for the "
                        "whole file; those bytes cannot be placed"
                    )
                # other bytes than asked, or bytes of another version: write none of them
                logger.info("GET %s: 206 with Content-Range %r for byte %d; starting over", url, header, have)
                discard_part(part)
                progress("reset", name, 0)
                return None
            limit = end - start + 1  # never write more than the range the server announced
            if total is None and info is not None:  # ``bytes N-M/*``: the size the file was announced at
                total = info.size
            if not have:  # a 206 for the whole file (some servers): a new .part all the same
                new_info = PartInfo.of(resp, url, total)
        else:  # 200: the whole file, from byte 0 (the file changed, or Range was ignored)
            if have:
                progress("reset", name, 0)
            have = 0
            length = resp.headers.get("Content-Length", "")
            total = int(length) if length.isdigit() else None
            new_info = PartInfo.of(resp, url, total)
        check_disk(part.parent, (total or expected_size or 0) - have, f"the download of {name}")
        progress("start", name, total or expected_size or 0)
        if have:
            logger.info("resuming %s at byte %d", url, have)
            progress("resume", name, have)
        record = new_info if new_info is not None else info
        _write_body(resp, part, have, limit, new_info, record, url, name, total, config, progress, tally)
        size = have + tally.received
        # a body shorter than announced (or than the registry's size) is a cut connection
        expected = total if total is not None else expected_size
        if expected is not None and size < expected:
            raise _Transient(f"connection closed after {size:,} of {expected:,} bytes")
        return size


def _write_body(
    resp: Any,
    part: Path,
    have: int,
    limit: int | None,
    new_info: PartInfo | None,
    record: PartInfo | None,
    url: str,
    name: str,
    total: int | None,
    config: HttpConfig,
    progress: DownloadProgress,
    tally: _Tally,
) -> None:
    """Append the body to ``part`` at ``have`` (a new file: record ``new_info`` first), applying
    the minimum-speed rule; a full disk keeps what was written, for a resume. ``record`` (the
    ``.part``'s record) is rewritten after each fsync of :data:`DURABLE_BYTES` with the bytes now
    durable."""
    part.parent.mkdir(parents=True, exist_ok=True)
    tally.start_window(config.clock())
    judge = not have and _labelled_page(resp, name)  # a body that may be a page, not the file
    chunks = _chunks(resp, HEAD_BYTES if judge else 0)
    if judge:
        first = next(chunks, b"")  # judged before the .part is touched: a resume's bytes stay
        if _starts_as_page(first):
            raise ServerResponseError(
                f"GET {url} answered a web page (text/html), not the file {name}: a login, error or "
                "network portal page"
            )
        chunks = itertools.chain([first], chunks)
    try:
        with open(part, "r+b" if have else "wb") as fh:
            fh.seek(have)
            fh.truncate()
            if new_info is not None:
                # after the truncation, before any byte: the .part never holds bytes of another
                # version than its record names
                write_part_info(part, new_info)
            durable = record if record is not None and record.durable is not None else None
            if durable is not None and (durable.boot != boot_id() or durable.durable != have):
                mark_durable(fh, part, durable, have)  # a resume: what it starts from, on disk first
            for chunk in chunks:
                if limit is not None:
                    chunk = chunk[: limit - tally.received]
                fh.write(chunk)
                tally.received += len(chunk)
                if durable is not None and have + tally.received - (durable.durable or 0) >= DURABLE_BYTES:
                    mark_durable(fh, part, durable, have + tally.received)
                tally.window_bytes += len(chunk)
                progress("advance", name, len(chunk))
                now = config.clock()
                window = now - tally.window_start
                speed = tally.slow_speed(config, now)
                if speed is not None:
                    raise _Transient(
                        f"too slow: {speed:,.0f} B/s over {window:.1f} s "
                        f"(minimum {config.min_speed:,.0f} B/s, RLDS_HTTP_MIN_SPEED)",
                        too_slow=True,
                    )
                if limit is not None and tally.received >= limit:
                    break
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        written = part.stat().st_size if part.is_file() else have
        needed = f"{total - written:,} more bytes are needed" if total is not None else "its size is unknown"
        info = read_part_info(part)
        if info is not None and info.validator:
            kept = "the partial file is kept: the same command resumes once there is space"
        else:  # nothing could prove it unchanged at a resume: give the space back now
            discard_part(part)
            kept = "the partial file was deleted: the server sends no validator to resume it safely"
        raise DiskFullError(
            f"the disk is full: {name} from {url} stopped at {written:,} bytes in {part}; {needed} ({kept})"
        ) from None


def _labelled_page(resp: Any, name: str) -> bool:
    """Whether the answer for the file ``name`` (not named ``.html``/``.htm``) says it is an HTML
    page (``Content-Type: text/html``: a login, error or captive-portal page served with 200).
    Its body must start as one too (:func:`_starts_as_page`): some servers label binary files
    ``text/html``."""
    if name.lower().endswith((".html", ".htm")):
        return False
    return str(resp.headers.get("Content-Type", "")).lower().startswith("text/html")


def _starts_as_page(first: bytes) -> bool:
    """Whether a body's first bytes are an HTML page's."""
    start = first.lstrip(b"\xef\xbb\xbf \t\r\n")[:15].lower()
    return start.startswith((b"<!doctype html", b"<html"))


#: Bytes the first chunk of a body labelled text/html holds at least: enough to tell a page.
HEAD_BYTES = 64


def _chunks(resp: Any, head: int = 0) -> Iterator[bytes]:
    """The body as it arrives, undecoded, its first chunk at least ``head`` bytes long (to judge
    it); ``read1`` (unlike ``iter_content``) loses no byte of a partial chunk when the connection
    is cut (a head cut short is not written: the resumed request asks for it again)."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 < 2
        arriving: Iterator[bytes] = resp.iter_content(CHUNK)
    else:
        arriving = iter(lambda: read1(CHUNK), b"")
    first = b""
    for chunk in arriving:
        if len(first) >= head:
            yield chunk
            continue
        first += chunk
        if len(first) >= head:
            yield first
    if 0 < len(first) < head:  # the whole body is shorter
        yield first


def _range_not_satisfiable(resp: Any, part: Path, have: int, info: PartInfo | None) -> int | None:
    """416 to ``Range: bytes=have-``: complete if the file is exactly ``have`` long (and still
    the version we have: its ETag, else the size its first answer announced), else restart."""
    m = _UNSATISFIED_RANGE.match(resp.headers.get("Content-Range", ""))
    total = int(m.group(1)) if m else (info.size if info else None)
    announced = info.size if info is not None else None
    # the version is the same one where the 416 carries the recorded ETag (the first answer's
    # length may have been a lie); without it, the length announced first must agree
    same = (
        info is not None and info.etag is not None and (resp.headers.get("ETag") or "").strip() == info.etag
    )
    if total == have and (announced in (None, have) or same) and (info is None or info.matches(resp)):
        return have
    discard_part(part)
    return None


def name_not_resolved(exc: BaseException) -> bool:
    """Whether a requests/urllib3 error comes from a failed DNS lookup (``socket.gaierror``,
    which urllib3 wraps as ``NameResolutionError`` inside ``MaxRetryError``)."""
    import socket

    import urllib3

    kinds: tuple[type[BaseException], ...] = (socket.gaierror,)
    if hasattr(urllib3.exceptions, "NameResolutionError"):
        kinds += (urllib3.exceptions.NameResolutionError,)
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kinds):
            return True
        stack.extend([e.__cause__, e.__context__, getattr(e, "reason", None), *e.args])
    return False


def describe_error(exc: BaseException) -> str:
    """A short reason: the cause urllib3 nests in its pool/URL preamble ("[Errno 111] Connection
    refused", "Read timed out"), at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text) or re.search(
        r"(Read timed out|Connection broken)", text
    )
    return f"{type(exc).__name__}: {m.group(1) if m else text}"[:300]


#: Retry-After values above this are treated as this (a misbehaving server must not park us).
MAX_RETRY_AFTER = 300.0


MAX_BACKOFF = 60.0


def backoff_delay(attempt: int, base: float, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...).

    Exponential back-off with jitter: between half and all of ``base * 2**(attempt-1)`` (capped at
    :data:`MAX_BACKOFF`), so clients that failed together do not retry together. A server's
    ``Retry-After`` (capped at :data:`MAX_RETRY_AFTER`) is a lower bound.
    """
    delay = min(MAX_BACKOFF, base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return delay


#: Requests one download of one URL may make in one command (a server whose every answer ends
#: early with a few new bytes would otherwise reset the stall budget forever). What arrived is
#: kept for the next command to resume.
MAX_REQUESTS = 64


#: Every this many requests, the back-off's floor doubles (also while progress is made).
_SLOWER_EVERY = 16


@dataclass
class RetryBudget:
    """The retry policy of rlds' HTTP calls: ``retries`` more tries after a failure without
    progress, at most ``max_requests`` requests in all, :func:`backoff_delay` between them.

    Attributes:
        requests: Requests made so far (the first one included).
        best: The furthest byte any try reached (progress is only a new furthest byte: a server
            resending the same beginning makes none).
    """

    retries: int
    base_delay: float
    failures: int = 0
    max_requests: int = MAX_REQUESTS
    requests: int = 1
    best: int = 0

    def next_delay(
        self, retry_after: float | None = None, *, progressed: bool = False, reached: int | None = None
    ) -> float | None:
        """Count a failed try; the seconds to wait before the next, or ``None`` when none is left.

        A try that ``progressed`` (to a byte beyond :attr:`best`, when ``reached`` is given)
        resets the failure count: ``retries`` is a budget per stall."""
        if reached is not None:
            progressed = progressed and reached > self.best
            self.best = max(self.best, reached)
        self.failures = 1 if progressed else self.failures + 1
        if self.failures > self.retries or self.out_of_requests:
            return None
        self.requests += 1
        attempt = max(self.failures, 1 + (self.requests - 1) // _SLOWER_EVERY)
        return backoff_delay(attempt, self.base_delay, retry_after)

    @property
    def out_of_requests(self) -> bool:
        """Whether the request cap, rather than a stall, ends the operation."""
        return self.requests >= self.max_requests

    def give_up(self, what: str, last: object) -> str:
        """The error message once :meth:`next_delay` returned ``None``."""
        if self.out_of_requests and self.failures <= self.retries:
            return (
                f"{what}: gave up after {self.requests} requests, each answer ending before the "
                f"end it announced (last error: {last}); a server keeps sending less than it says"
            )
        times = "once" if self.failures == 1 else f"{self.failures} times in a row"
        return f"{what} failed {times}; last error: {last}"


def size_of(part: Path) -> int:
    """How far a partial download reached (0 when there is none)."""
    return part.stat().st_size if part.is_file() else 0


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds from now."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def is_retryable_status(status: int) -> bool:
    """429 and 5xx are worth retrying; other 4xx are not."""
    return status == 429 or 500 <= status < 600
