"""Archives: each source kind converts from .zip / .tar / .tar.gz exactly as from the unpacked
files; traversal, links, bombs and damaged archives are refused with nothing written."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from rlds_cli.archives import Limits, UnsafeArchiveError, extract_archive
from rlds_cli.convert import convert
from rlds_cli.errors import SourceFormatError
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
        mode = "w:gz" if name.endswith((".tar.gz", ".tgz")) else "w"
        with tarfile.open(out, mode) as t:
            t.add(src, arcname=src.name)
    return out


def _arrays(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*.npy"))}


@pytest.mark.parametrize("suffix", [".zip", ".tar", ".tar.gz"])
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
