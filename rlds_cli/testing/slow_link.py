"""A slow link to a local object store, for tests and benchmarks: latency and a bandwidth cap.

An HTTP/1.1 reverse proxy on 127.0.0.1 in front of any HTTP server (a moto S3 server in the remote
benchmark). moto answers in ~1 ms, a real store in tens of ms to the first byte over a link of
finite bandwidth; :class:`Link` adds those costs:

* **latency**: each request waits ``latency`` seconds (or a uniform draw from ``(low, high)``)
  before it is forwarded;
* **bandwidth**: all response bodies together go out at most ``bandwidth`` bytes a second (one
  pace shared by every connection; no burst credit saved while idle), in 64 KiB blocks;
* **counters**: requests and body bytes both ways, from :meth:`Link.stats` or, in another
  process, ``GET /__link__/stats`` (JSON; ``__link__`` is no valid bucket name).

Request bodies are streamed to the store unshaped; an unreachable store gives ``502`` with the
reason. Run as its own process (its threads then share no GIL with what is measured)::

    python -m rlds_cli.testing.slow_link --moto --latency-ms 20,50 --bandwidth-mbs 100

It prints one JSON line ``{"store": URL, "link": URL}`` and serves until killed or its stdin
closes. ``--moto`` starts a moto S3 server behind the link whose ranged reads read only the range
(:func:`_read_ranges_only`); else ``--upstream URL``. Imports neither pytest nor moto (moto only
with ``--moto``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

#: Bytes a response body is sent in (each block paced on its own).
BLOCK = 64 << 10
#: The path of the counters (``__link__`` cannot be an S3 bucket's name).
STATS_PATH = "/__link__/stats"
#: Headers that belong to one hop of a connection, never forwarded (RFC 9110 7.6.1).
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)


class _Pace:
    """One shared bandwidth: :meth:`take` blocks until ``n`` more bytes fit the cap."""

    def __init__(self, bandwidth: float | None) -> None:
        self.rate = bandwidth
        self._free_at = 0.0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            # the link's next free moment: never in the past, so idle time is no saved credit
            self._free_at = max(now, self._free_at) + n / self.rate
            wait = self._free_at - now
        time.sleep(wait)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore a client that hangs up mid-request (only its connection ends; nothing printed)."""


class Link:
    """A shaping proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``).

    Args:
        upstream: The server requests are forwarded to (plain HTTP).
        latency: Seconds each request waits before it is forwarded: one value, or ``(low,
            high)`` for a uniform draw per request (seeded by ``seed``).
        bandwidth: Bytes a second all response bodies share (``None``: no cap).
        port: The port to listen on (0: any free one).

    Raises:
        ValueError: A negative latency, ``low > high``, or a bandwidth that is not positive.

    Use it as a context manager (or :meth:`start` and :meth:`close`); :attr:`url` is its address.
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency: float | tuple[float, float] = 0.0,
        bandwidth: float | None = None,
        port: int = 0,
        seed: int = 0,
    ) -> None:
        low, high = latency if isinstance(latency, tuple) else (latency, latency)
        if low < 0 or high < low:
            raise ValueError(f"latency must be 0 <= low <= high seconds, got {latency!r}")
        if bandwidth is not None and bandwidth <= 0:
            raise ValueError(f"bandwidth must be a positive number of bytes a second, got {bandwidth!r}")
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http://host:port URL, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.latency = (float(low), float(high))
        self.pace = _Pace(bandwidth)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "bytes_out": 0, "bytes_in": 0}
        self._server = _Server(("127.0.0.1", port), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def stats(self) -> dict[str, int]:
        """``requests`` forwarded, body bytes sent to the client (``bytes_out``) and received
        from it (``bytes_in``), since the start."""
        with self._lock:
            return dict(self._counts)

    def start(self) -> Link:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="link")
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the listening socket (connections still open end with it)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Link:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- used by the handler

    def delay(self) -> float:
        low, high = self.latency
        with self._lock:
            return low if low == high else self._rng.uniform(low, high)

    def count(self, requests: int = 0, bytes_out: int = 0, bytes_in: int = 0) -> None:
        with self._lock:
            self._counts["requests"] += requests
            self._counts["bytes_out"] += bytes_out
            self._counts["bytes_in"] += bytes_in


class _Body:
    """A request body of known length, read from the client in blocks (never whole in memory)."""

    def __init__(self, stream: Any, length: int, link: Link) -> None:
        self.stream, self.left, self.link = stream, length, link

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.stream.read(n) if n else b""
        self.left -= len(data)
        self.link.count(bytes_in=len(data))
        return data


def _handler(link: Link) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients use it
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: Any) -> None:  # a library never prints
            pass

        def _stats(self) -> None:
            body = json.dumps(link.stats()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _fail(self, code: int, reason: str) -> None:
            body = reason.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self) -> None:
            if self.path == STATS_PATH and self.command == "GET":
                return self._stats()
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self.close_connection = True
                return self._fail(501, "the link forwards request bodies of a known Content-Length only")
            length = int(self.headers.get("Content-Length") or 0)
            time.sleep(link.delay())
            link.count(requests=1)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            body = _Body(self.rfile, length, link) if length else None
            try:
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(*link.upstream, timeout=60)
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                response = self.upstream.getresponse()
            except OSError as exc:
                if self.upstream is not None:
                    self.upstream.close()
                    self.upstream = None
                self.close_connection = True
                return self._fail(502, f"the store at {link.upstream[0]}:{link.upstream[1]} failed: {exc}")
            self._relay(response)

        def _relay(self, response: http.client.HTTPResponse) -> None:
            self.send_response_only(response.status, response.reason)
            sized = response.getheader("Content-Length") is not None
            for key, value in response.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            has_body = self.command != "HEAD" and response.status not in (204, 304)
            if has_body and not sized:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while has_body:
                block = response.read(BLOCK)
                if not block:
                    break
                link.pace.take(len(block))
                link.count(bytes_out=len(block))  # before sending: a client that has it sees it counted
                self.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n" if not sized else block)
            if has_body and not sized:
                self.wfile.write(b"0\r\n\r\n")
            response.read()  # a HEAD's or an empty reply's end, so the connection can be reused
            if response.will_close and self.upstream is not None:
                self.upstream.close()
                self.upstream = None

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


class _Window:
    """A moto object whose slices are read on demand, for moto's range handling (``len``, a
    slice) without reading the whole object."""

    def __init__(self, key: Any) -> None:
        self.key = key

    def __len__(self) -> int:
        return int(self.key.size)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, where: slice) -> bytes:
        begin, end, _ = where.indices(len(self))
        with self.key.lock:
            self.key._value_buffer.seek(begin)
            return bytes(self.key._value_buffer.read(max(0, end - begin)))


def _read_ranges_only() -> bool:
    """Make the moto server of this process read only the range a ranged GET asks for.

    moto 5 reads the whole object under its lock for a ``Range: bytes=a-b`` GET (a 22 KB read of a
    265 MB object: ~0.3 s, concurrent reads serialized). For a single ``bytes=a-b`` range
    (``a <= b``) moto is handed a :class:`_Window` that reads just those bytes. Returns whether it
    applied (False: moto's internals differ; moto is left unchanged).
    """
    import threading

    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    value, get_object = FakeKey.__dict__.get("value"), S3Response.__dict__.get("get_object")
    if not isinstance(value, property) or value.fget is None or get_object is None:
        return False
    local = threading.local()
    whole = value.fget

    def read(key: Any) -> Any:
        return (
            _Window(key) if getattr(local, "window", False) and hasattr(key, "_value_buffer") else whole(key)
        )

    def get(response: Any) -> Any:
        spec = str(response.headers.get("range") or "")
        begin, _, end = spec.removeprefix("bytes=").partition("-")
        local.window = (
            spec.startswith("bytes=")
            and begin.isdigit()
            and end.isdigit()
            and int(begin) <= int(end)
            and not response.querystring.get("partNumber")
        )
        try:
            return get_object(response)
        finally:
            local.window = False

    FakeKey.value = property(read, value.fset)  # type: ignore[method-assign,assignment]
    S3Response.get_object = get  # type: ignore[method-assign,assignment]
    return True


def moto_server() -> Any:
    """A started moto S3 server on 127.0.0.1 (any free port) with :func:`_read_ranges_only`
    applied; ``stop()`` it. Address: ``"http://{}:{}".format(*server.get_host_and_port())``."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    _read_ranges_only()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return server


def main(argv: list[str] | None = None) -> int:
    """Serve a link (and, with ``--moto``, its store) until killed or stdin closes."""
    p = argparse.ArgumentParser(
        prog="python -m rlds_cli.testing.slow_link", description=__doc__.split("\n")[0]
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--moto", action="store_true", help="start a moto S3 server behind the link")
    where.add_argument("--upstream", help="an http://host:port server to put behind the link")
    p.add_argument("--latency-ms", default="0", help="ms a request waits: N, or LOW,HIGH (uniform)")
    p.add_argument("--bandwidth-mbs", type=float, default=0.0, help="MB/s of responses (0: no cap)")
    args = p.parse_args(argv)
    try:
        ms = [float(v) for v in args.latency_ms.split(",")]
        if not 1 <= len(ms) <= 2:
            raise ValueError
    except ValueError:
        p.exit(
            1, f"{p.prog}: error: --latency-ms takes N or LOW,HIGH milliseconds, got {args.latency_ms!r}\n"
        )
    server = moto_server() if args.moto else None
    store = "http://{}:{}".format(*server.get_host_and_port()) if server else args.upstream
    try:
        link = Link(store, latency=(ms[0] / 1e3, ms[-1] / 1e3), bandwidth=args.bandwidth_mbs * 1e6 or None)
    except ValueError as exc:
        if server is not None:
            server.stop()
        p.exit(1, f"{p.prog}: error: {exc}\n")
    try:
        with link:
            sys.stdout.write(json.dumps({"store": store, "link": link.url}) + "\n")
            sys.stdout.flush()
            sys.stdin.read()  # until the parent closes our stdin (or kills us)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
