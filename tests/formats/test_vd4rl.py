"""V-D4RL (``--format vd4rl``): Dreamer ``.npz`` episodes and drqbc ``.hdf5`` shards.

Sources are written by :mod:`tests.vd4rl_fixtures` in the exact upstream layouts. Every
converted dataset is compared, key by key and dtype by dtype, with a reference built here by a
plain loop over the raw rows and the episode ranges (the one-step shift written out: transition
``t`` of an episode is ``obs[t] -> obs[t + 1]`` with ``action[t + 1]`` and ``reward[t + 1]``),
never with the reader's own helpers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import SourceFormatError
from rlds_cli.formats import detect_format
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import refused as _refused
from tests.vd4rl_fixtures import (
    dreamer_episode,
    dreamer_name,
    drqbc_arrays,
    save_episode,
    write_dreamer_episodes,
    write_drqbc,
    write_drqbc_shards,
)

runner = CliRunner()
SIDE = 8  # small frames keep the tests fast; the layout is the real one


# ----------------------------------------------------------------------------- reference


def reference(
    frames: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
    terminal: np.ndarray,
    ranges: list[tuple[int, int]],
) -> dict[str, Any]:
    """The TED dataset of per-row source arrays cut into episodes ``ranges`` (first and last
    row, inclusive), built one transition at a time: observations flat (each step's, then the
    episode's final one), ``action[t + 1]``/``reward[t + 1]`` for transition ``t``."""
    obs, act, rew, term, trunc, lengths = [], [], [], [], [], []
    for first, last in ranges:
        if last == first:  # one row: no transition
            continue
        for t in range(first, last):
            obs.append(frames[t])
            act.append(action[t + 1])
            rew.append([reward[t + 1]])
            ended = t + 1 == last
            term.append([ended and bool(terminal[last])])
            trunc.append([ended and not bool(terminal[last])])
        obs.append(frames[last])
        lengths.append(last - first)
    return {
        "observation": np.stack(obs),
        "action": np.stack(act),
        "next/reward": np.array(rew, reward.dtype),
        "next/terminated": np.array(term, bool),
        "next/truncated": np.array(trunc, bool),
        "lengths": lengths,
    }


def episodes_reference(episodes: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """:func:`reference` of Dreamer episodes (one per file; old files: terminal = discount 0)."""
    frames = np.concatenate([ep["image"] for ep in episodes])
    action = np.concatenate([ep["action"] for ep in episodes])
    reward = np.concatenate([ep["reward"] for ep in episodes])
    terminal = np.concatenate([ep.get("is_terminal", ep["discount"] == 0) for ep in episodes])
    ranges, row = [], 0
    for ep in episodes:
        ranges.append((row, row + len(ep["reward"]) - 1))
        row += len(ep["reward"])
    return reference(frames, action, reward, terminal, ranges)


def step_type_ranges(step_type: np.ndarray) -> list[tuple[int, int]]:
    """Episode row ranges of a drqbc ``step_type`` column: from a 0 to the next 2, the last
    one running to the end of the data when it has no 2."""
    ranges, first = [], None
    for row, st in enumerate(step_type):
        if st == 0:
            first = row
        if st == 2:
            assert first is not None
            ranges.append((first, row))
            first = None
    if first is not None:
        ranges.append((first, len(step_type) - 1))
    return ranges


def check_dataset(name: str, want: dict[str, Any], *, image_key: str = "observation") -> None:
    """Dataset ``name`` holds exactly ``want`` (values, shapes and dtypes)."""
    ds = open_dataset(name)
    assert ds.episodes["length"].tolist() == want["lengths"]
    assert ds.episodes["final_known"].all()
    assert ds.num_steps == sum(want["lengths"])
    for key in ("action", "next/reward", "next/terminated", "next/truncated"):
        got = np.asarray(ds.column(key)[:])
        assert got.dtype == want[key].dtype and got.shape == want[key].shape, key
        np.testing.assert_array_equal(got, want[key], err_msg=key)
    got = np.asarray(ds.column(image_key)[:])
    assert got.dtype == np.uint8 and got.shape == want["observation"].shape, got.shape
    np.testing.assert_array_equal(got, want["observation"])


def inspect_check(name: str) -> None:
    result = runner.invoke(app, ["inspect", name, "--check"])
    assert result.exit_code == 0, result.output
    assert "check passed" in result.output


def three_episodes() -> list[dict[str, np.ndarray]]:
    """Three Dreamer episodes: truncated (time limit), terminated, and an old file without
    is_terminal that terminated (discount 0 on its last row)."""
    return [
        dreamer_episode(7, side=SIDE, seed=1),
        dreamer_episode(10, side=SIDE, seed=2, terminal=True),
        dreamer_episode(5, side=SIDE, seed=3, terminal=True, old=True),
    ]


# ----------------------------------------------------------------------------- Dreamer .npz


def test_dreamer_episodes_convert_with_the_shift(tmp_path: Path) -> None:
    episodes = three_episodes()
    files = write_dreamer_episodes(tmp_path / "64px", episodes)
    assert detect_format(tmp_path / "64px") == detect_format(files[0]) == "vd4rl"
    result = runner.invoke(app, ["download", str(tmp_path / "64px"), "--name", "dv"])
    assert result.exit_code == 0, result.output
    want = episodes_reference(episodes)
    check_dataset("dv", want)
    ds = open_dataset("dv")
    # the shift, spelled out: transition 0 pairs the reset frame with the first real action
    np.testing.assert_array_equal(np.asarray(ds.column("action")[:1])[0], episodes[0]["action"][1])
    assert np.asarray(ds.column("action")[:1]).any()  # not the zero padding of row 0
    np.testing.assert_array_equal(np.asarray(ds.column("observation")[:1])[0], episodes[0]["image"][0])
    assert (
        np.asarray(ds.column("next/terminated")[:])[:, 0].tolist().count(True) == 2
    )  # ep 2 and the old ep 3
    assert ds.manifest.fields["observation"].shape == (SIDE, SIDE, 3)
    conv = ds.manifest.conversion
    assert conv["rules"] == "vd4rl-v1" and conv["source_rows"] == 22
    assert any("action[t+1]" in n for n in conv["notes"])
    meta = ds.manifest.source["metadata"]["vd4rl"]
    assert meta["layout"] == "dreamer-npz" and meta["image_layout"] == meta["source_image_layout"] == "HWC"
    assert ds.manifest.source["checks"]["expected"] == {"num_steps": 19, "num_episodes": 3}
    assert ds.manifest.source["files"][0]["path"] == files[0].name
    episode_file = ds.source_arrays["vd4rl/episode_file"]
    assert episode_file.tolist() == [0, 1, 2]
    inspect_check("dv")


@pytest.mark.parametrize("block_rows", [1, 3, 4])
def test_small_blocks_store_the_same_values(tmp_path: Path, block_rows: int) -> None:
    """Episodes cut across reads (one observation carried from read to read) and packed back."""
    episodes = three_episodes()
    write_dreamer_episodes(tmp_path / "e", episodes)
    convert(tmp_path / "e", "small", options={"block_rows": block_rows})
    check_dataset("small", episodes_reference(episodes))


def test_episodes_are_read_in_name_order_and_one_row_files_are_dropped(tmp_path: Path) -> None:
    episodes = three_episodes()
    single = dreamer_episode(1, side=SIDE, seed=9)
    folder = tmp_path / "e"
    for i, ep in reversed(list(enumerate([episodes[0], single, episodes[1], episodes[2]]))):
        save_episode(folder / dreamer_name(i, len(ep["reward"])), ep)  # written in reverse order
    convert(folder, "ordered")
    check_dataset("ordered", episodes_reference(episodes))
    conv = open_dataset("ordered").manifest.conversion
    assert conv["dropped_episodes"] == 1 and conv["dropped_rows"] == 1
    assert any("one row" in n for n in conv["notes"])
    inspect_check("ordered")


def test_image_layout_option_transposes_while_streaming(tmp_path: Path) -> None:
    episodes = three_episodes()
    write_dreamer_episodes(tmp_path / "e", episodes)
    convert(tmp_path / "e", "chw", options={"image_layout": "chw", "block_rows": 4})
    want = episodes_reference(episodes)
    want["observation"] = want["observation"].transpose(0, 3, 1, 2)
    check_dataset("chw", want)
    ds = open_dataset("chw")
    assert ds.manifest.source["metadata"]["vd4rl"]["image_layout"] == "CHW"
    assert ds.manifest.source["metadata"]["vd4rl"]["source_image_layout"] == "HWC"
    assert ds.manifest.source["options"] == {"image_layout": "chw", "block_rows": 4}
    with pytest.raises(SourceFormatError, match="image_layout is 'nchw'"):
        convert(tmp_path / "e", "bad", options={"image_layout": "nchw"})


def test_extra_per_row_arrays_are_observations_beside_the_image(tmp_path: Path) -> None:
    episodes = three_episodes()
    rng = np.random.default_rng(5)
    for ep in episodes:
        ep["state"] = rng.standard_normal((len(ep["reward"]), 5))  # float64, as a proprio state
        ep["task name"] = np.array(["walk"] * len(ep["reward"]))  # text: dropped with a note
    write_dreamer_episodes(tmp_path / "e", episodes)
    convert(tmp_path / "e", "extra")
    check_dataset("extra", episodes_reference(episodes), image_key="observation/image")
    ds = open_dataset("extra")
    state = np.concatenate([ep["state"] for ep in episodes])  # every row: flat, like the frames
    got = np.asarray(ds.column("observation/state")[:])
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, state)
    assert sorted(ds.manifest.fields) == sorted(
        [
            "observation/image",
            "observation/state",
            "action",
            "next/reward",
            "next/terminated",
            "next/truncated",
        ]
    )
    assert any("task name" in n and "dropped" in n for n in ds.manifest.conversion["notes"])
    inspect_check("extra")


def test_a_first_row_with_an_action_is_noted(tmp_path: Path) -> None:
    episodes = three_episodes()
    episodes[1]["action"][0] = 0.5  # not Dreamer's zero padding
    write_dreamer_episodes(tmp_path / "e", episodes)
    convert(tmp_path / "e", "noted")
    notes = open_dataset("noted").manifest.conversion["notes"]
    assert any(n.startswith("1 episode(s) have a nonzero action") for n in notes)


# ----------------------------------------------------------------------------- drqbc .hdf5


def test_drqbc_shard_with_a_trailing_partial_episode(tmp_path: Path) -> None:
    episodes = three_episodes()
    arrays = drqbc_arrays(episodes)
    partial = {k: v[:4] for k, v in drqbc_arrays([dreamer_episode(9, side=SIDE, seed=7)]).items()}
    arrays = {k: np.concatenate([v, partial[k]]) for k, v in arrays.items()}
    path = write_drqbc(tmp_path / "84px" / "data.hdf5", arrays)
    assert detect_format(path) == detect_format(path.parent) == "vd4rl"
    assert arrays["step_type"].dtype == np.float64 and arrays["step_type"][-1] == 1
    result = runner.invoke(app, ["download", str(path), "--name", "dq"])
    assert result.exit_code == 0, result.output
    terminal = arrays["discount"] == 0
    want = reference(
        arrays["observation"],
        arrays["action"],
        arrays["reward"],
        terminal,
        step_type_ranges(arrays["step_type"]),
    )
    assert want["lengths"] == [6, 9, 4, 3]
    check_dataset("dq", want)
    ds = open_dataset("dq")
    assert ds.manifest.fields["observation"].shape == (3, SIDE, SIDE)
    assert ds.manifest.source["metadata"]["vd4rl"]["image_layout"] == "CHW"
    conv = ds.manifest.conversion
    assert conv["inferred_boundaries"] == 1 and conv["dropped_rows"] == 0
    assert any("end without step_type 2" in n for n in conv["notes"])
    assert not np.asarray(ds.column("next/terminated")[:])[-1, 0]  # cut by the file's end: truncated
    inspect_check("dq")


def test_shards_cut_mid_episode_are_joined_in_natural_order(tmp_path: Path) -> None:
    """``split_hdf5_shards.py`` cuts by rows: 11 shards (``10.hdf5`` after ``9.hdf5``), episodes
    running across them, convert to exactly the one-file dataset."""
    episodes = [dreamer_episode(n, side=SIDE, seed=n, terminal=n == 8) for n in (7, 8, 5, 6, 9, 4)]
    arrays = drqbc_arrays(episodes)
    write_drqbc(tmp_path / "one" / "data.hdf5", arrays)
    shards = write_drqbc_shards(tmp_path / "sharded", arrays, 11)
    assert shards[10].name == "10.hdf5"
    convert(tmp_path / "one", "one")
    convert(tmp_path / "sharded", "sharded", options={"block_rows": 2})
    want = episodes_reference(episodes)
    want["observation"] = want["observation"].transpose(0, 3, 1, 2)
    check_dataset("one", want)
    check_dataset("sharded", want)
    ds = open_dataset("sharded")
    assert ds.manifest.conversion["inferred_boundaries"] == 0
    assert any("joined" in n for n in ds.manifest.conversion["notes"])
    assert [f["path"] for f in ds.manifest.source["files"]] == [f"{i}.hdf5" for i in range(11)]
    # each episode's first shard (rows 0-3 are shard 0, 4-7 shard 1, ...: 39 rows in 11 shards)
    starts = np.cumsum([0, 7, 8, 5, 6, 9])
    bounds = np.cumsum([len(s) for s in np.array_split(np.arange(39), 11)])
    want_files = [int(np.searchsorted(bounds, s, side="right")) for s in starts]
    assert ds.source_arrays["vd4rl/episode_file"].tolist() == want_files
    inspect_check("sharded")


def test_a_shard_starting_mid_episode_drops_that_rows_action(tmp_path: Path) -> None:
    """A lone shard that begins inside an episode (its earlier rows are in another shard): its
    first row is only an observation. A nested per-row dataset is an observation beside the
    frames (``observation/infos/qpos``)."""
    episodes = three_episodes()
    arrays = {k: v[3:] for k, v in drqbc_arrays(episodes).items()}
    qpos = np.arange(len(arrays["reward"]) * 2, dtype=np.float32).reshape(-1, 2)
    path = write_drqbc(tmp_path / "s" / "3.hdf5", arrays)
    with h5py.File(path, "a") as f:
        f.create_dataset("infos/qpos", data=qpos)
    convert(tmp_path / "s", "mid")
    ranges = [(0, 3), *[(a - 3, b - 3) for a, b in step_type_ranges(drqbc_arrays(episodes)["step_type"])[1:]]]
    want = reference(
        arrays["observation"], arrays["action"], arrays["reward"], arrays["discount"] == 0, ranges
    )
    check_dataset("mid", want, image_key="observation/image")
    ds = open_dataset("mid")
    np.testing.assert_array_equal(np.asarray(ds.column("observation/infos/qpos")[:]), qpos)  # every row
    conv = ds.manifest.conversion
    assert conv["dropped_rows"] == 1 and conv["inferred_boundaries"] == 1
    assert ds.manifest.source["metadata"]["vd4rl"]["keys"] == {
        "infos/qpos": "observation/infos/qpos",
        "observation": "observation/image",
    }
    inspect_check("mid")


def test_both_layouts_of_the_same_episodes_agree(tmp_path: Path) -> None:
    """The npz episodes, and the drqbc file built from them, give the same dataset once one is
    asked for the other's layout."""
    episodes = three_episodes()
    write_dreamer_episodes(tmp_path / "npz", episodes)
    write_drqbc(tmp_path / "h5" / "data.hdf5", drqbc_arrays(episodes))
    convert(tmp_path / "npz", "npz-chw", options={"image_layout": "chw"})
    convert(tmp_path / "h5", "h5-chw")
    convert(tmp_path / "h5", "h5-hwc", options={"image_layout": "HWC"})
    convert(tmp_path / "npz", "npz-hwc")
    for left, right in (("npz-chw", "h5-chw"), ("npz-hwc", "h5-hwc")):
        a, b = open_dataset(left), open_dataset(right)
        assert a.manifest.content_digest["columns"] == b.manifest.content_digest["columns"]
        assert a.manifest.content_digest["episodes"] == b.manifest.content_digest["episodes"]


def test_torchrl_keeps_the_rows_unshifted(tmp_path: Path) -> None:
    """What TorchRL 0.14's ``VD4RLExperienceReplay`` builds from the same file (its own
    per-file processing, run offline): its transition 0 carries the zero action and reward of
    the reset row, rlds's carries the first real ones. Frames agree row for row."""
    pytest.importorskip("torchrl")
    from torchrl.data.datasets.vd4rl import VD4RLExperienceReplay, _from_npz

    ep = dreamer_episode(6, side=SIDE, seed=1)
    path = write_dreamer_episodes(tmp_path / "e", [ep])[0]
    td = VD4RLExperienceReplay._process_data(_from_npz(str(path)))
    convert(path, "shifted")
    ds = open_dataset("shifted")
    torch_action = td["action"].numpy()
    assert not torch_action[0].any()  # TorchRL: the padding row is transition 0
    np.testing.assert_array_equal(np.asarray(ds.column("action")[:]), torch_action[1:])
    np.testing.assert_array_equal(np.asarray(ds.column("next/reward")[:]), td["next", "reward"].numpy()[1:])
    np.testing.assert_array_equal(np.asarray(ds.column("observation")[:]), td["pixels"].numpy())
    assert td.shape[0] == ds.num_steps + 1  # TorchRL: 6 rows, 6 transitions; rlds: 5


# ----------------------------------------------------------------------------- refusals


def _bad_episode(change: str) -> dict[str, np.ndarray]:
    ep = dreamer_episode(6, side=SIDE, seed=4)
    if change == "missing":
        del ep["reward"]
    elif change == "ragged":
        ep["action"] = ep["action"][:-1]
    elif change == "first-inside":
        ep["is_first"][3] = True
    elif change == "last-early":
        ep["is_last"][2] = True
    elif change == "terminal-early":
        ep["is_terminal"][2] = True
    elif change == "float-frames":
        ep["image"] = ep["image"].astype(np.float32)
    elif change == "flat-frames":
        ep["image"] = ep["image"][..., 0]
    elif change == "no-channel-axis":
        ep["image"] = np.zeros((6, 8, 8, 8), np.uint8)
    elif change == "no-first":
        ep["is_first"][0] = False
    elif change == "no-terminal-info":
        del ep["is_terminal"], ep["discount"]
    return ep


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ("missing", ("no 'reward' array",)),
        ("ragged", ("'action' has 5 rows but 'image' has 6",)),
        ("first-inside", ("is_first is set on row 3 of 6",)),
        ("last-early", ("is_last is set on row 2 of 6",)),
        ("terminal-early", ("is_terminal is set on row 2 of 6",)),
        ("float-frames", ("'image' holds float32 frames",)),
        ("flat-frames", ("frames of shape [8, 8], not an image",)),
        ("no-channel-axis", ("no channel axis",)),
        ("no-first", ("is_first is not set on row 0",)),
        ("no-terminal-info", ("neither 'is_terminal' nor 'discount'",)),
    ],
)
def test_bad_dreamer_episode_is_one_line_naming_the_file(
    tmp_path: Path, change: str, needles: tuple[str, ...]
) -> None:
    folder = tmp_path / "e"
    write_dreamer_episodes(folder, [dreamer_episode(5, side=SIDE, seed=1)])
    bad = save_episode(folder / dreamer_name(1, 6), _bad_episode(change))
    result = runner.invoke(app, ["download", str(folder), "--name", "x", "--format", "vd4rl"])
    _refused(result, bad.name, *needles)


def test_truncated_npz_and_a_name_that_lies(tmp_path: Path) -> None:
    """A truncated file is refused; a name whose count no writer gives (7 for 5 rows: writers
    name 4 or 5) is only a label: the arrays are used, with a note."""
    folder = tmp_path / "e"
    files = write_dreamer_episodes(folder, three_episodes())
    files[1].write_bytes(files[1].read_bytes()[:-200])
    _refused(
        runner.invoke(app, ["download", str(folder), "--name", "x"]), files[1].name, "truncated or corrupt"
    )
    files[1].unlink()
    liar = files[2].rename(folder / dreamer_name(2, 7))  # 5 rows inside
    result = runner.invoke(app, ["download", str(folder), "--name", "x"])
    assert result.exit_code == 0, result.output
    ds = open_dataset("x")
    assert ds.episodes["length"].tolist() == [6, 4]
    notes = "\n".join(ds.manifest.conversion["notes"])
    assert f"{liar.name}: the file name says 7 rows, but its arrays hold 5" in notes


def test_npz_member_damaged_inside(tmp_path: Path) -> None:
    """A frame member whose compressed bytes are damaged: its CRC or inflate fails while streaming."""
    path = write_dreamer_episodes(tmp_path / "e", [dreamer_episode(40, side=16, seed=1)])[0]
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("image.npy")
    raw = bytearray(path.read_bytes())
    middle = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    raw[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    _refused(runner.invoke(app, ["download", str(path), "--name", "x"]), path.name, "'image'")


def test_files_of_different_schemas_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "e"
    write_dreamer_episodes(folder, [dreamer_episode(5, side=SIDE, seed=1)])
    other = save_episode(folder / dreamer_name(1, 5), dreamer_episode(5, side=SIDE, seed=2, action_dim=2))
    _refused(runner.invoke(app, ["download", str(folder), "--name", "x"]), other.name, "arrays action differ")


def test_a_folder_of_both_layouts_is_refused(tmp_path: Path) -> None:
    episodes = three_episodes()
    write_dreamer_episodes(tmp_path / "both", episodes)
    write_drqbc(tmp_path / "both" / "data.hdf5", drqbc_arrays(episodes))
    _refused(
        runner.invoke(app, ["download", str(tmp_path / "both"), "--name", "x"]),
        "holds both Dreamer .npz episodes",
    )


def _bad_shard(change: str) -> dict[str, np.ndarray]:
    arrays = drqbc_arrays(three_episodes())
    if change == "missing":
        del arrays["step_type"]
    elif change == "ragged":
        arrays["reward"] = arrays["reward"][:-2]
    elif change == "step-type":
        arrays["step_type"][4] = 3
    elif change == "early-discount":
        arrays["discount"][3] = 0
    elif change == "float-frames":
        arrays["observation"] = arrays["observation"].astype(np.float64)
    return arrays


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ("missing", ("no 'step_type' dataset",)),
        ("ragged", ("'reward' has 20 rows but 'observation' has 22",)),
        ("step-type", ("step_type is 3.0 at row 4",)),
        ("early-discount", ("discount is 0 at row 3 (step_type 1)",)),
        ("float-frames", ("'observation' holds float64 frames",)),
    ],
)
def test_bad_drqbc_shard_is_one_line_naming_the_file(
    tmp_path: Path, change: str, needles: tuple[str, ...]
) -> None:
    path = write_drqbc(tmp_path / "s" / "data.hdf5", _bad_shard(change))
    result = runner.invoke(app, ["download", str(path), "--name", "x", "--format", "vd4rl"])
    _refused(result, path.name, *needles)


def test_truncated_hdf5_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = write_drqbc(tmp_path / "s" / "data.hdf5", drqbc_arrays(three_episodes()))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = runner.invoke(app, ["download", str(path), "--name", "x", "--format", "vd4rl"])
    _refused(result, path.name, "truncated or corrupt")


# ----------------------------------------------------------------------------- detection


def test_sniff_claims_only_vd4rl(tmp_path: Path) -> None:
    from rlds_cli.formats.vd4rl import sniff

    ep = dreamer_episode(4, side=SIDE)
    np.savez(tmp_path / "ogbench.npz", observations=np.zeros((3, 2)), terminals=np.zeros(3))
    np.savez(tmp_path / "no_flags.npz", image=ep["image"], action=ep["action"], reward=ep["reward"])
    with h5py.File(tmp_path / "d4rl.hdf5", "w") as f:
        f["observations"] = np.zeros((3, 2))
    (tmp_path / "broken.hdf5").write_bytes(b"not hdf5")
    (tmp_path / "broken.npz").write_bytes(b"PK not a zip")
    for name in ("ogbench.npz", "no_flags.npz", "d4rl.hdf5", "broken.hdf5", "broken.npz", "missing.npz"):
        assert not sniff(tmp_path / name), name
    assert not sniff(tmp_path)  # a folder whose first file is another format's
    assert sniff(save_episode(tmp_path / "ep" / "x.npz", ep))
    assert sniff(tmp_path / "ep")


# ----------------------------------------------------------------------------- memory


_CAPPED = """
import resource, sys
from rlds_cli.sources.convert import convert
import h5py, numpy, xxhash  # loaded before the cap: only the conversion's own memory counts
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + {budget}, vm + {budget}))
convert(sys.argv[1], "capped", root=sys.argv[2])
print("converted")
"""


@pytest.mark.slow
def test_conversion_memory_is_bounded_by_the_block_not_the_source(tmp_path: Path) -> None:
    """A 300 MB (decoded) shard of zero frames converts under an address-space cap of 150 MB
    above the interpreter's: the reader holds a block, never the file."""
    rows, side = 6000, 128  # 6000 x 3 x 128 x 128 = 295 MB of frames
    step_type = np.ones(rows)
    step_type[::500] = 0
    step_type[499::500] = 2
    path = tmp_path / "big.hdf5"
    with h5py.File(path, "w") as f:  # written in slices, so the test itself stays small
        obs = f.create_dataset(
            "observation", (rows, 3, side, side), np.uint8, compression="gzip", chunks=(8, 3, side, side)
        )
        for a in range(0, rows, 1000):
            obs[a : a + 1000] = np.zeros((1000, 3, side, side), np.uint8)
        f.create_dataset("action", data=np.zeros((rows, 6), np.float32), compression="gzip")
        f.create_dataset("reward", data=np.zeros(rows, np.float32), compression="gzip")
        f.create_dataset("discount", data=np.ones(rows, np.float32), compression="gzip")
        f.create_dataset("step_type", data=step_type, compression="gzip")
    assert path.stat().st_size < 10_000_000
    env = {**os.environ, "RLDS_SOURCE_MAX_RATIO": "100000", "RLDS_FSYNC": "0", "OPENBLAS_NUM_THREADS": "1"}
    # one malloc arena: each thread's own reserves 64 MB of address space, as many as threads
    # happened to contend (a loaded machine failed to map a library under the cap)
    env["MALLOC_ARENA_MAX"] = "1"
    code = textwrap.dedent(_CAPPED).replace("{budget}", str(150 << 20))
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(tmp_path / "home")],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert out.returncode == 0 and "converted" in out.stdout, out.stderr[-2000:]
    manifest = json.loads((tmp_path / "home" / "datasets" / "capped" / "manifest.json").read_text())
    assert manifest["num_steps"] == rows - rows // 500 and manifest["num_episodes"] == rows // 500
