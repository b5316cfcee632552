"""Format auto-detection, multi-file sources in ``convert``, and the CLI on bad input: one error
line naming the file and the problem, exit code 1, nothing published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cli.app import app
from rlds_cli.errors import DatasetExistsError, SourceError, UnknownFormatError
from rlds_cli.formats import detect_format, known_formats
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import GoldenFactory, golden_three_episodes
from tests.formats_fixtures import (
    amago_arrays,
    golden_ogbench,
    golden_roboset,
    minari_episode,
    ogbench_arrays,
    roboset_trial,
    write_amago,
    write_minari_by_hand,
    write_ogbench,
    write_roboset,
)

pytestmark = [
    pytest.mark.usefixtures("consoles"),  # tests/conftest.py: fixed console widths
    pytest.mark.console_widths(250, 400),  # a wide stderr, so one error line stays one line
]


def test_detect_each_layout(tmp_path: Path) -> None:
    minari = write_minari_by_hand(tmp_path / "m", [minari_episode(2)])
    rob = golden_roboset(tmp_path / "r")
    amago = write_amago(tmp_path / "a", [(3, True)])
    og = golden_ogbench(tmp_path / "o.npz")
    d4rl = golden_three_episodes(tmp_path / "d.hdf5", with_next=True)
    assert detect_format(minari) == "minari"
    assert detect_format(minari / "data") == "minari"
    assert detect_format(minari / "data" / "main_data.hdf5") == "minari"
    assert detect_format(minari / "data" / "metadata.json") == "minari"
    assert detect_format(rob) == "roboset"
    assert detect_format(rob / "a_trace.h5") == "roboset"
    assert detect_format(amago) == "amago"
    assert detect_format(next(amago.rglob("*.npz"))) == "amago"
    assert detect_format(og) == "ogbench"
    assert detect_format(d4rl) == "d4rl"
    assert detect_format([rob / "a_trace.h5", rob / "b_trace.h5"]) == "roboset"


def test_unknown_layouts_list_the_formats(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("weights", data=np.zeros(3))
    (tmp_path / "empty").mkdir()
    for path in ("notes.txt", "other.npz", "other.h5", "empty"):
        with pytest.raises(UnknownFormatError) as info:
            detect_format(tmp_path / path)
        assert str(tmp_path / path) in str(info.value)
        for fmt in known_formats():
            assert fmt in info.value.hint
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_ogbench(mixed / "o.npz", ogbench_arrays([1], 2))
    write_roboset(mixed / "r.h5", {0: roboset_trial(0, 0, 3, done_last=True)})
    with pytest.raises(UnknownFormatError, match="several formats"):
        detect_format(mixed)


def test_format_overrides_detection(tmp_path: Path) -> None:
    np.savez(tmp_path / "traj.npz", **amago_arrays(0, 3, terminal=True))
    assert convert(tmp_path / "traj.npz", "t", format="amago").manifest.source["format"] == "amago"
    with pytest.raises(UnknownFormatError, match="unknown source format 'nope'"):
        convert(tmp_path / "traj.npz", "t2", format="nope")


def test_options_not_for_this_format(tmp_path: Path) -> None:
    og = golden_ogbench(tmp_path / "o.npz")
    # generic options (what the CLI passes whatever the format) are simply not given
    convert(og, "a", options={"workers": 3, "allow_pickle": True, "max_episode_steps": 10})
    with pytest.raises(SourceError, match="option 'frobnicate' does not apply to the ogbench format"):
        convert(og, "b", options={"frobnicate": 1})


def test_multi_file_reuse_and_change(tmp_path: Path) -> None:
    rob = golden_roboset(tmp_path / "r")
    files = [rob / "a_trace.h5", rob / "b_trace.h5"]
    first = convert(files, "set")
    assert [f["path"] for f in first.manifest.source["files"]] == ["a_trace.h5", "b_trace.h5"]
    assert convert(files, "set").reused
    assert convert(rob, "set").reused  # the same files named by their directory
    write_roboset(rob / "b_trace.h5", {60: roboset_trial(1, 60, 4, done_last=True)})
    with pytest.raises(DatasetExistsError):
        convert(files, "set")
    assert convert(files, "set", force=True).manifest.num_steps == 8


def _cli_error(*args: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), lines
    assert len(lines) <= 2 and "Traceback" not in result.stderr, lines
    return lines[0]


def _nothing_published(root: Path) -> None:
    for sub in ("datasets", "tmp"):
        folder = root / sub
        assert not folder.exists() or list(folder.iterdir()) == [], (sub, list(folder.iterdir()))


BAD_SOURCES = {
    "minari-missing-group": (
        lambda p: _minari_missing_group(p),
        ["main_data.hdf5", "total_episodes=3", "episode_1"],
    ),
    "roboset-ragged": (
        lambda p: write_roboset(
            p / "r.h5", {0: {**roboset_trial(0, 0, 4, done_last=True), "done": np.zeros(3, bool)}}
        ),
        ["r.h5:Trial0", "'done' has 3 rows"],
    ),
    "ogbench-truncated": (lambda p: _truncated(golden_ogbench(p / "o.npz")), ["o.npz"]),
    "amago-pickle": (lambda p: _traj_file(p), ["x.traj", "pickle"]),
    "unknown": (lambda p: _text(p / "notes.bin"), ["notes.bin", "cannot tell the format"]),
    "archive-traversal": (lambda p: _evil_zip(p / "evil.zip"), ["evil.zip", "escapes the destination"]),
}


def _minari_missing_group(p: Path) -> Path:
    d = write_minari_by_hand(p / "m", [minari_episode(2), minari_episode(2), minari_episode(2)])
    with h5py.File(d / "data" / "main_data.hdf5", "a") as f:
        del f["episode_1"]
    return d


def _truncated(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[:200])
    return path


def _traj_file(p: Path) -> Path:
    (p / "x.traj").write_bytes(b"\x80\x04K\x01.")
    return p / "x.traj"


def _text(path: Path) -> Path:
    path.write_bytes(b"hello")
    return path


def _evil_zip(path: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("../../evil.npz", b"x")
    return path


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_cli_bad_input_one_line_exit_1_nothing_published(
    tmp_path: Path, isolated_cache: Path, case: str
) -> None:
    make, words = BAD_SOURCES[case]
    path = make(tmp_path)
    line = _cli_error("download", path)
    for word in words:
        assert word in line, (word, line)
    _nothing_published(isolated_cache)


def test_cli_converts_each_kind(tmp_path: Path, isolated_cache: Path) -> None:
    sources = {
        "minari": write_minari_by_hand(tmp_path / "hand-minari", [minari_episode(3)]),
        "roboset": golden_roboset(tmp_path / "robo"),
        "amago": write_amago(tmp_path / "amago-run", [(3, True)]),
        "ogbench": golden_ogbench(tmp_path / "og.npz"),
    }
    import tarfile

    with tarfile.open(tmp_path / "robo.tar.gz", "w:gz") as t:
        t.add(sources["roboset"], arcname="robo")
    sources["archive"] = tmp_path / "robo.tar.gz"
    for kind, path in sources.items():
        result = CliRunner().invoke(app, ["download", str(path), "--name", kind, "--json"])
        assert result.exit_code == 0, (kind, result.stdout, result.stderr)
        assert json.loads(result.stdout)["num_steps"] > 0
    result = CliRunner().invoke(app, ["inspect", "roboset", "--check"])
    assert result.exit_code == 0, result.stdout
    assert "check passed" in result.stdout


def _every_source_path(tmp_path: Path, golden: Any) -> list[Path]:
    """Files and folders of every built-in format (and some of none), each path below them too."""
    from rlds_cli.export import export_dataset
    from tests.atari_dqn_fixtures import write_run
    from tests.gen_dgrl_fixtures import gen_dgrl_archive
    from tests.rlds_tfrecord_fixtures import write_rlds_dataset
    from tests.vd4rl_fixtures import dreamer_episode, drqbc_arrays, write_dreamer_episodes, write_drqbc

    episodes = [dreamer_episode(5, side=8, seed=s) for s in range(2)]
    roots = [
        write_minari_by_hand(tmp_path / "m", [minari_episode(2)]),
        golden_roboset(tmp_path / "r"),
        write_amago(tmp_path / "a", [(3, True)]),
        golden_ogbench(tmp_path / "o.npz"),
        golden_three_episodes(tmp_path / "d.hdf5", with_next=True),
        gen_dgrl_archive(tmp_path / "g" / "maze.tar.xz", episodes=2, steps=3, side=8)[0],
        write_drqbc(tmp_path / "v" / "drqbc.hdf5", drqbc_arrays(episodes)),
        write_dreamer_episodes(tmp_path / "dreamer", episodes)[0].parent,
        tmp_path / "oxe",
        tmp_path / "atari",
        export_dataset(golden, tmp_path / "td", "torchrl"),
        Path(__file__).parents[1] / "fixtures",  # LeRobot v3, replay buffers (dirs, zips), robomimic
    ]
    write_rlds_dataset(tmp_path / "oxe", (3, 2))
    write_run(tmp_path / "atari" / "replay_logs", capacity=20, episode_lengths=[6, 5], obs_shape=(8, 8))
    (tmp_path / "notes.txt").write_text("hello")
    for name in ("train.tfrecord-00000-of-00001.h5", "x.tfrecord.HDF5", "x.tfrecord.npz"):  # not shards
        (tmp_path / "oxe" / name).write_bytes(b"")
    paths = {tmp_path, *roots}
    for root in roots:
        if root.is_dir():
            paths.update(p for p in root.rglob("*") if not p.name.endswith((".py", ".golden.npz")))
    return sorted(paths)


def test_detection_asks_only_the_readers_that_may_claim_a_path(
    tmp_path: Path, golden_dataset: GoldenFactory
) -> None:
    """SNIFFED_KINDS only saves imports: over paths of every format, no reader whose kinds leave
    a path out recognises it, so detection with the table finds what asking every reader finds."""
    from rlds_cli.formats import DETECTION_ORDER, SNIFFED_KINDS, path_kind, reader_class, sniff_format

    assert set(SNIFFED_KINDS) == set(DETECTION_ORDER)
    paths = _every_source_path(tmp_path / "sources", golden_dataset(with_next=True))
    claimed = {fmt: 0 for fmt in DETECTION_ORDER}
    for path in paths:
        kind = path_kind(path)
        found = [fmt for fmt in DETECTION_ORDER if reader_class(fmt).sniff(path)]
        for fmt in found:
            assert kind in SNIFFED_KINDS[fmt], f"{fmt} recognises {path} ({kind}), left out by SNIFFED_KINDS"
            claimed[fmt] += 1
        assert sniff_format(path) == (found[0] if found else None)
    assert all(claimed.values()), claimed  # every format was met, so the check above means something


@pytest.mark.parametrize("fmt", [None, "d4rl"])
@pytest.mark.parametrize("inside", [False, True], ids=["file", "in-a-folder"])
def test_a_git_lfs_pointer_is_named_as_one(tmp_path: Path, fmt: str | None, inside: bool) -> None:
    """A clone without git-lfs holds pointer files: they were 'file signature not found' (HDF5)
    or an unknown format, with a hint to download again."""
    folder = tmp_path / "clone"
    folder.mkdir()
    pointer = folder / "hopper.hdf5"
    pointer.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"
    )
    source = folder if inside else pointer
    result = CliRunner().invoke(app, ["download", str(source), *(["--format", fmt] if fmt else [])])
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert f"{pointer} is a git-LFS pointer" in said and "git lfs pull" in said, said
