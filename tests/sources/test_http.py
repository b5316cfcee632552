"""The HTTP layer (rlds_cli.net) against a real local server that misbehaves on request."""

from __future__ import annotations

import gzip
import hashlib
import threading
from pathlib import Path

import pytest

from rlds_cli.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadFailedError,
    HTTPStatusError,
    OfflineError,
    ServerResponseError,
)
from rlds_cli.net.fetch import RemoteFile, fetch_files
from rlds_cli.net.http import HttpConfig, OriginAuth, backoff_delay, origin_of, parse_retry_after
from rlds_cli.net.layout import HashStore, PartInfo, boot_id, part_path, read_part_info, write_part_info
from tests.http_faults import DATA, PATH, Fault, FaultServer

SHA = hashlib.sha256(DATA).hexdigest()  # DATA at PATH: what the server fixture serves


def remote(server: FaultServer, **kw: object) -> RemoteFile:
    return RemoteFile("data.bin", (server.url(PATH),), **kw)  # type: ignore[arg-type]


def write_part(server: FaultServer, folder: Path, data: bytes, validator: bool = True) -> Path:
    """A .part of data.bin as an interrupted download leaves it (with the server's ETag)."""
    part = part_path(folder, "data.bin")
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data)
    if validator:
        etag = server.validator_headers(server.files[PATH])["ETag"]
        write_part_info(part, PartInfo(server.url(PATH), etag, None, len(server.files[PATH])))
    return part


def fetch(server: FaultServer, folder: Path, config: HttpConfig, **kw: object):  # type: ignore[no-untyped-def]
    events: list[tuple[str, str, int]] = []
    spec = kw.pop("spec", None) or remote(server)
    (result,) = fetch_files([spec], folder, config=config, progress=lambda *e: events.append(e), **kw)  # type: ignore[arg-type]
    return result, events


def test_plain_download_records_hash_then_reuses(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    result, events = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == DATA
    assert (result.sha256, result.size, result.action, result.hash_origin) == (
        SHA,
        len(DATA),
        "downloaded",
        "recorded",
    )
    assert ("done", "data.bin", len(DATA)) in events
    assert sum(v for e, _, v in events if e == "advance") == len(DATA)
    record = HashStore(tmp_path).get("data.bin")
    assert record is not None and (record.sha256, record.origin) == (SHA, "recorded")
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and "part" in p.name]
    again, events = fetch(server, tmp_path, config)
    assert again.action == "cached" and again.sha256 == SHA
    assert len(server.requests_for(PATH)) == 1  # no second request
    assert ("verify", "data.bin", len(DATA)) not in events  # unchanged since verified: not re-hashed


def test_cut_connection_resumes_with_range(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    server.add_faults(PATH, Fault("cut", after=100_000), Fault("cut", after=50_000))
    result, events = fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    assert result.path.read_bytes() == DATA
    ranges = [r.range for r in server.requests_for(PATH)]
    assert len(ranges) == 3 and ranges[0] is None
    # resumed from what reached the disk (whole chunks: a partly read chunk is lost)
    resumed = [v for e, _, v in events if e == "resume"]
    assert ranges[1:] == [f"bytes={v}-" for v in resumed]
    assert 0 < resumed[0] <= 100_000 and resumed[0] < resumed[1] <= resumed[0] + 50_000


def test_a_part_written_before_a_machine_crash_resumes_from_its_fsynced_bytes(
    server: FaultServer, tmp_path: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine crash leaves a .part's unsynced tail as zeros or old blocks at full length: a
    resume appended after them, and without a registry sha256 the damage was the file. A .part of
    another boot resumes from the bytes its record says were fsynced; one of this boot, whole."""
    from rlds_cli.net import http

    monkeypatch.setattr(http, "DURABLE_BYTES", 30_000)
    monkeypatch.setenv("RLDS_FSYNC", "1")
    server.add_faults(PATH, Fault("cut", after=100_000))
    with pytest.raises(DownloadFailedError):
        fetch(server, tmp_path, HttpConfig(retries=0, sleep=lambda s: None))
    part = part_path(tmp_path, "data.bin")
    info = read_part_info(part)
    assert info is not None and info.boot == boot_id()
    durable = info.durable or 0
    assert 60_000 <= durable <= part.stat().st_size
    # the machine crashed: the tail past the last fsync reads as zeros, and this is another boot
    part.write_bytes(DATA[:durable] + bytes(40_000))
    write_part_info(part, PartInfo(info.url, info.etag, None, info.size, "an-earlier-boot", durable))
    result, _ = fetch(server, tmp_path, config)  # no sha256 to catch a splice
    assert result.path.read_bytes() == DATA
    assert server.requests_for(PATH)[-1].range == f"bytes={durable}-"

    # the same boot (a killed process): the whole .part is the page cache's, resumed whole
    other = tmp_path / "again"
    part = write_part(server, other, DATA[:70_000])
    record = read_part_info(part)
    assert record is not None
    write_part_info(part, PartInfo(record.url, record.etag, None, record.size, boot_id(), 30_000))
    assert fetch(server, other, config)[0].path.read_bytes() == DATA
    assert server.requests_for(PATH)[-1].range == "bytes=70000-"


def test_503_then_success(
    server: FaultServer, tmp_path: Path, config: HttpConfig, sleeps: list[float]
) -> None:
    server.add_faults(PATH, *[Fault("status", code=503)] * 3)
    result, events = fetch(server, tmp_path, config)
    assert result.sha256 == SHA
    assert [s.status for s in server.requests_for(PATH)] == [503, 503, 503, 200]
    assert [v for e, _, v in events if e == "retry"] == [1, 2, 3]
    assert len(sleeps) == 3 and sleeps[0] <= 0.01 and sleeps[2] <= 0.04  # exponential, jittered


def test_429_honours_retry_after(
    server: FaultServer, tmp_path: Path, config: HttpConfig, sleeps: list[float]
) -> None:
    server.add_faults(PATH, Fault("status", code=429, headers={"Retry-After": "7"}))
    result, _ = fetch(server, tmp_path, config)
    assert result.sha256 == SHA
    assert sleeps == [7.0]


def test_retries_exhausted(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    server.add_faults(PATH, *[Fault("status", code=500)] * 10)
    with pytest.raises(DownloadFailedError) as info:
        fetch(server, tmp_path, config)
    assert server.url(PATH) in str(info.value) and "HTTP 500" in str(info.value)
    assert len(server.requests_for(PATH)) == config.retries + 1
    assert not (tmp_path / "data.bin").exists()


def test_404_fails_at_once_with_url_and_status(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    spec = RemoteFile("x.bin", (server.url("/missing.bin"),))
    with pytest.raises(HTTPStatusError) as info:
        fetch(server, tmp_path, config, spec=spec)
    assert str(info.value) == f"GET {server.url('/missing.bin')} answered HTTP 404 Not Found"
    assert info.value.status == 404
    assert len(server.requests_for("/missing.bin")) == 1


def test_next_mirror_after_404_and_after_corruption(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    server.files["/bad.bin"] = DATA[:-1] + b"X"
    urls = (server.url("/gone.bin"), server.url("/bad.bin"), server.url(PATH))
    result, _ = fetch(server, tmp_path, config, spec=RemoteFile("data.bin", urls, sha256=SHA))
    assert result.url == server.url(PATH) and result.path.read_bytes() == DATA


def test_a_web_page_in_place_of_the_file_is_the_next_mirrors_turn(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A mirror answering 200 with a login, error or portal page was kept as the file where the
    registry has no sha256 (the conversion failed next, and the next mirror was never tried). A
    binary file a server labels ``text/html`` is still the file."""
    page = b"\n<!DOCTYPE html>\n<html><body>Sign in to continue</body></html>\n"
    server.files["/portal.bin"] = page
    html = {"Content-Type": "text/html; charset=utf-8"}
    server.sticky["/portal.bin"] = [Fault("headers", headers=html)]
    urls = (server.url("/portal.bin"), server.url(PATH))
    result, _ = fetch(server, tmp_path / "a", config, spec=RemoteFile("data.bin", urls))
    assert result.url == server.url(PATH) and result.path.read_bytes() == DATA
    with pytest.raises(
        ServerResponseError, match=r"answered a web page \(text/html\), not the file data\.bin"
    ):
        fetch(server, tmp_path / "b", config, spec=RemoteFile("data.bin", urls[:1]))
    assert [p.name for p in (tmp_path / "b").rglob("data.bin*") if not p.name.endswith(".lock")] == []
    server.sticky[PATH] = [Fault("headers", headers=html)]
    result, _ = fetch(server, tmp_path / "c", config, spec=remote(server))
    assert result.path.read_bytes() == DATA
    server.files["/page.html"] = page  # a file that is a page
    result, _ = fetch(
        server, tmp_path / "d", config, spec=RemoteFile("page.html", (server.url("/page.html"),))
    )
    assert result.path.read_bytes() == page


def test_a_web_page_in_answer_to_a_resume_keeps_the_partial_file(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A network portal answering a resume with its page (200, ``text/html``) deleted the partial
    download before the page was told: its bytes stay, and the next run resumes them."""
    part = write_part(server, tmp_path, DATA[:1000])
    info = read_part_info(part)
    server.add_faults(PATH, Fault("page"))
    with pytest.raises(ServerResponseError, match=r"answered a web page \(text/html\)"):
        fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    assert part.read_bytes() == DATA[:1000] and read_part_info(part) == info
    result, _ = fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    assert result.path.read_bytes() == DATA and server.requests_for(PATH)[-1].range == "bytes=1000-"


def test_a_file_sent_content_encoded_is_the_next_mirrors_turn(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """rlds asks for ``identity``; a server that sends the file gzip-encoded all the same (an
    object stored with ``Content-Encoding: gzip``) had its encoded bytes kept as the file where
    the registry has no sha256."""
    server.files["/encoded.bin"] = gzip.compress(DATA)
    server.sticky["/encoded.bin"] = [Fault("headers", headers={"Content-Encoding": "gzip"})]
    urls = (server.url("/encoded.bin"), server.url(PATH))
    result, _ = fetch(server, tmp_path / "a", config, spec=RemoteFile("data.bin", urls))
    assert result.url == server.url(PATH) and result.path.read_bytes() == DATA
    with pytest.raises(ServerResponseError, match=r"answered the file data\.bin gzip-encoded") as info:
        fetch(server, tmp_path / "b", config, spec=RemoteFile("data.bin", urls[:1]))
    assert "curl --compressed" in info.value.hint
    assert [p.name for p in (tmp_path / "b").rglob("data.bin*") if not p.name.endswith(".lock")] == []
    server.sticky[PATH] = [Fault("headers", headers={"Content-Encoding": "identity"})]
    assert fetch(server, tmp_path / "c", config, spec=remote(server))[0].path.read_bytes() == DATA


def test_mirrors_failing_each_in_its_own_way_keep_each_ones_hint(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """The summary of every mirror's failure said to check the connection (a resume would pick
    up), which fits neither a web page nor an encoded file."""
    server.files["/encoded.bin"] = gzip.compress(DATA)
    server.sticky["/encoded.bin"] = [Fault("headers", headers={"Content-Encoding": "gzip"})]
    urls = (server.url("/encoded.bin"), server.url("/gone.bin"))
    with pytest.raises(DownloadFailedError, match=r"every mirror of data\.bin failed") as info:
        fetch(server, tmp_path, config, spec=RemoteFile("data.bin", urls))
    assert "curl --compressed" in info.value.hint and "check your connection" not in info.value.hint


def test_a_web_page_arriving_in_small_pieces_is_still_a_page(
    server: FaultServer, tmp_path: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page was judged by the first piece the socket gave: "\n<!D" is no page start, and
    the portal page was kept as the file."""
    import rlds_cli.net.http as http

    monkeypatch.setattr(http, "CHUNK", 4)
    server.files["/portal.bin"] = b"\n<!DOCTYPE html>\n<html><body>Sign in to continue</body></html>\n"
    server.sticky["/portal.bin"] = [Fault("headers", headers={"Content-Type": "text/html"})]
    with pytest.raises(ServerResponseError, match="answered a web page"):
        fetch(server, tmp_path, config, spec=RemoteFile("data.bin", (server.url("/portal.bin"),)))
    result, _ = fetch(server, tmp_path / "b", config, spec=remote(server, sha256=SHA))
    assert result.path.read_bytes() == DATA  # a file in pieces of 4 bytes is whole


def test_server_ignoring_range_restarts_cleanly(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    write_part(server, tmp_path, DATA[:1000])
    server.add_faults(PATH, Fault("ignore_range"))
    result, events = fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    assert result.path.read_bytes() == DATA
    assert server.requests_for(PATH)[0].range == "bytes=1000-"
    assert server.requests_for(PATH)[0].if_range == server.validator_headers(DATA)["ETag"]
    assert ("reset", "data.bin", 0) in events


def test_corrupt_bytes_rejected_nothing_left(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    server.add_faults(PATH, Fault("corrupt"))
    with pytest.raises(ChecksumMismatchError) as info:
        fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    message = str(info.value)
    assert f"expected {SHA}" in message and "has sha256 " in message and "deleted" in message
    assert hashlib.sha256(bytes([DATA[0] ^ 0xFF]) + DATA[1:]).hexdigest() in message
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == []


def test_wrong_size_rejected(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    server.files["/short.bin"] = DATA[:-10]
    spec = RemoteFile("data.bin", (server.url("/short.bin"),), size=len(DATA))
    with pytest.raises((ChecksumMismatchError, DownloadFailedError)):
        fetch(server, tmp_path, config, spec=spec)
    assert not (tmp_path / "data.bin").exists()


@pytest.mark.parametrize("known", [False, True])
def test_wrong_content_length_recovers(
    server: FaultServer, tmp_path: Path, config: HttpConfig, known: bool
) -> None:
    server.add_faults(PATH, Fault("bad_length", extra=5000))
    spec = remote(server, sha256=SHA, size=len(DATA)) if known else remote(server)
    result, _ = fetch(server, tmp_path, config, spec=spec)
    assert result.path.read_bytes() == DATA
    # the body ended short of the announced length; with the size known, the file is complete,
    # else the client asks for the rest and the server says there is none (416)
    logged = [(r.range, r.status) for r in server.requests_for(PATH)]
    assert logged == [(None, 200)] if known else [(None, 200), (f"bytes={len(DATA)}-", 416)]


def test_slow_server_times_out_and_retries(server: FaultServer, tmp_path: Path, sleeps: list[float]) -> None:
    # the read timeout (0.2 s) trips long before the body would come: a wide margin on a busy
    # machine, and no cost (the client hangs up; the server thread is a daemon)
    server.add_faults(PATH, Fault("slow", delay=5.0))
    config = HttpConfig(timeout=(2.0, 0.2), retries=2, base_delay=0.01, sleep=sleeps.append)
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == DATA
    assert len(server.requests_for(PATH)) == 2 and len(sleeps) == 1


def test_complete_part_gets_416_and_is_kept(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    write_part(server, tmp_path, DATA)
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == DATA
    assert [(r.range, r.status) for r in server.requests_for(PATH)] == [(f"bytes={len(DATA)}-", 416)]


def test_a_416_for_a_file_shorter_than_first_announced_restarts(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A 416 ``bytes */N`` without validators, N the part's length, made a cut part complete
    though the first answer announced more bytes: the part was published as the file."""
    half = DATA[: len(DATA) // 2]
    write_part(server, tmp_path, half)  # as a cut transfer leaves it: the ETag, len(DATA) announced
    server.files[PATH] = half
    server.validators = "none"
    server.add_faults(PATH, Fault("ignore_if_range"))
    result, _ = fetch(server, tmp_path, config)
    assert [(r.range, r.status) for r in server.requests_for(PATH)] == [
        (f"bytes={len(half)}-", 416),
        (None, 200),  # started over: the file as the server has it now, whole
    ]
    assert result.path.read_bytes() == half


def test_a_206_without_the_recorded_validator_restarts(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A server that ignores If-Range and sends no ETag with its 206 answered the resume of a
    replaced file with the new version's bytes: they were spliced onto the old ones, converted and
    pinned as the file's hash."""
    write_part(server, tmp_path, DATA[: len(DATA) // 2])  # the ETag of DATA recorded
    replaced = bytes(255 - b for b in DATA)  # the same length, other bytes
    server.files[PATH] = replaced
    server.add_faults(PATH, Fault("bare_206"))
    result, _ = fetch(server, tmp_path, config)
    assert [(r.range, r.status) for r in server.requests_for(PATH)] == [
        (f"bytes={len(DATA) // 2}-", 206),
        (None, 200),  # started over
    ]
    assert result.path.read_bytes() == replaced


def test_part_longer_than_file_restarts(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    write_part(server, tmp_path, DATA + b"junk")
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == DATA


def test_offline_never_touches_the_network(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    with pytest.raises(OfflineError) as info:
        fetch(server, tmp_path, config, offline=True)
    assert "offline" in str(info.value) and "--offline" in info.value.hint
    assert server.log == []
    fetch(server, tmp_path, config)
    result, _ = fetch(server, tmp_path, config, offline=True, force=True)  # force cannot re-download offline
    assert result.action == "cached"
    assert len(server.log) == 1


def test_env_offline(
    server: FaultServer, tmp_path: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLDS_OFFLINE", "1")
    with pytest.raises(OfflineError):
        fetch(server, tmp_path, config)
    assert server.log == []


def test_force_downloads_again_and_recorded_hash_is_enforced(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    fetch(server, tmp_path, config)
    assert fetch(server, tmp_path, config, force=True)[0].action == "downloaded"
    assert len(server.requests_for(PATH)) == 2
    server.files[PATH] = DATA[::-1]  # the server now serves other bytes
    with pytest.raises(ChecksumMismatchError) as info:
        fetch(server, tmp_path, config, force=True)
    assert f"expected {SHA} (recorded at the first download)" in str(info.value)
    # the verified copy stays until new bytes verify (it was deleted first: the only good copy)
    assert (tmp_path / "data.bin").read_bytes() == DATA
    with pytest.raises(ChecksumMismatchError):  # a mistyped --sha256 takes nothing away either
        fetch(server, tmp_path, config, spec=remote(server, sha256="0" * 64))
    assert (tmp_path / "data.bin").read_bytes() == DATA


def test_a_changed_local_file_is_downloaded_again(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    (tmp_path / "data.bin").write_bytes(b"tampered")
    result, _ = fetch(server, tmp_path, config, spec=remote(server, sha256=SHA))
    assert result.action == "downloaded" and result.path.read_bytes() == DATA


def test_disk_space_checked_before_any_request(
    server: FaultServer, tmp_path: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(DiskFullError) as info:
        fetch(server, tmp_path, config, spec=remote(server, size=len(DATA)))
    assert f"needs {len(DATA):,} bytes" in str(info.value) and "RLDS_HOME" in info.value.hint
    assert server.log == []


def test_two_threads_download_once(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    # the first download holds half the file until the other thread has found the file locked
    # (its "wait" event): the two surely overlap, and the second must reuse the first's file
    other_is_waiting = threading.Event()
    server.add_faults(PATH, Fault("pause", after=len(DATA) // 2, wait=other_is_waiting))
    results: list[object] = []
    errors: list[BaseException] = []

    def progress(event: str, name: str, value: int) -> None:
        if event == "wait":
            other_is_waiting.set()

    def run() -> None:
        try:
            results.extend(fetch_files([remote(server)], tmp_path, config=config, progress=progress))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert other_is_waiting.is_set()
    assert sorted(r.action for r in results) == ["cached", "downloaded"]  # type: ignore[attr-defined]
    assert len(server.requests_for(PATH)) == 1


def test_several_files_concurrently(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    server.throttle = (64 * 1024, 0.01)
    specs = []
    for i in range(4):
        server.files[f"/f{i}"] = DATA[i:]
        specs.append(RemoteFile(f"sub/f{i}.bin", (server.url(f"/f{i}"),)))
    server.add_faults("/f2", Fault("status", code=502))
    results = fetch_files(specs, tmp_path, config=config, workers=3)
    assert [r.path.read_bytes() for r in results] == [DATA[i:] for i in range(4)]
    assert set(HashStore(tmp_path).read()) == {f"sub/f{i}.bin" for i in range(4)}


def test_a_token_goes_to_its_own_origin_only(server: FaultServer, tmp_path: Path) -> None:
    """``HttpConfig.auth`` (the Hub token for a registry id's files) goes with each request to
    its origin (scheme, host and port), through a redirect that stays there, but not to the
    other origin a redirect leads to (a storage host's signed URL), and its repr hides it."""
    secret = "Bearer hf_originBoundSecret42"
    auth = OriginAuth(origin_of(server.base + "/x"), secret)
    assert (
        "hf_originBoundSecret42" not in repr(auth)
        and origin_of("HTTP://127.0.0.1/a") == "http://127.0.0.1:80"
    )
    with FaultServer() as storage:
        storage.files["/blob"] = DATA
        server.redirects["/hub/a.bin"] = storage.url("/blob")  # another port: another origin
        server.redirects["/hub/b.bin"] = PATH  # the same origin
        specs = [RemoteFile(n, (server.url(f"/hub/{n}"),), sha256=SHA) for n in ("a.bin", "b.bin")]
        results = fetch_files(specs, tmp_path, config=HttpConfig(retries=0, auth=auth), workers=1)
    assert [r.path.read_bytes() for r in results] == [DATA, DATA]
    assert [e.authorization for e in server.log] == [secret] * 3  # /hub/a.bin, /hub/b.bin, PATH
    assert [e.authorization for e in storage.log] == [None]
    assert "hf_originBoundSecret42" not in (tmp_path / ".rlds" / "hashes.json").read_text()


def test_backoff_and_retry_after() -> None:
    for attempt in range(1, 8):
        delay = backoff_delay(attempt, 1.0)
        assert 0.5 * min(60, 2 ** (attempt - 1)) <= delay <= min(60, 2 ** (attempt - 1))
    assert backoff_delay(1, 0.01, retry_after=3) == 3
    assert backoff_delay(1, 0.01, retry_after=10_000) == 300
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_a_failing_file_stops_its_siblings_early(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    server.throttle = (4096, 0.05)  # the big file alone would take about 4 s
    # the 404 comes once the big file's first chunk is in its .part (so there is one to keep)
    big_file_under_way = threading.Event()

    def progress(event: str, name: str, value: int) -> None:
        if event == "advance" and name == "data.bin":
            big_file_under_way.set()

    server.add_faults("/gone.bin", Fault("status", code=404, wait=big_file_under_way))
    specs = [remote(server), RemoteFile("gone.bin", (server.url("/gone.bin"),))]
    with pytest.raises(HTTPStatusError):
        fetch_files(specs, tmp_path, config=config, workers=2, progress=progress)
    assert big_file_under_way.is_set()
    assert not (tmp_path / "data.bin").exists()
    part = part_path(tmp_path, "data.bin")
    assert part.is_file() and 0 < part.stat().st_size < len(DATA)  # kept, for a resume
    # did not wait for the big file: the server never got to send all of it
    assert server.sent[PATH] < len(DATA)
