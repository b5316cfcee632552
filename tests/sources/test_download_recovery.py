"""Downloads that recover (issue 24, part 4): a first download that is wrong (a captive portal's
page, a truncated file, a gzip ``Content-Encoding``) fails to convert and is never trusted, so the
*same* command succeeds once the server is fixed; and retries always run out, however the server
lies about its sizes. Every server is a real one on 127.0.0.1 (:mod:`tests.http_faults`); requests
are counted on the server, never timed."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from rlds_cli.cache.root import CacheRoot
from rlds_cli.catalog import registry
from rlds_cli.cli.app import app
from rlds_cli.errors import (
    DatasetExistsError,
    DownloadFailedError,
    DownloadTooSlowError,
    SourceFormatError,
    UnknownFormatError,
)
from rlds_cli.net.fetch import RemoteFile, fetch_files
from rlds_cli.net.http import MAX_REQUESTS, HttpConfig
from rlds_cli.net.layout import (
    REFETCH_HINT,
    FileRecord,
    HashStore,
    confirmed_by_conversion,
    must_refetch,
    part_path,
    url_dir,
    url_file_name,
)
from tests.http_faults import Fault, FaultServer, serving

DEMO = registry.resolve("demo").files[0].bundled_path().read_bytes()
DEMO_SHA = hashlib.sha256(DEMO).hexdigest()
PATH = "/d4rl/pointmass.hdf5"
PORTAL = b"<!DOCTYPE html><html><body>Please log in to the hotel Wi-Fi</body></html>\n" * 40

pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


@pytest.fixture
def server(server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    # conftest's server, the downloader's retries 1 ms apart (these tests retry many times)
    with serving(server, {}, monkeypatch, retry_delay="0.001"):
        yield server


def invoke(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def folder_of(home: Path, url: str) -> Path:
    return url_dir(CacheRoot(home), url)


def published(home: Path) -> list[str]:
    folder = home / "datasets"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def download(url: str, *extra: str) -> Result:
    return invoke("download", url, "--option", "max_episode_steps=100", *extra)


def one_error_line(result: Result) -> str:
    """The error line of a failed command: exit 1, an ``error:`` line and at most a hint."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: ") and len(lines) <= 2, result.stderr
    assert "Traceback" not in result.output and "unexpected" not in result.stderr
    return lines[0]


def _gzip_encoded(server: FaultServer) -> None:
    server.files[PATH] = gzip.compress(DEMO)
    server.sticky[PATH] = [Fault("headers", headers={"Content-Encoding": "gzip"})]


BAD_BODIES = {
    "captive portal": lambda srv: srv.files.__setitem__(PATH, PORTAL),
    "truncated file": lambda srv: srv.files.__setitem__(PATH, DEMO[: len(DEMO) // 2]),
    "gzip content-encoding": _gzip_encoded,
}


@pytest.mark.parametrize("bad", sorted(BAD_BODIES))
def test_the_same_command_succeeds_once_the_server_is_fixed(
    bad: str, server: FaultServer, isolated_cache: Path
) -> None:
    BAD_BODIES[bad](server)
    url = server.url(PATH)
    first = download(url)
    line = one_error_line(first)
    assert published(isolated_cache) == []
    folder = folder_of(isolated_cache, url)
    record = HashStore(folder).get(url_file_name(url))
    if bad == "gzip content-encoding":  # refused as it arrives: nothing kept, nothing recorded
        assert "gzip-encoded" in line and record is None
        assert not (folder / url_file_name(url)).exists()
    else:
        assert "run the same command again" in first.stderr
        assert record is not None and not record.pinned and record.convert_failed
    # the server is fixed: the same command (no --force, nothing deleted by hand) fetches it again
    server.files[PATH] = DEMO
    server.sticky.clear()
    before = len(server.requests_for(PATH))
    second = download(url)
    assert second.exit_code == 0, second.output
    assert len(server.requests_for(PATH)) == before + 1
    assert (folder / url_file_name(url)).read_bytes() == DEMO
    record = HashStore(folder).get(url_file_name(url))
    assert record is not None and (record.sha256, record.pinned, record.convert_failed) == (
        DEMO_SHA,
        True,
        False,
    )
    assert published(isolated_cache) == ["pointmass"]
    # converted and pinned: after 'rlds rm', the same command reuses the file, asking nothing
    assert invoke("rm", "pointmass", "--yes").exit_code == 0
    assert download(url).exit_code == 0
    assert len(server.requests_for(PATH)) == before + 1


def test_a_converted_file_is_reused_not_fetched_again(server: FaultServer, isolated_cache: Path) -> None:
    server.files[PATH] = DEMO
    url = server.url(PATH)
    assert download(url).exit_code == 0
    assert invoke("rm", "pointmass", "--yes").exit_code == 0
    assert download(url).exit_code == 0
    assert len(server.requests_for(PATH)) == 1


def test_only_a_failure_to_read_the_file_marks_it(tmp_path: Path) -> None:
    """A conversion refused for a reason that is not the file's (a name taken, a full disk) says
    nothing about the bytes: the file is not fetched again. A source error marks it, and its
    hint says the same command fetches it again."""
    store = HashStore(tmp_path)
    store.put("a.hdf5", FileRecord("0" * 64, 3, "recorded", pinned=False))
    with pytest.raises(DatasetExistsError) as taken, confirmed_by_conversion(tmp_path, ["a.hdf5"]):
        raise DatasetExistsError("dataset 'a' already exists")
    assert taken.value.hint == DatasetExistsError.default_hint
    assert not store.get("a.hdf5").convert_failed  # type: ignore[union-attr]
    with pytest.raises(SourceFormatError) as bad, confirmed_by_conversion(tmp_path, ["a.hdf5"]):
        raise SourceFormatError("a.hdf5 is not HDF5")
    assert bad.value.hint == REFETCH_HINT
    assert store.get("a.hdf5").convert_failed  # type: ignore[union-attr]
    # a format not told (a URL without a suffix) names --format first: fetching again, the whole
    # file each time, failed the same way
    store.put("a.hdf5", FileRecord("0" * 64, 3, "recorded", pinned=False))
    with pytest.raises(UnknownFormatError) as untold, confirmed_by_conversion(tmp_path, ["a.hdf5"]):
        raise UnknownFormatError(
            "cannot tell the format of a.hdf5", hint="pass --format (known formats: d4rl)"
        )
    assert untold.value.hint == f"pass --format (known formats: d4rl); if it still fails, {REFETCH_HINT}"
    remote = RemoteFile("a.hdf5", ("http://127.0.0.1:9/a.hdf5",))
    assert must_refetch(remote, store.get("a.hdf5"))
    # a hash from an authority is never second-guessed: the file was checked against it
    assert not must_refetch(replace(remote, sha256="0" * 64), store.get("a.hdf5"))
    with confirmed_by_conversion(tmp_path, ["a.hdf5"]):
        pass
    record = store.get("a.hdf5")
    assert record is not None and record.pinned and not record.convert_failed


def test_with_sha256_the_bad_body_is_refused_and_the_rerun_succeeds(
    server: FaultServer, isolated_cache: Path
) -> None:
    server.files[PATH] = PORTAL
    url = server.url(PATH)
    first = download(url, "--sha256", DEMO_SHA)
    line = one_error_line(first)
    assert "sha256" in line and "--sha256" in first.stderr
    assert published(isolated_cache) == []
    assert not (folder_of(isolated_cache, url) / "pointmass.hdf5").exists()
    server.files[PATH] = DEMO
    second = download(url, "--sha256", DEMO_SHA)
    assert second.exit_code == 0, second.output
    assert published(isolated_cache) == ["pointmass"]


def test_offline_a_failed_file_is_not_fetched(server: FaultServer, isolated_cache: Path) -> None:
    """Offline, nothing can be fetched again: the file is converted as it is (and fails again)."""
    server.files[PATH] = PORTAL
    url = server.url(PATH)
    one_error_line(download(url))
    again = download(url, "--offline")
    one_error_line(again)
    assert len(server.requests_for(PATH)) == 1


# --------------------------------------------------------------------------- bounded retries


def test_a_server_sending_a_few_bytes_per_request_is_given_up(
    server: FaultServer, isolated_cache: Path
) -> None:
    """Each answer announces the whole rest and sends 10 bytes: every request makes progress, so
    the stall budget never ran out (712 requests in 60 s, no end). Now the requests of one command
    are bounded, the error names the URL, and the .part is kept for the next run to resume."""
    server.files[PATH] = DEMO
    server.sticky[PATH] = [Fault("cut", after=10)]
    url = server.url(PATH)
    result = download(url)
    line = one_error_line(result)
    assert url in line and f"{MAX_REQUESTS} requests" in line
    assert "run the same command again" in result.stderr
    assert len(server.requests_for(PATH)) == MAX_REQUESTS
    part = part_path(folder_of(isolated_cache, url), "pointmass.hdf5")
    assert part.stat().st_size == 10 * MAX_REQUESTS
    assert published(isolated_cache) == []
    # the server is fixed: the same command resumes and converts
    server.sticky.clear()
    assert download(url).exit_code == 0
    assert published(isolated_cache) == ["pointmass"]


def test_a_few_bytes_per_late_answer_are_progress_all_the_same(server: FaultServer, tmp_path: Path) -> None:
    """The same server, far away or on a loaded machine: each request seems to take seconds
    (the clock jumps 5 s at each reading). Its 10 bytes are still progress: the minimum speed is
    judged over whole windows of the body, not over the request's wall time (connection, wait
    for the first byte), where 10 bytes at 1,024 B/s were a trickle past 10 ms, and 6 such
    answers in a row gave up, saying no progress was made."""
    server.files[PATH] = DEMO
    server.sticky[PATH] = [Fault("cut", after=10)]
    clock = itertools.count(0.0, 5.0)
    config = HttpConfig(
        timeout=(5.0, 5.0),
        retries=2,
        base_delay=0.001,
        sleep=lambda s: None,
        min_speed=1024,
        speed_window=60,
        clock=lambda: next(clock),
    )
    spec = RemoteFile("pointmass.hdf5", (server.url(PATH),))
    with pytest.raises(DownloadFailedError) as info:
        fetch_files([spec], tmp_path, config=config, workers=1)
    assert f"gave up after {MAX_REQUESTS} requests" in str(info.value)
    assert len(server.requests_for(PATH)) == MAX_REQUESTS
    assert part_path(tmp_path, "pointmass.hdf5").stat().st_size == 10 * MAX_REQUESTS


def test_a_few_bytes_then_a_stall_of_a_whole_window_are_no_progress(
    server: FaultServer, tmp_path: Path
) -> None:
    """The rule still judges a window that ends in a stall: 10 bytes, then nothing until the
    read timeout (0.2 s, two windows of 0.1 s), is a trickle: the retries run out."""
    server.files[PATH] = DEMO
    release = threading.Event()
    server.sticky[PATH] = [Fault("pause", after=10, wait=release)]
    config = HttpConfig(
        timeout=(5.0, 0.2),
        retries=2,
        base_delay=0.001,
        sleep=lambda s: None,
        min_speed=1024,
        speed_window=0.1,
    )
    spec = RemoteFile("pointmass.hdf5", (server.url(PATH),))
    try:
        with pytest.raises((DownloadFailedError, DownloadTooSlowError)) as info:
            fetch_files([spec], tmp_path, config=config, workers=1)
    finally:
        release.set()  # the server's handlers end
    assert "3 times in a row" in str(info.value)
    assert len(server.requests_for(PATH)) == 3


def test_a_server_sending_nothing_new_stops_after_the_retries(
    server: FaultServer, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that ignores Range and cuts every answer at the same byte makes no progress:
    the consecutive-failure budget (RLDS_HTTP_RETRIES) ends it."""
    monkeypatch.setenv("RLDS_HTTP_RETRIES", "3")
    server.files[PATH] = DEMO
    server.sticky[PATH] = [Fault("cut", after=1000)]
    server.validators = None  # no validator: every retry starts from byte 0
    url = server.url(PATH)
    line = one_error_line(download(url))
    assert url in line and "4 times in a row" in line
    assert len(server.requests_for(PATH)) == 4


def test_a_length_larger_than_the_body_ends(server: FaultServer, isolated_cache: Path) -> None:
    """Content-Length 1,000 bytes more than sent, on every answer: the resume past the end gets
    416 with the real size, so the file completes in two requests."""
    server.files[PATH] = DEMO
    server.sticky[PATH] = [Fault("bad_length", extra=1000)]
    url = server.url(PATH)
    assert download(url).exit_code == 0
    assert len(server.requests_for(PATH)) == 2


def test_a_length_larger_than_the_body_without_validators_stops(
    server: FaultServer, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same lie from a server with no validator (nothing can be resumed safely): every answer
    starts from byte 0 and ends at the same byte, which is no progress; the retries run out."""
    monkeypatch.setenv("RLDS_HTTP_RETRIES", "5")
    server.files[PATH] = DEMO
    server.sticky[PATH] = [Fault("bad_length", extra=1000)]
    server.validators = None
    url = server.url(PATH)
    line = one_error_line(download(url))
    assert url in line and "6 times in a row" in line
    assert len(server.requests_for(PATH)) == 6
    assert published(isolated_cache) == []


def test_an_older_rlds_can_still_read_the_hashes(tmp_path: Path) -> None:
    """The failure mark is written only when set: records without it keep rlds 0.2's keys."""
    store = HashStore(tmp_path)
    store.put("a", FileRecord("0" * 64, 3, "recorded", pinned=False))
    store.put("b", FileRecord("1" * 64, 3, "recorded", pinned=False))
    store.mark_failed(["b"])
    files = json.loads(store.path.read_text())["files"]
    assert "convert_failed" not in files["a"] and files["b"]["convert_failed"] is True
    assert store.get("b").convert_failed and not store.get("a").convert_failed  # type: ignore[union-attr]
