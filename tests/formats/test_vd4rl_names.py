"""Episode files named as their writers name them (``rlds_cli.formats.folders``).

DreamerV2's ``save_episode`` and DrQ-v2's ``_store_episode`` count ``rows - 1`` in the name,
V-D4RL's ``hdf5_to_npz.py`` counts ``rows``: folders written by each convert, with no note; a
count no writer gives is a note, not a refusal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.formats.folders import name_mismatch, named_rows
from tests.vd4rl_fixtures import dreamer_episode, dreamerv2_save_episode, vd4rl_script_save_episode

runner = CliRunner()
STAMPS = ("20220109T010000", "20220109T010001", "20220109T010002")


def _episodes() -> list[dict[str, np.ndarray]]:
    return [
        dreamer_episode(501, side=8, seed=1),  # the 500-step DMC episode: "-500.npz" from DreamerV2
        dreamer_episode(7, side=8, seed=2, terminal=True),
        dreamer_episode(4, side=8, seed=3),
    ]


@pytest.mark.parametrize(
    ("writer", "counted"),
    [(dreamerv2_save_episode, [500, 6, 3]), (vd4rl_script_save_episode, [501, 7, 4])],
    ids=["dreamerv2", "vd4rl-hdf5_to_npz"],
)
def test_a_folder_written_by_each_writer_converts_without_a_note(
    tmp_path: Path, writer: object, counted: list[int]
) -> None:
    folder = tmp_path / "episodes"
    folder.mkdir()
    files = [writer(folder, ep, stamp) for ep, stamp in zip(_episodes(), STAMPS, strict=True)]  # type: ignore[operator]
    assert [named_rows(f) for f in files] == counted  # the names are exactly the writer's
    result = runner.invoke(app, ["download", str(folder), "--name", "w", "--format", "vd4rl"])
    assert result.exit_code == 0, result.output
    ds = open_dataset("w")
    assert ds.episodes["length"].tolist() == [500, 6, 3]
    assert not any("file name says" in n for n in ds.manifest.conversion["notes"])
    assert "file name says" not in result.output


def test_a_count_no_writer_gives_is_a_note_shown_as_a_warning(tmp_path: Path) -> None:
    folder = tmp_path / "episodes"
    folder.mkdir()
    good = dreamerv2_save_episode(folder, dreamer_episode(6, side=8, seed=1), STAMPS[0])
    odd = dreamerv2_save_episode(folder, dreamer_episode(5, side=8, seed=2), STAMPS[1])
    odd = odd.rename(odd.with_name(odd.name.replace("-4.npz", "-9.npz")))
    result = runner.invoke(app, ["download", str(folder), "--name", "w"])
    assert result.exit_code == 0, result.output
    note = f"{odd.name}: the file name says 9 rows, but its arrays hold 5 (writers name 4 or 5)"
    assert any(n.startswith(note) for n in open_dataset("w").manifest.conversion["notes"])
    assert f"warning: {note}" in " ".join(result.stderr.split())
    assert name_mismatch(good, 6) is None


def test_drqv2_names_count_rows_minus_one() -> None:
    """DrQ-v2 names ``{timestamp}_{index}_{episode_len}.npz`` with ``episode_len = rows - 1``."""
    name = Path("20220109T010000_3_500.npz")
    assert named_rows(name) == 500
    assert name_mismatch(name, 501) is None
    assert name_mismatch(name, 500) is None
    assert "says 500 rows, but its arrays hold 400" in (name_mismatch(name, 400) or "")
    assert named_rows(Path("episode_500.npz")) is None  # no writer's pattern: no count
