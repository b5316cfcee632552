"""The shared small helpers: atomic writes (``rlds_cli._util.io``), sha256 of a file, the disk-space
check, the episode-range parser and the retry budget."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from rlds_cli._util.io import (
    DISK_MARGIN,
    atomic_path,
    atomic_write,
    check_disk,
    sha256_file,
    temp_path,
)
from rlds_cli._util.numbers import parse_numbers, parse_range
from rlds_cli.errors import DiskFullError, InvalidSelectionError
from rlds_cli.net.http import RetryBudget, backoff_delay
from tests.faults import count_steps, kill_at

# ----------------------------------------------------------------------------- atomic writes


def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")
    atomic_write(target, "new ✓")
    atomic_write(tmp_path / "b.bin", b"\0\1")
    atomic_write(tmp_path / "c.npy", lambda fh: np.save(fh, np.arange(3)))
    assert target.read_text(encoding="utf-8") == "new ✓" and (tmp_path / "b.bin").read_bytes() == b"\0\1"
    assert np.load(tmp_path / "c.npy").tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.bin", "c.npy"]


def test_temp_names() -> None:
    path = Path("/x/hashes.json")
    assert temp_path(path, unique=False) == Path("/x/.hashes.json.tmp")
    assert temp_path(path) == Path(f"/x/.hashes.json.{os.getpid()}.{threading.get_ident()}.tmp")
    assert temp_path(path, suffix=".partial").name.endswith(".partial")


def test_a_kill_at_any_step_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    """Killed before any step (fsync of the file, rename, fsync of the folder), the file holds
    its old bytes or its new ones, never a mix, and nothing else ever holds the new name."""
    target = tmp_path / "state.json"

    def write() -> None:
        atomic_write(target, "new" * 1000, fsync=True, sync_dir=True)

    target.write_text("old")
    steps = count_steps(write)
    assert steps == 3
    for k in range(1, steps + 1):
        target.write_text("old")
        assert kill_at(write, k) is not None
        # the rename is step 2: killed before it, the old file is intact
        assert target.read_text() == ("old" if k <= 2 else "new" * 1000), k


def test_an_error_before_the_rename_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.json"
    target.write_text("old")

    def failing_replace(src: object, dst: object) -> None:
        raise OSError("rename failed")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        atomic_write(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["m.json"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_failing_writer_leaves_nothing_behind(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "out"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="writer failed"), atomic_path(target, suffix=".partial") as tmp:
        if kind == "file":
            tmp.write_text("half")
        else:
            (tmp / "sub").mkdir(parents=True)
            (tmp / "sub" / "x").write_text("half")
        raise RuntimeError("writer failed")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_durability_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp file is fsynced before the rename, the folder after it; nothing without the flags."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("replace", Path(src).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "j.publish"
    atomic_write(target, "{}", fsync=True, sync_dir=True, unique=False)
    assert events == [
        ("fsync", str(tmp_path / ".j.publish.tmp")),
        ("replace", ".j.publish.tmp"),
        ("fsync", str(tmp_path)),
    ]
    events.clear()
    atomic_write(target, "{}")
    assert [kind for kind, _ in events] == ["replace"]


# ----------------------------------------------------------------------------- sha256


@pytest.mark.parametrize("size", [0, 1, (1 << 18) + 7, 5 * (1 << 20)])
def test_sha256_file_is_hashlibs(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert sha256_file(path) == sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- disk space


def test_check_disk_names_the_folder_and_the_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=5000))
    with pytest.raises(DiskFullError) as info:
        check_disk(tmp_path, 123_456, "the download")
    assert str(info.value) == (
        f"not enough disk space in {tmp_path}: the download needs 123,456 bytes and 5,000 are free "
        f"(plus {DISK_MARGIN // 2**20} MiB kept spare)"
    )
    assert "RLDS_HOME" in (info.value.hint or "")
    check_disk(tmp_path, 0, "nothing")  # nothing needed: no check
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=DISK_MARGIN + 10))
    check_disk(tmp_path, 10, "the download")


# ----------------------------------------------------------------------------- episode ranges


def test_one_range_parser_with_two_rules() -> None:
    assert parse_range("-3:", negative=True) == (-3, None)
    assert parse_range(":5", negative=False) == (None, 5)
    assert parse_range([2, None], negative=False) == (2, None)
    for spec in ("4", "1:2:3", "a:b", "1.5:2", [None, 2], ["0", 2], 3):
        for negative in (True, False):
            with pytest.raises(InvalidSelectionError, match="is not of the form A:B"):
                parse_range(spec, negative=negative)
    for spec in ("-3:", "5:5", "5:2", "0:-1"):
        with pytest.raises(InvalidSelectionError, match=r"must be A:B with 0 <= A < B") as info:
            parse_range(spec, negative=False)
        assert "rlds view" in (info.value.hint or "")
        parse_range(spec, negative=True)


def test_a_number_selection_reads_ranges_by_the_same_rule() -> None:
    """``checkpoints`` and registry file sets: ``A:B`` is ``A <= N < B`` (either side empty),
    refused where :func:`parse_range` refuses it without negatives (as a ``ValueError``)."""
    for spec, picked in (("2:5", [2, 3, 4]), (" 3 :", [3, 4, 5, 6]), (":2", [0, 1]), (":", list(range(7)))):
        keep, named = parse_numbers(spec)
        assert keep is not None and named is None
        assert [n for n in range(7) if keep(n)] == picked, spec
    for spec in ("5:2", "3:3", "-1:", "1:2:3", "a:b", ":0"):
        with pytest.raises(ValueError):
            parse_numbers(spec)


# ----------------------------------------------------------------------------- retries


def test_retry_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("random.uniform", lambda a, b: 1.0)
    budget = RetryBudget(retries=2, base_delay=1.0)
    assert budget.next_delay() == backoff_delay(1, 1.0) == 1.0
    assert budget.next_delay(retry_after=7.0) == 7.0
    assert budget.next_delay() is None and budget.failures == 3
    budget = RetryBudget(retries=2, base_delay=1.0)
    budget.next_delay()
    budget.next_delay()
    assert budget.next_delay(progressed=True) == 1.0 and budget.failures == 1  # a new stall


@pytest.mark.parametrize(
    ("code", "raised"), [(errno.EIO, True), (errno.EINVAL, False), (errno.ENOTSUP, False)]
)
def test_a_folder_fsync_raises_what_lost_data_and_skips_what_cannot_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, raised: bool
) -> None:
    """EIO on a folder's fsync means its entries may be gone: the caller must not commit what
    names them. A filesystem that cannot sync folders (EINVAL, ENOTSUP) has nothing to do."""
    from rlds_cli._util import io as _io

    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)
    if raised:
        with pytest.raises(OSError) as info:
            _io.fsync_dir(tmp_path)
        assert info.value.errno == code
    else:
        _io.fsync_dir(tmp_path)
