"""``--frames`` from the command line: a pixel source converted with each mode, what ``inspect``
shows of it, and a bad mode as one line before anything is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.testing.sources import write_d4rl
from tests.cli_fixtures import download, download_ok
from tests.frames_fixtures import frame_rows

runner = CliRunner()


def _d4rl_file(
    path: Path, observations: np.ndarray, ends: list[int], **next_observations: np.ndarray
) -> Path:
    """A D4RL file of ``observations`` whose episodes end (time out) at rows ``ends``."""
    rows = len(observations)
    timeouts = np.zeros(rows, bool)
    timeouts[ends] = True
    return write_d4rl(
        path,
        observations=observations,
        actions=np.zeros((rows, 2), np.float32),
        rewards=np.ones(rows, np.float32),
        terminals=np.zeros(rows, bool),
        timeouts=timeouts,
        **next_observations,
    )


@pytest.fixture
def pixel_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A D4RL file of 2 episodes (5 and 4 steps) of 48x64 RGB camera frames."""
    frames = frame_rows(11)
    obs = np.concatenate([frames[:5], frames[6:10]])
    nxt = np.concatenate([frames[1:6], frames[7:11]])
    return _d4rl_file(tmp_path / "pix.hdf5", obs, [4, 8], next_observations=nxt), frames


@pytest.mark.parametrize("mode", ["png", "webp", "raw", "keep"])
def test_download_with_each_mode(
    isolated_cache: Path, pixel_file: tuple[Path, np.ndarray], mode: str
) -> None:
    path, frames = pixel_file
    result = download_ok(path, "pix", "--frames", mode, "--json")
    info = json.loads(result.output)
    lossless = mode in ("png", "webp")
    assert info["frames"] == ({"observation": mode} if lossless else {})
    ds = open_dataset("pix")
    np.testing.assert_array_equal(ds.episode(0)["observation"], frames[:5])
    np.testing.assert_array_equal(ds.episode(1)["next/observation"], frames[7:11])
    shown = json.loads(runner.invoke(app, ["inspect", "pix", "--json"]).output)
    codec = mode if lossless else "raw"
    assert shown["fields"]["observation"]["codec"] == codec
    assert shown["fields"]["next/observation"]["codec"] == codec
    assert shown["stored"]["observation"]["codec"] == codec
    check = runner.invoke(app, ["inspect", "pix", "--check"])
    assert check.exit_code == 0, check.output


def test_jpeg_quality_in_the_text_output(isolated_cache: Path, pixel_file: tuple[Path, np.ndarray]) -> None:
    result = download_ok(pixel_file[0], "pix", "--frames", "jpeg:80")
    assert "frames observation: jpeg, encoded (0 kept)" in result.output
    assert open_dataset("pix").manifest.source["frames"] == "jpeg:80"
    table = runner.invoke(app, ["inspect", "pix"]).output
    assert "uint8 jpeg" in table


def test_another_mode_is_not_a_reuse(isolated_cache: Path, pixel_file: tuple[Path, np.ndarray]) -> None:
    download_ok(pixel_file[0], "pix", "--frames", "png")
    again = download(pixel_file[0], "pix", "--frames", "webp")
    assert again.exit_code == 1 and "already exists" in again.output
    download_ok(pixel_file[0], "pix", "--frames", "webp", "--force")
    assert open_dataset("pix").stored_fields["observation"].codec == "webp"
    reused = json.loads(download_ok(pixel_file[0], "pix", "--frames", "webp", "--json").output)
    assert reused["reused"] is True


def test_a_bad_mode_is_one_line(isolated_cache: Path, pixel_file: tuple[Path, np.ndarray]) -> None:
    result = download(pixel_file[0], "pix", "--frames", "gif")
    assert result.exit_code == 1
    assert "--frames 'gif' is not a frames mode" in result.output
    assert "Traceback" not in result.output
    assert not (isolated_cache / "datasets" / "pix").exists()


@pytest.mark.parametrize(
    ("frames", "mode", "note"),
    [
        (
            np.zeros((4, 40, 40, 4), np.uint8),
            "jpeg",
            "observation (40x40x4) stays an array: jpeg images have 1 or 3 channels, not 4",
        ),
        (
            np.zeros((4, 40, 40), np.uint16),
            "png",
            "observation (40x40) stays an array: uint16, and frames are uint8",
        ),
        (
            np.zeros((4, 3), np.float32),
            "webp",
            "no observation key holds camera frames (uint8 images, both sides >= 32 px)",
        ),
    ],
)
def test_a_codec_mode_that_encodes_nothing_says_why(
    isolated_cache: Path, tmp_path: Path, frames: np.ndarray, mode: str, note: str
) -> None:
    """``--frames jpeg`` over RGBA frames, ``png`` over uint16 depth and any codec over low-dim
    data stored arrays without a word: the user saw no sign the mode did nothing."""
    path = _d4rl_file(tmp_path / "odd.hdf5", frames, [1, 3])
    result = download_ok(path, "odd", "--frames", mode)
    assert f"warning: --frames {mode}: {note}" in " ".join(result.output.split())
    assert open_dataset("odd").stored_fields["observation"].codec == "raw"
