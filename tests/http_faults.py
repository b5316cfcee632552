"""A real HTTP server on 127.0.0.1 for download tests, with faults to order.

Serves ``server.files[path] = bytes`` with Range support, and a fake Hugging Face tree API
(``server.trees[(repo, folder)] = [items]``). Each path has a queue of one-shot faults consumed
by successive requests, plus sticky settings (``throttle``). Every request is logged.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class Fault:
    """What to do to one request.

    kind: ``status`` (answer ``code`` with ``headers``), ``cut`` (send ``after`` body bytes and
    close), ``ignore_range`` (answer 200 with the whole file), ``corrupt`` (flip a byte),
    ``bad_length`` (announce ``extra`` bytes more than sent, then close), ``slow`` (wait
    ``delay`` seconds before the body).
    """

    kind: str
    code: int = 503
    headers: dict[str, str] = field(default_factory=dict)
    after: int = 0
    extra: int = 100
    delay: float = 0.0


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    status: int


class FaultServer:
    """The server; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.trees: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.sticky: dict[str, list[Fault]] = {}
        self.log: list[Logged] = []
        self.throttle: tuple[int, float] | None = None  # (chunk bytes, seconds per chunk)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

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
            if path.startswith("/api/datasets/"):
                return self._tree(path)
            body = server.files.get(path)
            fault = server.next_fault(path)
            rng = self.headers.get("Range")
            if fault and fault.kind == "status":
                return self._reply(path, rng, fault.code, b"busy\n", fault.headers)
            if body is None:
                return self._reply(path, rng, 404, b"not found\n")
            if fault and fault.kind == "corrupt":
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            start, status, headers = 0, 200, {}
            m = _RANGE.match(rng or "")
            if m and not (fault and fault.kind == "ignore_range"):
                start = int(m.group(1))
                if start >= len(body):
                    return self._reply(path, rng, 416, b"", {"Content-Range": f"bytes */{len(body)}"})
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            payload = body[start:]
            length = len(payload) + (fault.extra if fault and fault.kind == "bad_length" else 0)
            if fault and fault.kind == "cut":
                payload = payload[: fault.after]
            server.record(Logged("GET", path, rng, status))
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(length), "Accept-Ranges": "bytes"}.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            if fault and fault.kind == "slow":
                time.sleep(fault.delay)
            self._send_body(payload)
            if fault and fault.kind in ("cut", "bad_length"):
                self.close_connection = True

        def _send_body(self, payload: bytes) -> None:
            throttle = server.throttle
            try:
                if throttle is None:
                    self.wfile.write(payload)
                    return
                size, pause = throttle
                for i in range(0, len(payload), size):
                    self.wfile.write(payload[i : i + size])
                    self.wfile.flush()
                    time.sleep(pause)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _tree(self, path: str) -> None:
            fault = server.next_fault(path)
            if fault and fault.kind == "status":
                return self._reply(path, None, fault.code, b"busy\n", fault.headers)
            m = re.match(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)/(.*)", path)
            key = (m.group(1), _unquote(m.group(3))) if m else ("", "")
            items = server.trees.get(key)
            if items is None:
                return self._reply(path, None, 404, b'{"error": "not found"}')
            page = int(self.path.split("page=", 1)[1]) if "page=" in self.path else 0
            chunk = items[page * 2 : page * 2 + 2]  # two per page: exercises Link paging
            headers = {"Content-Type": "application/json"}
            if (page + 1) * 2 < len(items):
                headers["Link"] = f'<{server.base}{path}?recursive=true&page={page + 1}>; rel="next"'
            self._reply(path, None, 200, json.dumps(chunk).encode(), headers)

        def _reply(
            self, path: str, rng: str | None, code: int, body: bytes, headers: dict[str, str] | None = None
        ) -> None:
            server.record(Logged("GET", path, rng, code))
            self.send_response(code)
            for k, v in {**(headers or {}), "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)
