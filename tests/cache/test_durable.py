"""_util/io.py: fsyncs issued together on the process's shared pool."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rlds_cli._util import io as durable
from tests.faults import assert_finishes_forked
from tests.waits import HANG_SECONDS


def _files(tmp_path: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x" * (i + 1))
        paths.append(path)
    return paths


def test_a_wave_syncs_every_path_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five files and a folder: each fsynced once, and all six were under way together (each
    fsync here waits until all have begun, which one after the other would never happen)."""
    paths = _files(tmp_path, 5)
    begun = threading.Barrier(6, timeout=HANG_SECONDS)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        begun.wait()
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    durable.fsync_wave(paths, [tmp_path])
    assert sorted(synced) == sorted(str(p) for p in [*paths, tmp_path])


def test_the_first_error_is_raised_once_every_fsync_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _files(tmp_path, 4)
    ended: list[str] = []
    real = durable.fsync_file

    def fsync_file(path: Path) -> None:
        if path.name == "f0":
            raise OSError(5, "Input/output error", str(path))
        threading.Event().wait(0.05)  # the others end after the failure
        real(path)
        ended.append(path.name)

    monkeypatch.setattr(durable, "fsync_file", fsync_file)
    wait = durable.start_fsyncs(paths, [])
    with pytest.raises(OSError, match="Input/output error"):
        wait()
    assert sorted(ended) == ["f1", "f2", "f3"]


def _sync_in_child(paths: list[Path]) -> None:
    durable.fsync_wave(paths, [])


def test_a_forked_child_makes_its_own_pool(tmp_path: Path) -> None:
    """The parent's pool object reaches a forked child without its threads: the child's wave
    runs on a pool of its own instead of waiting forever."""
    paths = _files(tmp_path, 4)
    durable.fsync_wave(paths, [])  # the parent's pool exists, its threads alive
    assert_finishes_forked(_sync_in_child, paths)
