"""Ranged reads of a store's files by presigned URL, over a pool of plain HTTP connections.

fsspec's async object stores read a response in pieces on an event loop and join them: s3fs
over aiohttp spends ~3x the CPU of one urllib3 request per byte (300 MB in 4 MiB ranges, 8 at a
time, from moto on 127.0.0.1: 0.58-0.71 CPU-s against 0.19-0.20), CPU a learner's cores need for
decoding. Where the filesystem presigns a path (s3fs; gcsfs with a signing key) and the store
answers a ranged GET of that URL, :class:`SignedRanges` reads each range with one request of
its own, the body read into one buffer, requests in flight on a pool of threads. Any other
filesystem (the Hub, ``memory://``, a folder, a store that refuses the probe) keeps fsspec's
``cat_ranges``.

A URL is signed for :data:`SIGN_SECONDS` and signed again once most of that has passed, or when
the store answers 403 (an expired or revoked signature) once.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class _Unsigned(logging.Filter):
    """urllib3 logs each retry with its URL, whose query is a presigned URL's signature (and a
    session's token): the query is left out of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "?" in text:
            record.msg, record.args = re.sub(r"\?[^\s'\")]*", "?<signed>", text), ()
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_Unsigned())

#: Seconds a presigned URL is asked to stay valid (signed again after 90% of it).
SIGN_SECONDS = 3600
#: Requests in flight at once, per process.
WORKERS = 16
#: Seconds to connect, and to wait for the next bytes of a response (as botocore's defaults).
CONNECT_SECONDS = 60.0
READ_SECONDS = 60.0
#: A request refused (connection) or answered 500-504 is tried again this many times, after
#: ``RETRY_BACKOFF * 2**n`` seconds.
RETRIES = 3
RETRY_BACKOFF = 0.2


class SignedRanges:
    """Ranged GETs of ``fs``'s files by presigned URL (see the module). Safe from several
    threads; a forked child makes its own connections and threads."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._signed: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._pid = -1
        self._http: Any = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def probe(cls, fs: Any, path: str) -> SignedRanges | None:
        """The signed reader of ``fs``'s files, or ``None`` where ``fs`` cannot presign ``path``,
        signs a URL that is not HTTP, or the store does not answer a one-byte ranged GET of it
        with those bytes (or "range not satisfiable", for an empty file)."""
        reader = cls(fs)
        try:
            url = reader._url(path)
            if not url.startswith(("http://", "https://")):
                return None
            response = reader._clients()[0].request(
                "GET", url, headers={"Range": "bytes=0-0"}, preload_content=False, decode_content=False
            )
            try:
                ok = response.status == 416 or (response.status == 206 and len(response.read()) == 1)
            finally:
                response.release_conn()
        except Exception:  # no signing (NotImplementedError, no key), unreachable: fsspec's way
            return None
        return reader if ok else None

    def cat_ranges(
        self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> list[bytes | BaseException]:
        """Bytes ``[start, end)`` of each path, as fsspec's ``cat_ranges(..., on_error="return")``:
        a failed range is the exception in its place (``FileNotFoundError`` for a missing file,
        ``PermissionError`` for access denied, ``ConnectionError`` for an unreachable store)."""
        http, pool = self._clients()

        def one(k: int) -> bytes | BaseException:
            try:
                return self._get(http, paths[k], int(starts[k]), int(ends[k]))
            except Exception as exc:
                return exc

        if len(paths) == 1:
            return [one(0)]
        return list(pool.map(one, range(len(paths))))

    def _get(self, http: Any, path: str, start: int, end: int) -> bytes:
        import urllib3

        if end <= start:
            return b""
        for attempt in range(2):
            try:
                response = http.request(
                    "GET",
                    self._url(path, fresh=attempt > 0),
                    headers={"Range": f"bytes={start}-{end - 1}"},
                    decode_content=False,
                )
            except urllib3.exceptions.HTTPError as exc:  # retries spent: connection refused, timed out
                # never urllib3's text: it quotes the URL, whose query is the signature
                cause = getattr(exc, "reason", None) or exc
                raise ConnectionError(f"{path}: {type(cause).__name__} (retried {RETRIES} times)") from None
            if attempt == 0 and _expired(response):  # an expired signature: sign again, once
                continue
            break
        if response.status == 206:
            return bytes(response.data)
        if response.status == 200:
            raise OSError(
                f"{path}: the store ignored the byte range asked (HTTP 200 for bytes {start}-{end - 1})"
            )
        if response.status == 404:
            raise FileNotFoundError(f"{path}: not found (HTTP 404)")
        if response.status == 403:
            raise PermissionError(f"{path}: access denied (HTTP 403)")
        if response.status == 416:  # past the end: the caller reports the file shorter than pushed
            return b""
        raise OSError(f"{path}: HTTP {response.status} for bytes {start}-{end - 1}")

    def _url(self, path: str, fresh: bool = False) -> str:
        now = time.monotonic()
        with self._lock:
            signed = self._signed.get(path)
        if fresh or signed is None or signed[1] < now:
            signed = (str(self._fs.sign(path, expiration=SIGN_SECONDS)), now + 0.9 * SIGN_SECONDS)
            with self._lock:
                self._signed[path] = signed
        return signed[0]

    def _clients(self) -> tuple[Any, ThreadPoolExecutor]:
        if self._pid != os.getpid():  # a forked child: a lock, connections and threads of its own
            self._lock, self._pool = threading.Lock(), None
        with self._lock:
            if self._pool is None:
                import urllib3

                retries = urllib3.Retry(
                    total=RETRIES,
                    backoff_factor=RETRY_BACKOFF,
                    status_forcelist=(500, 502, 503, 504),
                    raise_on_status=False,
                )
                timeout = urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS)
                self._http = urllib3.PoolManager(maxsize=WORKERS, retries=retries, timeout=timeout)
                self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="rlds-fetch")
                self._pid = os.getpid()
            return self._http, self._pool


def _expired(response: Any) -> bool:
    """Whether the store refused a request for its signature's age (S3: 403, or 400
    ``ExpiredToken`` once the credentials' session ended; GCS: 400): sign again."""
    if response.status == 403:
        return True
    return response.status == 400 and b"xpired" in bytes(response.data or b"")[:4096]
