"""Which video frame a LeRobot row gets: its episode's span and its timestamp, converted from the
CLI (``rlds download PATH --name N``) on copies of the golden fixture (3 episodes of 20/25/30
frames at 10 fps, spans 0-2 s, 2-4.5 s and 4.5-7.5 s of one mp4, written by lerobot itself) whose
parquet files a test rewrites.

* An episode's span (v3.0 ``videos/<key>/from_timestamp``, ``to_timestamp``) must hold as many
  frames at ``fps`` as the episode has rows (half a frame of slack): a span cut short, one too
  long, or two episodes of different lengths swapping spans, are refused naming the episodes
  table, the episode and the camera.
* Every frame a row gets lies inside its episode's span (v2.1: 0 s to ``length / fps`` of the
  episode's own file): timestamps shifted out of it take another episode's frame, refused naming
  the video, the episode, the row and the camera.
* Timestamps of a dataset with video are finite and increase strictly within an episode (also
  across block edges), and no two rows get the same frame: refused naming the data file, the
  episode and the row. A dataset without video keeps its timestamps as data (``info/timestamp``).

Two episodes of the same length that swap spans cannot be told from the files (each one's frames
lie inside the span it declares, one per row): no test claims otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import SourceFormatError
from rlds_cli.sources.convert import convert
from tests.cli_fixtures import download
from tests.formats_fixtures import refused
from tests.lerobot_fixtures import (
    DATA,
    EPISODES,
    LENGTHS,
    VIDEO,
    edit_column,
    remux,
    state_only_tree,
    v21_tree,
    writable_v3,
)

pytest.importorskip("pyarrow")
pytest.importorskip("av")

SPAN = "videos/observation.image/"


#: wide consoles: one error line stays one line
pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(400, 400)]


@pytest.fixture
def v3(tmp_path: Path) -> Path:
    """A writable copy of the golden v3.0 tree."""
    return writable_v3(tmp_path)


def _set(values: list[Any], **at: Any) -> None:
    for row, value in at.items():
        values[int(row.removeprefix("r"))] = value


def _shift(first: int, count: int, by: float) -> Any:
    """An edit that adds ``by`` to values ``first .. first + count``."""

    def edit(values: list[Any]) -> None:
        for i in range(first, first + count):
            values[i] += by

    return edit


# ----------------------------------------------------------------------------- spans


def test_swapped_spans_of_episodes_of_different_lengths_are_refused(v3: Path) -> None:
    """It converted with exit 0 and every frame of episodes 0 and 1 was the other's."""
    for column in ("from_timestamp", "to_timestamp"):
        edit_column(v3 / EPISODES, SPAN + column, lambda v: v.__setitem__(slice(0, 2), v[1::-1]))
    line = refused(
        download(v3, "lr"),
        str(v3 / EPISODES),
        "episode 0",
        "'observation.image'",
        "2.0 s to 4.5 s",
        "holds 25 frames at 10 fps",
        "the episode has 20 rows",
        hint=True,
    )
    assert f"{SPAN}from_timestamp" in line


@pytest.mark.parametrize(("stop", "frames"), [(4.0, 20), (5.0, 30), (4.4, 24)])
def test_a_span_holding_another_number_of_frames_than_rows_is_refused(
    v3: Path, stop: float, frames: int
) -> None:
    """Episode 1 has 25 rows: a span to 4.0 s holds 20 frames (it converted, the docs said no), one
    to 5.0 s holds 30."""
    edit_column(v3 / EPISODES, SPAN + "to_timestamp", lambda v: _set(v, r1=stop))
    result = download(v3, "lr")
    refused(result, str(v3 / EPISODES), "episode 1", f"holds {frames} frames", "has 25 rows", hint=True)
    assert "download the whole dataset folder again" in result.stderr.splitlines()[1]


def test_a_span_within_half_a_frame_of_its_rows_converts(v3: Path) -> None:
    """Durations a muxer rounds (a few ms) are not refused: 2.0 s to 4.52 s is 25.2 frames."""
    edit_column(v3 / EPISODES, SPAN + "to_timestamp", lambda v: _set(v, r1=4.52))
    result = download(v3, "lr")
    assert result.exit_code == 0, (result.output, result.exception)
    assert open_dataset("lr").num_steps == sum(LENGTHS)


@pytest.mark.parametrize(
    ("first", "count", "by", "row", "at"),
    [
        (0, LENGTHS[0], 0.1, 19, "2.0000 s"),  # episode 0's last row takes episode 1's first frame
        (LENGTHS[0], LENGTHS[1], -0.1, 0, "1.9000 s"),  # episode 1's first row, episode 0's last
    ],
)
def test_a_frame_outside_its_episodes_span_is_refused(
    v3: Path, first: int, count: int, by: float, row: int, at: str
) -> None:
    """Timestamps shifted by a frame: it converted, one row holding another episode's frame."""
    edit_column(v3 / DATA, "timestamp", _shift(first, count, by))
    episode = 0 if first == 0 else 1
    line = refused(
        download(v3, "lr"),
        str(v3 / VIDEO),
        f"row {row} of episode {episode}",
        "'observation.image'",
        f"frame at {at}",
        "outside the episode's span",
        hint=True,
    )
    assert f"{SPAN}from_timestamp" in line


def test_a_v21_frame_past_its_episodes_length_is_refused(v3: Path, tmp_path: Path) -> None:
    """v2.1: an episode video with a frame more than its rows, timestamps shifted by one frame: it
    converted, skipping the first frame; the span is 0 s to length / fps of the episode's file."""
    src = v21_tree(v3, tmp_path / "v21")
    video = src / "videos" / "chunk-000" / "observation.image" / "episode_000001.mp4"
    assert remux(v3 / VIDEO, video, 2.0, 4.6) == LENGTHS[1] + 1
    data = src / "data" / "chunk-000" / "episode_000001.parquet"
    edit_column(data, "timestamp", _shift(0, LENGTHS[1], 0.1))
    line = refused(
        download(src, "lr"),
        str(video),
        "row 24 of episode 1",
        "frame at 2.5000 s",
        "outside the episode's span 0.000 s to 2.500 s",
        hint=True,
    )
    assert "length / fps" in line


# ----------------------------------------------------------------------------- timestamps


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_timestamp_that_is_not_a_finite_number_is_refused(v3: Path, value: float) -> None:
    """A NaN converted with exit 0, the step holding the previous row's frame."""
    edit_column(v3 / DATA, "timestamp", lambda v: _set(v, r3=value))
    refused(
        download(v3, "lr"),
        str(v3 / DATA),
        "row 3 of episode 0",
        f"has timestamp {value}",
        "finite number of seconds",
        hint=True,
    )


def test_a_timestamp_in_a_later_episode_names_its_row_and_the_file_row(v3: Path) -> None:
    edit_column(v3 / DATA, "timestamp", lambda v: _set(v, r47=float("nan")))
    refused(download(v3, "lr"), str(v3 / DATA), "row 2 of episode 2 (file row 47)", hint=True)


@pytest.mark.parametrize("block_rows", [None, 3])
def test_a_repeated_timestamp_is_refused(v3: Path, block_rows: int | None) -> None:
    """Row 3 = row 2: it converted, frame 2 stored twice and frame 3 never used. With blocks of 3
    rows, rows 2 and 3 lie in different blocks."""
    edit_column(v3 / DATA, "timestamp", lambda v: _set(v, r3=v[2]))
    options = {"block_rows": block_rows} if block_rows else {}
    with pytest.raises(SourceFormatError) as caught:
        convert(v3, "lr", options=options)
    message = str(caught.value)
    assert message.startswith(str(v3 / DATA)), message
    assert "row 3 of episode 0" in message and "not after row 2's 0.2000 s" in message, message
    assert "download the whole dataset folder again" in caught.value.hint


def test_a_decreasing_timestamp_is_refused_from_the_cli(v3: Path) -> None:
    edit_column(v3 / DATA, "timestamp", lambda v: _set(v, r30=0.05))  # episode 1's row 10
    refused(
        download(v3, "lr"),
        str(v3 / DATA),
        "row 10 of episode 1 (file row 30)",
        "timestamp 0.0500 s, not after row 9's 0.9000 s",
        hint=True,
    )


def test_two_rows_matched_to_one_frame_are_refused(v3: Path) -> None:
    """Row 3 a hair after row 2 (0.2 s + 20 us): increasing, but both within lerobot's tolerance
    of the frame at 0.2 s; it converted, frame 3 never used."""
    edit_column(v3 / DATA, "timestamp", lambda v: _set(v, r3=v[2] + 2e-5))
    refused(
        download(v3, "lr"),
        str(v3 / VIDEO),
        "rows 2 and 3 of episode 0",
        "'observation.image'",
        "both matched to the frame at 0.2000 s",
        hint=True,
    )


def test_timestamps_without_video_are_data(tmp_path: Path) -> None:
    """Without a video key no frame is chosen by timestamp: a NaN or a repeat is kept as stored in
    info/timestamp (the camera-less tests' rows all have timestamp 0)."""
    src = state_only_tree(tmp_path / "s", 6)
    edit_column(src / DATA, "timestamp", lambda v: _set(v, r2=float("nan")))
    result = download(src, "state")
    assert result.exit_code == 0, (result.output, result.exception)
    stamps = np.asarray(open_dataset("state").column("info/timestamp")[:])[:, 0]
    assert np.isnan(stamps[2]) and (np.delete(stamps, 2) == 0).all()


def test_the_golden_fixture_still_converts(v3: Path, tmp_path: Path) -> None:
    """The spans and timestamps lerobot writes pass every rule (v3.0 and its v2.1 rewrite)."""
    for name, src in (("v3", v3), ("v21", v21_tree(v3, tmp_path / "v21"))):
        result = download(src, name)
        assert result.exit_code == 0, (result.output, result.exception)
        assert open_dataset(name).num_steps == sum(LENGTHS)
