"""Folders an actor is still writing (``rlds_cli.formats.folders``), through the CLI.

The writers open the final name and write into it (DreamerV2 and Gen-DGRL from a ``BytesIO``,
AMAGO with ``np.savez(path)``), so a folder being filled holds one truncated file under its final
name; copy tools leave hidden temporary files (rsync's ``.name.npz.Xy12Ab``). Hidden and
in-progress names are never read; a truncated file is one error line saying how to convert the
rest, and with ``--option skip_bad_files=true`` the rest converts and the file is noted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.formats import source_files
from tests.cli_fixtures import download
from tests.formats_fixtures import golden_ogbench, refused, write_amago
from tests.gen_dgrl_fixtures import npy_bytes, procgen_trajectory, write_folder
from tests.vd4rl_fixtures import dreamer_episode, dreamerv2_save_episode

runner = CliRunner()
SKIP = "pass --option skip_bad_files=true to convert the rest"
STAMPS = ("20220109T010000", "20220109T010001", "20220109T010002")


def _dreamer_folder(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    episodes = [dreamer_episode(6 + i, side=8, seed=i) for i in range(3)]
    return [dreamerv2_save_episode(folder, ep, stamp) for ep, stamp in zip(episodes, STAMPS, strict=True)]


def _half(path: Path, keep: float = 0.5) -> Path:
    """``path`` as it is while its writer is halfway through ``f.write``."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def test_hidden_and_in_progress_names_are_never_read(tmp_path: Path) -> None:
    folder = tmp_path / "replay"
    files = _dreamer_folder(folder)
    junk = files[0].read_bytes()[:100]  # each would stop the conversion if it were read
    (folder / f".{files[0].name}.Xy12Ab").write_bytes(junk)  # rsync's temporary copy
    (folder / ".partial.npz").write_bytes(junk)
    (folder / f"{files[1].name}.part").write_bytes(junk)
    (folder / "20220109T010003-0123456789abcdef0123456789abcdef-5.npz.tmp").write_bytes(junk)
    (folder / ".staging").mkdir()
    (folder / ".staging" / files[2].name).write_bytes(junk)
    result = download(folder, "f", "--format", "vd4rl")
    assert result.exit_code == 0, result.output
    assert open_dataset("f").episodes["length"].tolist() == [5, 6, 7]


def test_a_half_written_episode_is_one_line_then_skipped_when_asked(tmp_path: Path) -> None:
    folder = tmp_path / "replay"
    files = _dreamer_folder(folder)
    writing = _half(files[2])  # the newest episode, still being written
    line = refused(download(folder, "f"), writing.name, "truncated or corrupt", SKIP)
    assert line.count("\n") == 0
    result = download(folder, "f", "--option", "skip_bad_files=true")
    assert result.exit_code == 0, result.output
    ds = open_dataset("f")
    assert ds.episodes["length"].tolist() == [5, 6]
    notes = "\n".join(ds.manifest.conversion["notes"])
    assert "1 unreadable files skipped (skip_bad_files=true): cannot open " in notes
    assert f"{writing.name} as .npz (truncated or corrupt?)" in notes


def test_gen_dgrl_loose_folder_skips_a_half_written_trajectory_when_asked(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    trajs = [procgen_trajectory(rng, 3 + i, index=i, side=8) for i in range(3)]
    folder = write_folder(tmp_path / "collected", trajs)
    writing = _half(folder / trajs[1].collector_name())
    refused(download(folder, "f", "--format", "gen_dgrl"), writing.name, SKIP)
    result = download(folder, "f", "--format", "gen_dgrl", "--option", "skip_bad_files=true")
    assert result.exit_code == 0, result.output
    ds = open_dataset("f")
    assert ds.episodes["length"].tolist() == [3, 5]
    assert any(writing.name in n and "skipped" in n for n in ds.manifest.conversion["notes"])


def test_amago_folder_skips_a_half_written_trajectory_when_asked(tmp_path: Path) -> None:
    root = write_amago(tmp_path / "run", [(5, True), (6, False), (4, True)])
    writing = _half(sorted((root / "buffer" / "fifo").glob("*.npz"))[2])
    (writing.parent / f".{writing.name}").write_bytes(b"junk")  # hidden: never read
    refused(download(root, "f", "--format", "amago"), writing.name, SKIP)
    result = download(root, "f", "--format", "amago", "--option", "skip_bad_files=true")
    assert result.exit_code == 0, result.output
    ds = open_dataset("f")
    assert ds.episodes["length"].tolist() == [4, 5]
    assert any(writing.name in n for n in ds.manifest.conversion["notes"])


class _Reduces:
    def __reduce__(self) -> tuple[object, ...]:
        return (eval, ("1",))


@pytest.mark.parametrize("skip", [False, True], ids=["default", "skip_bad_files"])
def test_a_hostile_file_is_never_skipped(tmp_path: Path, skip: bool) -> None:
    """``skip_bad_files`` is for broken files; a pickle asking for ``eval`` still stops it all."""
    rng = np.random.default_rng(1)
    folder = write_folder(tmp_path / "collected", [procgen_trajectory(rng, 3, side=8)])
    (folder / "zz_evil.npy").write_bytes(npy_bytes({"observations": _Reduces()}))
    extra = ["--option", "skip_bad_files=true"] if skip else []
    line = refused(download(folder, "f", "--format", "gen_dgrl", *extra), "zz_evil.npy", "builtins.eval")
    assert SKIP not in line


def test_dataset_folders_skip_hidden_and_in_progress_npz_too(tmp_path: Path) -> None:
    """OGBench and D4RL folders (one dataset file, not episodes) leave the same names out: a
    hidden copy of the dataset would otherwise be a second dataset file in the folder."""
    folder = tmp_path / "og"
    folder.mkdir()
    good = golden_ogbench(folder / "toy-v0.npz")
    (folder / f".{good.name}.Xy12Ab").write_bytes(good.read_bytes()[:64])
    (folder / f".{good.name}").write_bytes(good.read_bytes()[:64])
    (folder / "toy-v0.npz.part").write_bytes(good.read_bytes()[:64])
    assert source_files("ogbench", [folder]) == [good]
    d4rl = tmp_path / "d4rl"
    d4rl.mkdir()
    (d4rl / "hopper.hdf5").write_bytes(b"x")
    (d4rl / ".hopper.hdf5.tmp").write_bytes(b"x")
    (d4rl / ".hidden.hdf5").write_bytes(b"x")
    assert source_files("d4rl", [d4rl]) == [d4rl / "hopper.hdf5"]
