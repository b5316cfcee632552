"""``rlds inspect --check`` / :func:`rlds_cli.inspection.validate.check_dataset`: clean datasets of every
format pass; damage is reported by episode and step, and the CLI exits 1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import golden_three_episodes
from tests.dataset_fixtures import rewrite_manifest
from tests.formats_fixtures import (
    golden_ogbench,
    golden_roboset,
    minari_episode,
    write_amago,
    write_minari_by_hand,
)

pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


def _sources(tmp_path: Path) -> dict[str, Path]:
    return {
        "d4rl": golden_three_episodes(tmp_path / "d.hdf5", with_next=False),
        "minari": write_minari_by_hand(
            tmp_path / "m", [minari_episode(3), minari_episode(4, terminated=False)]
        ),
        "roboset": golden_roboset(tmp_path / "r"),
        "ogbench": golden_ogbench(tmp_path / "o.npz"),
        "amago": write_amago(tmp_path / "a", [(4, True), (2, False)]),
    }


def test_clean_datasets_pass(tmp_path: Path) -> None:
    for kind, path in _sources(tmp_path).items():
        convert(path, kind)
        report = check_dataset(open_dataset(kind))
        assert report.ok, (kind, [str(v) for v in report.violations])
        assert report.checks == ["files", "index", "done", "continuity", "counts", "nan", "digest"]


def _minari(tmp_path: Path) -> Path:
    convert(
        write_minari_by_hand(tmp_path / "m", [minari_episode(3), minari_episode(4, terminated=False)]), "m"
    )
    return open_dataset("m").directory


def test_new_nan_reported_by_episode_and_step(tmp_path: Path) -> None:
    directory = _minari(tmp_path)
    # flat rows: episode 0 steps 0-2 + final (rows 0-3), episode 1 starts at row 4
    obs = np.load(directory / "arrays" / "observation.npy", mmap_mode="r+")
    obs[5, 1] = np.nan  # episode 1, step 1
    obs.flush()
    del obs
    report = check_dataset(open_dataset("m"))
    nan = [v for v in report.violations if v.check == "nan"]
    assert [(v.episode, v.step, v.key) for v in nan] == [(1, 1, "observation")]
    assert "1 NaN values, the source had 0" in str(nan[0])
    # the continuity check reads the same damage (NaN != the recorded value is still NaN on both sides)
    assert not report.ok


def test_flags_and_counts_reported(tmp_path: Path) -> None:
    directory = _minari(tmp_path)
    term = np.load(directory / "arrays" / "next" / "terminated.npy", mmap_mode="r+")
    term[4, 0] = True  # episode 1, step 1: a flag before the episode's end
    term.flush()
    del term
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["source"]["checks"]["expected"]["num_steps"] = 99
    (directory / "manifest.json").write_text(json.dumps(manifest))
    rewrite_manifest(directory / "manifest.json")
    report = check_dataset(open_dataset("m"))
    found = {(v.check, v.episode, v.step) for v in report.violations}
    assert ("done", 1, 1) in found
    assert ("counts", None, None) in found
    assert any("the source declares 99" in str(v) for v in report.violations)


def test_index_gap_reported(tmp_path: Path) -> None:
    directory = _minari(tmp_path)
    index = np.load(directory / "episodes.npy")
    index["start"][1] += 1  # lengths still sum to num_steps, but episode 1 no longer follows episode 0
    np.save(directory / "episodes.npy", index)
    # refused when the dataset is opened (rlds_cli.cache.integrity), before any check or read
    with pytest.raises(CorruptDatasetError, match=r"episodes\.npy is damaged: episode 1 starts at step 4, "):
        open_dataset("m")


def test_cli_check_exit_codes(tmp_path: Path) -> None:
    directory = _minari(tmp_path)
    result = CliRunner().invoke(app, ["inspect", "m", "--check"])
    assert result.exit_code == 0 and "check passed" in result.stdout
    term = np.load(directory / "arrays" / "next" / "truncated.npy", mmap_mode="r+")
    term[6, 0] = False  # episode 1's last step loses its end flag
    term.flush()
    del term
    result = CliRunner().invoke(app, ["inspect", "m", "--check"])
    assert result.exit_code == 1
    assert "[done] episode 1, step 3: the episode's last step has next/done false" in result.stdout
    assert "check failed" in result.stdout
    # the hint points at the lines above (it said to run the command that printed them)
    assert result.stderr.splitlines()[-1] == "hint: listed above; 'rlds verify m' checks every file"
    # as verify: one error line on stderr, with -q too (it printed nothing but the exit code)
    quiet = CliRunner().invoke(app, ["inspect", "m", "--check", "-q"])
    assert quiet.exit_code == 1 and quiet.stderr.startswith("error: m: check failed: 2 violation(s)")
    assert "'rlds inspect m --check' without -q lists them" in quiet.stderr
    result = CliRunner().invoke(app, ["inspect", "m", "--check", "--json"])
    assert result.exit_code == 1
    assert result.stderr == ""  # --json: the document says it
    data = json.loads(result.stdout)
    assert data["check"]["ok"] is False
    assert {"check": "done", "episode": 1, "step": 3, "key": None}.items() <= data["check"]["violations"][
        0
    ].items()
