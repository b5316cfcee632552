"""OGBench ``.npz`` conversion: golden values, rewards rule, splits, streaming, bad files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import SourceFormatError
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import golden_ogbench, ogbench_arrays, write_ogbench


def test_golden_values(tmp_path: Path) -> None:
    m = convert(golden_ogbench(tmp_path / "cube-single-play-v0.npz"), "og").manifest
    ds = open_dataset("og")
    assert m.source["format"] == "ogbench"
    # rows 0-3 -> 3 transitions; row 4 alone -> dropped; rows 5-8 -> 3 transitions
    assert (ds.num_steps, ds.num_episodes) == (6, 2)
    b = ds[:]
    assert b["observation"][:, 0].tolist() == [0, 1, 2, 5, 6, 7]
    assert b["next/observation"][:, 0].tolist() == [1, 2, 3, 6, 7, 8]
    assert b["action"][:, 0].tolist() == [0, -1, -2, -5, -6, -7]  # the end rows' actions are not stored
    assert b["info/qpos"][:, 0].tolist() == [0, 0.5, 1, 2.5, 3, 3.5]
    assert b["next/info/qvel"][:, 0].tolist() == [0.25, 0.5, 0.75, 1.5, 1.75, 2.0]
    assert b["next/reward"].tolist() == [[0.0]] * 6
    assert b["next/reward"].dtype == np.float32
    assert b["next/terminated"].sum() == 0
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 1, 0, 0, 1]
    conv = m.conversion
    assert (conv["dropped_rows"], conv["dropped_episodes"]) == (3, 1)
    assert any("no rewards" in n for n in conv["notes"])


def test_rewards_array_is_used_when_present(tmp_path: Path) -> None:
    arrays = ogbench_arrays([3], 4)
    arrays["rewards"] = np.array([1, 2, 3, 4], np.float32)
    convert(write_ogbench(tmp_path / "task.npz", arrays), "rw")
    ds = open_dataset("rw")
    assert ds[:]["next/reward"][:, 0].tolist() == [1, 2, 3]
    assert not any("no rewards" in n for n in ds.manifest.conversion["notes"])


def test_train_and_val_files_in_a_directory(tmp_path: Path) -> None:
    d = tmp_path / "og"
    d.mkdir()
    write_ogbench(d / "antmaze-v0.npz", ogbench_arrays([2, 5], 6))
    write_ogbench(d / "antmaze-v0-val.npz", ogbench_arrays([2], 3))
    m = convert(d, "both").manifest
    ds = open_dataset("both")
    assert [f["path"] for f in m.source["files"]] == ["antmaze-v0.npz", "antmaze-v0-val.npz"]
    assert ds.episodes["length"].tolist() == [2, 2, 2]
    assert ds.source_arrays["ogbench/episode_file"].tolist() == [0, 0, 1]
    # one split alone
    assert convert(d / "antmaze-v0-val.npz", "val").manifest.num_steps == 2


@pytest.mark.parametrize("block_rows", [1, 2, 3, 5])
def test_tiny_blocks_byte_identical(tmp_path: Path, block_rows: int) -> None:
    arrays = ogbench_arrays([0, 3, 4, 5, 9, 10, 16], 17)
    path = write_ogbench(tmp_path / "x.npz", arrays)
    ref = convert(path, "ref")
    other = convert(path, f"b{block_rows}", options={"block_rows": block_rows})
    for p in sorted(ref.path.rglob("*.npy")):
        assert p.read_bytes() == (other.path / p.relative_to(ref.path)).read_bytes()
    assert ref.manifest.conversion == other.manifest.conversion
    # rows 0, 4, 5 and 10 are one-row trajectories (dropped); 1-3, 6-9 and 11-16 remain
    assert (ref.manifest.num_episodes, ref.manifest.num_steps) == (3, 10)
    assert ref.manifest.conversion["dropped_episodes"] == 4


def test_uncompressed_npz_and_int_actions(tmp_path: Path) -> None:
    arrays = ogbench_arrays([2], 3)
    arrays["actions"] = np.array([4, 5, 6], np.int32)
    np.savez(tmp_path / "powder.npz", **arrays)
    ds = open_dataset(convert(tmp_path / "powder.npz", "p").manifest.name)
    assert ds.fields["action"] == ((), "int32")
    assert ds[:]["action"].tolist() == [4, 5]


def test_bad_files(tmp_path: Path) -> None:
    arrays = ogbench_arrays([4], 5)
    no_term = {k: v for k, v in arrays.items() if k != "terminals"}
    with pytest.raises(SourceFormatError, match=r"no 'terminals' array"):
        convert(write_ogbench(tmp_path / "a.npz", no_term), "bad", format="ogbench")
    with pytest.raises(SourceFormatError, match=r"ragged.npz: 'qpos' has 4 rows but 'observations' has 5"):
        convert(write_ogbench(tmp_path / "ragged.npz", {**arrays, "qpos": arrays["qpos"][:4]}), "bad")
    with pytest.raises(SourceFormatError, match=r"holds Python objects"):
        obj = np.empty(5, object)
        convert(write_ogbench(tmp_path / "obj.npz", {**arrays, "qpos": obj}), "bad")
    d = tmp_path / "mixed"
    d.mkdir()
    write_ogbench(d / "a.npz", arrays)
    write_ogbench(d / "b.npz", {**arrays, "qvel": np.zeros((5, 3), np.float32)})
    with pytest.raises(SourceFormatError, match=r"b.npz: arrays \['qvel'\] differ"):
        convert(d, "bad")


def test_truncated_and_corrupt(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = ogbench_arrays([99], 100)
    arrays["observations"] = rng.standard_normal((100, 64)).astype(np.float32)
    path = write_ogbench(tmp_path / "t.npz", arrays)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceFormatError, match=r"t.npz"):
        convert(path, "bad", format="ogbench")
    # a flipped byte inside the compressed observations: zlib or the CRC check catches it
    path.write_bytes(data)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("observations.npy")
    corrupt = bytearray(data)
    pos = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2
    corrupt[pos] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    with pytest.raises(SourceFormatError, match=r"t.npz: reading array 'observations' failed"):
        convert(path, "bad", format="ogbench")
