"""``rlds export --to lerobot --lerobot-version 2.1``: the golden LeRobot fixture (written by
lerobot 0.4.4) converted, written back in lerobot 0.3's v2.1 layout, compared with the v2.1 tree
derived from the fixture (:func:`tests.lerobot_fixtures.v21_tree`) and converted again."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import ExportError
from rlds_cli.export import export_dataset
from rlds_cli.export.lerobot import camera_stats, sample_indices
from rlds_cli.sources.convert import convert
from tests.cli_fixtures import download
from tests.lerobot_fixtures import FIXTURE, LENGTHS, v21_tree, writable_v3

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
av = pytest.importorskip("av")
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("consoles")


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _info(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta" / "info.json").read_text())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def tiny(isolated_cache: Path, tmp_path: Path) -> Path:
    """The golden v3.0 fixture converted as ``tiny``; returns its v2.1 rewrite's folder."""
    assert download(writable_v3(tmp_path), "tiny").exit_code == 0
    return v21_tree(FIXTURE, tmp_path / "v21")


def test_a_view_exports_with_its_parents_fps_and_tasks(tiny: Path, tmp_path: Path) -> None:
    """A view's export took the default 30 fps and the view's name as its one task (every
    timestamp wrong, the instruction lost): a view's source metadata is its parent's."""
    assert runner.invoke(app, ["view", "tiny", "--episodes", "0:2", "--name", "part"]).exit_code == 0
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export", "part", str(out), "--to", "lerobot", "--lerobot-version", "2.1"])
    assert result.exit_code == 0, result.output
    assert _info(out)["fps"] == _info(tiny)["fps"]
    assert _jsonl(out / "meta/tasks.jsonl") == _jsonl(tiny / "meta/tasks.jsonl")


def test_trimmed_merged_and_downsampled_datasets_keep_the_rate_and_tasks(tiny: Path, tmp_path: Path) -> None:
    """A trim of a 10 fps LeRobot dataset exported at 30 fps (every timestamp 3x off) with its own
    name as the task: derived datasets carry the rate (the card; downsampling divides it) and a
    trim or a merge of one source its source's facts; a rate that is not whole is refused."""

    def export(name: str) -> Any:
        out = tmp_path / f"out-{name}"
        return runner.invoke(
            app, ["export", name, str(out), "--to", "lerobot", "--lerobot-version", "2.1"]
        ), out

    assert runner.invoke(app, ["trim", "tiny", "--end", "1", "--name", "cut"]).exit_code == 0
    assert runner.invoke(app, ["view", "cut", "--episodes", "0:2", "--name", "cut-part"]).exit_code == 0
    assert runner.invoke(app, ["view", "tiny", "--episodes", "0:1", "--name", "first"]).exit_code == 0
    assert runner.invoke(app, ["view", "tiny", "--episodes", "1:3", "--name", "rest"]).exit_code == 0
    assert runner.invoke(app, ["merge", "first", "rest", "--name", "joined"]).exit_code == 0
    for name in ("cut", "cut-part", "joined"):
        result, out = export(name)
        assert result.exit_code == 0, result.output
        assert _info(out)["fps"] == _info(tiny)["fps"] == 10, name
        assert _jsonl(out / "meta/tasks.jsonl") == _jsonl(tiny / "meta/tasks.jsonl"), name
        ts = pq.read_table(out / "data/chunk-000/episode_000000.parquet").column("timestamp").to_pylist()
        assert ts[:3] == pytest.approx([0.0, 0.1, 0.2]), name
    assert runner.invoke(app, ["downsample", "tiny", "--every", "2", "--name", "half"]).exit_code == 0
    result, out = export("half")
    assert result.exit_code == 0, result.output
    assert _info(out)["fps"] == 5
    assert runner.invoke(app, ["downsample", "tiny", "--every", "3", "--name", "third"]).exit_code == 0
    result, out = export("third")
    assert result.exit_code == 1 and not out.exists()
    assert "third runs at 3.33333 frames a second; LeRobot's timestamps and videos take a whole number" in (
        " ".join(result.output.split())
    )


def test_export_writes_the_v21_layout_and_round_trips(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    policy = os.sched_getscheduler(0)
    result = runner.invoke(app, ["export", "tiny", str(out), "--to", "lerobot", "--lerobot-version", "2.1"])
    assert result.exit_code == 0, result.output
    # SVT-AV1 moves its calling thread to SCHED_FIFO when run as root: the export puts it back
    assert os.sched_getscheduler(0) == policy
    assert _files(out) == sorted([*_files(tiny), "meta/episodes_stats.jsonl"])
    info, want = _info(out), _info(tiny)
    assert info["features"] == want["features"]
    for key in ("codebase_version", "data_path", "video_path", "fps", "total_episodes", "total_frames"):
        assert info[key] == want[key], key
    assert (info["total_videos"], info["total_chunks"], info["chunks_size"]) == (3, 1, 1000)
    assert _jsonl(out / "meta/episodes.jsonl") == _jsonl(tiny / "meta/episodes.jsonl")
    assert _jsonl(out / "meta/tasks.jsonl") == _jsonl(tiny / "meta/tasks.jsonl")
    for e in range(3):
        rel = f"data/chunk-000/episode_{e:06d}.parquet"
        ours, theirs = pq.read_table(out / rel), pq.read_table(tiny / rel)
        assert ours.schema.equals(theirs.schema, check_metadata=False), rel
        assert ours.to_pydict() == theirs.to_pydict(), rel
        with av.open(str(out / f"videos/chunk-000/observation.image/episode_{e:06d}.mp4")) as container:
            stream = container.streams.video[0]
            packets = [p for p in container.demux(stream) if p.pts is not None]
        assert len(packets) == LENGTHS[e] and packets[0].is_keyframe and packets[0].pts == 0
    # back into the cache: the same keys, values and episodes; frames within AV1's loss
    assert download(out, "back").exit_code == 0
    a, b = open_dataset("tiny"), open_dataset("back")
    assert b.manifest.source["metadata"]["lerobot"]["codebase_version"] == "v2.1"
    assert sorted(a.manifest.fields) == sorted(b.manifest.fields)
    assert a.episode_index.tolist() == b.episode_index.tolist()
    for key in a.manifest.fields:
        x, y = np.asarray(a.column(key)[:]), np.asarray(b.column(key)[:])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        if key != "observation/image":
            np.testing.assert_array_equal(x, y, err_msg=key)
    x = np.asarray(a.column("observation/image")[:]).astype(np.float64)
    y = np.asarray(b.column("observation/image")[:]).astype(np.float64)
    assert 10 * np.log10(255**2 / np.mean((x - y) ** 2)) > 25


def test_episode_stats_are_lerobot_03s(tiny: Path, tmp_path: Path) -> None:
    """Per feature min, max, mean, std and count over the episode (no quantiles); a camera's per
    channel over the sampled frames, divided by 255, shaped (3, 1, 1)."""
    ds = open_dataset("tiny")
    out = export_dataset(ds, tmp_path / "out", "lerobot", options={"version": "2.1"})
    lines = _jsonl(out / "meta/episodes_stats.jsonl")
    assert [line["episode_index"] for line in lines] == [0, 1, 2]
    features = list(_info(out)["features"])
    for e, line in enumerate(lines):
        stats = line["stats"]
        assert list(stats) == [f for f in features if f in stats] and set(stats) == set(features)
        episode = ds.episode(e)
        action = episode["action"]
        assert sorted(stats["action"]) == ["count", "max", "mean", "min", "std"]
        np.testing.assert_allclose(stats["action"]["mean"], action.astype(np.float64).mean(axis=0))
        np.testing.assert_array_equal(stats["action"]["min"], action.min(axis=0))
        assert stats["action"]["count"] == [LENGTHS[e]]
        assert stats["frame_index"]["max"] == [LENGTHS[e] - 1]
        frames = episode["observation/image"]
        image = stats["observation.image"]
        assert np.asarray(image["mean"]).shape == (3, 1, 1) and image["count"] == [LENGTHS[e]]
        chw = frames.transpose(0, 3, 1, 2) if frames.shape[-1] == 3 else frames
        want = chw.mean(axis=(0, 2, 3)) / 255.0
        np.testing.assert_allclose(np.asarray(image["mean"]).reshape(3), want)


def test_sampling_and_downsampling_follow_lerobot() -> None:
    assert sample_indices(20).tolist() == list(range(20))
    assert len(sample_indices(1000)) == 177  # lerobot's docstring: at 1000, 177 samples
    assert len(sample_indices(20_000)) == 1681
    big = np.zeros((2, 3, 480, 640), np.uint8)
    big[:, :, ::4, ::4] = 255  # what a stride of 4 (640 / 150) keeps
    assert np.asarray(camera_stats(big, "CHW")["mean"]).reshape(3).tolist() == [1.0, 1.0, 1.0]


def test_a_d4rl_dataset_round_trips(isolated_cache: Path, tmp_path: Path) -> None:
    from tests.d4rl_fixtures import golden_three_episodes

    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=False), "g")
    out = export_dataset(open_dataset("g"), tmp_path / "g-v21", "lerobot", options={"version": "v2.1"})
    info = _info(out)
    assert info["video_path"] is None and info["total_videos"] == 0 and info["codebase_version"] == "v2.1"
    assert _jsonl(out / "meta/tasks.jsonl") == [{"task_index": 0, "task": "g"}]
    convert(out, "back")
    a, b = open_dataset("g"), open_dataset("back")
    for key in ("action", "next/reward", "next/terminated", "next/truncated"):
        np.testing.assert_array_equal(a.column(key)[:], b.column(key)[:], err_msg=key)


def test_unknown_version_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"LeRobot version '2\.0'; rlds writes 3\.0 and 2\.1"):
        export_dataset(open_dataset("tiny"), tmp_path / "x", "lerobot", options={"version": "2.0"})
    result = runner.invoke(
        app, ["export", "tiny", str(tmp_path / "y"), "--to", "lerobot", "--lerobot-version", "4"]
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: LeRobot version '4'; rlds writes 3.0 and 2.1"
    wrong = runner.invoke(
        app, ["export", "tiny", str(tmp_path / "z"), "--to", "rlds", "--lerobot-version", "2.1"]
    )
    assert (
        wrong.stderr.splitlines()[0]
        == "error: --lerobot-version is an option of --to lerobot, not of --to rlds"
    )
    assert not any((tmp_path / n).exists() for n in "xyz")


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_episode_tables_stream_and_stats_are_the_datasets(
    version: str, isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every episode's row (and, in 3.0, its statistics) was held until the end: ~45 KB an episode.
    The rows are now written as they come (3.0: INDEX_ROWS at a time; here 7), the dataset
    statistics accumulated; they equal the statistics of the whole dataset's arrays."""
    from rlds_cli.export import lerobot

    monkeypatch.setattr(lerobot, "INDEX_ROWS", 7)
    monkeypatch.setattr(lerobot, "DATA_ROWS", 300)  # row groups of several episodes
    assert download("demo", "demo").exit_code == 0
    ds = open_dataset("demo")
    out = export_dataset(ds, tmp_path / "out", "lerobot", options={"version": version})
    if version == "2.1":
        rows = _jsonl(out / "meta/episodes.jsonl")
        assert [r["episode_index"] for r in rows] == list(range(ds.num_episodes))
        assert [r["length"] for r in rows] == ds.episodes["length"].tolist()
        assert len(_jsonl(out / "meta/episodes_stats.jsonl")) == ds.num_episodes
        return
    table = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet")
    assert table.column("episode_index").to_pylist() == list(range(ds.num_episodes))
    assert table.column("length").to_pylist() == ds.episodes["length"].tolist()
    stats = json.loads((out / "meta/stats.json").read_text())["action"]
    action = np.asarray(ds.column("action")[:], np.float64)
    np.testing.assert_allclose(stats["mean"], action.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["std"], action.std(0), rtol=1e-6)
    np.testing.assert_allclose(stats["min"], action.min(0), rtol=1e-6)
    np.testing.assert_allclose(stats["max"], action.max(0), rtol=1e-6)
    assert stats["count"] == [ds.num_steps]
    index = json.loads((out / "meta/stats.json").read_text())["index"]  # an integer feature stays one
    assert (index["min"], index["max"]) == ([0], [ds.num_steps - 1])
    data = pq.ParquetFile(out / "data/chunk-000/file-000.parquet")
    assert 1 < data.num_row_groups < ds.num_episodes and data.metadata.num_rows == ds.num_steps


def test_pooled_statistics_keep_a_small_spread_around_a_large_mean() -> None:
    """sqrt(E[x^2] - mean^2) gave std 0.0 for values around 1e9 with a spread of 1e-3, and made
    integer and bool minima floats; the pairwise combination keeps both."""
    from rlds_cli.export.lerobot import StatsTotal
    from rlds_cli.export.lerobot_common import as_list, feature_stats

    rng = np.random.default_rng(0)
    parts = [1e9 + rng.standard_normal((n, 1)) * 1e-3 for n in (40, 7, 90)]
    flags = [rng.integers(0, 2, (len(x), 1)).astype(bool) for x in parts]
    total = StatsTotal()
    for x, f in zip(parts, flags, strict=True):
        row = {f"stats/x/{w}": as_list(v) for w, v in feature_stats(x).items()}
        row |= {f"stats/f/{w}": as_list(v) for w, v in feature_stats(f).items()}
        total.add(row)
    got = total.result()
    whole = np.concatenate(parts)
    np.testing.assert_allclose(got["x"]["std"], whole.std(0), rtol=1e-3)
    np.testing.assert_allclose(got["x"]["mean"], whole.mean(0), rtol=1e-12)
    assert got["f"]["min"].dtype == bool and got["f"]["max"].dtype == bool


def test_statistics_of_values_that_are_not_finite_are_nan_without_a_warning() -> None:
    """A column holding infinities (a D4RL info, a sensor's overflow) has NaN/inf statistics, as
    lerobot's own; numpy's "invalid value" warnings reached the terminal (an error under -W error)."""
    from rlds_cli.export.lerobot import StatsTotal
    from rlds_cli.export.lerobot_common import as_list, feature_stats

    total = StatsTotal()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for values in (np.full((3, 1), np.inf), np.array([[1.0], [2.0]])):
            total.add({f"stats/x/{w}": as_list(v) for w, v in feature_stats(values).items()})
        got = total.result()["x"]
    assert np.isnan(got["std"][0]) and got["max"][0] == np.inf and got["min"][0] == 1.0


def _recorded(name: str, **extra: np.ndarray) -> Any:
    """A dataset written with DatasetWriter: two episodes of 6 steps, a 7x7x3 uint8 grid as the
    observation (MiniGrid's: object, colour and state indices) and ``extra`` step keys."""
    from rlds_cli import DatasetWriter

    rng = np.random.default_rng(0)
    with DatasetWriter(name) as writer:
        for _ in range(2):
            grid = rng.integers(0, 11, (7, 7, 7, 3), dtype=np.uint8)
            done = np.arange(6) == 5
            writer.add_episode({
                "observation": grid[:-1], "next/observation": grid[1:],
                "action": np.zeros((6, 1), np.float32), "next/reward": np.zeros(6, np.float32),
                "next/terminated": done, "next/truncated": np.zeros(6, bool), "next/done": done, **extra,
            })  # fmt: skip
    return open_dataset(name)


def test_a_small_uint8_grid_is_data_not_a_camera(isolated_cache: Path, tmp_path: Path) -> None:
    # a 7x7x3 grid of indices was AV1-encoded as a video: 82% of its cells came back changed
    ds = _recorded("grid")
    out = export_dataset(ds, tmp_path / "grid-lerobot", "lerobot")
    assert not (out / "videos").exists()
    convert(out, "grid-back")
    back = open_dataset("grid-back")
    for e in range(2):
        # a plain observation is named observation.state, as LeRobot names a state
        np.testing.assert_array_equal(back.episode(e)["observation/state"], ds.episode(e)["observation"])


@pytest.mark.parametrize("name", ["timestamp", "index", "frame_index", "next.success"])
def test_info_keys_named_like_lerobots_own_columns_are_refused(
    isolated_cache: Path, tmp_path: Path, name: str
) -> None:
    # a recorded wall-clock info/timestamp was replaced by frame_index / fps without a word
    ds = _recorded("clash", **{f"info/{name}": 1.7e9 + np.arange(6, dtype=np.float64)})
    with pytest.raises(ExportError, match=f"'info/{name}' map to the LeRobot feature name.*'{name}'"):
        export_dataset(ds, tmp_path / "clash-lerobot", "lerobot")
    assert not (tmp_path / "clash-lerobot").exists()
