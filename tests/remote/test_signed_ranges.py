"""Ranged reads by presigned URL (``rlds_cli.remote.files``): used for S3 (moto), never
for a filesystem that cannot sign, and every answer of a store mapped: a range, a missing file,
access denied (after signing again once), a server error (after retries), a store that ignores
the range, one that cannot be reached. A local HTTP server on 127.0.0.1 plays the store."""

from __future__ import annotations

import multiprocessing
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from rlds_cli.errors import CorruptDatasetError
from rlds_cli.loader.opening import open_dataset
from rlds_cli.remote import files as signed_ranges
from rlds_cli.remote.files import SignedRanges
from rlds_cli.remote.push import push
from tests.remote.test_remote import moto_endpoint, s3  # noqa: F401  (fixtures)
from tests.remote.test_remote_read import URL, build, read_everything

DATA = bytes(range(256)) * 64  # 16 KiB


class _Store(BaseHTTPRequestHandler):
    """``/ok``: DATA by range; ``/gone``: 404; ``/denied``: 403; ``/stale``: 403 unless signed
    twice (``?sig=2``); ``/broken``: 500; ``/whole``: 200 with all of DATA, range or not."""

    hits: ClassVar[dict[str, int]] = {}

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        _Store.hits[path] = _Store.hits.get(path, 0) + 1
        status, body = 200, DATA
        if path == "/gone":
            status, body = 404, b"no such key"
        elif path == "/denied" or (path == "/stale" and query != "sig=2"):
            status, body = 403, b"signature expired"
        elif path == "/session" and query != "sig=2":  # S3 once a session's credentials ended
            status, body = 400, b"<Error><Code>ExpiredToken</Code></Error>"
        elif path == "/broken":
            status, body = 500, b"internal error"
        elif path in ("/ok", "/stale", "/session"):
            first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers["Range"]).groups())
            if first >= len(DATA):
                status, body = 416, b""
            else:
                status, body = 206, DATA[first : last + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Store.hits = {}
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def _memory_store_cleared() -> Iterator[None]:
    """fsspec's memory:// store lives as long as the process: left clean for the next test."""
    from fsspec.implementations.memory import MemoryFileSystem

    yield
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


class _Signer:
    """A filesystem that signs ``path`` as ``base + path``, counting its signatures."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.signed: dict[str, int] = {}

    def sign(self, path: str, expiration: int = 100) -> str:
        self.signed[path] = self.signed.get(path, 0) + 1
        return f"{self.base}{path}?sig={self.signed[path]}"


def test_each_answer_of_the_store_is_mapped(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signed_ranges, "READ_SECONDS", 5.0)
    monkeypatch.setattr(signed_ranges, "RETRY_BACKOFF", 0.0)
    fs = _Signer(server)
    reader = SignedRanges.probe(fs, "/ok")
    assert reader is not None
    got = reader.cat_ranges(["/ok", "/ok", "/ok", "/ok"], [0, 100, 16000, 16384], [10, 4196, 16384, 16400])
    assert got == [DATA[:10], DATA[100:4196], DATA[16000:], b""]  # past the end: nothing
    assert fs.signed["/ok"] == 1  # one signature, reused while valid
    gone, denied, stale = reader.cat_ranges(["/gone", "/denied", "/stale"], [0, 0, 5], [8, 8, 9])
    assert isinstance(gone, FileNotFoundError)
    assert isinstance(denied, PermissionError) and fs.signed["/denied"] == 2  # signed again once
    assert stale == DATA[5:9] and fs.signed["/stale"] == 2
    (session,) = reader.cat_ranges(["/session"], [5], [9])
    assert session == DATA[5:9] and fs.signed["/session"] == 2
    (broken,) = reader.cat_ranges(["/broken"], [0], [8])
    assert isinstance(broken, OSError) and "HTTP 500" in str(broken)
    assert _Store.hits["/broken"] == 1 + signed_ranges.RETRIES  # retried, then reported
    (whole,) = reader.cat_ranges(["/whole"], [0], [8])
    assert isinstance(whole, OSError) and "HTTP 200" in str(whole)  # never the whole object


def test_stores_that_cannot_take_signed_ranges_keep_fsspec(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(signed_ranges, "RETRY_BACKOFF", 0.0)

    class NoSigning:
        def sign(self, path: str, expiration: int = 100) -> str:
            raise NotImplementedError

    assert SignedRanges.probe(NoSigning(), "/ok") is None
    assert SignedRanges.probe(_Signer("file://"), "/ok") is None  # not HTTP
    assert SignedRanges.probe(_Signer(server), "/whole") is None  # ignores the range
    assert SignedRanges.probe(_Signer(server), "/denied") is None
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert SignedRanges.probe(_Signer(closed), "/ok") is None
    reader = SignedRanges(_Signer(closed))
    (unreachable,) = reader.cat_ranges(["/ok"], [0], [8])
    assert isinstance(unreachable, ConnectionError)
    assert "sig=" not in str(unreachable)  # never the signed URL (its query is the signature)


def _read_all_in_child(z: Any, out: Any) -> None:
    try:
        out.put(len(z.gather(np.arange(z.num_steps), ["state", "pixels", "next/reward"])["state"]))
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.usefixtures("_memory_store_cleared")
def test_s3_is_read_by_signed_ranges_and_memory_by_fsspec(
    s3: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    build("m", "memmap", (130, 10, 290))
    build("z", "zarr", (130, 10, 290))
    local = open_dataset("m")
    url = f"s3://{s3.bucket}/rlds/z"
    push("z", url)
    for options in ({}, {"cache": tmp_path / "c", "cache_limit": 1 << 22}):
        z = open_dataset(url, **options)
        read_everything(local, z)
        assert isinstance(z._files._signed, SignedRanges), options
    push("z", URL)
    z = open_dataset(URL)
    read_everything(local, z)
    assert z._files._signed is False  # memory:// cannot sign
    # a child forked after the parent read signs with a filesystem of its own (the parent's
    # s3fs is not fork-safe: every file the parent had not signed failed to read)
    z = open_dataset(url)
    z.gather(np.arange(3), ["action"])  # the child reads files the parent never signed
    got = _in_forked_child(_read_all_in_child, z)
    assert got == local.num_steps, got
    # a file gone from the store after the open is named, through the signed reads too
    z = open_dataset(url)
    s3.rm(f"{s3.bucket}/rlds/z/arrays/action", recursive=True)
    with pytest.raises(CorruptDatasetError, match="missing, though"):
        np.asarray(z.column("action")[np.arange(z.num_steps)])


def _in_forked_child(target: Any, *args: Any) -> Any:
    """``target(*args, out)`` run in a forked child; what it put on ``out``."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, out))
    child.start()
    got = out.get(timeout=120)
    child.join(60)
    return got


def _at_once(fn: Any, threads: int = 4) -> None:
    """``fn()`` on ``threads`` threads released together."""
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        fn()

    started = [threading.Thread(target=run) for _ in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()


def _clients_from_threads(reader: SignedRanges, out: Any) -> None:
    """In a forked child: threads take the reader's clients at once; how many pools they got."""
    pools: list[int] = []
    _at_once(lambda: pools.append(id(reader._clients()[1])))
    out.put(len(set(pools)))


def test_threads_of_a_forked_child_build_one_set_of_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads of a fresh child each replaced the lock the others held and built a pool of their own
    (all but one leaked): the first now rebuilds, the others wait for it."""
    import urllib3

    reader = SignedRanges(object())
    reader._clients()  # the parent's
    built = urllib3.PoolManager

    def slow(*args: Any, **kwargs: Any) -> Any:  # widens the window the threads met in
        time.sleep(0.2)
        return built(*args, **kwargs)

    monkeypatch.setattr(urllib3, "PoolManager", slow)
    assert _in_forked_child(_clients_from_threads, reader) == 1


def _reopen_from_threads(files: Any, opened: list[int], out: Any) -> None:
    """In a forked child: threads take the files' filesystem at once; how often it was opened."""
    _at_once(lambda: files.fs)
    out.put(len(opened))


def test_threads_of_a_forked_child_reopen_the_store_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlds_cli.remote import store

    build("z", "zarr")
    push("z", URL)
    files = open_dataset(URL)._files
    assert files.fs is not None  # the parent's
    opened: list[int] = []
    real = store.open_url

    def slow(*args: Any, **kwargs: Any) -> Any:  # widens the window the threads met in
        opened.append(1)
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "open_url", slow)
    assert _in_forked_child(_reopen_from_threads, files, opened) == 1
