"""The guards of ``tests/conftest.py``: no ``RLDS_*`` setting leaks in from the shell, and the test
process cannot reach a host other than loopback (it fails at once, it does not time out)."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.conftest import NameLookupBlockedError, NetworkBlockedError, is_local_host

# TEST-NET addresses (RFC 5737 / RFC 3849): never routed, so a real connect would hang until timeout
FAR_V4 = "192.0.2.1"
FAR_V6 = "2001:db8::1"


def test_only_the_tests_own_rlds_variables_are_set() -> None:
    assert sorted(k for k in os.environ if k.startswith("RLDS_")) == ["RLDS_FSYNC", "RLDS_HOME"]


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
        ("LOCALHOST.", True), ("::ffff:127.0.0.1", True), ("0.0.0.0", True), ("", True), (None, True),
        (b"localhost", True), ("10.0.0.1", False), (FAR_V4, False), (FAR_V6, False),
        ("example.com", False), ("localhost.example.com", False), ("::ffff:8.8.8.8", False),
    ],
)  # fmt: skip
def test_what_counts_as_this_machine(host: object, local: bool) -> None:
    assert is_local_host(host) is local


def test_a_connection_to_another_host_fails_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(NetworkBlockedError) as info, socket.socket() as sock:
        sock.settimeout(30)
        sock.connect((FAR_V4, 80))
    assert info.value.errno == errno.ENETUNREACH and "blocks the network" in str(info.value)
    with socket.socket(socket.AF_INET6) as sock:
        with pytest.raises(NetworkBlockedError):
            sock.connect((FAR_V6, 80, 0, 0))
        assert sock.connect_ex((FAR_V6, 80, 0, 0)) == errno.ENETUNREACH
    with pytest.raises(NetworkBlockedError):
        socket.create_connection((FAR_V4, 80), timeout=30)
    with pytest.raises(NameLookupBlockedError, match=r"no lookup of 'example\.com'"):
        socket.create_connection(("example.com", 80), timeout=30)
    with pytest.raises(socket.gaierror):  # what code under test sees: a name that does not resolve
        socket.getaddrinfo("example.com", 443)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{FAR_V4}/x", timeout=30)
    assert time.monotonic() - started < 5


def test_loopback_still_works() -> None:
    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"hi")

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Hello) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            port = server.server_address[1]
            assert requests.get(f"http://127.0.0.1:{port}/", timeout=10).text == "hi"
            assert requests.get(f"http://localhost:{port}/", timeout=10).text == "hi"
        finally:
            server.shutdown()
    with socket.socket(socket.AF_UNIX) as sock:  # other families are not concerned
        assert sock.connect_ex("/nonexistent/socket") != errno.ENETUNREACH
