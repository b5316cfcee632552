"""``rlds export``: TorchRL memmap, D4RL HDF5, npz; and importing them back."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import ExportError, UnknownFormatError
from rlds_cli.export import export_dataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import GOLDEN_NO_NEXT, GoldenFactory

runner = CliRunner()
#: The golden file's TED columns without next_observations (what the ``golden`` fixture holds).
GOLDEN = GOLDEN_NO_NEXT["columns"]


pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


@pytest.fixture(params=["memmap", "zarr"])
def golden(request: pytest.FixtureRequest, golden_dataset: GoldenFactory) -> Dataset:
    """The golden file without next_observations: one synthesized final observation, rows dropped."""
    return golden_dataset("g", backend=request.param)


def _same(a: Dataset, b: Dataset) -> None:
    x, y = a[:], b[:]
    assert sorted(x) == sorted(y)
    for key in x:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    assert a.episodes[["start", "length"]].tolist() == b.episodes[["start", "length"]].tolist()


def test_d4rl_export_columns(golden: Dataset, tmp_path: Path) -> None:
    out = export_dataset(golden, tmp_path / "out.hdf5", "d4rl")
    with h5py.File(out) as f:
        assert sorted(f.keys()) == [
            "actions",
            "infos",
            "metadata",  # the source's (the golden file has some)
            "next_observations",
            "observations",
            "rewards",
            "terminals",
            "timeouts",
        ]
        assert f["observations"][:].tolist() == GOLDEN["observation"]
        assert f["next_observations"][:].tolist() == GOLDEN["next/observation"]
        assert f["rewards"][:].tolist() == [r for (r,) in GOLDEN["next/reward"]]  # D4RL: 1-D
        assert f["terminals"][:].tolist() == [t for (t,) in GOLDEN["next/terminated"]]
        assert f["timeouts"][:].tolist() == [t for (t,) in GOLDEN["next/truncated"]]
        assert f["infos/qpos"][:].tolist() == GOLDEN["info/qpos"]
        assert f["actions"][:].tolist() == GOLDEN["action"]


@pytest.mark.parametrize("to", ["d4rl", "robomimic"])
def test_an_hdf5_export_refused_by_the_os_names_its_path(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    """h5py's PermissionError (a folder the user may not write in) names no file: the line said
    "permission denied: (unknown file)"."""
    import errno

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Unable to synchronously create file")

    monkeypatch.setattr(h5py, "File", refused)
    out = tmp_path / f"out.{to}.hdf5"
    result = runner.invoke(app, ["export", golden.name, str(out), "--to", to])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == f"error: permission denied: {out}", result.output
    assert not list(tmp_path.glob("out.*"))


def test_d4rl_round_trip(golden: Dataset, tmp_path: Path) -> None:
    out = export_dataset(golden, tmp_path / "out.hdf5", "d4rl")
    convert(out, "back")
    _same(golden, open_dataset("back"))


def test_d4rl_round_trip_keeps_the_sources_metadata(tmp_path: Path) -> None:
    """A D4RL file's metadata/ (algorithm, env, max_episode_steps) was kept in the cache but not
    written by --to d4rl: export, then download, lost it."""
    from tests.d4rl_fixtures import golden_three_episodes

    source = golden_three_episodes(tmp_path / "src.hdf5", with_next=True)
    with h5py.File(source, "r+") as f:
        del f["metadata/algorithm"]
        f["metadata/algorithm"] = "SAC"
        f["metadata/env"] = "Hopper-v2"
        f["metadata/sizes"] = np.array([3, 4])
        f["metadata"].attrs["max_episode_steps"] = 1000
        f["metadata/env"].attrs["version"] = "v2"
        f.attrs["env_name"] = "hopper-medium-v2"
    convert(source, "src")
    kept = open_dataset("src").source_metadata
    assert kept["metadata/algorithm"] == "SAC" and kept["metadata@max_episode_steps"] == 1000
    out = export_dataset(open_dataset("src"), tmp_path / "out.hdf5", "d4rl")
    convert(out, "back")
    back = {
        k: v
        for k, v in open_dataset("back").source_metadata.items()
        if k not in ("@exported_by", "@source_dataset")
    }
    assert back == kept


def test_npz_matches_d4rl_export(golden: Dataset, tmp_path: Path) -> None:
    h5 = export_dataset(golden, tmp_path / "out.hdf5", "d4rl")
    npz = export_dataset(golden, tmp_path / "out.npz", "npz")
    with np.load(npz) as z, h5py.File(h5) as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        names = [n for n in names if not n.startswith("metadata/")]  # the source's: HDF5 only
        assert sorted(z.files) == sorted(names)
        for name in names:
            np.testing.assert_array_equal(z[name], f[name][:], err_msg=name)
            assert z[name].dtype == f[name].dtype


def test_torchrl_memmap_layout(golden: Dataset, tmp_path: Path) -> None:
    out = export_dataset(golden, tmp_path / "td", "torchrl")
    root = json.loads((out / "meta.json").read_text())
    assert root["shape"] == [6] and root["_type"] == "<class 'tensordict._td.TensorDict'>"
    assert root["next"] == {"type": "TensorDict"} and root["info"] == {"type": "TensorDict"}
    assert root["observation"] == {
        "device": "cpu",
        "shape": [6, 2],
        "dtype": "torch.float32",
        "is_nested": False,
    }
    nxt = json.loads((out / "next" / "meta.json").read_text())
    assert sorted(k for k in nxt if k not in ("shape", "device", "_type")) == [
        "done",
        "observation",
        "reward",
        "terminated",
        "truncated",
    ]
    obs = np.fromfile(out / "next" / "observation.memmap", np.float32).reshape(6, 2)
    assert obs.tolist() == GOLDEN["next/observation"]
    assert np.fromfile(out / "episode.memmap", np.int64).tolist() == GOLDEN["episode"]
    assert np.fromfile(out / "done.memmap", np.bool_).tolist() == [False] * 6
    assert np.fromfile(out / "next" / "done.memmap", np.bool_).tolist() == [d for (d,) in GOLDEN["next/done"]]


def test_torchrl_memmap_loads_with_tensordict(golden: Dataset, tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    out = export_dataset(golden, tmp_path / "td", "torchrl")
    td = tensordict.TensorDict.load_memmap(out)
    batch = golden[:]
    for key, value in batch.items():
        np.testing.assert_array_equal(td[tuple(key.split("/"))].numpy(), value, err_msg=key)


def test_a_key_named_as_a_memmap_meta_field_is_refused(tmp_path: Path) -> None:
    """``info/shape`` was exported, and lost: the level's own ``shape`` wrote over its meta.json
    entry, so tensordict loaded no such key."""
    import rlds_cli
    from rlds_cli.errors import ExportError

    obs = np.zeros((4, 2), np.float32)
    with rlds_cli.DatasetWriter("metas", root=tmp_path, mode="create") as writer:
        episode = {
            "observation": obs[:-1],
            "next/observation": obs[1:],
            "action": np.zeros((3, 1), np.float32),
        }
        episode |= {"next/reward": np.zeros(3, np.float32), "next/terminated": np.arange(3) == 2}
        episode |= {"next/truncated": np.zeros(3, bool), "info/shape": np.ones((3, 2), np.float32)}
        writer.add_episode(episode)
    ds = rlds_cli.open_dataset("metas", root=tmp_path)
    with pytest.raises(ExportError, match="key 'info/shape' holds the name 'shape'"):
        export_dataset(ds, tmp_path / "td", "torchrl")
    assert not (tmp_path / "td").exists()


def test_torchrl_round_trip(golden: Dataset, tmp_path: Path) -> None:
    out = export_dataset(golden, tmp_path / "td", "torchrl")
    result = convert(out, "back", format="torchrl")
    assert result.manifest.conversion["inferred_boundaries"] == 0
    _same(golden, open_dataset("back"))


def test_existing_target_needs_overwrite(golden: Dataset, tmp_path: Path) -> None:
    out = tmp_path / "x.hdf5"
    out.write_bytes(b"keep me")
    with pytest.raises(ExportError, match="already exists"):
        export_dataset(golden, out, "d4rl")
    assert out.read_bytes() == b"keep me"
    with pytest.raises(ExportError, match="is a file that is no earlier export of this format"):
        export_dataset(golden, out, "d4rl", overwrite=True)  # not an HDF5 file: not an export
    assert out.read_bytes() == b"keep me"
    out.write_bytes(b"")
    export_dataset(golden, out, "d4rl", overwrite=True)
    assert h5py.is_hdf5(out)
    export_dataset(golden, out, "d4rl", overwrite=True)  # an earlier export: replaced


def test_unknown_format(golden: Dataset, tmp_path: Path) -> None:
    with pytest.raises(UnknownFormatError, match="unknown export format 'parquet'"):
        export_dataset(golden, tmp_path / "x", "parquet")


def test_failed_export_leaves_nothing(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli.export import d4rl

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(d4rl, "_chunks", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export_dataset(golden, tmp_path / "x.hdf5", "d4rl")
    assert list(tmp_path.glob("*x.hdf5*")) == []


def test_cli_export(golden: Dataset, tmp_path: Path) -> None:
    out = tmp_path / "cli.hdf5"
    result = runner.invoke(app, ["export", "g", str(out), "--to", "d4rl", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"name": "g", "format": "d4rl", "path": str(out), "num_steps": 6}
    again = runner.invoke(app, ["export", "g", str(out), "--to", "d4rl"])
    assert again.exit_code == 1
    assert again.stderr.splitlines()[0] == f"error: {out} already exists"
    assert runner.invoke(app, ["export", "g", str(out), "--to", "d4rl", "--force"]).exit_code == 0
    bad = runner.invoke(app, ["export", "g", str(tmp_path / "y"), "--to", "parquet"])
    assert bad.exit_code == 1
    assert bad.stderr.splitlines()[0] == "error: unknown export format 'parquet'"
    missing = runner.invoke(app, ["export", "nope", str(tmp_path / "z")])
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: no dataset named 'nope'")


def test_minari_export_reads_back_with_minari(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    out = export_dataset(golden, tmp_path / "minari" / "golden-v0", "minari")
    loaded = minari.load_dataset("golden-v0")
    assert (loaded.total_episodes, loaded.total_steps) == (3, 6)
    for i, episode in enumerate(loaded.iterate_episodes()):
        ours = golden.episode(i)
        np.testing.assert_array_equal(
            episode.observations, np.concatenate([ours["observation"], ours["next/observation"][-1:]])
        )
        np.testing.assert_array_equal(episode.actions, ours["action"])
        np.testing.assert_array_equal(episode.rewards, ours["next/reward"][:, 0])
        np.testing.assert_array_equal(episode.terminations, ours["next/terminated"][:, 0])
        np.testing.assert_array_equal(episode.truncations, ours["next/truncated"][:, 0])
        np.testing.assert_array_equal(episode.infos["qpos"], ours["info/qpos"])
    convert(out, "back")
    _same(golden, open_dataset("back"))


def test_minari_export_gives_bool_keys_a_bool_box(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bool observation was declared ``Box(0, 255, uint8)``: a space whose dtype and range are
    not the data's (a policy built from the space saw 256 values)."""
    minari = pytest.importorskip("minari")
    from rlds_cli.write.writer import DatasetWriter

    with DatasetWriter("b", root=isolated_cache) as writer:
        for t in range(3):
            writer.add_step(
                observation={"pos": np.full(2, t, np.float32), "contact": np.array([t % 2 == 0, t > 0])},
                action=np.zeros(1, np.float32),
                reward=1.0,
                terminated=np.bool_(t == 2),
                truncated=np.bool_(False),
                next_observation={
                    "pos": np.full(2, t + 1, np.float32),
                    "contact": np.array([t % 2 == 1, True]),
                },
            )
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    export_dataset(open_dataset("b"), tmp_path / "minari" / "b-v0", "minari")
    loaded = minari.load_dataset("b-v0")
    space = loaded.observation_space["contact"]
    assert (type(space).__name__, space.dtype, space.shape) == ("Box", np.dtype(bool), (2,))
    episode = next(iter(loaded.iterate_episodes()))
    assert episode.observations["contact"].dtype == bool
    assert all(space.contains(row) for row in episode.observations["contact"])
    back = convert(tmp_path / "minari" / "b-v0", "back")
    assert back.manifest.fields["observation/contact"].dtype == "bool"


@pytest.mark.parametrize("codec", ["jpeg", "png"])
def test_minari_export_of_frames(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    """JPEG frames are written as minari writes its own (their stored bytes, ``jpeg_encoding``
    true); frames in another codec are written decoded, ``jpeg_encoding`` false. Either way
    minari reads what rlds reads, and rlds reads the export back the same."""
    minari = pytest.importorskip("minari")
    from tests.frames_fixtures import build_frames

    build_frames(isolated_cache, "cam", [4, 3], codec, prefix="observation/")
    ds = open_dataset("cam")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    out = export_dataset(ds, tmp_path / "minari" / "cam-v0", "minari")
    meta = json.loads((out / "data" / "metadata.json").read_text())
    assert meta["jpeg_encoding"] is (codec == "jpeg")
    loaded = minari.load_dataset("cam-v0")
    for i, episode in enumerate(loaded.iterate_episodes()):
        ours = ds.episode(i)
        want = np.concatenate([ours["observation/pixels"], ours["next/observation/pixels"][-1:]])
        np.testing.assert_array_equal(episode.observations["pixels"], want)
    if codec == "jpeg":
        with h5py.File(out / "data" / "main_data.hdf5") as f:
            written = bytes(f["episode_1/observations/pixels"][0])
        assert written == bytes(
            ds.column("observation/pixels").frame_bytes(5)
        )  # episode 1's first row: kept bytes
    back = convert(out, "back").manifest
    assert back.fields["observation/pixels"].codec == ("jpeg" if codec == "jpeg" else "raw")
    back_pixels = open_dataset("back").column("observation/pixels")[:]
    np.testing.assert_array_equal(back_pixels, ds.column("observation/pixels")[:])


def test_minari_export_of_identical_jpeg_files(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A static camera: every JPEG file of an episode of one length (h5py would make them a 2-D
    array if written at once)."""
    minari = pytest.importorskip("minari")
    from rlds_cli.cache.builder import DatasetBuilder
    from tests.frames_fixtures import frames_block

    block, _ = frames_block([3, 2], prefix="observation/")
    still = np.broadcast_to(
        block.observations["observation/pixels"][:1], block.observations["observation/pixels"].shape
    )
    block.observations["observation/pixels"] = np.ascontiguousarray(still)  # type: ignore[index]
    with DatasetBuilder("still", frames="jpeg") as builder:
        builder.append(block)
        builder.commit()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    export_dataset(open_dataset("still"), tmp_path / "minari" / "still-v0", "minari")
    episode = next(iter(minari.load_dataset("still-v0").iterate_episodes()))
    np.testing.assert_array_equal(
        episode.observations["pixels"], open_dataset("still").episode(0)["observation/pixels"][[0, 0, 0, 0]]
    )


def test_minari_export_needs_a_minari_id(golden: Dataset, tmp_path: Path) -> None:
    pytest.importorskip("minari")
    with pytest.raises(ExportError, match="is not a Minari dataset id"):
        export_dataset(golden, tmp_path / "no_version", "minari")


def test_npz_round_trip(golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The D4RL layout in an .npz is detected and read back by the D4RL reader, in small blocks."""
    out = export_dataset(golden, tmp_path / "out.npz", "npz")
    convert(out, "back", options={"block_rows": 2})
    _same(golden, open_dataset("back"))
    assert open_dataset("back").manifest.source["format"] == "d4rl"


def test_export_help_names_every_format() -> None:
    """`rlds export --help` names each format `--to` takes, in its summary and in the option."""
    from rlds_cli.export import EXPORTERS

    result = runner.invoke(app, ["export", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    summary = result.output.split("Export a dataset to", 1)[1].split("\n\n", 1)[0].lower()
    for name in EXPORTERS:
        assert name in summary, f"{name} is missing from the summary: {summary!r}"
        assert result.output.lower().count(name) >= 2, name  # the summary and --to


def _robomimic_with(path: Path, extra: dict[str, np.ndarray]) -> Path:
    """A one-demo robomimic file with ``extra`` observation keys beside ``pos``."""
    with h5py.File(path, "w") as f:
        demo = f.create_group("data/demo_0")
        demo["actions"] = np.zeros((3, 2))
        demo["rewards"] = np.zeros(3)
        demo["dones"] = np.array([0, 0, 1])
        demo["obs/pos"] = np.zeros((3, 2))
        for key, values in extra.items():
            demo[f"obs/{key}"] = values
    return path


def _convert(source: Path, name: str) -> None:
    result = runner.invoke(app, ["download", str(source), "--format", "robomimic", "--name", name, "-q"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("to", ["rlds", "lerobot"])
def test_complex_numbers_are_refused_where_the_format_has_no_type_for_them(tmp_path: Path, to: str) -> None:
    """A cast would keep the real parts as integers (the RLDS export wrote 0.5+2j as 0, exit 0);
    LeRobot's parquet failed with a raw pyarrow error."""
    if to == "lerobot":
        pytest.importorskip("pyarrow")
    values = np.array([[0.5 + 2j, 1.75 - 3j], [2.5 + 1j, -0.25 + 0j], [3.9 + 9j, 4.1 + 4j]])
    source = _robomimic_with(tmp_path / "c.hdf5", {"c": values})
    _convert(source, "c")
    out = tmp_path / f"out.{to}"
    result = runner.invoke(app, ["export", "c", str(out), "--to", to])
    assert result.exit_code == 1
    assert "'observation/c' holds complex numbers (complex128)" in result.output
    assert "Traceback" not in result.output and not out.exists()
    back = tmp_path / "back.hdf5"
    assert runner.invoke(app, ["export", "c", str(back), "--to", "robomimic"]).exit_code == 0
    with h5py.File(back) as f:
        np.testing.assert_array_equal(f["data/demo_0/obs/c"][()], values)


def test_keys_that_clash_as_lerobot_names_are_named(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    source = _robomimic_with(tmp_path / "k.hdf5", {"a.b": np.zeros((3, 1)), "a/b": np.ones((3, 1))})
    _convert(source, "k")
    result = runner.invoke(app, ["export", "k", str(tmp_path / "out"), "--to", "lerobot"])
    assert result.exit_code == 1
    named = "'observation/a.b', 'observation/a/b' map to the LeRobot feature name(s) 'observation.a.b'"
    assert named in result.output
    assert "--force" not in result.output and "observation/pos" not in result.output


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
@pytest.mark.parametrize("to", ["npz", "torchrl", "d4rl"])
def test_a_damaged_dataset_is_refused_not_exported(to: str, storage: str, tmp_path: Path) -> None:
    """One flipped byte of a column (the file's size unchanged): the export names the damaged key
    and writes nothing, as merge does, instead of copying the damage out as data."""
    result = runner.invoke(app, ["download", "demo", "--storage", storage, "--name", "d", "-q"])
    assert result.exit_code == 0, result.output
    arrays = open_dataset("d").directory / "arrays"
    column = arrays / "action.npy" if storage == "memmap" else arrays / "action" / "c" / "0" / "0"
    data = bytearray(column.read_bytes())
    data[-5] ^= 0x01
    column.write_bytes(bytes(data))
    out = tmp_path / ("out.npz" if to == "npz" else "out.hdf5" if to == "d4rl" else "out")
    result = runner.invoke(app, ["export", "d", str(out), "--to", to])
    assert result.exit_code == 1, result.output
    line = result.stderr.splitlines()[0]
    assert line.startswith("error: dataset 'd' is damaged") and "action" in line, line
    assert not out.exists() and not list(tmp_path.glob("*.partial*"))


@pytest.mark.parametrize("to", ["npz", "torchrl", "d4rl"])
def test_the_current_folder_and_its_parents_are_never_replaced(
    to: str, golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rlds export NAME .. --force`` removed the folder the user was in and everything beside it,
    then failed with 'unexpected OSError'; ``.`` failed with 'unexpected ValueError'."""
    here = tmp_path / "project" / "work"
    here.mkdir(parents=True)
    (here / "mine.txt").write_text("keep")
    (tmp_path / "project" / "other.txt").write_text("keep")
    monkeypatch.chdir(here)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for out in (".", "..", str(tmp_path / "project"), str(tmp_path / "home")):
        result = runner.invoke(app, ["export", golden.name, out, "--to", to, "--force"])
        assert result.exit_code == 1, (out, result.output)
        assert "the current folder, a folder holding it or the home folder" in " ".join(result.output.split())
        assert "unexpected" not in result.output
    assert (here / "mine.txt").read_text() == "keep" == (tmp_path / "project" / "other.txt").read_text()
    assert sorted(p.name for p in (tmp_path / "project").iterdir()) == ["other.txt", "work"]


@pytest.mark.parametrize("to", ["npz", "d4rl", "robomimic"])
def test_a_file_export_never_replaces_a_folder(to: str, golden: Dataset, tmp_path: Path) -> None:
    """``rlds export NAME exports/ --to d4rl --force`` removed the folder ``exports`` and every file
    in it, and wrote one HDF5 file in its place."""
    folder = tmp_path / "exports"
    (folder / "run1").mkdir(parents=True)
    (folder / "results.csv").write_text("keep")
    result = runner.invoke(app, ["export", golden.name, f"{folder}/", "--to", to, "--force"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: {folder} is a folder, and this export is one file")
    assert (folder / "results.csv").read_text() == "keep" and (folder / "run1").is_dir()
    assert runner.invoke(app, ["export", golden.name, str(folder / "g.out"), "--to", to]).exit_code == 0
    # nor another file: a text file, or (npz) an HDF5 source file, was written over, exit 0
    other = "d4rl" if to == "npz" else "npz"
    assert runner.invoke(app, ["export", golden.name, str(folder / "o.out"), "--to", other]).exit_code == 0
    for victim in (folder / "results.csv", folder / "o.out"):
        before = victim.read_bytes()
        result = runner.invoke(app, ["export", golden.name, str(victim), "--to", to, "--force"])
        assert (
            result.exit_code == 1
            and f"{victim} is a file that is no earlier export of this format" in result.output
        )
        assert victim.read_bytes() == before
    again = runner.invoke(app, ["export", golden.name, str(folder / "g.out"), "--to", to, "--force"])
    assert again.exit_code == 0, again.output  # an earlier export of the format is replaced
    # nor the file a cached dataset was converted from (an HDF5 file as an export is)
    source = Path(golden.manifest.source["path"])
    assert source.is_file() and source.suffix == ".hdf5"
    if to != "npz":
        result = runner.invoke(app, ["export", golden.name, str(source), "--to", to, "--force"])
        assert (
            result.exit_code == 1
            and f"{source} is the source dataset {golden.name!r} was converted" in result.output
        )
        moved = source.rename(source.with_suffix(".moved"))  # a source removed since: a free path
        assert runner.invoke(app, ["export", golden.name, str(source), "--to", to]).exit_code == 0
        source.unlink()
        moved.rename(source)
    (folder / "empty").touch()
    assert (
        runner.invoke(app, ["export", golden.name, str(folder / "empty"), "--to", to, "--force"]).exit_code
        == 0
    )


@pytest.mark.parametrize("to", ["torchrl", "rlds", "lerobot", "minari", "amago"])
def test_a_folder_export_replaces_only_an_earlier_export(to: str, golden: Dataset, tmp_path: Path) -> None:
    """``rlds export NAME results --to rlds --force`` removed the folder ``results`` and every file
    in it (and a file named as OUT); ``--force`` replaces an empty folder or an earlier export of
    that format only."""
    if to == "rlds":
        pytest.importorskip("crc32c")
    if to == "lerobot":
        pytest.importorskip("pyarrow")
    if to == "minari":
        pytest.importorskip("minari")
    folder, file, empty = tmp_path / "results-v0", tmp_path / "notes-v0", tmp_path / "empty-v0"  # minari ids
    (folder / "run1").mkdir(parents=True)
    (folder / "results.csv").write_text("keep")
    file.write_text("keep")
    for out, says in ((folder, "is a folder that holds no earlier export"), (file, "is a file")):
        result = runner.invoke(app, ["export", golden.name, str(out), "--to", to, "--force"])
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"error: {out} {says}"), result.output
    assert (folder / "results.csv").read_text() == "keep" and (folder / "run1").is_dir()
    assert file.read_text() == "keep"
    empty.mkdir()
    for _ in range(2):  # an empty folder, then the export it became
        result = runner.invoke(app, ["export", golden.name, str(empty), "--to", to, "--force"])
        assert result.exit_code == 0, result.output


def test_a_dict_action_is_refused_by_the_formats_of_one_action_array(tmp_path: Path) -> None:
    """``action/<k>`` keys (a dict action space) gave 'unexpected KeyError' in d4rl, npz, robomimic
    and amago, and a torchrl export that rlds could not read back."""
    from tests.rlds_tfrecord_fixtures import write_rlds_dataset

    pytest.importorskip("tfrecord")
    write_rlds_dataset(tmp_path / "src", (3, 4), dict_action=True)
    convert(tmp_path / "src", "dictact")
    for to in ("d4rl", "npz", "robomimic", "amago", "torchrl", "lerobot"):
        result = runner.invoke(app, ["export", "dictact", str(tmp_path / f"out-{to}"), "--to", to])
        assert result.exit_code == 1, (to, result.output)
        text = " ".join(result.output.split())
        assert "has no single 'action' array (action/" in text and "export to minari or rlds" in text, text
        assert not (tmp_path / f"out-{to}").exists()
    export_dataset(open_dataset("dictact"), tmp_path / "kept", "rlds")  # a format that keeps them


def test_a_dataset_without_an_action_is_refused_by_every_format(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every format holds an action: a dataset without one (no writer makes it; a hand-edited
    manifest can) is refused in one line before anything is written."""
    fields = {k: v for k, v in golden.stored_fields.items() if k != "action"}
    monkeypatch.setattr(type(golden), "stored_fields", property(lambda self: fields))
    for to in ("rlds", "minari", "npz"):
        with pytest.raises(ExportError, match=f"{golden.name} has no action key; the {to} format holds one"):
            export_dataset(golden, tmp_path / to, to)
        assert not (tmp_path / to).exists()


def test_a_path_through_a_file_and_a_full_disk_name_the_output(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file where a folder of the path should be was 'unexpected FileExistsError'; a full disk
    was 'no space left on the device: (unknown file)' with a hint about the cache."""
    import errno

    import h5py

    from rlds_cli.errors import DiskFullError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExportError, match=r"afile\) is a file, not a folder"):
        export_dataset(golden, tmp_path / "afile" / "x.hdf5", "d4rl")

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(h5py.File, "create_dataset", full)
    with pytest.raises(DiskFullError, match=r"no space left on the device writing .*out\.hdf5") as info:
        export_dataset(golden, tmp_path / "out.hdf5", "d4rl")
    assert "export to another disk" in info.value.hint
    assert not (tmp_path / "out.hdf5").exists() and not list(tmp_path.glob("*partial*"))


def test_hdf5_exports_check_the_disk_first_and_name_a_full_one(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HDF5 meeting a full disk raised h5py's RuntimeError ('unexpected RuntimeError', the errno
    only in its text) and could end the process with a segfault as h5py cleaned up: the HDF5
    exports now check the disk for the bytes they write first, and name a disk that fills up."""
    import shutil
    from collections import namedtuple

    from rlds_cli.errors import DiskFullError

    pytest.importorskip("minari")
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - 16, 16))
    (tmp_path / "out").mkdir()
    row = sum(4 * int(np.prod(golden.fields[k][0])) for k in ("observation", "action"))
    for to, name in (("d4rl", "out.hdf5"), ("robomimic", "out.hdf5"), ("minari", "out-v0")):
        with pytest.raises(
            DiskFullError, match=rf"the export to {name} needs [\d,]+ bytes and 16 are free"
        ) as info:
            export_dataset(golden, tmp_path / "out" / name, to)
        assert info.value.hint == "free space there, or export to another disk"
        need = int(str(info.value).split(" needs ")[1].split(" bytes")[0].replace(",", ""))
        assert need >= golden.num_steps * row, to  # at least observations and actions, uncompressed
        assert list((tmp_path / "out").iterdir()) == [], to
    monkeypatch.setattr(shutil, "disk_usage", real)

    def full(*args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "Can't write data (file write failed: time = Sat Nov 28 10:09:35 2026, filename = 'x', "
            "file descriptor = 3, errno = 28, error message = 'No space left on device')"
        )

    monkeypatch.setattr(h5py.File, "create_dataset", full)
    with pytest.raises(DiskFullError, match=r"no space left on the device writing .*out\.hdf5"):
        export_dataset(golden, tmp_path / "out" / "out.hdf5", "d4rl")
    assert list((tmp_path / "out").iterdir()) == []


def test_robomimic_disk_check_counts_the_bytes_written(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check counted ``dones`` at their stored dtype (bool) while robomimic's are written as
    int64: the need fell short of the file's data by 7 bytes a step."""
    import shutil
    from collections import namedtuple

    from rlds_cli.errors import DiskFullError

    written = 0
    with h5py.File(export_dataset(golden, tmp_path / "ok.hdf5", "robomimic"), "r") as f:
        assert f["data/demo_0/dones"].dtype == np.int64

        def add(_: str, obj: object) -> None:
            nonlocal written
            if isinstance(obj, h5py.Dataset):
                written += obj.nbytes

        f["data"].visititems(add)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - 16, 16))
    with pytest.raises(DiskFullError) as info:
        export_dataset(golden, tmp_path / "out.hdf5", "robomimic")
    need = int(str(info.value).split(" needs ")[1].split(" bytes")[0].replace(",", ""))
    assert need >= written


def test_an_export_into_the_caches_tmp_folder_is_refused(golden: Dataset, tmp_path: Path) -> None:
    """Anything under the cache's tmp/ was let through (meant for the Hub export's own build),
    where gc removes what it does not know."""
    cache = golden.directory.parent.parent
    with pytest.raises(ExportError, match="lies inside the rlds cache's tmp/ folder"):
        export_dataset(golden, cache / "tmp" / "x.hdf5", "d4rl")
    assert not (cache / "tmp" / "x.hdf5").exists()


def test_keys_a_format_has_no_place_for_are_refused_not_dropped(isolated_cache: Path, tmp_path: Path) -> None:
    """A goal beside the observation (and a step key ``task``) was left out of minari and AMAGO
    exports without a word; the RLDS export put ``goal`` under the tensor ``steps/observation``,
    where features.json could not hold it."""
    import rlds_cli

    rng = np.random.default_rng(0)
    obs, goal = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    with rlds_cli.DatasetWriter("goal", mode="create") as writer:
        writer.add_episode({
            "observation": obs[:-1], "goal": goal[:-1], "action": np.zeros((3, 2), np.float32),
            "task": np.full(3, 7, np.int64),
            "next": {"observation": obs[1:], "goal": goal[1:], "reward": np.ones(3, np.float32),
                     "terminated": np.array([0, 0, 1], bool), "truncated": np.zeros(3, bool)},
        })  # fmt: skip
    for to, out, words in [
        ("minari", "goal-v0", "a Minari dataset has no place for the key(s) goal, task"),
        ("amago", "am", "an AMAGO trajectory has no place for the key(s) goal, task"),
        # it named 'steps/observation/info' (no such feature) for a flat info key
        (
            "rlds",
            "rl",
            "steps/observation/goal (key 'goal') would lie under the tensor feature steps/observation",
        ),
    ]:
        if to == "minari":
            pytest.importorskip("minari")
        result = runner.invoke(app, ["export", "goal", str(tmp_path / out), "--to", to])
        assert result.exit_code == 1 and words in " ".join(result.output.split()), (to, result.output)
        assert not (tmp_path / out).exists()
    with rlds_cli.DatasetWriter("flat-info", mode="create") as writer:  # info at reset and each step
        writer.add_episode({
            "observation": obs[:-1], "next/observation": obs[1:], "info/x": goal[:-1, 0],
            "next/info/x": goal[1:, 0], "action": np.zeros((3, 2), np.float32),
            "next/reward": np.ones(3, np.float32), "next/terminated": np.array([0, 0, 1], bool),
            "next/truncated": np.zeros(3, bool),
        })  # fmt: skip
    result = runner.invoke(app, ["export", "flat-info", str(tmp_path / "fi"), "--to", "rlds"])
    assert result.exit_code == 1
    assert "steps/observation/info/x (key 'info/x') would lie under the tensor feature steps/observation" in (
        " ".join(result.output.split())
    )  # it named 'steps/observation/info', which is no feature
    export_dataset(open_dataset("goal"), tmp_path / "td", "torchrl")  # which keeps every key
    back = convert(tmp_path / "td", "back")
    assert {"goal", "task"} <= set(open_dataset(back.manifest.name).stored_fields)


def test_what_a_killed_export_left_is_removed_by_the_next(golden: Dataset, tmp_path: Path) -> None:
    """A killed export leaves ``.<name>.<pid>.<thread>.partial`` beside its output, which nothing
    removed; the next export to that output removes those of processes that are gone."""
    import os
    import subprocess
    import sys
    import time

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(gone.stdout)
    left_file = tmp_path / f".out.hdf5.{dead}.1.partial"
    left_file.write_bytes(b"half")
    left_dir = tmp_path / f".td.{dead}.1.partial"
    (left_dir / "x").mkdir(parents=True)
    running = tmp_path / f".out.hdf5.{os.getpid()}.9.partial"  # a live process's: kept
    running.write_bytes(b"busy")
    recent = tmp_path / f".td.{dead}.2.partial"  # unchanged for less than 15 minutes: kept (a
    recent.write_bytes(b"?")  # process of another machine sharing the folder looks dead here)
    old = time.time() - 16 * 60
    for path in (left_file, left_dir, left_dir / "x", running):
        os.utime(path, (old, old))
    export_dataset(golden, tmp_path / "out.hdf5", "d4rl")
    export_dataset(golden, tmp_path / "td", "torchrl")
    assert not left_file.exists() and not left_dir.exists() and running.exists() and recent.exists()


def test_a_replaced_export_folder_is_whole_at_every_moment(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--force`` deleted the old folder, then renamed the new one in: a kill in between left a
    half-deleted OUT that read back as a smaller dataset. The old version is removed only once the
    new one holds the name."""
    import rlds_cli.export as export_module

    out = tmp_path / "out"
    export_dataset(golden, out, "torchrl")
    (out / "old-marker").write_text("old")
    seen: list[tuple[bool, bool]] = []
    rmtree = export_module.shutil.rmtree

    def watched(path: str | Path, *args: object, **kw: object) -> None:
        seen.append(((out / "old-marker").exists(), out.is_dir() and any(out.iterdir())))
        rmtree(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(export_module.shutil, "rmtree", watched)
    export_dataset(golden, out, "torchrl", overwrite=True)
    assert seen and all(not old and new for old, new in seen), seen  # OUT was the new export already
    assert not (out / "old-marker").exists() and not list(tmp_path.glob(".out.*"))
    convert(out, "back")
    _same(golden, open_dataset("back"))


def test_an_out_that_appears_during_the_export_is_kept(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether OUT existed was checked only when the export began: a folder made meanwhile was
    deleted and replaced without --force."""
    import rlds_cli.export as export_module

    out = tmp_path / "out"
    check_disk = export_module.check_disk

    def then_appears(*args: object, **kw: object) -> None:
        check_disk(*args, **kw)  # type: ignore[arg-type]
        out.mkdir()
        (out / "notes.txt").write_text("precious")

    monkeypatch.setattr(export_module, "check_disk", then_appears)
    result = runner.invoke(app, ["export", golden.name, str(out), "--to", "torchrl"])
    assert result.exit_code == 1 and "appeared during the export" in result.stderr, result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and not list(tmp_path.glob(".out.*"))


def test_a_link_or_an_empty_path_as_out_is_refused_before_any_work(golden: Dataset, tmp_path: Path) -> None:
    """A link as OUT failed with 'unexpected OSError' (--force) or 'unexpected NotADirectoryError'
    (dangling) once the whole export had run; an empty OUT was named as ''."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out, to in (("link", "torchrl"), ("dangling", "torchrl"), ("dangling", "d4rl")):
        result = runner.invoke(app, ["export", golden.name, str(tmp_path / out), "--to", to, "--force"])
        assert result.exit_code == 1 and "is a symbolic link" in result.stderr, (out, result.output)
        assert "unexpected" not in result.output
    assert (tmp_path / "dangling").is_symlink() and list(target.iterdir()) == []
    empty = runner.invoke(app, ["export", golden.name, "", "--to", "d4rl"])
    assert empty.exit_code == 1 and "the export's path is empty" in empty.stderr, empty.output


def test_a_folder_is_replaced_where_it_cannot_be_swapped_in_one_step(
    golden: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where renameat2's exchange is missing (another system, some filesystems), the old folder is
    moved aside, the new one renamed in, the old one removed: nothing is left beside OUT."""
    import rlds_cli.export as export_module

    monkeypatch.setattr(export_module, "exchange", lambda a, b: False)
    out = tmp_path / "out"
    export_dataset(golden, out, "torchrl")
    (out / "old-marker").write_text("old")
    export_dataset(golden, out, "torchrl", overwrite=True)
    assert not (out / "old-marker").exists() and not list(tmp_path.glob(".out*"))
    convert(out, "back")
    _same(golden, open_dataset("back"))
