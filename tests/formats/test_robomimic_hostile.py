"""robomimic files a hostile or broken writer could make: a demo number past int64, a
``num_samples`` that is no count and chunks far larger than their array are refused in one line
naming the demo, nothing published."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import SourceFormatError
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import refused
from tests.robomimic_fixtures import IMAGE


def _edited(tmp_path: Path, edit: str) -> Path:
    path = Path(shutil.copy(IMAGE, tmp_path / "h.hdf5"))
    with h5py.File(path, "a") as f:
        if edit == "huge_demo":
            f.move("data/demo_2", "data/demo_" + "9" * 30)
        elif edit == "text_num_samples":
            f["data/demo_1"].attrs["num_samples"] = "four"
        elif edit == "array_num_samples":
            f["data/demo_1"].attrs["num_samples"] = np.array([4, 4])
        elif edit == "float_num_samples":  # a whole float is a count all the same
            n = f["data/demo_1/actions"].shape[0]
            f["data/demo_1"].attrs["num_samples"] = float(n)
        elif edit == "chunk_bomb":  # 48 bytes of data in gzip chunks of 480 MB (470 KB stored each)
            f["data/demo_0/obs"].create_dataset(
                "big",
                data=np.zeros((3, 2)),
                chunks=(3, 20_000_000),
                maxshape=(None, None),
                compression="gzip",
            )
        elif edit == "newline_name":  # '$' matched before the newline: accepted as demo 1
            f.move("data/demo_1", "data/demo_1\n")
        elif edit == "same_number":  # demo_1 and demo_001: robomimic's order of the two is undefined
            f.copy("data/demo_1", "data/demo_001")
        elif edit == "dtype_differs":  # "mixed shapes" was said of a dtype
            rewards = f["data/demo_1/rewards"][()]
            del f["data/demo_1/rewards"]
            f["data/demo_1/rewards"] = rewards.astype(np.float16)
        elif edit == "sparse_together":  # 4 never-written arrays of 48 MiB: each under the floor
            for k in range(4):
                f["data/demo_0/obs"].create_dataset(f"sparse{k}", shape=(6_291_456, 1), dtype="f8")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("huge_demo", "has a demo number past 2**63 - 1"),
        ("text_num_samples", "data/demo_1: num_samples is 'four', not a count of steps"),
        ("array_num_samples", "data/demo_1: num_samples is '[4 4]', not a count of steps"),
        ("sparse_together", "its arrays together declare 201,3"),
        ("newline_name", r"'data/demo_1\\n' is not a demo_<N> group"),
        ("same_number", "'data/demo_001' and 'data/demo_1' have the same demo number .1."),
        (
            "dtype_differs",
            "dtype float16 per step, but .. float64 in data/demo_0 .mixed dtypes across demos",
        ),
        ("chunk_bomb", "'data/demo_0/obs/big' declares chunks of 480,000,000 bytes for 48 bytes of data"),
    ],
)
def test_refused_in_one_line(tmp_path: Path, edit: str, message: str) -> None:
    with pytest.raises(SourceFormatError, match=message.replace("*", r"\*").replace("[", r"\[")) as info:
        convert(_edited(tmp_path, edit), "bad", format="robomimic")
    assert "\n" not in info.value.message
    assert not CacheRoot().dataset_dir("bad").exists()


def test_a_whole_float_num_samples_is_read(tmp_path: Path) -> None:
    from rlds_cli.cache.opening import open_dataset

    convert(IMAGE, "original", format="robomimic")
    convert(_edited(tmp_path, "float_num_samples"), "ok", format="robomimic")
    ok, original = open_dataset("ok"), open_dataset("original")
    assert ok.episodes["length"].tolist() == original.episodes["length"].tolist()
    for e in range(ok.num_episodes):
        np.testing.assert_array_equal(ok.episode(e)["action"], original.episode(e)["action"])


@pytest.mark.usefixtures("consoles")
@pytest.mark.console_widths(250, 250)
def test_from_the_cli(tmp_path: Path) -> None:
    CacheRoot().path.mkdir(parents=True, exist_ok=True)
    result = CliRunner().invoke(app, ["download", str(_edited(tmp_path, "huge_demo")), "--name", "bad"])
    refused(result, "demo number past 2**63 - 1", hint=True)


def _demos(path: Path, attrs: dict[int, dict[str, str]]) -> Path:
    with h5py.File(path, "w") as f:
        for i in range(3):
            demo = f.create_group(f"data/demo_{i}")
            demo["actions"], demo["rewards"] = np.full((2, 2), float(i)), np.zeros(2)
            demo["dones"], demo["obs/x"] = np.zeros(2, "i8"), np.zeros((2, 1))
            demo.attrs.update(attrs.get(i, {}))
    return path


def test_a_demos_own_lang_and_its_ep_meta_make_one_row(tmp_path: Path) -> None:
    """A demo with both an ``ep_meta`` holding ``lang`` and its own ``lang`` attribute added two rows
    for one episode: every later demo's instruction was the one before it."""
    path = _demos(
        tmp_path / "l.hdf5",
        {
            0: {"ep_meta": '{"lang": "open the drawer"}', "lang": "open the drawer (own)"},
            1: {"ep_meta": '{"lang": "close the fridge"}'},
            2: {"model_file": "<xml/>"},
        },
    )
    convert(path, "l")
    ds = open_dataset("l")
    langs = [ds.episode_metadata(i).get("robomimic/lang") for i in range(3)]
    assert langs == ["open the drawer (own)", "close the fridge", None]


def test_json_nested_past_the_parsers_depth_is_kept_as_text(tmp_path: Path) -> None:
    """``env_args`` of 100,000 nested lists was 'unexpected RecursionError'."""
    deep = "[" * 100_000 + "]" * 100_000
    path = _demos(tmp_path / "d.hdf5", {1: {"ep_meta": deep}})
    with h5py.File(path, "a") as f:
        f["data"].attrs["env_args"] = deep
    convert(path, "d")
    ds = open_dataset("d")
    assert ds.num_episodes == 3


@pytest.mark.parametrize(
    ("offset", "mask"), [(1415, 0x80), (42480, 0xFF), (38704, 0x80), (28353, 0x80), (37950, 0x1)]
)
def test_damaged_metadata_is_named_as_damage(tmp_path: Path, offset: int, mask: int) -> None:
    """One flipped byte in the fixture's HDF5 metadata (a link table, an attribute message, an
    object header, a dataspace) was 'unexpected RuntimeError' or was taken for a group and skipped."""
    data = bytearray(IMAGE.read_bytes())
    data[offset] ^= mask
    path = tmp_path / "flipped.hdf5"
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["download", str(path), "--name", "x"])
    refused(result, f"{path} is damaged: HDF5 cannot", hint=True, published=())


@pytest.mark.usefixtures("consoles")
@pytest.mark.console_widths(400, 400)
@pytest.mark.parametrize("where", ["obs", "mask", "demo"])
def test_a_name_that_is_not_utf8_is_named(tmp_path: Path, where: str) -> None:
    """h5py hands such names out as bytes: 'unexpected TypeError' in three places."""
    path = tmp_path / "names.hdf5"
    shutil.copy(IMAGE, path)
    with h5py.File(path, "a") as f:
        if where == "obs":
            f["data/demo_0/obs"].create_dataset(
                b"x\xff", data=np.zeros((f["data/demo_0/actions"].shape[0], 1))
            )
        elif where == "mask":
            f["mask"].create_dataset(b"tr\xffain", data=np.array([b"demo_0"]))
        else:
            f.move("data/demo_1", b"data/demo_1\xff")
    refused(
        CliRunner().invoke(app, ["download", str(path), "--name", "x"]),
        "is not UTF-8 text",
        hint=True,
        published=(),
    )


@pytest.mark.usefixtures("consoles")
@pytest.mark.console_widths(400, 400)
def test_episodes_past_the_end_are_named_as_such(tmp_path: Path) -> None:
    """``--episodes 10:20`` of a 4-demo file said it 'holds no complete transition'."""
    result = CliRunner().invoke(app, ["download", str(IMAGE), "--name", "x", "--episodes", "10:20"])
    refused(result, "episodes 10:20 selects none of the 4 episodes of", hint=True, published=())


@pytest.mark.usefixtures("consoles")
@pytest.mark.console_widths(400, 400)
def test_a_file_a_writer_holds_is_named_as_such(tmp_path: Path) -> None:
    """HDF5's file lock was reported as a truncated or corrupt file, with a hint to download again."""
    import subprocess
    import sys

    path = Path(shutil.copy(IMAGE, tmp_path / "open.hdf5"))
    code = "import h5py, sys; f = h5py.File(sys.argv[1], 'a'); print('open', flush=True); sys.stdin.read()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        result = CliRunner().invoke(app, ["download", str(path), "--name", "x"])
        refused(result, "is open for writing in another process (HDF5's file lock)", hint=True, published=())
        assert "HDF5_USE_FILE_LOCKING=FALSE" in result.stderr
    finally:
        holder.communicate("", timeout=30)


def test_demos_that_differ_in_byte_order_alone_convert(tmp_path: Path) -> None:
    """A demo stored big-endian beside little-endian ones was refused as 'mixed shapes' (robomimic
    reads it): rows are read in native byte order, the values the same."""
    path = Path(shutil.copy(IMAGE, tmp_path / "endian.hdf5"))
    with h5py.File(path, "a") as f:
        actions = f["data/demo_1/actions"][()]
        del f["data/demo_1/actions"]
        f["data/demo_1/actions"] = actions.astype(actions.dtype.newbyteorder(">"))
    convert(path, "endian")
    with h5py.File(path, "r") as f:
        demos = sorted(f["data"], key=lambda name: int(name[len("demo_") :]))
        want = np.concatenate([f[f"data/{name}/actions"][()] for name in demos])
    got = open_dataset("endian")[:]["action"]
    assert got.dtype.isnative and np.array_equal(got, want)
