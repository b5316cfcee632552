"""Downloads that cannot be tricked (issue 11: items 3, 4, 13 and the unclear messages; issue 17:
item 6): resumes never splice two versions of a file, a ``206`` is written where it belongs, a
trickling server is cut, redirects are checked, a full disk keeps the ``.part``, a name that
does not resolve fails at once, and bookkeeping never collides with a downloaded file's name.

Every server is a real one on 127.0.0.1 (:mod:`tests.http_faults`); DNS failures are simulated
by replacing ``socket.getaddrinfo``, so nothing leaves the machine.
"""

from __future__ import annotations

import email.utils
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlds_cli.errors import (
    ChecksumMismatchError,
    CorruptDatasetError,
    DiskFullError,
    DownloadTooSlowError,
    HostNotFoundError,
    RedirectError,
    RegistryFormatError,
    ServerResponseError,
)
from rlds_cli.net import http as http_module
from rlds_cli.net.fetch import FetchResult, RemoteFile, fetch_files
from rlds_cli.net.http import HttpConfig
from rlds_cli.net.layout import HashStore, part_info_path, part_path
from tests.http_faults import DATA as V1  # what the server fixture serves at PATH
from tests.http_faults import PATH, Fault, FaultServer, bounded
from tests.waits import HANG_SECONDS

V2 = bytes(reversed(range(256))) * 1200  # the same file regenerated upstream: same size
BAD_HOST = "nonexistent.invalid"  # RFC 2606: never resolves; getaddrinfo is mocked anyway


def fetch(
    server: FaultServer, folder: Path, config: HttpConfig, path: str = PATH, **kw: Any
) -> tuple[FetchResult, list[tuple[str, str, int]]]:
    events: list[tuple[str, str, int]] = []
    spec = kw.pop("spec", None) or RemoteFile("data.bin", (server.url(path),))
    (result,) = fetch_files([spec], folder, config=config, progress=lambda *e: events.append(e), **kw)
    return result, events


# --------------------------------------------------------------------------- 3: validators


@pytest.mark.parametrize("validators", ["etag", "last-modified"])
def test_a_file_changed_between_cut_and_resume_is_fetched_whole(
    server: FaultServer, tmp_path: Path, validators: str
) -> None:
    """v1 is cut half-way, upstream regenerates the file (v2), the resume must give exactly v2."""
    server.validators = validators
    v1_validator = next(iter(server.validator_headers(V1).values()))
    server.add_faults(PATH, Fault("cut", after=150_000))

    def upstream_regenerates(delay: float) -> None:  # runs between the cut and the retry
        server.files[PATH] = V2

    config = HttpConfig(timeout=(2.0, 2.0), retries=2, base_delay=0.01, sleep=upstream_regenerates)
    result, events = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V2  # not 150 KB of v1 followed by the end of v2
    first, second = server.requests_for(PATH)
    assert (first.range, first.status) == (None, 200)
    # the resume asked for the rest of v1 only; the server said the file changed (200, whole file)
    assert second.range is not None and second.range.startswith("bytes=")
    assert (second.if_range, second.status) == (v1_validator, 200)
    assert ("reset", "data.bin", 0) in events
    assert HashStore(tmp_path).get("data.bin").sha256 == hashlib.sha256(V2).hexdigest()  # type: ignore[union-attr]


def test_a_last_modified_date_as_recent_as_the_answer_is_no_validator(
    server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written in the second of the answer can change again within that second and keep
    its date (RFC 9110 8.8.2.2: such a date is weak): the resume sent it as If-Range, the server
    answered 206 for the new version's bytes, and a mix of both was published."""
    monkeypatch.setattr(
        server, "validator_headers", lambda body: {"Last-Modified": email.utils.formatdate(usegmt=True)}
    )
    server.add_faults(PATH, Fault("cut", after=150_000))

    def upstream_regenerates(delay: float) -> None:  # within the same second: the same date
        server.files[PATH] = V2

    config = HttpConfig(timeout=(2.0, 2.0), retries=2, base_delay=0.01, sleep=upstream_regenerates)
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V2
    second = server.requests_for(PATH)[1]
    assert (second.range, second.if_range, second.status) == (None, None, 200)  # started over


def test_an_unchanged_file_resumes_with_if_range(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    server.add_faults(PATH, Fault("cut", after=150_000))
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1
    second = server.requests_for(PATH)[1]
    assert (second.if_range, second.status) == (server.validator_headers(V1)["ETag"], 206)


@pytest.mark.parametrize("validators", [None, "weak-etag"])
def test_without_a_strong_validator_a_resume_starts_over(
    server: FaultServer, tmp_path: Path, config: HttpConfig, validators: str | None
) -> None:
    """Nothing proves the bytes on disk are of the file the server has now: start from byte 0."""
    server.validators = validators
    server.add_faults(PATH, Fault("cut", after=150_000))
    result, events = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1
    assert [(r.range, r.status) for r in server.requests_for(PATH)] == [(None, 200), (None, 200)]
    assert ("reset", "data.bin", 0) in events


def test_a_server_ignoring_if_range_is_caught_by_its_etag(server: FaultServer, tmp_path: Path) -> None:
    """A buggy server sends the rest of v2 as 206 despite If-Range: its new ETag gives it away."""
    server.add_faults(PATH, Fault("cut", after=150_000), Fault("ignore_if_range"))

    def upstream_regenerates(delay: float) -> None:
        server.files[PATH] = V2

    config = HttpConfig(timeout=(2.0, 2.0), retries=2, base_delay=0.01, sleep=upstream_regenerates)
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V2
    assert [(r.range is None, r.status) for r in server.requests_for(PATH)] == [
        (True, 200),
        (False, 206),  # refused: not written
        (True, 200),
    ]


def test_a_part_from_an_older_rlds_is_not_spliced(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A .part with no validator record (or one for another URL) is restarted, not resumed."""
    part = part_path(tmp_path, "data.bin")
    part.parent.mkdir(parents=True)
    part.write_bytes(V2[:1000])
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1
    assert server.requests_for(PATH)[0].range is None
    assert not part.exists() and not part_info_path(part).exists()


# --------------------------------------------------------------------------- 4: Content-Range


def test_a_206_for_other_bytes_is_not_written(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """The resume asks for byte N; a hostile server answers 206 from byte N-5000. Those bytes
    must not be written anywhere: the download starts over and the result is exactly the file."""
    server.add_faults(PATH, Fault("cut", after=150_000), Fault("wrong_range", shift=5000))
    result, events = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1
    logged = server.requests_for(PATH)
    assert [(r.range is None, r.status) for r in logged] == [(True, 200), (False, 206), (True, 200)]
    assert ("reset", "data.bin", 0) in events


def test_a_206_to_a_whole_file_request_fails_clearly(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    server.sticky[PATH] = [Fault("wrong_range", shift=500)]  # every answer starts at the wrong byte

    def run() -> None:
        fetch(server, tmp_path, config)

    with pytest.raises(ServerResponseError) as info:
        bounded(run, HANG_SECONDS)
    message = str(info.value)
    assert server.url(PATH) in message and f"bytes 500-{len(V1) - 1}/{len(V1)}" in message
    assert "RLDS_REGISTRY" in info.value.hint
    assert not (tmp_path / "data.bin").exists()


def test_a_206_of_another_total_size_restarts(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A careless server: it ignores If-Range and sends no ETag any more, but the total size in
    its Content-Range changed. Only the size can tell: nothing of that 206 is written."""
    server.add_faults(PATH, Fault("cut", after=150_000), Fault("ignore_if_range"))

    def grow(delay: float) -> None:
        server.files[PATH] = V1 + b"appended"
        server.validators = None

    config.sleep = grow
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1 + b"appended"
    assert [(r.range is None, r.status) for r in server.requests_for(PATH)] == [
        (True, 200),
        (False, 206),  # bytes of a file of another size: refused
        (True, 200),
    ]


def test_a_206_for_part_of_the_rest_of_unknown_total_is_not_the_end(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A resume answered ``206 bytes N-M/*`` (a range short of the end, no total) was taken for
    the end of the file: the download ended there. The size the first answer announced says more
    is to come: the download goes on from M + 1."""
    server.add_faults(PATH, Fault("cut", after=150_000), Fault("short_range", after=10_000))
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1
    assert [r.status for r in server.requests_for(PATH)] == [200, 206, 206]
    assert [r.range for r in server.requests_for(PATH)][1:] == ["bytes=150000-", "bytes=160000-"]


# --------------------------------------------------------------------------- 13: slow servers


def test_a_trickling_server_is_cut_with_the_speed_seen(server: FaultServer, tmp_path: Path) -> None:
    """1 byte every 20 ms (50 B/s) never trips the read timeout; the minimum-speed rule cuts it,
    the cut is retried, and a trickle never resets the retry budget."""
    server.files["/slow.bin"] = b"x" * 400  # about 8 s at that speed, were it not cut
    server.throttle = (1, 0.02)
    sleeps: list[float] = []
    config = HttpConfig(
        timeout=(2.0, 2.0), retries=2, base_delay=0.01, sleep=sleeps.append, min_speed=2000, speed_window=0.3
    )
    with pytest.raises(DownloadTooSlowError) as info:
        fetch(
            server,
            tmp_path,
            config,
            path="/slow.bin",
            spec=RemoteFile("slow.bin", (server.url("/slow.bin"),)),
        )
    # cut early, not waited out: the three tries together got less than one file's bytes
    assert server.sent["/slow.bin"] < len(server.files["/slow.bin"])
    message = str(info.value)
    assert server.url("/slow.bin") in message and "too slow" in message
    assert " B/s over " in message and "minimum 2,000 B/s" in message
    assert "RLDS_HTTP_MIN_SPEED" in info.value.hint
    assert len(server.requests_for("/slow.bin")) == 3 and len(sleeps) == 2  # 1 try + 2 retries
    assert not (tmp_path / "slow.bin").exists()


def test_the_speed_rule_can_be_set_and_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLDS_HTTP_MIN_SPEED", "0")
    monkeypatch.setenv("RLDS_HTTP_SPEED_WINDOW", "5")
    assert (HttpConfig().min_speed, HttpConfig().speed_window) == (0, 5)
    monkeypatch.delenv("RLDS_HTTP_MIN_SPEED")
    monkeypatch.delenv("RLDS_HTTP_SPEED_WINDOW")
    assert (HttpConfig().min_speed, HttpConfig().speed_window) == (1024, 60)


# --------------------------------------------------------------------------- redirects


def test_redirects_are_followed(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    server.redirects["/r1"] = "/r2"  # relative
    server.redirects["/r2"] = server.url(PATH)  # absolute
    result, _ = fetch(server, tmp_path, config, path="/r1")
    assert result.path.read_bytes() == V1


def test_a_redirect_loop_is_refused_naming_the_chain(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    server.redirects["/a"] = "/b"
    server.redirects["/b"] = "/a"
    with pytest.raises(RedirectError) as info:
        fetch(server, tmp_path, config, path="/a")
    a, b = server.url("/a"), server.url("/b")
    assert str(info.value) == f"GET {a} is a redirect loop: {a} -> {b} -> {a}"
    assert len(server.requests_for("/a")) == 1  # not retried
    assert not (tmp_path / "data.bin").exists()


def test_too_many_redirects(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    for i in range(12):
        server.redirects[f"/hop{i}"] = f"/hop{i + 1}"
    with pytest.raises(RedirectError, match="redirected more than 10 times"):
        fetch(server, tmp_path, config, path="/hop0")


@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1/data.bin", "gopher://x/"])
def test_a_redirect_out_of_http_is_refused(
    server: FaultServer, tmp_path: Path, config: HttpConfig, target: str
) -> None:
    server.redirects["/go"] = "/go2"
    server.redirects["/go2"] = target
    with pytest.raises(RedirectError) as info:
        fetch(server, tmp_path, config, path="/go")
    scheme = target.split(":")[0]
    assert str(info.value) == (
        f"GET {server.url('/go')} was redirected to a {scheme}:// URL, which rlds never follows: "
        f"{server.url('/go')} -> {server.url('/go2')} -> {target}"
    )
    assert not (tmp_path / "data.bin").exists()


# --------------------------------------------------------------------------- full disk


class _FillingFile:
    """A file whose disk fills after ``room`` bytes (what ``write`` raises on a full disk)."""

    def __init__(self, real: Any, room: int) -> None:
        self.real, self.room = real, room

    def __enter__(self) -> _FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.real.write(data[: self.room])
            self.real.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.real.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_full_disk_keeps_the_part_and_says_what_is_needed(
    server: FaultServer, tmp_path: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    room = [100_000]

    def filling_open(path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        handle = open(path, mode, *args, **kw)  # noqa: SIM115 - wrapped and closed by the caller
        return _FillingFile(handle, room[0]) if "b" in mode and Path(path).suffix == ".part" else handle

    monkeypatch.setattr(http_module, "open", filling_open, raising=False)
    with pytest.raises(DiskFullError) as info:
        fetch(server, tmp_path, config)
    part = part_path(tmp_path, "data.bin")
    assert part.stat().st_size == 100_000  # kept for a resume
    message = str(info.value)
    assert message.startswith(
        f"the disk is full: data.bin from {server.url(PATH)} stopped at 100,000 bytes in "
    )
    assert f"{len(V1) - 100_000:,} more bytes are needed" in message and "\n" not in message
    assert len(server.requests_for(PATH)) == 1  # no retry into a full disk
    room[0] = 10**9  # space was freed: the same call resumes
    result, _ = fetch(server, tmp_path, config)
    assert result.path.read_bytes() == V1
    assert server.requests_for(PATH)[-1].range == "bytes=100000-"


def test_a_full_disk_without_validator_gives_the_space_back(
    server: FaultServer, tmp_path: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .part that could not be resumed safely (no validator) is not kept to fill the disk."""
    server.validators = None

    def filling_open(path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        handle = open(path, mode, *args, **kw)  # noqa: SIM115 - wrapped and closed by the caller
        return _FillingFile(handle, 100_000) if "b" in mode and Path(path).suffix == ".part" else handle

    monkeypatch.setattr(http_module, "open", filling_open, raising=False)
    with pytest.raises(DiskFullError, match="the partial file was deleted"):
        fetch(server, tmp_path, config)
    assert not part_path(tmp_path, "data.bin").exists()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs (root only, where mounting is allowed); skipped elsewhere."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_disk(
    server: FaultServer, small_disk: Path, config: HttpConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program fills the disk during the download: a clear error, the .part kept, and
    the next run resumes once space is freed."""
    filler = small_disk / "other-program.bin"
    filler.write_bytes(b"\0" * 300_000)
    usage = shutil.disk_usage(small_disk)
    # the space check passed when the download began; the disk fills afterwards
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=10**12))
    with pytest.raises(DiskFullError) as info:
        fetch(server, small_disk / "raw", config)
    part = part_path(small_disk / "raw", "data.bin")
    assert 0 < part.stat().st_size < len(V1)
    assert "the disk is full: data.bin" in str(info.value) and "more bytes are needed" in str(info.value)
    filler.unlink()
    result, _ = fetch(server, small_disk / "raw", config)
    assert result.path.read_bytes() == V1
    assert server.requests_for(PATH)[-1].status == 206


# --------------------------------------------------------------------------- DNS (issue 17.6)


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``getaddrinfo`` fails for BAD_HOST like an offline machine (loopback still resolves)."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        if host == BAD_HOST:
            asked.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    return asked


def test_a_name_that_does_not_resolve_fails_at_once(
    tmp_path: Path, config: HttpConfig, sleeps: list[float], no_dns: list[str]
) -> None:
    url = f"http://{BAD_HOST}/d4rl/hopper_medium-v2.hdf5"
    with pytest.raises(HostNotFoundError) as info:
        fetch_files([RemoteFile("hopper.hdf5", (url,))], tmp_path, config=config)
    assert no_dns == [BAD_HOST] and sleeps == []  # one lookup, no retry, no waiting
    assert str(info.value).startswith(f"GET {url}: cannot resolve the host name '{BAD_HOST}'")
    assert "--offline" in info.value.hint and "RLDS_OFFLINE=1" in info.value.hint


def test_every_mirror_unresolvable_keeps_the_offline_hint(
    tmp_path: Path, config: HttpConfig, no_dns: list[str]
) -> None:
    urls = (f"http://{BAD_HOST}/a.hdf5", f"https://{BAD_HOST}/b.hdf5")
    with pytest.raises(HostNotFoundError, match=r"every mirror of x\.hdf5 failed") as info:
        fetch_files([RemoteFile("x.hdf5", urls)], tmp_path, config=config)
    assert "--offline" in info.value.hint and len(no_dns) == 2


def test_hub_listing_with_no_dns_fails_at_once(
    no_dns: list[str], monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    """A registry id's Hub folder is listed by huggingface_hub: a Hub whose name does not
    resolve is one lookup, no wait, and the error that says --offline."""
    pytest.importorskip("huggingface_hub")
    from rlds_cli.net.hub import list_folder

    waits: list[float] = []
    monkeypatch.setattr("time.sleep", waits.append)
    monkeypatch.setenv("RLDS_HF_ENDPOINT", f"https://{BAD_HOST}")
    with pytest.raises(HostNotFoundError, match=f"cannot resolve the host name '{BAD_HOST}'") as info:
        list_folder("org/repo", "x")
    assert no_dns == [BAD_HOST] and waits == []
    assert "--offline" in info.value.hint


# --------------------------------------------------------------------------- bookkeeping names


def test_files_named_like_bookkeeping_do_not_collide(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """A dataset whose files are called hashes.json, listing.json, x.part or .x.lock: before, the
    file 'hashes.json' took the hash store's own lock (a deadlock) and overwrote it."""
    names = [
        "hashes.json",
        "listing.json",
        "data.bin",
        "data.bin.part",
        ".data.bin.lock",
        ".hashes.json.lock",
    ]
    bodies = {name: V1[i * 7 :] for i, name in enumerate(names)}
    for name, body in bodies.items():
        server.files[f"/{name}"] = body
    specs = [RemoteFile(name, (server.url(f"/{name}"),)) for name in names]
    results = bounded(lambda: fetch_files(specs, tmp_path, config=config, workers=3), HANG_SECONDS)
    assert [r.path.read_bytes() for r in results] == list(bodies.values())
    records = HashStore(tmp_path).read()
    assert {n: r.sha256 for n, r in records.items()} == {
        n: hashlib.sha256(b).hexdigest() for n, b in bodies.items()
    }
    again = bounded(lambda: fetch_files(specs, tmp_path, config=config), HANG_SECONDS)
    assert [r.action for r in again] == ["cached"] * len(names)


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut
        lambda text: text.replace('"files"', '"filez"'),  # a key flipped
        lambda text: re.sub(r'"size": (\d+)', r'"size": "\1"', text),  # a type
    ],
    ids=["cut", "key", "type"],
)
def test_a_damaged_hash_record_is_named_never_taken_for_none(
    server: FaultServer, tmp_path: Path, config: HttpConfig, damage: Any
) -> None:
    """An unreadable hashes.json counted as empty: the pins it held were dropped silently, and
    the next download overwrote it, checking the file against no earlier download."""
    fetch(server, tmp_path, config)
    record = HashStore(tmp_path).path
    record.write_text(damage(record.read_text()))
    before = record.read_bytes()
    server.files[PATH] = V2  # the server's file changed meanwhile
    with pytest.raises(CorruptDatasetError, match=r"hashes\.json is damaged") as info:
        fetch(server, tmp_path, config, force=True)
    assert "delete it" in info.value.hint
    assert record.read_bytes() == before and (tmp_path / "data.bin").read_bytes() == V1


def test_fields_a_newer_rlds_records_are_left_out(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    fetch(server, tmp_path, config)
    store = HashStore(tmp_path)
    doc = json.loads(store.path.read_text())
    doc["files"]["data.bin"]["signed_by"] = "someone"
    store.path.write_text(json.dumps(doc))
    assert store.get("data.bin").sha256 == hashlib.sha256(V1).hexdigest()  # type: ignore[union-attr]


def test_the_bookkeeping_folder_is_reserved(tmp_path: Path, config: HttpConfig) -> None:
    for name in (
        ".rlds/hashes.json",
        "./.rlds/hashes.json",
        "data/../.rlds/hashes.json",
        ".RLDS/hashes.json",
    ):
        with pytest.raises(RegistryFormatError, match=f"file name '{re.escape(name)}' is reserved"):
            fetch_files([RemoteFile(name, ("http://127.0.0.1:9/x",))], tmp_path, config=config)


# --------------------------------------------------------------------------- 5: pin after conversion


def test_a_file_that_did_not_convert_is_fetched_from_the_other_mirrors_first(
    server: FaultServer, tmp_path: Path, config: HttpConfig
) -> None:
    """No sha256 or size known, the first mirror serving a short file: the conversion failed, and
    every later run fetched the same short file from the same mirror again."""
    server.files["/short.bin"] = V1[: len(V1) // 2]
    urls = (server.url("/short.bin"), server.url(PATH))
    spec = RemoteFile("data.bin", urls)
    first, _ = fetch(server, tmp_path, config, spec=spec, pin=False)
    assert first.url == urls[0]
    HashStore(tmp_path).mark_failed(["data.bin"])  # what a failed conversion records
    again, _ = fetch(server, tmp_path, config, spec=spec, pin=False)
    assert again.url == urls[1] and again.path.read_bytes() == V1


def test_an_unpinned_hash_binds_nothing(server: FaultServer, tmp_path: Path, config: HttpConfig) -> None:
    """pin=False (what ``rlds download`` does before converting): the hash is remembered, not
    enforced, so a wrong first download (a captive portal page) can be replaced."""
    server.files[PATH] = b"<html>please log in</html>"
    fetch(server, tmp_path, config, pin=False)
    assert HashStore(tmp_path).get("data.bin").pinned is False  # type: ignore[union-attr]
    server.files[PATH] = V1
    result, _ = fetch(server, tmp_path, config, pin=False, force=True)
    assert result.path.read_bytes() == V1
    HashStore(tmp_path).pin(["data.bin"])
    server.files[PATH] = V2
    with pytest.raises(ChecksumMismatchError, match="recorded at the first download"):
        fetch(server, tmp_path, config, pin=False, force=True)
