"""robomimic / LIBERO / RoboCasa HDF5 conversion: every key and step against the file, demo
order, metadata, filter keys, the final observation without next_obs, bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import SourceFormatError
from rlds_cli.formats import detect_format
from rlds_cli.sources.convert import convert
from tests.fixtures.robomimic.make_fixtures import write_libero, write_robocasa, write_robomimic_image
from tests.robomimic_fixtures import ALL, IMAGE, LIBERO, ROBOCASA, differences


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_every_key_and_step_reads_as_the_file_holds_it(path: Path) -> None:
    assert detect_format(path) == "robomimic"
    convert(path, "rm")
    assert differences(open_dataset("rm"), path) == []


def test_the_committed_fixtures_are_what_the_script_writes(tmp_path: Path) -> None:
    for path, write in ((IMAGE, write_robomimic_image), (LIBERO, write_libero), (ROBOCASA, write_robocasa)):
        fresh = write(tmp_path / path.name)
        convert(fresh, f"fresh-{path.stem}")
        assert differences(open_dataset(f"fresh-{path.stem}"), path) == []


def test_demos_come_in_robomimics_order_with_their_numbers() -> None:
    convert(IMAGE, "img")
    ds = open_dataset("img")
    # h5py lists demo_0, demo_1, demo_10, demo_2; robomimic sorts by number
    assert ds.episodes["source_id"].tolist() == [0, 1, 2, 10]
    assert ds.episodes["length"].tolist() == [5, 3, 4, 2]
    assert ds.episodes["final_known"].all()
    b = ds[:]
    # dones set mid-demo (done_mode 2: a success state) are kept; the demo ends at its last step
    assert b["info/dones"][5:8].tolist() == [1, 0, 1]
    assert b["next/terminated"][:, 0].tolist() == [0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 1]


def test_without_next_obs_the_final_observation_is_unknown_never_invented() -> None:
    result = convert(LIBERO, "lib")
    ds = open_dataset("lib")
    assert not ds.episodes["final_known"].any()
    assert result.manifest.conversion["synthesized_final_observations"] == 2
    ep = ds.episode(0)
    with h5py.File(LIBERO) as f:
        rgb = f["data/demo_0/obs/agentview_rgb"][()]
    np.testing.assert_array_equal(ep["next/observation/agentview_rgb"][:-1], rgb[1:])
    np.testing.assert_array_equal(ep["next/observation/agentview_rgb"][-1], rgb[-1])  # repeated, flagged
    assert any("final_known = false" in n for n in result.manifest.conversion["notes"])


def test_dataset_and_demo_metadata_are_kept_and_readable() -> None:
    convert(LIBERO, "lib")
    convert(ROBOCASA, "casa")
    lib, casa = open_dataset("lib"), open_dataset("casa")
    meta = lib.source_metadata["robomimic"]
    assert meta["language_instruction"] == "put the black bowl on the plate"
    assert meta["env_args"]["problem_name"] == "libero_kitchen_tabletop_manipulation"
    assert meta["attrs"]["macros_image_convention"] == "opengl"
    assert meta["attrs"]["total"] == 7
    first = lib.episode_metadata(0)
    assert first["robomimic/model_file"].startswith("<mujoco")
    with h5py.File(LIBERO) as f:
        np.testing.assert_array_equal(first["robomimic/init_state"], f["data/demo_0"].attrs["init_state"])
    assert casa.episode_metadata(1)["robomimic/lang"] == "Press the start button on the microwave."
    assert '"layout_id": 1' in casa.episode_metadata(1)["robomimic/ep_meta"]
    assert casa.source_metadata["robomimic"]["env_args"]["env_name"] == "OpenDrawer"
    with pytest.raises(IndexError, match="outside"):
        casa.episode_metadata(2)


def test_filter_keys_follow_an_episode_selection() -> None:
    convert(IMAGE, "part", options={"episodes": "1:3"})
    ds = open_dataset("part")
    assert ds.episodes["source_id"].tolist() == [1, 2]
    from rlds_cli.cache.derive import filter_key_episodes

    assert filter_key_episodes(ds, "valid").tolist() == [0]  # demo_1
    assert filter_key_episodes(ds, "train").tolist() == [1]  # demo_2
    assert ds.episode_metadata(1)["robomimic/model_file"].endswith('pos="0 0 2"/></worldbody></mujoco>')


def test_a_mask_naming_a_missing_demo_is_reported(tmp_path: Path) -> None:
    path = shutil.copy(IMAGE, tmp_path / "m.hdf5")
    with h5py.File(path, "a") as f:
        f["mask/extra"] = np.array(["demo_0", "demo_99"], dtype="S")
    result = convert(Path(path), "m")
    assert any("demo_99" in n for n in result.manifest.conversion["notes"])
    from rlds_cli.cache.derive import filter_key_episodes

    assert filter_key_episodes(open_dataset("m"), "extra").tolist() == [0]


def _broken(tmp_path: Path, edit: str) -> Path:
    path = Path(shutil.copy(IMAGE, tmp_path / "b.hdf5"))
    with h5py.File(path, "a") as f:
        if edit == "name":
            f["data/extra"] = np.zeros(3)
        elif edit == "dones":
            del f["data/demo_1/dones"]
        elif edit == "num_samples":
            f["data/demo_2"].attrs["num_samples"] = 9
        elif edit == "next_obs":
            f["data/demo_0/next_obs/object"][1] = 7.0
        elif edit == "mask":
            f["mask/bad"] = np.zeros(3)
        elif edit == "mask_dataset":
            del f["mask"]
            f["mask"] = np.array([b"demo_0"])
        elif edit == "ragged":
            del f["data/demo_0/states"]
            f["data/demo_0/states"] = np.zeros((4, 12))
        elif edit == "schema":
            del f["data/demo_2/obs/object"]
            f["data/demo_2/obs/object"] = np.zeros((4, 11))
        elif edit == "states_only":
            for demo in f["data"]:
                del f[f"data/{demo}/obs"]
                del f[f"data/{demo}/next_obs"]
        elif edit == "text_obs":
            del f["data/demo_0/obs/object"]
            f["data/demo_0/obs/object"] = np.array([b"a"] * 5)
        elif edit == "next_keys":
            for demo in f["data"]:
                del f[f"data/{demo}/next_obs/object"]
        elif edit == "rewards":  # two per step: a return summed over both, an export that failed
            for demo in f["data"]:
                rewards = f[f"data/{demo}/rewards"][()]
                del f[f"data/{demo}/rewards"]
                f[f"data/{demo}/rewards"] = np.stack([rewards, rewards], axis=1)
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("name", "'data/extra' is not a demo_<N> group"),
        ("dones", "data/demo_1 has no 'dones' dataset"),
        ("num_samples", "num_samples is 9 but 'actions' has 4 rows"),
        ("next_obs", r"next_obs/object\[1\] differs from obs/object\[2\]"),
        ("mask", "filter key 'mask/bad' is not a list of demo names"),
        ("mask_dataset", "'mask' is not a group of filter keys"),
        ("ragged", "'states' has 4 rows, 'actions' has 5"),
        ("schema", r"'obs/object' has shape \(11,\)"),
        ("states_only", "has no obs/ datasets: a states-only file"),
        ("text_obs", "'obs/object' holds fixed-width byte strings"),
        ("next_keys", "next_obs/ holds"),
        ("rewards", r"'rewards' must have one value per row, has shape \(\d+, 2\)"),
    ],
)
def test_bad_files_are_refused_in_one_line_naming_what(tmp_path: Path, edit: str, message: str) -> None:
    path = _broken(tmp_path, edit)
    with pytest.raises(SourceFormatError, match=message) as info:
        convert(path, "bad", format="robomimic")
    assert "\n" not in info.value.message
    from rlds_cli.cache.root import CacheRoot

    assert not CacheRoot().dataset_dir("bad").exists()


def test_data_attributes_that_are_not_what_robomimic_writes_are_noted(tmp_path: Path) -> None:
    """Kept as they are, but said: an ``env_args`` that is not a JSON object, a ``total`` that is
    not a count (they were kept without a word)."""
    path = Path(shutil.copy(IMAGE, tmp_path / "a.hdf5"))
    with h5py.File(path, "a") as f:
        f["data"].attrs["env_args"] = "{not json"
        f["data"].attrs["total"] = "lots"
    notes = convert(path, "a").manifest.conversion["notes"]
    said = "data@env_args is not a JSON object (robomimic writes json.dumps of a dict): kept as it is"
    assert said in notes
    assert "data@total is 'lots', not a count of steps: kept as it is" in notes
    meta = open_dataset("a").source_metadata["robomimic"]
    assert meta["env_args"] == "{not json" and meta["attrs"]["total"] == "lots"


def test_text_datasets_of_a_demo_are_dropped_with_a_note(tmp_path: Path) -> None:
    path = Path(shutil.copy(IMAGE, tmp_path / "t.hdf5"))
    with h5py.File(path, "a") as f:
        for demo in f["data"]:
            n = f[f"data/{demo}/actions"].shape[0]
            f[f"data/{demo}/subtask"] = np.array([b"reach"] * n)
    result = convert(path, "t")
    assert "info/subtask" not in open_dataset("t").fields
    assert any("subtask" in n and "dropped" in n for n in result.manifest.conversion["notes"])


def _with_empty_rows(tmp_path: Path, key: str) -> Path:
    """``key`` (``obs/...``, ``next_obs/...`` or ``actions``) of every demo replaced by rows of width 0."""
    path = Path(shutil.copy(IMAGE, tmp_path / "e.hdf5"))
    with h5py.File(path, "a") as f:
        for demo in f["data"]:
            n = f[f"data/{demo}/actions"].shape[0]
            for name in [key, key.replace("obs/", "next_obs/", 1)] if key.startswith("obs/") else [key]:
                if name in f[f"data/{demo}"]:
                    del f[f"data/{demo}/{name}"]
                f[f"data/{demo}/{name}"] = np.zeros((n, 0))
    return path


def test_rows_of_width_zero_are_not_stored_and_named(tmp_path: Path) -> None:
    """They hold no value (nothing is lost); stored, the column's row count read 0 (an internal
    error); an action without a value is refused."""
    result = convert(_with_empty_rows(tmp_path, "obs/empty"), "e")
    assert "observation/empty" not in open_dataset("e").fields
    note = "observation/empty holds rows of shape (0,) (no values): not stored"
    assert note in result.manifest.conversion["notes"]
    with pytest.raises(SourceFormatError, match=r"the action has rows of shape \(0,\), which hold no value"):
        convert(_with_empty_rows(tmp_path, "actions"), "a")


def test_chunks_never_written_are_named(tmp_path: Path) -> None:
    """HDF5 reads an unwritten chunk as the fill value, as robomimic does: the conversion keeps
    what the file reads and says which chunks were never written (it said nothing)."""
    path = Path(shutil.copy(IMAGE, tmp_path / "u.hdf5"))
    with h5py.File(path, "a") as f:
        n = f["data/demo_0/actions"].shape[0]
        width = f["data/demo_0/obs/object"].shape[1]
        del f["data/demo_0/obs/object"], f["data/demo_0/next_obs/object"]
        f["data/demo_0/obs/object"] = np.arange(n, dtype="f8")[:, None].repeat(width, 1)
        group = f["data/demo_0/next_obs"]
        nxt = group.create_dataset("object", shape=(n, width), chunks=(1, width), dtype="f8")
        for t in range(n - 1):  # the last row (the demo's final observation) never written
            nxt[t] = t + 1
    notes = convert(path, "u").manifest.conversion["notes"]
    note = f"data/demo_0/next_obs/object: 1 of {n} chunks are not stored; h5py (and robomimic) read them"
    assert any(n.startswith(note) and n.endswith("as the fill value 0.0") for n in notes), notes


def test_counts_the_demos_contradict_are_named(tmp_path: Path) -> None:
    path = Path(shutil.copy(IMAGE, tmp_path / "n.hdf5"))
    with h5py.File(path, "a") as f:
        steps = sum(f[f"data/{d}/actions"].shape[0] for d in f["data"])
        demos = len(f["data"])
        f["data"].attrs["total"] = 999
        f["data"].attrs["num_demos"] = demos + 5
    notes = convert(path, "n").manifest.conversion["notes"]
    assert f"data@total says 999 steps, the file's demos hold {steps:,}: the demos are converted" in notes
    said = f"data@num_demos says {demos + 5} demos, the file's demos hold {demos}: the demos are converted"
    assert said in notes
    assert open_dataset("n").num_steps == steps


def test_dones_other_than_0_and_1_are_named(tmp_path: Path) -> None:
    path = Path(shutil.copy(IMAGE, tmp_path / "d.hdf5"))
    with h5py.File(path, "a") as f:
        n = f["data/demo_0/dones"].shape[0]
        del f["data/demo_0/dones"]
        f["data/demo_0/dones"] = np.r_[np.zeros(n - 2), 5, 3].astype(f["data/demo_1/dones"].dtype)
    notes = convert(path, "d").manifest.conversion["notes"]
    assert any(n.startswith("data/<demo>/dones holds values other than 0 and 1") for n in notes), notes
    ds = open_dataset("d")
    assert ds.episode(0)["info/dones"][-2:].tolist() == [5, 3]  # kept as stored
    assert bool(ds.episode(0)["next/terminated"][-1])


def test_a_file_of_another_layout_given_as_robomimic_is_refused(tmp_path: Path) -> None:
    from rlds_cli.testing.sources import golden_three_episodes

    d4rl = golden_three_episodes(tmp_path / "d.hdf5", with_next=False)
    with pytest.raises(SourceFormatError, match="has no 'data' group"):
        convert(d4rl, "x", format="robomimic")
    empty = tmp_path / "empty.hdf5"
    with h5py.File(empty, "w") as f:
        f.create_group("data")
    with pytest.raises(SourceFormatError, match="'data' holds no demo_<N> group"):
        convert(empty, "x", format="robomimic")
    stepless = write_robomimic_image(tmp_path / "stepless.hdf5", {0: 0})
    with pytest.raises(SourceFormatError, match="no demo under 'data' has a step"):
        convert(stepless, "x")


def test_a_demo_with_other_datasets_than_the_first_is_refused(tmp_path: Path) -> None:
    path = Path(shutil.copy(IMAGE, tmp_path / "x.hdf5"))
    with h5py.File(path, "a") as f:
        f["data/demo_2/actions_abs"] = np.zeros((4, 7))
    differ = r"data/demo_2: datasets differ from data/demo_0's; unknown \['actions_abs'\]"
    with pytest.raises(SourceFormatError, match=differ):
        convert(path, "x")


@pytest.mark.parametrize("path", [IMAGE, LIBERO], ids=lambda p: p.stem)
def test_demos_read_in_pieces_read_the_same(path: Path) -> None:
    # pieces of 2 steps: next_obs checked across piece ends, the final observation on the last
    convert(path, "pieces", options={"block_rows": 2})
    assert differences(open_dataset("pieces"), path) == []


def test_next_obs_is_checked_at_the_last_step_of_a_piece(tmp_path: Path) -> None:
    # pieces of 2 steps: next_obs[1] is checked against obs[2], the first row of the next piece
    with pytest.raises(SourceFormatError, match=r"next_obs/object\[1\] differs from obs/object\[2\]"):
        convert(_broken(tmp_path, "next_obs"), "bad", format="robomimic", options={"block_rows": 2})


def test_a_demo_of_no_step_is_dropped_and_counted(tmp_path: Path) -> None:
    path = write_robomimic_image(tmp_path / "z.hdf5", {0: 3, 1: 0, 2: 2})
    result = convert(path, "z")
    ds = open_dataset("z")
    assert ds.episodes["source_id"].tolist() == [0, 2]
    assert result.manifest.conversion["dropped_episodes"] == 1
    # demo_1 (valid) had no step: the membership rows follow the kept episodes
    assert ds.source_arrays["filter_keys/episode_member"].tolist() == [[True, False], [True, False]]
    assert ds.episode_metadata(1)["robomimic/num_samples"] == 2


def test_a_demo_read_is_forgotten(tmp_path: Path) -> None:
    """The gzip chunk reader held every demo's chunk index and last decoded chunks until the file
    was done (431 MiB at 400 demos of two cameras): it holds only the demo being read."""
    from rlds_cli.formats.robomimic import RobomimicReader

    path = tmp_path / "gz.hdf5"
    with h5py.File(IMAGE) as src, h5py.File(path, "w") as out:
        src.copy("data", out)  # the same demos, each dataset gzip-compressed
        names: list[str] = []
        out["data"].visititems(
            lambda name, node: names.append(name) if isinstance(node, h5py.Dataset) else None
        )
        for name in names:
            _gzip_in_place(out["data"][name])
    reader = RobomimicReader(path)
    held: list[int] = []
    try:
        for _ in reader.blocks():
            held.append(len(reader._chunk_rows._layouts))
        assert held and max(held) <= 20 and len(reader._chunk_rows._layouts) == 0
    finally:
        reader.close()
    convert(path, "gz")
    assert differences(open_dataset("gz"), IMAGE) == []


def _gzip_in_place(node: h5py.Dataset) -> None:
    data, parent, name = node[()], node.parent, node.name.rsplit("/", 1)[1]
    if data.ndim:
        del parent[name]
        parent.create_dataset(name, data=data, compression="gzip")


def test_hdf5s_metadata_cache_is_held_small() -> None:
    """HDF5's default metadata cache (32 MiB, grown as objects are visited) kept ~50 KB a demo
    alive: a peak of 193 MB converting a file of 3,000 small demos (80 MB now)."""
    from rlds_cli.formats.hdf5_util import METADATA_CACHE_BYTES
    from rlds_cli.formats.robomimic import RobomimicReader

    reader = RobomimicReader(IMAGE)
    try:
        config = reader._file.id.get_mdc_config()
        assert config.max_size == METADATA_CACHE_BYTES == 4 << 20
        assert config.initial_size <= METADATA_CACHE_BYTES
    finally:
        reader.close()
