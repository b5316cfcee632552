"""The source's sha256 beside the conversion: a one-file source starts hashing before its format
is detected, that digest serves the file list the format reads, and a failed conversion stops
the hashing instead of leaving it running."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from rlds_cli._util import io
from rlds_cli.errors import UnknownFormatError
from rlds_cli.sources import convert as convert_module
from rlds_cli.sources.convert import SourceHash, convert
from tests.d4rl_fixtures import golden_three_episodes
from tests.waits import settles


def _hash_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rlds-hash"]


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file :func:`sha256_file` is called on, from the conversion's hashing."""
    calls: list[Path] = []
    real = io.sha256_file

    def counting(path: Path, stop: threading.Event | None = None) -> str:
        calls.append(Path(path))
        return real(path, stop)

    monkeypatch.setattr(convert_module, "sha256_file", counting)
    return calls


def test_a_begun_file_is_hashed_once_and_its_digest_serves_the_file_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counted(monkeypatch)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"a" * 3_000_000)
    b.write_bytes(b"b" * 10)
    source_hash = SourceHash(None, "user", None)
    source_hash.begin(a)
    source_hash.start([a, b], tmp_path)
    records, _ = source_hash.checked()
    assert [r["sha256"] for r in records] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    assert [r["path"] for r in records] == ["a.bin", "b.bin"]
    assert sorted(calls) == [a, b]  # a once, though begun before the list was known


def test_a_file_list_without_the_begun_file_is_hashed_as_it_is(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    source_hash = SourceHash(hashlib.sha256(b"b").hexdigest(), "user", None)
    source_hash.begin(a)
    source_hash.start([b], tmp_path)
    assert source_hash.checked()[1] == hashlib.sha256(b"b").hexdigest()


def test_a_converted_file_is_hashed_once_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counted(monkeypatch)
    source = golden_three_episodes(tmp_path / "three.hdf5", with_next=True)
    result = convert(source, "three", root=tmp_path / "cache")
    assert result.manifest.source["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert calls == [source]


def test_stop_ends_a_hash_under_way(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        fh.truncate(64 << 20)
    stop = threading.Event()
    stop.set()
    with pytest.raises(InterruptedError, match=r"big\.bin"):
        io.sha256_file(big, stop)
    source_hash = SourceHash(None, "user", None)
    source_hash.stop()
    source_hash.begin(big)
    source_hash.start([big], tmp_path)
    with pytest.raises(InterruptedError):
        source_hash.checked()


def test_a_failed_conversion_stops_its_hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes: list[str] = []
    real = io.sha256_file

    def recording(path: Path, stop: threading.Event | None = None) -> str:
        try:
            digest = real(path, stop)
        except InterruptedError:
            outcomes.append("stopped")
            raise
        outcomes.append("finished")
        return digest

    monkeypatch.setattr(convert_module, "sha256_file", recording)
    big = tmp_path / "notes.bin"
    with open(big, "wb") as fh:
        fh.truncate(8 << 30)  # sparse: hashing all of it takes seconds, the detection milliseconds
    with pytest.raises(UnknownFormatError):
        convert(big, "notes", root=tmp_path / "cache")
    assert not settles(lambda: not outcomes)
    assert outcomes == ["stopped"]
    assert not settles(_hash_threads)
