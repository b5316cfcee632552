"""Archives: each source kind converts from .zip / .tar / .tar.gz exactly as from the unpacked
files; traversal, links, bombs and damaged archives are refused with nothing written."""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from rlds_cli.errors import DiskFullError, SourceFormatError
from rlds_cli.formats.archives import Limits, UnsafeArchiveError, extract_archive
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import (
    golden_ogbench,
    golden_roboset,
    minari_episode,
    write_amago,
    write_minari_by_hand,
)


def _sources(tmp_path: Path) -> dict[str, Path]:
    return {
        "roboset": golden_roboset(tmp_path / "src" / "roboset"),
        "amago": write_amago(tmp_path / "src" / "amago", [(4, True), (3, False)]),
        "minari": write_minari_by_hand(tmp_path / "src" / "minari", [minari_episode(3), minari_episode(2)]),
        "ogbench": golden_ogbench(tmp_path / "src" / "og.npz"),
    }


def _pack(src: Path, out: Path) -> Path:
    name = out.name
    if name.endswith(".zip"):
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted([src, *src.rglob("*")] if src.is_dir() else [src]):
                if p.is_file():
                    z.write(p, p.relative_to(src.parent).as_posix())
    else:
        modes = {".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.bz2": "w:bz2", ".tar.xz": "w:xz"}
        mode = next((m for suffix, m in modes.items() if name.endswith(suffix)), "w")
        with tarfile.open(out, mode) as t:
            t.add(src, arcname=src.name)
    return out


def _arrays(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*.npy"))}


@pytest.mark.parametrize("suffix", [".zip", ".tar", ".tar.gz", ".tar.bz2", ".tar.xz"])
def test_every_kind_converts_from_an_archive(tmp_path: Path, isolated_cache: Path, suffix: str) -> None:
    for kind, src in _sources(tmp_path).items():
        direct = convert(src, f"{kind}-direct")
        archive = _pack(src, tmp_path / f"{kind}{suffix}")
        packed = convert(archive, f"{kind}-packed")
        assert packed.manifest.source["format"] == kind
        assert packed.manifest.source["archive"] is True
        assert packed.manifest.source["files"][0]["path"] == archive.name
        assert _arrays(direct.path) == _arrays(packed.path), kind
        assert convert(archive, f"{kind}-packed").reused
    # the unpacked copies are gone
    assert not any(p.name.endswith(".incomplete") for p in (isolated_cache / "tmp").iterdir())


def _zip(path: Path, members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            z.writestr(info, target)
    return path


def _tar(path: Path, members: dict[str, bytes], links: dict[str, tuple[bytes, str]] | None = None) -> Path:
    with tarfile.open(path, "w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, (kind, target) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target
            t.addfile(info)
    return path


BAD_CASES = {
    "zip-dotdot": lambda p: _zip(p / "a.zip", {"data/../../evil.npz": b"x"}),
    "zip-absolute": lambda p: _zip(p / "a.zip", {"/tmp/evil.npz": b"x"}),
    "zip-symlink": lambda p: _zip(p / "a.zip", {"ok.npz": b"x"}, {"link": "/etc/passwd"}),
    "tar-dotdot": lambda p: _tar(p / "a.tar", {"../evil.npz": b"x"}),
    "tar-absolute": lambda p: _tar(p / "a.tar", {"/abs/evil.npz": b"x"}),
    "tar-symlink-out": lambda p: _tar(p / "a.tar", {}, {"link": (tarfile.SYMTYPE, "/etc")}),
    "tar-hardlink": lambda p: _tar(p / "a.tar", {"f": b"x"}, {"g": (tarfile.LNKTYPE, "../../etc/passwd")}),
    "tar-device": lambda p: _tar(p / "a.tar", {}, {"dev": (tarfile.CHRTYPE, "")}),
}


def _tar_dir_after_file(path: Path) -> Path:
    with tarfile.open(path, "w") as t:
        info = tarfile.TarInfo("d")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        t.addfile(folder)
    return path


#: Members whose paths clash with an earlier member's; "appears twice" named a path that did not.
CLASH_CASES = {
    "tar-under-a-file": (
        lambda p: _tar(p / "a.tar", {"d": b"x", "d/x.npz": b"y"}),
        "member 'd/x.npz' lies under 'd', which the archive holds as a file",
    ),
    "tar-folder-over-a-file": (
        lambda p: _tar_dir_after_file(p / "a.tar"),
        "member 'd' is a file and a folder",
    ),
    "zip-under-a-file": (
        lambda p: _zip(p / "a.zip", {"d": b"x", "d/e/x.npz": b"y"}),
        "member 'd/e/x.npz' lies under 'd', which the archive holds as a file",
    ),
    "zip-twice": (
        lambda p: _zip(p / "a.zip", {"x.npz": b"x", "./x.npz": b"y"}),
        "member './x.npz' appears twice",
    ),
}


@pytest.mark.parametrize("case", sorted(CLASH_CASES))
def test_members_that_clash_are_named_for_what_they_are(
    tmp_path: Path, isolated_cache: Path, case: str
) -> None:
    make, want = CLASH_CASES[case]
    with pytest.raises(UnsafeArchiveError) as info:
        convert(make(tmp_path), "bad", format="ogbench")
    assert str(info.value).endswith(want), str(info.value)
    linked = tmp_path / "linked"  # a cache root reached through a link: "unexpected ValueError"
    linked.symlink_to(isolated_cache)
    with pytest.raises(UnsafeArchiveError) as info:
        convert(make(tmp_path), "bad", format="ogbench", root=linked)
    assert str(info.value).endswith(want), str(info.value)


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_unsafe_archives_refused(tmp_path: Path, isolated_cache: Path, case: str) -> None:
    archive = BAD_CASES[case](tmp_path)
    with pytest.raises(UnsafeArchiveError, match=r"a\.(zip|tar): member") as info:
        convert(archive, "bad", format="ogbench")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "evil.npz").exists() and not Path("/tmp/evil.npz").exists()
    assert not (isolated_cache / "datasets").exists() or not list((isolated_cache / "datasets").iterdir())
    assert [p for p in (isolated_cache / "tmp").iterdir()] == []


def test_zip_bomb_over_the_size_limit(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("big.npz", b"\0" * (8 << 20))  # 8 MiB of zeros: ratio ~1000
    with pytest.raises(UnsafeArchiveError, match=r"compression ratio|unpacks to more|declares"):
        convert(bomb, "bad")
    # the size limit alone (ratio check relaxed): counted while copying too
    monkeypatch.setenv("RLDS_ARCHIVE_MAX_BYTES", str(1 << 20))
    with pytest.raises(UnsafeArchiveError, match=r"bomb.zip: (declares|unpacks to)"):
        extract_archive(bomb, tmp_path / "out1", Limits(max_ratio=1e9))
    tgz = tmp_path / "bomb.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        info = tarfile.TarInfo("big.npz")
        info.size = 4 << 20
        t.addfile(info, io.BytesIO(b"\0" * info.size))
    (tmp_path / "out2").mkdir()
    with pytest.raises(UnsafeArchiveError, match=r"bomb.tar.gz: unpacks to more than 1,048,576 bytes"):
        extract_archive(tgz, tmp_path / "out2")
    assert list((tmp_path / "out2").iterdir()) == []
    assert [p for p in (isolated_cache / "tmp").iterdir()] == []


def test_zip_members_that_overlap_are_refused(tmp_path: Path) -> None:
    """Members sharing their compressed bytes (a 217 KB zip unpacking to 842 MB) passed every
    limit: each member's bytes were counted as read once per member."""
    bomb = tmp_path / "overlap.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npz", b"\0" * 1000)
        z.writestr("b.npz", b"\0" * 1000)
    data = bytearray(bomb.read_bytes())
    second = data.rindex(b"PK\x01\x02")  # b's central directory entry: its local header at 0 too
    data[second + 42 : second + 46] = (0).to_bytes(4, "little")
    bomb.write_bytes(bytes(data))
    (tmp_path / "out").mkdir()
    with pytest.raises(UnsafeArchiveError, match=r"members 'a.npz' and 'b.npz' overlap in the file"):
        extract_archive(bomb, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_damaged_archives(tmp_path: Path) -> None:
    src = golden_ogbench(tmp_path / "og.npz")
    for suffix in (".zip", ".tar.gz"):
        archive = _pack(src, tmp_path / f"og{suffix}")
        data = archive.read_bytes()
        archive.write_bytes(data[: len(data) // 2])
        with pytest.raises(SourceFormatError, match=rf"og{suffix.replace('.', '[.]')}"):
            convert(archive, "bad", format="ogbench")


def test_safe_paths_inside_are_fine(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "ok.zip", {"a/./b/c.npz": b"1", "a/d.npz": b"2"})
    out = tmp_path / "out"
    out.mkdir()
    root = extract_archive(archive, out)
    assert root == out / "a"
    assert (root / "b" / "c.npz").read_bytes() == b"1"
    shutil.rmtree(out)
    assert os.path.exists(archive)


# ----------------------------------------------------------------------------- the same limits for every type


def _zeros_archive(path: Path, nbytes: int) -> Path:
    """An archive of one member of ``nbytes`` zero bytes, compressed by its type."""
    if path.name.endswith(".zip"):
        return _pack_bytes_zip(path, nbytes)
    mode = {".gz": "w:gz", ".tgz": "w:gz", ".bz2": "w:bz2", ".xz": "w:xz", ".txz": "w:xz"}.get(
        path.suffix, "w"
    )
    with tarfile.open(path, mode) as t:
        info = tarfile.TarInfo("zeros.npz")
        info.size = nbytes
        t.addfile(info, io.BytesIO(bytes(nbytes)))
    return path


def _pack_bytes_zip(path: Path, nbytes: int) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.npz", bytes(nbytes))
    return path


@pytest.mark.parametrize("name", ["z.tar.gz", "z.tgz", "z.tar.bz2", "z.tar.xz", "z.txz", "z.zip"])
def test_the_ratio_is_measured_while_extracting_for_every_type(tmp_path: Path, name: str) -> None:
    """8 MiB of zeros from a few KB: refused as soon as the bytes unpacked pass the floor with a
    ratio over the limit (here a 1 MiB floor), with nothing left in the destination."""
    archive = _zeros_archive(tmp_path / name, 8 << 20)
    out = tmp_path / "out"
    out.mkdir()
    limits = Limits(max_ratio=1e9, ratio_floor_bytes=1 << 20)  # the zip header check off: measured only
    with pytest.raises(
        UnsafeArchiveError, match=r"unpacks ([\d,]+) bytes from [\d,]+ bytes of archive"
    ) as info:
        extract_archive(archive, out, limits)
    unpacked = int(re.search(r"unpacks ([\d,]+) bytes", str(info.value)).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert unpacked <= 3 << 20, "the extraction did not stop at the first chunk over the limit"
    assert "RLDS_ARCHIVE_MAX_RATIO" in info.value.hint
    assert list(out.iterdir()) == []
    # the same archive, trusted: a higher ratio limit lets it through
    (tmp_path / "ok").mkdir()
    assert extract_archive(
        archive, tmp_path / "ok", Limits(max_ratio=1e9, max_total_ratio=1e6, ratio_floor_bytes=1 << 20)
    )


def test_default_ratio_limit_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Limits().max_total_ratio == 200 and Limits().ratio_floor_bytes == 64 << 20
    monkeypatch.setenv("RLDS_ARCHIVE_MAX_RATIO", "5000")
    assert Limits().max_total_ratio == 5000


def test_tar_bz2_and_tar_xz_are_archives(tmp_path: Path) -> None:
    from rlds_cli.formats import ARCHIVE_SUFFIXES as DETECTED
    from rlds_cli.formats import is_archive
    from rlds_cli.formats.archives import ARCHIVE_SUFFIXES

    assert ARCHIVE_SUFFIXES == DETECTED
    for name in ("a.tar.bz2", "a.tbz2", "a.tar.xz", "a.txz"):
        (tmp_path / name).write_bytes(b"")
        assert is_archive(tmp_path / name), name


def test_zip_members_must_be_stored_or_deflated(tmp_path: Path) -> None:
    """Python inflates bzip2 and LZMA zip members without an output bound: refused up front."""
    for method in (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        archive = tmp_path / f"m{method}.zip"
        with zipfile.ZipFile(archive, "w", method) as z:
            z.writestr("a.npz", b"x" * 100)
        (tmp_path / f"out{method}").mkdir()
        with pytest.raises(UnsafeArchiveError, match=f"uses compression method {method}"):
            extract_archive(archive, tmp_path / f"out{method}")


def test_an_archive_of_folders_only_is_refused(tmp_path: Path, isolated_cache: Path) -> None:
    archive = tmp_path / "folders.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(zipfile.ZipInfo("a/"), b"")
        z.writestr(zipfile.ZipInfo("a/b/"), b"")
    for fmt in (None, "ogbench"):
        with pytest.raises(SourceFormatError, match=r"folders\.zip holds no files"):
            convert(archive, "x", format=fmt)
    assert [p for p in (isolated_cache / "tmp").iterdir()] == []


@pytest.mark.parametrize("name", ["full.tar.gz", "full.zip"])
def test_a_full_disk_is_not_a_damaged_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A write that fails (no space left) is reported as such, naming the file, not as damage."""
    archive = _zeros_archive(tmp_path / name, 3 << 20)
    real_open = open

    class _Full:
        def __init__(self, path: Path, mode: str) -> None:
            self._fh = real_open(path, mode)

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device", str(self._fh.name))

        def close(self) -> None:
            self._fh.close()

    def fake_open(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return _Full(path, mode) if "x" in mode else real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("rlds_cli.formats.archives.open", fake_open, raising=False)
    (tmp_path / "out").mkdir()
    with pytest.raises(DiskFullError, match=r"no space left on the device: .*zeros\.npz"):
        extract_archive(archive, tmp_path / "out", Limits(max_ratio=1e9))
    assert list((tmp_path / "out").iterdir()) == []
