"""A real HTTP server on 127.0.0.1 for download tests, with faults to order.

Serves ``server.files[path] = bytes`` with Range support (the Hugging Face Hub's API is
:mod:`tests.hub_standin`'s). Each path has a queue of one-shot faults consumed by successive
requests, plus sticky settings (``throttle``, ``validators``, ``redirects``). Every request is
logged (with the ``Authorization`` header it carried), and so is how many body bytes each path
got out (``sent``), so a test can tell how far a download went without timing it.

Like a real static file server, each body carries validators derived from its bytes (a strong
``ETag`` by default; ``validators`` picks ``"last-modified"``, ``"weak-etag"`` or ``None``), and
``If-Range`` is honoured: a Range request whose validator no longer matches gets the whole file.
"""

from __future__ import annotations

import email.utils
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
#: The file the ``server`` fixture (tests/conftest.py) serves at :data:`PATH`: 300 KiB, every byte
#: position distinguishable.
DATA = bytes(range(256)) * 1200
PATH = "/files/data.bin"
#: How long a fault waits for its event: long enough for any loaded machine, short enough that
#: a test whose event never comes fails instead of hanging.
_WAIT_LIMIT = 60.0


#: A network portal's page (what ``page`` faults answer).
PORTAL_PAGE = b"<!DOCTYPE html><html><body>Please log in to the hotel Wi-Fi</body></html>\n"


@dataclass
class Fault:
    """What to do to one request.

    kind: ``status`` (answer ``code`` with ``headers``, after ``delay`` seconds, and once ``wait``
    is set when one is given: a test orders the answer after an event), ``cut`` (send
    ``after`` body bytes and close), ``ignore_range`` (answer 200 with the whole file), ``corrupt``
    (flip a byte),
    ``bad_length`` (announce ``extra`` bytes more than sent, then close), ``slow`` (wait
    ``delay`` seconds before the body), ``wrong_range`` (answer 206 for bytes starting ``shift``
    before the asked one, or at ``shift`` for a request without Range), ``ignore_if_range``
    (honour Range even when If-Range no longer matches: a buggy server), ``bare_206`` (the same,
    and the 206 carries no ETag or Last-Modified, against RFC 9110 15.3.7), ``pause`` (send
    ``after`` body bytes, then the rest once ``wait`` is set: the download is surely under way
    and surely unfinished until the test says so), ``headers`` (the usual answer with ``headers``
    added, e.g. a ``Content-Encoding`` the client did not ask for), ``short_range`` (answer a
    Range request with its first ``after`` bytes only, announced as ``bytes N-M/*``: a total the
    server does not give), ``page`` (answer 200 with :data:`PORTAL_PAGE`, ``text/html``: a network
    portal).
    """

    kind: str
    code: int = 503
    headers: dict[str, str] = field(default_factory=dict)
    after: int = 0
    extra: int = 100
    delay: float = 0.0
    shift: int = 0
    wait: threading.Event | None = None


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    status: int
    if_range: str | None = None
    authorization: str | None = None


class FaultServer:
    """The server; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.sticky: dict[str, list[Fault]] = {}
        self.log: list[Logged] = []
        self.sent: dict[str, int] = {}  # path -> body bytes written to its sockets
        self.throttle: tuple[int, float] | None = None  # (chunk bytes, seconds per chunk)
        self.validators: str | None = "etag"  # "etag", "last-modified", "weak-etag" or None
        self.redirects: dict[str, str] = {}  # path -> Location, answered with 302
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        # a short poll interval: stop() (every test's teardown) waits up to one interval
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base + path

    def add_faults(self, path: str, *faults: Fault) -> None:
        with self._lock:
            self.faults.setdefault(path, []).extend(faults)

    def next_fault(self, path: str) -> Fault | None:
        with self._lock:
            queue = self.faults.get(path)
            if queue:
                return queue.pop(0)
            sticky = self.sticky.get(path)
            return sticky[0] if sticky else None

    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def validator_headers(self, body: bytes) -> dict[str, str]:
        """The ETag / Last-Modified a static server would send for ``body``."""
        digest = hashlib.sha256(body).hexdigest()
        if self.validators == "etag":
            return {"ETag": f'"{digest[:20]}"'}
        if self.validators == "weak-etag":
            return {"ETag": f'W/"{digest[:20]}"'}
        if self.validators == "last-modified":
            when = 1_600_000_000 + int(digest[:6], 16)  # differs with the bytes
            return {"Last-Modified": email.utils.formatdate(when, usegmt=True)}
        return {}

    def count_sent(self, path: str, nbytes: int) -> None:
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + nbytes

    def requests_for(self, path: str) -> list[Logged]:
        with self._lock:
            return [e for e in self.log if e.path == path]

    def start(self) -> FaultServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(server: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            rng = self.headers.get("Range")
            if path in server.redirects:
                return self._reply(path, rng, 302, b"", {"Location": server.redirects[path]})
            body = server.files.get(path)
            fault = server.next_fault(path)
            if fault and fault.kind == "status":
                time.sleep(fault.delay)
                if fault.wait is not None:
                    fault.wait.wait(_WAIT_LIMIT)  # unset by then: the test's own checks fail
                return self._reply(path, rng, fault.code, b"busy\n", fault.headers)
            if fault and fault.kind == "page":  # a network portal: its page, whatever was asked
                return self._reply(path, rng, 200, PORTAL_PAGE, {"Content-Type": "text/html"})
            if body is None:
                return self._reply(path, rng, 404, b"not found\n")
            validators = server.validator_headers(body)
            if fault and fault.kind == "corrupt":
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            start, status, headers = 0, 200, dict(validators)
            if fault and fault.kind == "headers":  # the body as usual, with extra headers
                headers.update(fault.headers)
            m = _RANGE.match(rng or "")
            if_range = self.headers.get("If-Range")
            # RFC 9110 13.1.5: a Range whose If-Range validator does not match (weak ETags never
            # match) is ignored, and the whole file is sent
            current = validators.get("ETag", "") if if_range and if_range.startswith(("W/", '"')) else None
            stale = if_range is not None and (
                (current is not None and (if_range != current or current.startswith("W/")))
                or (current is None and if_range != validators.get("Last-Modified"))
            )
            if stale and fault and fault.kind in ("ignore_if_range", "bare_206"):
                stale = False
            if fault and fault.kind == "wrong_range":
                start = max(0, int(m.group(1)) - fault.shift) if m else fault.shift
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            elif m and not stale and not (fault and fault.kind == "ignore_range"):
                start = int(m.group(1))
                if start >= len(body):
                    return self._reply(
                        path, rng, 416, b"", {"Content-Range": f"bytes */{len(body)}", **validators}
                    )
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
                if fault and fault.kind == "bare_206":
                    headers = {k: v for k, v in headers.items() if k not in ("ETag", "Last-Modified")}
                if fault and fault.kind == "short_range":
                    body = body[: start + fault.after]
                    headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/*"
            payload = body[start:]
            length = len(payload) + (fault.extra if fault and fault.kind == "bad_length" else 0)
            if fault and fault.kind == "cut":
                payload = payload[: fault.after]
            server.record(Logged("GET", path, rng, status, if_range, self.headers.get("Authorization")))
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(length), "Accept-Ranges": "bytes"}.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            if fault and fault.kind == "slow":
                time.sleep(fault.delay)
            if fault and fault.kind == "pause" and fault.wait is not None:
                self._send_body(path, payload[: fault.after])
                fault.wait.wait(_WAIT_LIMIT)
                payload = payload[fault.after :]
            self._send_body(path, payload)
            if fault and fault.kind in ("cut", "bad_length"):
                self.close_connection = True

        def _send_body(self, path: str, payload: bytes) -> None:
            throttle = server.throttle
            try:
                if throttle is None:
                    self.wfile.write(payload)
                    server.count_sent(path, len(payload))
                    return
                size, pause = throttle
                for i in range(0, len(payload), size):
                    self.wfile.write(payload[i : i + size])
                    self.wfile.flush()
                    server.count_sent(path, len(payload[i : i + size]))
                    time.sleep(pause)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _reply(
            self, path: str, rng: str | None, code: int, body: bytes, headers: dict[str, str] | None = None
        ) -> None:
            auth = self.headers.get("Authorization")
            server.record(Logged("GET", path, rng, code, self.headers.get("If-Range"), auth))
            self.send_response(code)
            for k, v in {**(headers or {}), "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return Handler


def bounded(operation: Callable[[], Any], seconds: float) -> Any:
    """Run ``operation`` in a daemon thread; its result, or its exception re-raised. A call still
    running after ``seconds`` (a hang, a deadlock) fails the test instead of stalling the suite."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = operation()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (a hang or a deadlock)"
    if "error" in box:
        raise box["error"]
    return box.get("result")


# ----------------------------------------------------------------------------- shared fixtures


@contextmanager
def serving(
    server: FaultServer,
    files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    *,
    registry: Callable[[str], str] | None = None,
    where: Path | None = None,
    retry_delay: str = "0.01",
) -> Iterator[FaultServer]:
    """``server`` (the ``server`` fixture) holding ``files`` too, with the downloader's retries
    fast and its timeouts short, the network allowed; with ``registry`` (the base URL -> a
    registry TOML), that registry file written into ``where`` and read instead of the packaged
    one until the block ends."""
    from rlds_cli.catalog import registry as registry_module

    server.files.update(files)
    monkeypatch.setenv("RLDS_RETRY_BASE_DELAY", retry_delay)
    monkeypatch.setenv("RLDS_HTTP_TIMEOUT", "5,5")
    monkeypatch.delenv("RLDS_OFFLINE", raising=False)
    if registry is not None:
        assert where is not None
        path = where / "registry-under-test.toml"
        path.write_text(registry(server.base))
        monkeypatch.setenv("RLDS_REGISTRY", str(path))
        registry_module._load.cache_clear()
    try:
        yield server
    finally:
        registry_module._load.cache_clear()
