"""Gen-DGRL (Procgen, ``--format gen_dgrl``): ``.tar.xz`` archives read as a stream, loose files and
folders, converted through the CLI (``rlds download PATH``).

Sources are written by :mod:`tests.gen_dgrl_fixtures` the way gen_dgrl's collector
(``np.savez_compressed`` episodes) and TorchRL's archives (``np.save`` of a pickled dict) write
them. Every converted value is compared with an expectation computed here from the raw arrays.
Hostile sources (escaping or linked members, pickles asking for code, bombs, damaged archives)
must fail with one line naming the file and the problem, exit code 1, nothing published.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import textwrap
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.formats import detect_format
from rlds_cli.formats.gen_dgrl import sniff
from tests.cli_fixtures import download
from tests.formats_fixtures import golden_ogbench
from tests.formats_fixtures import refused as _refused
from tests.gen_dgrl_fixtures import (
    Trajectory,
    as_torchrl_member,
    gen_dgrl_archive,
    members_of,
    npy_bytes,
    npz_bytes,
    procgen_trajectory,
    write_folder,
    write_tar,
)

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _expected(trajectories: list[Trajectory]) -> dict[str, np.ndarray]:
    """The flat TED columns of whole trajectories (each ends with ``done``), from the raw arrays:
    the frames of every step as uint8, then the last step's frame again (the file's last frame is
    the next episode's first, never used)."""
    frames, actions, rewards = [], [], []
    for traj in trajectories:
        obs = traj.arrays["observations"]
        t = traj.steps
        frames += [obs[:t].astype(np.uint8), obs[t - 1 : t].astype(np.uint8)]
        actions.append(traj.arrays["actions"])
        rewards.append(traj.arrays["rewards"].reshape(t, 1))
    return {
        "observation": np.concatenate(frames),
        "action": np.concatenate(actions),
        "next/reward": np.concatenate(rewards),
    }


def _check_converted(name: str, trajectories: list[Trajectory]) -> None:
    ds = open_dataset(name)
    lengths = [t.steps for t in trajectories]
    assert ds.episodes["length"].tolist() == lengths
    assert ds.episodes["source_id"].tolist() == list(range(len(lengths)))
    assert not ds.episodes["final_known"].any()
    want = _expected(trajectories)
    for key, values in want.items():
        got = np.asarray(ds.column(key)[:])
        assert got.dtype == values.dtype and got.shape == values.shape, (key, got.dtype, got.shape)
        np.testing.assert_array_equal(got, values, err_msg=key)
    ends = np.cumsum(lengths) - 1
    term = np.asarray(ds.column("next/terminated")[:])[:, 0]
    trunc = np.asarray(ds.column("next/truncated")[:])[:, 0]
    assert np.flatnonzero(term).tolist() == ends.tolist() and not trunc.any()
    arrays = ds.source_arrays
    assert arrays["gen_dgrl/episode_level_seed"].tolist() == [t.level_seed for t in trajectories]
    assert arrays["gen_dgrl/episode_trajectory"].tolist() == list(range(len(lengths)))
    conversion = ds.manifest.conversion
    assert conversion["rules"] == "gen-dgrl-v1"
    assert conversion["synthesized_final_observations"] == len(lengths)
    assert conversion["source_rows"] == sum(lengths)
    check = runner.invoke(app, ["inspect", name, "--check"])
    assert check.exit_code == 0, check.output
    assert "check passed" in check.output


# ----------------------------------------------------------------------------- conversions


def test_archive_of_both_member_kinds_converts_exactly(tmp_path: Path) -> None:
    """npz (collector) and npy (pickled dict) members in one ``.tar.xz``, detected from the CLI
    and read as a stream: the archive is the one source file, never unpacked."""
    archive, trajectories = gen_dgrl_archive(tmp_path / "bigfish.tar.xz", episodes=4, steps=12)
    assert sniff(archive)
    result = download(archive, "gd")
    assert result.exit_code == 0, result.output
    _check_converted("gd", trajectories)
    source = open_dataset("gd").manifest.source
    assert source["format"] == "gen_dgrl" and "archive" not in source
    assert source["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert [f["path"] for f in source["files"]] == ["bigfish.tar.xz"]
    assert source["metadata"]["gen_dgrl"]["trajectories"] == 4
    assert source["metadata"]["gen_dgrl"]["observation_dtypes_in_source"] == ["float32"]
    notes = open_dataset("gd").manifest.conversion["notes"]
    assert any("cast from float32 to uint8" in n for n in notes)
    # the same bytes again: reused, not converted twice
    again = download(archive, "gd")
    assert again.exit_code == 0 and "already in the cache" in again.output, again.output


def test_a_folder_and_loose_files(tmp_path: Path) -> None:
    """The collector's own output folder (npz), one loose npy, and a folder of both kinds."""
    rng = np.random.default_rng(3)
    trajectories = [procgen_trajectory(rng, 5 + i, index=i, level_seed=40 + i, side=16) for i in range(3)]
    folder = write_folder(tmp_path / "episodes", trajectories, kinds="npz")
    assert detect_format(folder) == "gen_dgrl"
    assert download(folder, "folder").exit_code == 0
    # files are read in sorted name order
    in_order = sorted(trajectories, key=lambda t: t.collector_name())
    _check_converted("folder", in_order)

    mixed = write_folder(tmp_path / "mixed", trajectories, kinds="mixed")
    assert download(mixed, "mixed").exit_code == 0
    names = sorted(p.name for p in mixed.iterdir())
    by_stem = {t.collector_name()[:-4]: t for t in trajectories}
    _check_converted("mixed", [by_stem[Path(n).stem] for n in names])

    npy = next(p for p in mixed.iterdir() if p.suffix == ".npy")
    assert detect_format(npy) == "gen_dgrl"
    assert download(npy, "one").exit_code == 0
    _check_converted("one", [by_stem[npy.stem]])


def test_done_before_the_end_splits_and_a_cut_trajectory_ends_truncated(tmp_path: Path) -> None:
    """``dones`` at step 3 of 9 and not at the end: two episodes, the first terminated with its
    last frame repeated, the second truncated with the file's last frame as its real final one."""
    rng = np.random.default_rng(5)
    traj = procgen_trajectory(rng, 9, side=8, done_at_end=False, early_dones=[3], dones_dtype=np.bool_)
    archive = write_tar(tmp_path / "chaser.tar.xz", members_of([traj], kinds="npy"))
    assert download(archive, "gd").exit_code == 0
    ds = open_dataset("gd")
    assert ds.episodes["length"].tolist() == [4, 5]
    assert ds.episodes["final_known"].tolist() == [False, True]
    frames = traj.arrays["observations"].astype(np.uint8)
    flat = np.concatenate([frames[:4], frames[3:4], frames[4:10]])
    np.testing.assert_array_equal(np.asarray(ds.column("observation")[:]), flat)
    term = np.asarray(ds.column("next/terminated")[:])[:, 0]
    trunc = np.asarray(ds.column("next/truncated")[:])[:, 0]
    assert np.flatnonzero(term).tolist() == [3] and np.flatnonzero(trunc).tolist() == [8]
    np.testing.assert_array_equal(np.asarray(ds.column("action")[:]), traj.arrays["actions"])
    # a split trajectory's level seed is ambiguous: -1 for both
    assert ds.source_arrays["gen_dgrl/episode_level_seed"].tolist() == [-1, -1]
    assert ds.manifest.conversion["synthesized_final_observations"] == 1
    assert any("1 trajectories hold several episodes" in n for n in ds.manifest.conversion["notes"])
    assert runner.invoke(app, ["inspect", "gd", "--check"]).exit_code == 0


def test_uint8_frames_extra_keys_and_other_members(tmp_path: Path) -> None:
    """uint8 frames are kept as they are; keys besides the four are noted, not stored; members
    that are not trajectories (a README) are noted and skipped."""
    rng = np.random.default_rng(6)
    traj = procgen_trajectory(rng, 6, side=8)
    arrays = {**traj.arrays, "observations": traj.arrays["observations"].astype(np.uint8)}
    arrays["infos"] = np.arange(6)
    members = [("game/README.txt", b"hello"), ("game/a.npz", npz_bytes(arrays))]
    archive = write_tar(tmp_path / "x.tar.xz", members)
    assert download(archive, "gd", "--format", "gen_dgrl").exit_code == 0
    ds = open_dataset("gd")
    np.testing.assert_array_equal(
        np.asarray(ds.column("observation")[:]),
        np.concatenate([arrays["observations"][:6], arrays["observations"][5:6]]),
    )
    notes = ds.manifest.conversion["notes"]
    assert any("not stored: ['infos']" in n for n in notes)
    assert any(
        "1 archive members that are not .npy/.npz were ignored: x.tar.xz: game/README.txt" in n for n in notes
    )
    assert not any("cast from" in n for n in notes)
    assert set(ds.manifest.fields) == {
        "observation",
        "action",
        "next/reward",
        "next/terminated",
        "next/truncated",
    }


def test_a_subset_of_episodes(tmp_path: Path) -> None:
    archive, trajectories = gen_dgrl_archive(tmp_path / "maze.tar.xz", episodes=5, steps=4, side=8)
    assert download(archive, "sub", "--episodes", "1:3").exit_code == 0
    ds = open_dataset("sub")
    assert ds.episodes["length"].tolist() == [t.steps for t in trajectories[1:3]]
    assert ds.source_arrays["gen_dgrl/episode_level_seed"].tolist() == [101, 102]
    check = runner.invoke(app, ["inspect", "sub", "--check"])
    assert check.exit_code == 0, check.output


# ----------------------------------------------------------------------------- detection


def test_detection_claims_only_gen_dgrl(tmp_path: Path) -> None:
    archive, trajectories = gen_dgrl_archive(tmp_path / "a.tar.xz", episodes=2, steps=3, side=8)
    assert sniff(archive) and detect_format(archive) == "gen_dgrl"
    gz = write_tar(tmp_path / "a.tar.gz", members_of(trajectories, kinds="npy"), mode="w:gz")
    assert sniff(gz)
    (tmp_path / "og").mkdir()
    og = golden_ogbench(tmp_path / "og" / "o.npz")
    assert not sniff(og) and not sniff(og.parent)
    og_tar = write_tar(tmp_path / "og.tar.xz", [("og/o.npz", og.read_bytes())])
    assert not sniff(og_tar)
    plain = tmp_path / "plain.npy"
    np.save(plain, np.zeros(3))
    assert not sniff(plain) and not sniff(tmp_path / "missing.tar.xz") and not sniff(tmp_path / "og")
    (tmp_path / "junk.tar.xz").write_bytes(b"not an archive")
    assert not sniff(tmp_path / "junk.tar.xz")


def test_an_ogbench_tar_is_still_unpacked_and_converted(tmp_path: Path) -> None:
    (tmp_path / "og").mkdir()
    og = golden_ogbench(tmp_path / "og" / "o.npz")
    og_tar = write_tar(tmp_path / "og.tar.xz", [("og/o.npz", og.read_bytes())])
    result = download(og_tar, "og")
    assert result.exit_code == 0, result.output
    assert open_dataset("og").manifest.source["format"] == "ogbench"
    assert open_dataset("og").manifest.source["archive"] is True


# ----------------------------------------------------------------------------- pickles


class Custom:
    """A class of this test module: the restricted unpickler must not even import it."""


class _Reduces:
    """Pickles as a call of ``fn(*args)``: what a hostile pickle does."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


def _pickled_member(tmp_path: Path, payload: Any, name: str = "evil") -> Path:
    """An archive whose first member is fine and whose second holds ``payload`` in its dict."""
    rng = np.random.default_rng(0)
    good = procgen_trajectory(rng, 3, side=8)
    bad = {**as_torchrl_member(good), "payload": payload}
    members = [("g/good.npz", npz_bytes(good.arrays)), (f"g/{name}.npy", npy_bytes(bad))]
    return write_tar(tmp_path / f"{name}.tar.xz", members)


@pytest.mark.parametrize(
    ("payload", "global_name"),
    [
        (_Reduces(os.system, "touch PWNED"), f"{os.system.__module__}.system"),
        (_Reduces(eval, "__import__('pathlib').Path('PWNED').touch()"), "builtins.eval"),
        (Custom(), "tests.formats.test_gen_dgrl.Custom"),
    ],
    ids=["os.system", "builtins.eval", "custom-class"],
)
def test_the_restricted_unpickler_refuses_other_globals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: Any, global_name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    archive = _pickled_member(tmp_path, payload)
    line = _refused(download(archive, "gd"), str(archive), "member 'g/evil.npy'", f"asks for {global_name}")
    assert "not part of a numpy array" in line
    assert not (tmp_path / "PWNED").exists()


def test_allow_pickle_reads_a_benign_pickle_the_restriction_refuses(tmp_path: Path) -> None:
    """An ``OrderedDict`` trajectory (``collections.OrderedDict`` is no numpy global)."""
    rng = np.random.default_rng(1)
    traj = procgen_trajectory(rng, 4, side=8)
    member = npy_bytes(OrderedDict(as_torchrl_member(traj)))
    archive = write_tar(tmp_path / "od.tar.xz", [("g/od.npy", member)])
    _refused(download(archive, "gd", "--format", "gen_dgrl"), "asks for collections.OrderedDict")
    result = download(archive, "gd", "--allow-pickle")
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(np.asarray(open_dataset("gd").column("action")[:]), traj.arrays["actions"])


def test_protocol_2_and_5_pickles_of_arrays_are_read(tmp_path: Path) -> None:
    """Pickles of other protocols ask for ``_codecs.encode`` (2) and ``_frombuffer`` (5)."""
    import pickle

    rng = np.random.default_rng(2)
    traj = procgen_trajectory(rng, 3, side=8)
    members = []
    for protocol in (2, 5):
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "|O", "fortran_order": False, "shape": ()})
        body = pickle.dumps(np.array(as_torchrl_member(traj) | {}, dtype=object), protocol=protocol)
        members.append((f"g/p{protocol}.npy", header.getvalue() + body))
    archive = write_tar(tmp_path / "p.tar.xz", members)
    result = download(archive, "gd")
    assert result.exit_code == 0, result.output
    assert open_dataset("gd").episodes["length"].tolist() == [3, 3]


# ----------------------------------------------------------------------------- hostile archives


def _tar_with(tmp_path: Path, extra: tarfile.TarInfo, data: bytes = b"") -> Path:
    """A ``.tar.xz`` whose first member is a good trajectory and whose second is ``extra``."""
    rng = np.random.default_rng(0)
    good = procgen_trajectory(rng, 3, side=8)
    archive = tmp_path / "bad.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        blob = npz_bytes(good.arrays)
        info = tarfile.TarInfo("g/good.npz")
        info.size = len(blob)
        tf.addfile(info, io.BytesIO(blob))
        extra.size = len(data) if extra.isfile() else 0
        tf.addfile(extra, io.BytesIO(data) if extra.isfile() else None)
    return archive


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    ("member", "needle"),
    [
        (_member("../escape.npz"), "escapes the archive"),
        (_member("/etc/abs.npz"), "absolute path"),
        (_member("g/link.npz", tarfile.SYMTYPE, "/etc/passwd"), "is a link (to '/etc/passwd')"),
        (_member("g/hard.npz", tarfile.LNKTYPE, "g/good.npz"), "is a link (to 'g/good.npz')"),
        (_member("g/dev", tarfile.CHRTYPE), "is a device or FIFO"),
        (_member("g/fifo", tarfile.FIFOTYPE), "is a device or FIFO"),
        (_member("g/good.npz"), "appears twice"),
    ],
    ids=["dotdot", "absolute", "symlink", "hardlink", "device", "fifo", "duplicate"],
)
def test_unsafe_members_are_refused(tmp_path: Path, member: tarfile.TarInfo, needle: str) -> None:
    data = (
        npz_bytes(procgen_trajectory(np.random.default_rng(1), 2, side=8).arrays) if member.isfile() else b""
    )
    archive = _tar_with(tmp_path, member, data)
    _refused(download(archive, "gd"), str(archive), f"member {member.name!r}", needle)


def test_a_truncated_archive(tmp_path: Path) -> None:
    archive, _ = gen_dgrl_archive(tmp_path / "t.tar.xz", episodes=3, steps=30, side=32, preset=0)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) * 2 // 3])
    _refused(download(archive, "gd", "--format", "gen_dgrl"), str(archive), "damaged tar archive")


def test_a_decompression_bomb_is_refused(tmp_path: Path) -> None:
    """Constant frames inflate over 200-fold: refused once past 64 MiB, like any archive bomb."""
    archive = _constant_archive(tmp_path / "bomb.tar.xz", members=8, steps=1000, dtype=np.uint8)
    line = _refused(download(archive, "gd", "--format", "gen_dgrl"), str(archive), "decompression bomb")
    assert "ratio over 200" in line


# ----------------------------------------------------------------------------- bad trajectories


def _one_member(tmp_path: Path, arrays: dict[str, Any], kind: str = "npz") -> Path:
    blob = npz_bytes(arrays) if kind == "npz" else npy_bytes(arrays)
    return write_tar(tmp_path / f"one-{kind}.tar.xz", [(f"g/t.{kind}", blob)])


@pytest.mark.parametrize("kind", ["npz", "npy"])
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            {"rewards": np.zeros((4, 1), np.float32)},
            "'rewards' has 4 rows, 'actions' has 5 (ragged trajectory)",
        ),
        ({"observations": np.zeros((5, 3, 8, 8), np.float32)}, "'observations' has 5 rows, expected 6"),
        ({"observations": np.full((6, 3, 8, 8), 256.0, np.float32)}, "holds 256.0 at (0, 0, 0, 0)"),
        ({"observations": np.full((6, 3, 8, 8), 0.5, np.float32)}, "holds 0.5 at (0, 0, 0, 0)"),
        ({"observations": np.full((6, 3, 8, 8), -1, np.int16)}, "holds -1 at (0, 0, 0, 0)"),
        ({"observations": np.full((6, 3, 8, 8), np.nan, np.float32)}, "holds nan at"),
        ({"dones": np.array([0, 0, 2, 0, 1], np.float32)}, "'dones' holds 2.0 at row 2; expected 0 or 1"),
        ({"dones": None}, "has no 'dones' array"),
        ({"actions": np.array(["a"] * 5)}, "'actions' holds fixed-width unicode strings"),
    ],
    ids=[
        "ragged-rewards",
        "ragged-obs",
        "over-255",
        "fraction",
        "negative",
        "nan",
        "dones-2",
        "missing",
        "strings",
    ],
)
def test_bad_trajectories_are_refused(tmp_path: Path, kind: str, change: dict[str, Any], needle: str) -> None:
    arrays = procgen_trajectory(np.random.default_rng(4), 5, side=8).arrays | change
    arrays = {k: v for k, v in arrays.items() if v is not None}
    archive = _one_member(tmp_path, arrays, kind)
    _refused(download(archive, "gd", "--format", "gen_dgrl"), f"{archive}: member 'g/t.{kind}'", needle)


def test_trajectories_of_different_dtypes_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    first, second = (procgen_trajectory(rng, 3, index=i, side=8) for i in range(2))
    second.arrays["actions"] = second.arrays["actions"].astype(np.int32)
    archive = write_tar(tmp_path / "mixed.tar.xz", members_of([first, second], kinds="npz"))
    line = _refused(
        download(archive, "gd"), "'action' has shape (1,) dtype int32", "(mixed shapes across episodes)"
    )
    assert second.collector_name() in line and first.collector_name() in line


def test_a_plain_npy_member_and_a_pickled_list(tmp_path: Path) -> None:
    plain = io.BytesIO()
    np.save(plain, np.zeros((3, 2)))
    archive = write_tar(tmp_path / "plain.tar.xz", [("g/t.npy", plain.getvalue())])
    _refused(
        download(archive, "gd", "--format", "gen_dgrl"),
        "holds an array of shape (3, 2)",
        "not a pickled dict",
    )
    boxed = np.empty((), object)
    boxed[()] = [1, 2, 3]  # np.save of a 0-d object array holding a list
    listed = write_tar(tmp_path / "list.tar.xz", [("g/t.npy", npy_bytes(boxed))])
    _refused(download(listed, "gd", "--format", "gen_dgrl"), "member 'g/t.npy': holds a list, not a dict")


def test_a_damaged_loose_file(tmp_path: Path) -> None:
    traj = procgen_trajectory(np.random.default_rng(7), 3, side=8)
    path = tmp_path / "t.npy"
    blob = npy_bytes(as_torchrl_member(traj))
    path.write_bytes(blob[: len(blob) // 2])
    _refused(download(path, "gd", "--format", "gen_dgrl"), str(path), "not a readable pickle")


# ----------------------------------------------------------------------------- memory


def _constant_archive(path: Path, members: int, steps: int = 300, dtype: Any = np.float32) -> Path:
    """``members`` trajectories of constant frames (15 MB of float32 frames each for 300 steps, a few
    KB of xz): npz and npy alternating, the same bytes under distinct names."""
    traj = procgen_trajectory(np.random.default_rng(0), steps, constant_frames=7)
    traj.arrays["observations"] = traj.arrays["observations"].astype(dtype)
    npz, npy = npz_bytes(traj.arrays), npy_bytes(as_torchrl_member(traj))
    items = [
        (f"g/{i}_{i}_{steps}_{i}_0.00.np{'yz'[i % 2 == 0]}", npz if i % 2 == 0 else npy)
        for i in range(members)
    ]
    return write_tar(path, items, preset=0)


@pytest.mark.slow
def test_memory_is_bounded_by_a_trajectory_not_the_source(tmp_path: Path) -> None:
    """48 trajectories of 15 MB of float32 frames (710 MB decoded) convert in a process whose
    address space is capped at 320 MB: members are read one at a time, never all at once."""
    archive = _constant_archive(tmp_path / "big.tar.xz", members=48)
    decoded = 48 * 301 * 3 * 64 * 64 * 4
    cap = 320 << 20
    assert decoded > 2 * cap
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
        from rlds_cli.sources.convert import convert
        result = convert({str(archive)!r}, "big", format="gen_dgrl")
        print("steps", result.manifest.num_steps)
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "1",  # a thread's own arena reserves 64 MB of the capped address space
        "RLDS_ARCHIVE_MAX_RATIO": "1000000",  # constant frames: a bomb by ratio, trusted here
    }
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"steps {48 * 300}" in proc.stdout
    ds = open_dataset("big")
    assert ds.num_episodes == 48 and int(np.asarray(ds.column("observation")[:301]).max()) == 7


# ----------------------------------------------------------------------------- registry


def test_registry_entries_follow_torchrl_and_are_generated() -> None:
    """128 ids (16 games x 8 categories), TorchRL's URL rule, and the committed file is what
    ``scripts/gen_registry.py --family gen_dgrl`` writes."""
    import importlib.util
    import sys

    from rlds_cli.catalog import registry

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        where = REPO / "scripts" / "registry_gen_dgrl.py"
        spec = importlib.util.spec_from_file_location("registry_gen_dgrl", where)
        assert spec is not None and spec.loader is not None
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert (REPO / "registry" / "gen_dgrl.toml").read_text(encoding="utf-8") == script.render()[0]
    registry._load.cache_clear()
    entries = [e for e in registry.entries() if e.format == "gen_dgrl"]
    assert len(entries) == 128
    entry = registry.resolve("gen_dgrl/coinrun-level_40_S")
    assert entry.id == "coinrun-level_40_S" and entry.cache_name == "coinrun-level_40_S"
    (file,) = entry.files
    assert file.name == "coinrun.tar.xz" and file.sha256 is None
    assert file.urls == (
        "https://dl.fbaipublicfiles.com/DGRL/Procgen/Datasets/Compressed/100k/level_40/suboptimal/coinrun.tar.xz",
    )
    assert registry.resolve("bigfish-25M").files[0].urls[0].endswith("/25M/level_200/expert/bigfish.tar.xz")
