"""The slow link (:mod:`rlds_cli.testing.slow_link`) adds its latency to every request, caps the
bandwidth of what the store sends (shared by every connection), relays bodies and heads as they
are, and says when the store is gone; S3 works through it (moto). Lower bounds of time only: a
sleep never ends early, a loaded machine only makes a request slower."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

from rlds_cli.testing.slow_link import STATS_PATH, Link

BLOB = bytes(range(256)) * 4096  # 1 MiB, every position distinguishable


class _Store(BaseHTTPRequestHandler):
    """``/blob``: :data:`BLOB` with its length; ``/stream``: the same without one (the body ends
    when the connection closes, as HTTP/1.0 servers send); ``/put``: echoes the body's size."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BLOB)))
        self.end_headers()

    def do_GET(self) -> None:
        if self.path == "/stream":
            self.protocol_version = "HTTP/1.0"
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(BLOB)
            self.close_connection = True
            return
        self.do_HEAD()
        self.wfile.write(BLOB)

    def do_PUT(self) -> None:
        size = len(self.rfile.read(int(self.headers["Content-Length"])))
        body = str(size).encode()
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def store() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://{}:{}".format(*server.server_address[:2])
    server.shutdown()
    server.server_close()


def request(
    url: str, method: str = "GET", path: str = "/blob", body: bytes | None = None
) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_every_request_waits_the_latency(store: str) -> None:
    with Link(store, latency=0.05) as link:
        parts = urlsplit(link.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)  # one kept-alive connection
        t = time.perf_counter()
        for _ in range(4):
            conn.request("HEAD", "/blob")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        elapsed = time.perf_counter() - t
        conn.close()
        assert elapsed >= 4 * 0.05
        assert link.stats() == {"requests": 4, "bytes_out": 0, "bytes_in": 0}


def test_a_latency_range_draws_within_it() -> None:
    link = Link("http://127.0.0.1:9", latency=(0.02, 0.05), seed=1)
    try:
        draws = [link.delay() for _ in range(200)]
    finally:
        link.close()
    assert 0.02 <= min(draws) < 0.025 and 0.045 < max(draws) <= 0.05


def test_the_bandwidth_is_capped_and_shared_by_every_connection(store: str) -> None:
    with Link(store, bandwidth=4e6) as link:
        t = time.perf_counter()
        status, body = request(link.url)
        one = time.perf_counter() - t
        assert (status, body) == (200, BLOB)  # every byte, in order
        assert one >= len(BLOB) / 4e6

        got: list[bytes] = []
        threads = [threading.Thread(target=lambda: got.append(request(link.url)[1])) for _ in range(2)]
        t = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        both = time.perf_counter() - t
        assert got == [BLOB, BLOB]
        assert both >= 2 * len(BLOB) / 4e6  # two connections share one link's cap
        assert link.stats()["bytes_out"] == 3 * len(BLOB)


def test_bodies_of_unknown_length_heads_and_uploads_are_relayed(store: str) -> None:
    with Link(store) as link:
        assert request(link.url, path="/stream") == (200, BLOB)  # re-sent chunked
        assert request(link.url, "HEAD") == (200, b"")
        assert request(link.url, "PUT", "/put", body=b"x" * 5000) == (201, b"5000")
        assert link.stats() == {"requests": 3, "bytes_out": len(BLOB) + 4, "bytes_in": 5000}
        status, body = request(link.url, path=STATS_PATH)  # the counters, for another process
        assert status == 200 and json.loads(body) == link.stats()


def test_a_store_that_is_gone_gets_502_naming_it() -> None:
    with Link("http://127.0.0.1:9") as link:  # port 9 (discard): nothing listens on loopback
        status, body = request(link.url)
    assert status == 502
    assert b"the store at 127.0.0.1:9 failed" in body


@pytest.mark.parametrize(
    ("upstream", "options", "message"),
    [
        ("http://127.0.0.1:9", {"latency": -0.1}, "latency must be"),
        ("http://127.0.0.1:9", {"latency": (0.05, 0.02)}, "latency must be"),
        ("http://127.0.0.1:9", {"bandwidth": 0}, "bandwidth must be"),
        ("s3://bucket", {}, "upstream must be an http://host:port URL"),
    ],
)
def test_bad_settings_are_refused(upstream: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Link(upstream, **options)


def test_s3_through_the_link_reads_exactly_the_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--moto``: a moto S3 server behind the link, in its own process, whose ranged GETs read
    only the range (moto's own would read the whole object first); every kind of range answers
    the bytes S3 would."""
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    botocore = pytest.importorskip("botocore.exceptions")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    cmd = [sys.executable, "-m", "rlds_cli.testing.slow_link", "--moto", "--latency-ms", "30"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        urls = json.loads(proc.stdout.readline())
        s3 = boto3.client("s3", endpoint_url=urls["store"])
        s3.create_bucket(Bucket="bench")
        s3.put_object(Bucket="bench", Key="k", Body=BLOB)
        slow = boto3.client("s3", endpoint_url=urls["link"])

        def get(spec: str) -> bytes:
            return slow.get_object(Bucket="bench", Key="k", Range=spec)["Body"].read()  # type: ignore[no-any-return]

        t = time.perf_counter()
        assert get("bytes=256-511") == BLOB[256:512]
        assert time.perf_counter() - t >= 0.03
        assert get("bytes=0-0") == BLOB[:1]
        assert get(f"bytes={len(BLOB) - 10}-{len(BLOB) + 99}") == BLOB[-10:]  # cut at the end
        assert get("bytes=1000-") == BLOB[1000:]  # open and suffix ranges: moto's own handling
        assert get("bytes=-100") == BLOB[-100:]
        assert slow.get_object(Bucket="bench", Key="k")["Body"].read() == BLOB
        with pytest.raises(botocore.ClientError, match="InvalidRange"):
            get(f"bytes={len(BLOB)}-{len(BLOB) + 5}")
        with urllib.request.urlopen(urls["link"] + STATS_PATH) as r:
            stats = json.loads(r.read())
        assert stats["bytes_out"] >= 256 + 1 + 10 + (len(BLOB) - 1000) + 100 + len(BLOB)
    finally:
        proc.kill()
        proc.wait()


def test_the_link_as_a_process(store: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlds_cli.testing.slow_link", "--upstream", store, "--latency-ms", "10,20"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        urls = json.loads(proc.stdout.readline())
        assert urls["store"] == store and urls["link"].startswith("http://127.0.0.1:")
        assert request(urls["link"]) == (200, BLOB)
        proc.stdin.close()  # the parent is done: the link ends
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_the_process_refuses_a_bad_latency_in_one_line() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlds_cli.testing.slow_link",
            "--upstream",
            "http://127.0.0.1:9",
            "--latency-ms",
            "a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "python -m rlds_cli.testing.slow_link: error: --latency-ms takes N or LOW,HIGH milliseconds, got 'a'"
    ]
