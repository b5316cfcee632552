"""A growing dataset with frames kept compressed: ``DatasetWriter(frames=...)`` encodes on the
commit thread, readers decode, compaction copies the stored bytes (never re-encoded) after
checking them, and damage stops it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.backends.frames import frame_files
from rlds_cli.cache.digest import check_digests
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import CorruptDatasetError, FramesModeError
from rlds_cli.write.compact import compact
from rlds_cli.write.writer import DatasetWriter
from tests.dataset_fixtures import rewrite_manifest
from tests.frames_fixtures import frame_rows, psnr


def episode(length: int, first: int, shape: tuple[int, ...] = (48, 64, 3)) -> tuple[dict, np.ndarray]:
    frames = frame_rows(length + 1, shape, first)
    done = np.zeros(length, bool)
    done[-1] = True
    ep = {
        "observation": frames[:-1],
        "next/observation": frames[1:],
        "action": np.full((length, 2), first, np.float32),
        "next/reward": np.ones(length, np.float32),
        "next/terminated": np.zeros(length, bool),
        "next/truncated": done,
    }
    return ep, frames


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_writer_encodes_and_compaction_keeps_the_bytes(tmp_path: Path, backend: str) -> None:
    written = []
    with DatasetWriter("g", root=tmp_path, frames="png", storage=backend, grace_seconds=0) as writer:
        for i, length in enumerate([3, 4, 2, 5]):
            ep, frames = episode(length, 10 * i)
            writer.add_episode(ep)
            written.append(frames)
            writer.flush()  # one segment per episode
    ds = open_dataset("g", tmp_path)
    assert ds.manifest.fields["observation"].codec == "png"
    assert ds.manifest.fields["action"].codec == "raw"
    for i, frames in enumerate(written):
        np.testing.assert_array_equal(ds.episode(i)["observation"], frames[:-1])
        np.testing.assert_array_equal(ds.episode(i)["next/observation"], frames[1:])
    segments_before = [
        bytes(open_dataset("g", tmp_path).segment_datasets()[i].column("observation").frame_bytes(0))
        for i in range(4)
    ]
    report = compact("g", tmp_path, grace_seconds=0)
    assert (report.segments_before, report.segments_after) == (4, 1)
    after = open_dataset("g", tmp_path)
    assert check_digests(after).ok and after.check_files() == []
    (merged,) = after.segment_datasets()
    column = merged.column("observation")
    # each episode's first frame: the same bytes, copied, not encoded again
    assert [bytes(column.frame_bytes(int(s) + i)) for i, s in enumerate(merged.episode_index["start"])] == (
        segments_before
    )
    for i, frames in enumerate(written):
        np.testing.assert_array_equal(after.episode(i)["observation"], frames[:-1])


def test_writer_jpeg_quality_and_append_keeps_the_codec(tmp_path: Path) -> None:
    ep, frames = episode(4, 0)
    with DatasetWriter("q", root=tmp_path, frames="jpeg:95") as writer:
        writer.add_episode(ep)
    ds = open_dataset("q", tmp_path)
    assert ds.manifest.fields["observation"].codec == "jpeg"
    assert psnr(ds.episode(0)["observation"], frames[:-1]) > 40
    ep2, frames2 = episode(3, 7)
    with DatasetWriter("q", root=tmp_path, mode="append") as writer:  # keep: the dataset's codec
        writer.add_episode(ep2)
    ds = open_dataset("q", tmp_path)
    assert ds.num_episodes == 2 and ds.manifest.fields["observation"].codec == "jpeg"
    assert psnr(ds.episode(1)["observation"], frames2[:-1]) > 38


def test_writer_keep_stores_arrays(tmp_path: Path) -> None:
    ep, frames = episode(3, 0)
    with DatasetWriter("k", root=tmp_path) as writer:
        writer.add_episode(ep)
    ds = open_dataset("k", tmp_path)
    assert ds.manifest.fields["observation"].codec == "raw"
    np.testing.assert_array_equal(ds.episode(0)["observation"], frames[:-1])


def test_a_bad_mode_fails_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(FramesModeError, match="'jpg'"):
        DatasetWriter("bad", root=tmp_path, frames="jpg")
    assert not (tmp_path / "datasets" / "bad").exists()


def test_compaction_refuses_a_damaged_frame_segment_and_keeps_it(tmp_path: Path) -> None:
    with DatasetWriter("d", root=tmp_path, frames="webp", grace_seconds=0) as writer:
        for i in range(3):
            writer.add_episode(episode(3, i)[0])
            writer.flush()
    victim = open_dataset("d", tmp_path).segment_datasets()[1]
    path, _ = frame_files(victim.directory, "observation")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDatasetError, match="do not match their digest"):
        compact("d", tmp_path, grace_seconds=0)
    assert victim.directory.is_dir() and path.read_bytes() == bytes(data)  # nothing merged or removed
    assert not check_digests(open_dataset("d", tmp_path)).ok


def test_a_segment_whose_codec_was_edited_is_refused_and_never_compacted(tmp_path: Path) -> None:
    with DatasetWriter("c", root=tmp_path, frames="png", grace_seconds=0) as writer:
        for i in range(2):
            writer.add_episode(episode(3, i)[0])
            writer.flush()
    victim = open_dataset("c", tmp_path).segment_datasets()[0]
    path = victim.directory / "manifest.json"
    path.write_text(path.read_text().replace('"codec": "png"', '"codec": "webp"'))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match="stored as webp frames in the segment, as png"):
        open_dataset("c", tmp_path).episode(0)
    with pytest.raises(CorruptDatasetError):
        compact("c", tmp_path, grace_seconds=0)
    assert victim.directory.is_dir()


def test_appending_with_another_mode_keeps_the_codec_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with DatasetWriter("w", root=tmp_path, frames="png") as writer:
        writer.add_episode(episode(2, 0)[0])
    ep, frames = episode(3, 5)
    with (
        caplog.at_level("WARNING"),
        DatasetWriter("w", root=tmp_path, mode="append", frames="jpeg") as writer,
    ):
        writer.add_episode(ep)
    assert "stores observation as png: this writer's frames='jpeg' does not change it" in caplog.text
    ds = open_dataset("w", tmp_path)
    assert ds.manifest.fields["observation"].codec == "png"
    np.testing.assert_array_equal(ds.episode(1)["observation"], frames[:-1])  # png: exact
