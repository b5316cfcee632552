"""LeRobot datasets (``--format lerobot``): v3.0 and v2.1 directories converted through the CLI.

The golden source is ``tests/fixtures/lerobot-v3-tiny/``, written by lerobot 0.4.4 itself (a copy
of ``../shared/fixtures/lerobot-v3-tiny/``: 3 episodes of 20/25/30 frames, fps 10, one 64x64 AV1
camera). Every converted value is compared with the parquet read by pyarrow here, and every frame
with the mp4 decoded by PyAV here (the same decoder, so equality is exact). The v2.1 tree is
*derived* from that fixture (:func:`tests.lerobot_fixtures.v21_tree`), following lerobot's v2.1
layout (one parquet and one mp4 per episode, ``meta/episodes.jsonl``, ``meta/tasks.jsonl``); its
mp4s are the v3 file's packets remuxed (not re-encoded), so their frames are bit-identical. The
export tests write the converted fixture back as LeRobot v3.0 (``rlds export --to lerobot``),
compare its files and schemas with the fixture's, and convert it again.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import SourceFormatError, UnknownFormatError
from rlds_cli.formats import detect_format
from rlds_cli.formats.base import is_valid_key
from rlds_cli.sources.convert import convert
from tests.cli_fixtures import download
from tests.formats_fixtures import refused
from tests.lerobot_fixtures import (
    DATA,
    EPISODES,
    FIXTURE,
    LENGTHS,
    VIDEO,
    episode_windows,
    remux,
    split_v3_tree,
    state_only_tree,
    v21_tree,
    writable_v3,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
av = pytest.importorskip("av")

runner = CliRunner()


# ----------------------------------------------------------------------------- sources


@pytest.fixture
def v3(tmp_path: Path) -> Path:
    """A writable copy of the golden v3.0 tree."""
    return writable_v3(tmp_path)


def _parquet() -> dict[str, Any]:
    return pq.read_table(FIXTURE / DATA).to_pydict()


def _info(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta" / "info.json").read_text())


def _write_info(root: Path, info: dict[str, Any]) -> None:
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def _reference_frames(video: Path = FIXTURE / VIDEO) -> list[tuple[float, np.ndarray]]:
    """Every frame of ``video`` as (time in seconds, HWC uint8 RGB), decoded by PyAV here."""
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        return [
            (float(f.pts * stream.time_base), f.to_ndarray(format="rgb24")) for f in container.decode(stream)
        ]


# ----------------------------------------------------------------------------- golden


def _check_against_fixture(name: str, *, chw: bool = False) -> None:
    """The dataset ``name`` holds exactly the fixture's parquet values and decoded frames."""
    ds = open_dataset(name)
    src = _parquet()
    n = len(src["index"])
    assert ds.num_steps == n == sum(LENGTHS)
    assert ds.episodes["length"].tolist() == LENGTHS
    assert ds.episodes["source_id"].tolist() == [0, 1, 2]
    assert not ds.episodes["final_known"].any()  # no observation after the last frame
    ends = np.cumsum(LENGTHS) - 1

    def steps(key: str) -> np.ndarray:
        return np.asarray(ds.column(key)[:])

    expected_steps = {
        "action": np.array(src["action"], np.float32),
        "next/reward": np.array(src["next.reward"], np.float32)[:, None],
        "info/timestamp": np.array(src["timestamp"], np.float32)[:, None],
        "info/frame_index": np.array(src["frame_index"], np.int64)[:, None],
        "info/task_index": np.array(src["task_index"], np.int64)[:, None],
        "info/next.success": np.array(src["next.success"], bool)[:, None],
    }
    for key, want in expected_steps.items():
        got = steps(key)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)
    # terminated where next.success is true on the last frame, truncated otherwise
    success = np.array(src["next.success"], bool)
    term, trunc = steps("next/terminated")[:, 0], steps("next/truncated")[:, 0]
    assert np.flatnonzero(term | trunc).tolist() == ends.tolist()
    np.testing.assert_array_equal(term[ends], success[ends])
    np.testing.assert_array_equal(trunc[ends], ~success[ends])
    # flat observations: every frame's row, then the last one again as the final observation
    state = np.array(src["observation.state"], np.float32)
    flat = np.insert(state, ends + 1, state[ends], axis=0)
    got = steps("observation/state")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, flat)
    frames = _reference_frames()
    per_episode = [
        np.stack([img for when, img in frames if lo - 1e-4 <= when < hi - 1e-4])
        for lo, hi in episode_windows()
    ]
    images = np.concatenate([np.concatenate([f, f[-1:]]) for f in per_episode])
    if chw:
        images = images.transpose(0, 3, 1, 2)
    got = steps("observation/image")
    assert got.dtype == np.uint8 and got.shape == images.shape
    np.testing.assert_array_equal(got, images)
    # episode_index and index are the episode index and the step position: not stored again
    assert not {"info/episode_index", "info/index", "next/next.done"} & set(ds.manifest.fields)
    assert all(is_valid_key(k) for k in ds.manifest.fields)


def test_golden_v3_fixture_converts_exactly(v3: Path) -> None:
    assert detect_format(v3) == "lerobot"
    result = download(v3, "lr")
    assert result.exit_code == 0, result.output
    _check_against_fixture("lr")
    ds = open_dataset("lr")
    meta = ds.manifest.source["metadata"]["lerobot"]
    assert meta["tasks"] == {"0": "push the T"}
    assert meta["codebase_version"] == "v3.0" and meta["fps"] == 10
    assert meta["video_layout"] == {"observation/image": "HWC"}
    assert ds.manifest.conversion["rules"] == "lerobot-v1"
    assert ds.manifest.conversion["synthesized_final_observations"] == 3
    check = runner.invoke(app, ["inspect", "lr", "--check"])
    assert check.exit_code == 0, check.output
    assert "check passed" in check.output


def test_info_json_path_and_small_blocks_give_the_same_data(v3: Path) -> None:
    """``meta/info.json`` as the source is detected too; blocks of 7 rows (episodes spanning
    blocks, frames decoded across block edges) store the same values."""
    assert detect_format(v3 / "meta" / "info.json") == "lerobot"
    convert(v3 / "meta" / "info.json", "small", options={"block_rows": 7})
    _check_against_fixture("small")


def test_v21_layout_converts_to_the_same_data(v3: Path, tmp_path: Path) -> None:
    src = v21_tree(v3, tmp_path / "v21")
    assert detect_format(src) == "lerobot"
    result = download(src, "v21")
    assert result.exit_code == 0, result.output
    _check_against_fixture("v21")
    assert open_dataset("v21").manifest.source["metadata"]["lerobot"]["codebase_version"] == "v2.1"
    assert runner.invoke(app, ["inspect", "v21", "--check"]).exit_code == 0


def test_channels_first_video_feature(v3: Path) -> None:
    info = _info(v3)
    feature = info["features"]["observation.image"]
    feature["shape"], feature["names"] = [3, 64, 64], ["channels", "height", "width"]
    _write_info(v3, info)
    assert download(v3, "chw").exit_code == 0
    _check_against_fixture("chw", chw=True)
    assert open_dataset("chw").manifest.source["metadata"]["lerobot"]["video_layout"] == {
        "observation/image": "CHW"
    }


def test_without_reward_and_success_columns(v3: Path) -> None:
    """No next.reward: reward 0 (noted). No next.success: every episode ends truncated."""
    table = pq.read_table(v3 / DATA).drop_columns(["next.reward", "next.success"])
    pq.write_table(table, v3 / DATA)
    info = _info(v3)
    del info["features"]["next.reward"], info["features"]["next.success"]
    _write_info(v3, info)
    assert download(v3, "bare").exit_code == 0
    ds = open_dataset("bare")
    assert not np.asarray(ds.column("next/reward")[:]).any()
    assert not np.asarray(ds.column("next/terminated")[:]).any()
    trunc = np.asarray(ds.column("next/truncated")[:])[:, 0]
    assert np.flatnonzero(trunc).tolist() == (np.cumsum(LENGTHS) - 1).tolist()
    notes = "\n".join(ds.manifest.conversion["notes"])
    assert "no next.reward column" in notes and "every episode ends truncated" in notes
    assert runner.invoke(app, ["inspect", "bare", "--check"]).exit_code == 0


@pytest.mark.parametrize("block_rows", [None, 1, 19])
def test_last_step_drop_keeps_the_last_frame_as_the_real_final_observation(v3: Path, block_rows: Any) -> None:
    """``last_step="drop"`` (the reference's rule 1): L - 1 transitions per episode, the last frame
    is the final observation (``final_known``), its reward and success move onto step L - 2.
    ``block_rows`` 1 and 19 put an episode's last row alone at a block edge."""
    options: dict[str, Any] = {"last_step": "drop"}
    if block_rows:
        options["block_rows"] = block_rows
    convert(v3, "drop", options=options)
    ds = open_dataset("drop")
    src = _parquet()
    assert ds.episodes["length"].tolist() == [n - 1 for n in LENGTHS]
    assert ds.episodes["final_known"].all()
    assert ds.manifest.conversion["dropped_rows"] == len(LENGTHS)
    bounds = np.cumsum([0, *LENGTHS])
    keep = np.concatenate([np.arange(a, b - 1) for a, b in itertools.pairwise(bounds)])
    last = bounds[1:] - 1
    action = np.array(src["action"], np.float32)
    np.testing.assert_array_equal(np.asarray(ds.column("action")[:]), action[keep])
    reward = np.array(src["next.reward"], np.float32)
    moved = reward.copy()
    moved[last - 1] += reward[last]
    np.testing.assert_array_equal(np.asarray(ds.column("next/reward")[:])[:, 0], moved[keep])
    success = np.array(src["next.success"], bool)
    term = np.asarray(ds.column("next/terminated")[:])[:, 0]
    step_ends = np.cumsum([n - 1 for n in LENGTHS]) - 1
    np.testing.assert_array_equal(term[step_ends], success[last])
    assert term.sum() == success[last].sum()
    # every frame is an observation, the last of each episode its real final observation
    state = np.array(src["observation.state"], np.float32)
    np.testing.assert_array_equal(np.asarray(ds.column("observation/state")[:]), state)
    frames = np.stack([img for _, img in _reference_frames()])
    np.testing.assert_array_equal(np.asarray(ds.column("observation/image")[:]), frames)
    assert runner.invoke(app, ["inspect", "drop", "--check"]).exit_code == 0


def test_an_unknown_last_step_rule_is_refused(v3: Path) -> None:
    with pytest.raises(SourceFormatError, match="last_step is 'first'"):
        convert(v3, "x", options={"last_step": "first"})


def test_a_subset_of_episodes_and_an_early_done(v3: Path) -> None:
    """``--episodes 1:3`` keeps episodes 1 and 2 with their source ids and passes the check; a
    ``next.done`` set mid-episode does not cut it and is noted."""
    table = pq.read_table(v3 / DATA)
    done = np.array(table.column("next.done").to_pylist())
    done[30] = True  # inside episode 1 (rows 20..44)
    table = table.set_column(table.column_names.index("next.done"), "next.done", pa.array(done))
    pq.write_table(table, v3 / DATA)
    assert download(v3, "sub", "--episodes", "1:3").exit_code == 0
    ds = open_dataset("sub")
    assert ds.episodes["source_id"].tolist() == [1, 2]
    assert ds.episodes["length"].tolist() == LENGTHS[1:]
    action = np.array(_parquet()["action"], np.float32)
    np.testing.assert_array_equal(np.asarray(ds.column("action")[:]), action[LENGTHS[0] :])
    assert "next.done is true on 1 frame(s) that are not an episode's last" in "\n".join(
        ds.manifest.conversion["notes"]
    )
    check = runner.invoke(app, ["inspect", "sub", "--check"])
    assert check.exit_code == 0, check.output


def test_v3_tree_split_over_several_data_and_video_files(v3: Path, tmp_path: Path) -> None:
    """Episodes 0-1 in ``file-000``, episode 2 in ``file-001`` (parquet and mp4, as lerobot does
    once a file reaches its size limit): rows found by ``dataset_from_index`` within each file,
    frames by each file's own timestamps."""
    split_v3_tree(v3)
    result = download(v3, "split")
    assert result.exit_code == 0, result.output
    _check_against_fixture("split")


def test_two_cameras(v3: Path) -> None:
    """A second camera ``observation.images.wrist`` (here the same mp4) is its own key."""
    wrist = Path("videos/observation.images.wrist/chunk-000/file-000.mp4")
    (v3 / wrist).parent.mkdir(parents=True)
    shutil.copyfile(v3 / VIDEO, v3 / wrist)
    info = _info(v3)
    info["features"]["observation.images.wrist"] = info["features"]["observation.image"]
    _write_info(v3, info)
    episodes = pq.read_table(v3 / EPISODES)
    for part in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
        episodes = episodes.append_column(
            f"videos/observation.images.wrist/{part}", episodes.column(f"videos/observation.image/{part}")
        )
    pq.write_table(episodes, v3 / EPISODES)
    assert download(v3, "two", "--format", "lerobot").exit_code == 0
    _check_against_fixture("two")
    ds = open_dataset("two")
    np.testing.assert_array_equal(
        np.asarray(ds.column("observation/images/wrist")[:]), np.asarray(ds.column("observation/image")[:])
    )


def test_without_codebase_version_it_is_not_detected(v3: Path) -> None:
    info = _info(v3)
    del info["codebase_version"]
    _write_info(v3, info)
    with pytest.raises(UnknownFormatError):
        detect_format(v3)


# ----------------------------------------------------------------------------- bad input


def test_a_video_with_fewer_frames_than_the_parquet(v3: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.mp4"
    assert remux(v3 / VIDEO, short, 0.0, 7.5, drop_last=3) == 72
    shutil.copyfile(short, v3 / VIDEO)
    line = refused(download(v3, "lr"), str(v3 / VIDEO), "episode 2 has 27 frames", "parquet has 30 rows")
    assert "error: " in line


def test_a_v21_episode_video_with_fewer_frames(v3: Path, tmp_path: Path) -> None:
    src = v21_tree(v3, tmp_path / "v21")
    video = src / "videos" / "chunk-000" / "observation.image" / "episode_000001.mp4"
    remux(v3 / VIDEO, video, 2.0, 4.5, drop_last=1)
    refused(download(src, "lr"), str(video), "episode 1 has 24 frames", "parquet has 25 rows")


@pytest.mark.parametrize("damaged", [DATA, VIDEO, EPISODES])
def test_a_truncated_file_is_one_line_naming_it(v3: Path, damaged: Path) -> None:
    data = (v3 / damaged).read_bytes()
    (v3 / damaged).write_bytes(data[: len(data) * 6 // 10])
    refused(download(v3, "lr"), str(v3 / damaged))


@pytest.mark.parametrize("missing", [DATA, VIDEO])
def test_a_missing_file_named_in_info_json(v3: Path, missing: Path) -> None:
    (v3 / missing).unlink()
    what = "data_path" if missing == DATA else "video_path"
    refused(download(v3, "lr"), str(v3 / missing), "is missing", what)


def test_a_wrong_codebase_version(v3: Path) -> None:
    info = _info(v3)
    info["codebase_version"] = "v1.6"
    _write_info(v3, info)
    refused(download(v3, "lr"), "info.json", "codebase_version 'v1.6'")


@pytest.mark.parametrize(
    ("field", "template", "needle"),
    [
        ("data_path", "../../outside/file-{file_index:03d}.parquet", "escapes the dataset directory"),
        ("data_path", "/etc/file-{file_index:03d}.parquet", "escapes the dataset directory"),
        ("video_path", "videos/../../{video_key}.mp4", "escapes the dataset directory"),
        ("data_path", "data/{chunk_index.__class__}.parquet", "uses the field"),
        ("data_path", "data/{chunk_index:0999999999d}.parquet", "uses the field"),
        ("video_path", "videos/{video_key!r}.mp4", "uses the field"),
    ],
)
def test_a_path_template_that_escapes_or_abuses_format(
    v3: Path, field: str, template: str, needle: str
) -> None:
    outside = v3.parent / "outside"
    outside.mkdir()
    shutil.copyfile(v3 / DATA, outside / "file-000.parquet")  # a real file there: only the rule refuses it
    info = _info(v3)
    info[field] = template
    _write_info(v3, info)
    refused(download(v3, "lr"), "info.json", field, needle)


def test_a_data_file_that_is_a_symlink_out_of_the_dataset(v3: Path) -> None:
    outside = v3.parent / "outside.parquet"
    shutil.move(v3 / DATA, outside)
    (v3 / DATA).symlink_to(outside)
    refused(download(v3, "lr"), "escapes the dataset directory")


def test_a_hugging_face_cache_snapshot_converts(tmp_path: Path) -> None:
    """In the hub cache (``datasets--org--name/snapshots/<rev>/``) every file is a symlink into the
    repository's own ``blobs/``: those are read; a link elsewhere is still refused."""
    repo = tmp_path / "hub" / "datasets--lerobot--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for i, rel in enumerate(_files(FIXTURE)):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copyfile(FIXTURE / rel, blob)
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).symlink_to(os.path.relpath(blob, (snapshot / rel).parent))
    assert download(snapshot, "hub").exit_code == 0
    _check_against_fixture("hub")
    outside = tmp_path / "elsewhere.parquet"
    shutil.copyfile(FIXTURE / DATA, outside)
    (snapshot / DATA).unlink()
    (snapshot / DATA).symlink_to(outside)
    refused(download(snapshot, "hub2"), "escapes the dataset directory", published=("hub",))


def test_frames_of_another_size_than_info_json_declares(v3: Path) -> None:
    info = _info(v3)
    info["features"]["observation.image"]["shape"] = [32, 32, 3]
    _write_info(v3, info)
    refused(download(v3, "lr"), str(v3 / VIDEO), "frames are 64x64")


def test_episodes_table_and_data_file_disagree(v3: Path) -> None:
    table = pq.read_table(v3 / DATA)
    pq.write_table(table.slice(0, 70), v3 / DATA)
    refused(download(v3, "lr"), str(v3 / DATA), "has 70 rows", "75")


@pytest.mark.parametrize(
    ("content", "needle"), [("[1, 2]", "is not a JSON object"), ("{", "not readable JSON")]
)
def test_an_info_json_that_is_no_json_object_is_named(v3: Path, content: str, needle: str) -> None:
    """It said 'cannot tell the format of ...' for valid JSON that is no object."""
    (v3 / "meta" / "info.json").write_text(content)
    refused(download(v3, "lr"), "meta/info.json", needle)


def test_a_task_index_outside_the_tasks_table_is_refused(v3: Path) -> None:
    """It converted, then every export failed, sending the user to ``rlds verify``, which passed."""
    table = pq.read_table(v3 / DATA)
    tasks = np.array(table.column("task_index").to_pylist())
    tasks[40] = 7  # meta/tasks.parquet holds task 0 alone
    table = table.set_column(table.column_names.index("task_index"), "task_index", pa.array(tasks))
    pq.write_table(table, v3 / DATA)
    refused(download(v3, "lr"), str(v3 / DATA), "task_index 7", "meta/tasks.parquet does not hold")


def test_hostile_feature_names_are_cleaned(v3: Path) -> None:
    """A feature named ``observation.../../../x y`` (in info.json and the parquet) is stored
    under a cleaned key inside the dataset, with a note; nothing lands outside the cache."""
    hostile = "observation.../../../x y"
    table = pq.read_table(v3 / DATA)
    names = [hostile if n == "observation.state" else n for n in table.column_names]
    pq.write_table(table.rename_columns(names), v3 / DATA)
    info = _info(v3)
    info["features"] = {(hostile if k == "observation.state" else k): v for k, v in info["features"].items()}
    _write_info(v3, info)
    result = download(v3, "hostile")
    assert result.exit_code == 0, result.output
    ds = open_dataset("hostile")
    assert all(is_valid_key(k) for k in ds.manifest.fields)
    notes = "\n".join(ds.manifest.conversion["notes"])
    assert repr(hostile) in notes
    (key,) = [k for k in ds.manifest.fields if k.startswith("observation/") and k != "observation/image"]
    assert ".." not in key.split("/")
    state = np.array(_parquet()["observation.state"], np.float32)
    np.testing.assert_array_equal(np.asarray(ds.column(key)[:])[: LENGTHS[0]], state[: LENGTHS[0]])
    arrays = Path(os.environ["RLDS_HOME"]) / "datasets" / "hostile" / "arrays"
    assert all(p.resolve().is_relative_to(arrays.resolve()) for p in arrays.rglob("*"))


def test_a_camera_less_dataset_converts(tmp_path: Path) -> None:
    src = state_only_tree(tmp_path / "s", 12)
    assert download(src, "state").exit_code == 0
    ds = open_dataset("state")
    assert ds.num_steps == 12 and "observation/state" in ds.manifest.fields
    assert runner.invoke(app, ["inspect", "state", "--check"]).exit_code == 0


def test_a_data_file_declaring_far_more_rows_than_it_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All-zero columns compress to almost nothing: the declared/stored rule of every reader
    refuses such a file before anything is decoded (floors lowered to keep the file small)."""
    monkeypatch.setattr("rlds_cli.formats.untrusted.RATIO_FLOOR_BYTES", 1 << 20)
    src = state_only_tree(tmp_path / "s", 200_000)
    assert (src / DATA).stat().st_size < 200_000
    refused(download(src, "lr"), str(src / DATA), "a decompression bomb")


# ----------------------------------------------------------------------------- export


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_export_matches_the_fixture_layout_and_round_trips(v3: Path, tmp_path: Path) -> None:
    """``rlds export --to lerobot`` of the converted fixture writes the fixture's files with its
    info.json, its episodes, data and tasks schemas; converting the export back gives every
    parquet value exactly and the frames within AV1's loss."""
    assert download(v3, "tiny").exit_code == 0
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export", "tiny", str(out), "--to", "lerobot"])
    assert result.exit_code == 0, result.output
    assert _files(out) == _files(FIXTURE)
    assert _info(out) == _info(FIXTURE)
    for rel in (EPISODES, DATA):
        assert pq.read_schema(out / rel).equals(pq.read_schema(FIXTURE / rel), check_metadata=False), rel
    assert pq.read_table(out / "meta/tasks.parquet").to_pydict() == {
        "task_index": [0],
        "__index_level_0__": ["push the T"],
    }
    episodes = pq.read_table(out / EPISODES).to_pydict()
    fixture_episodes = pq.read_table(FIXTURE / EPISODES).to_pydict()
    for col in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "tasks"):
        assert episodes[col] == fixture_episodes[col], col
    for col in ("from_timestamp", "to_timestamp"):
        name = f"videos/observation.image/{col}"
        np.testing.assert_allclose(episodes[name], fixture_episodes[name])
    # the data parquet holds the fixture's values, column by column
    exported, source = pq.read_table(out / DATA).to_pydict(), _parquet()
    for col, values in source.items():
        if col == "timestamp":
            np.testing.assert_allclose(exported[col], values, rtol=1e-6)
        else:
            assert exported[col] == values, col
    # every episode starts on a keyframe (readers seek there)
    with av.open(str(out / VIDEO)) as container:
        stream = container.streams.video[0]
        keys = {round(float(p.pts * stream.time_base), 4) for p in container.demux(stream) if p.is_keyframe}
    assert {0.0, 2.0, 4.5} <= keys
    # back into the cache: the same keys, values and episodes; frames within the codec's loss
    assert download(out, "back").exit_code == 0
    assert runner.invoke(app, ["inspect", "back", "--check"]).exit_code == 0
    a, b = open_dataset("tiny"), open_dataset("back")
    assert sorted(a.manifest.fields) == sorted(b.manifest.fields)
    assert a.episode_index.tolist() == b.episode_index.tolist()
    for key in a.manifest.fields:
        x, y = np.asarray(a.column(key)[:]), np.asarray(b.column(key)[:])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        if key != "observation/image":
            np.testing.assert_array_equal(x, y, err_msg=key)
    x = np.asarray(a.column("observation/image")[:]).astype(np.float64)
    y = np.asarray(b.column("observation/image")[:]).astype(np.float64)
    psnr = 10 * np.log10(255**2 / np.mean((x - y) ** 2))
    assert psnr > 25, psnr  # 27.5 dB measured: the fixture's frames are noise, AV1 at CRF 30


def test_export_of_a_d4rl_dataset_round_trips(tmp_path: Path) -> None:
    """A dataset that never was LeRobot: ``observation`` becomes ``observation.state`` (read back
    as ``observation/state``), one task named after the dataset, fps 30, the terminated flag in
    ``next.success``; the final observations are not exported (LeRobot has none)."""
    from tests.d4rl_fixtures import golden_three_episodes

    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    convert(src, "g")
    out = tmp_path / "g-lerobot"
    assert runner.invoke(app, ["export", "g", str(out), "--to", "lerobot"]).exit_code == 0
    info = _info(out)
    assert info["fps"] == 30 and "observation.state" in info["features"] and info["video_path"] is None
    assert pq.read_table(out / "meta/tasks.parquet").to_pydict()["__index_level_0__"] == ["g"]
    assert download(out, "g-back").exit_code == 0
    a, b = open_dataset("g"), open_dataset("g-back")
    assert a.episodes["length"].tolist() == b.episodes["length"].tolist()
    for key in ("action", "next/reward", "next/terminated", "next/truncated"):
        np.testing.assert_array_equal(np.asarray(a.column(key)[:]), np.asarray(b.column(key)[:]), err_msg=key)
    starts = a.episodes["start"] + np.arange(a.num_episodes)  # flat rows without the final observations
    obs = np.asarray(a.column("observation")[:])
    steps = np.concatenate([obs[s : s + n] for s, n in zip(starts, a.episodes["length"], strict=True)])
    back = np.asarray(b.column("observation/state")[:])
    back_starts = b.episodes["start"] + np.arange(b.num_episodes)
    np.testing.assert_array_equal(
        np.concatenate([back[s : s + n] for s, n in zip(back_starts, b.episodes["length"], strict=True)]),
        steps,
    )


def _state_episodes(root: Path, lengths: list[int]) -> Path:
    """A camera-less v3.0 tree of episodes of ``lengths`` frames, in one data file."""
    state_only_tree(root, sum(lengths))
    info = _info(root)
    info.update(total_episodes=len(lengths))
    _write_info(root, info)
    table = pq.read_table(root / DATA)
    index = np.repeat(np.arange(len(lengths)), lengths)
    table = table.set_column(table.schema.get_field_index("episode_index"), "episode_index", pa.array(index))
    pq.write_table(table, root / DATA)
    ends = np.cumsum(lengths)
    episodes = pa.table(
        {
            "episode_index": list(range(len(lengths))),
            "length": lengths,
            "data/chunk_index": [0] * len(lengths),
            "data/file_index": [0] * len(lengths),
            "dataset_from_index": (ends - lengths).tolist(),
            "dataset_to_index": ends.tolist(),
        }
    )
    pq.write_table(episodes, root / EPISODES)
    return root


@pytest.mark.parametrize("episodes", ["1:", "1:5"])
def test_a_subset_counts_the_episodes_without_a_transition_as_the_whole_source_does(
    tmp_path: Path, episodes: str
) -> None:
    """An episode of one frame has no transition under last_step="drop": dropped, and counted in
    the report whether or not the episodes read start after it (the subset passes the check)."""
    from rlds_cli.inspection.validate import check_dataset

    src = _state_episodes(tmp_path / "s", [1, 3, 4])
    options: dict[str, Any] = {"last_step": "drop"}
    convert(src, "whole", options=options)
    convert(src, "sub", options={**options, "episodes": episodes})
    whole, sub = open_dataset("whole"), open_dataset("sub")
    assert sub.episodes["source_id"].tolist() == [2]
    assert sub.manifest.conversion["dropped_episodes"] == whole.manifest.conversion["dropped_episodes"] == 1
    # the frame of the skipped episode, and the last frame of the one kept (the drop rule)
    assert sub.manifest.conversion["dropped_rows"] == 2
    report = check_dataset(sub)
    assert report.ok, report


# ----------------------------------------------------------------------------- image features


def _image_tree(v3: Path, codec: str = "PNG") -> tuple[Path, list[bytes]]:
    """The golden tree with its camera as an image feature: each row's frame (the video's,
    decoded here) as one image file in the parquet, in the struct of ``bytes`` and ``path`` the
    Hugging Face ``Image`` type writes (lerobot's ``dtype: image``)."""
    import io

    from PIL import Image

    frames = [img for _, img in _reference_frames()]
    files = []
    for img in frames:
        out = io.BytesIO()
        Image.fromarray(img).save(out, format=codec)
        files.append(out.getvalue())
    table = pq.read_table(v3 / DATA)
    struct = pa.StructArray.from_arrays(
        [pa.array(files[: table.num_rows], pa.binary()), pa.array([None] * table.num_rows, pa.string())],
        names=["bytes", "path"],
    )
    pq.write_table(table.append_column("observation.image", struct), v3 / DATA)
    info = _info(v3)
    info["features"]["observation.image"]["dtype"] = "image"
    info["features"]["observation.image"].pop("info", None)
    _write_info(v3, info)
    return v3, files[: table.num_rows]


@pytest.mark.parametrize("codec", ["PNG", "JPEG"])
def test_image_features_kept_as_the_parquet_stores_them(v3: Path, codec: str) -> None:
    root, files = _image_tree(v3, codec)
    m = convert(root, "img").manifest
    assert m.fields["observation/image"].codec == codec.lower()
    ds = open_dataset("img")
    column = ds.column("observation/image")
    assert bytes(column.frame_bytes(0)) == files[0] and bytes(column.frame_bytes(21)) == files[20]  # kept
    import io

    from PIL import Image

    want = np.asarray(Image.open(io.BytesIO(files[3])))
    np.testing.assert_array_equal(ds.episode(0)["observation/image"][3], want)
    raw = convert(root, "img-raw", frames="raw").manifest
    assert raw.fields["observation/image"].codec == "raw"
    np.testing.assert_array_equal(open_dataset("img-raw").column("observation/image")[:], column[:])


def test_image_features_by_path_only_are_refused(v3: Path) -> None:
    root, _ = _image_tree(v3)
    table = pq.read_table(root / DATA)
    n = table.num_rows
    paths = pa.StructArray.from_arrays(
        [pa.array([None] * n, pa.binary()), pa.array(["images/f.png"] * n, pa.string())],
        names=["bytes", "path"],
    )
    i = table.column_names.index("observation.image")
    pq.write_table(table.set_column(i, "observation.image", paths), root / DATA)
    refused(download(root, "img"), "image column 'observation.image' names files by path")


def test_a_vast_shape_in_info_json_is_refused_naming_the_feature(tmp_path: Path) -> None:
    """A ``meta/info.json`` declaring ``observation.state`` of 200 million values was refused as
    "'rows' declares ... bytes": a key no file has, and no word of info.json."""
    src = state_only_tree(tmp_path / "s", 12)
    info = _info(src)
    info["features"]["observation.state"]["shape"] = [200_000_000]
    _write_info(src, info)
    refused(
        download(src, "lr"),
        str(src / DATA),
        "by meta/info.json's shapes, the largest 'observation.state' [200000000]",
        "a decompression bomb",
    )
