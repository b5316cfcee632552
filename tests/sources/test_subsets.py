"""``rlds download --episodes A:B``: every per-episode array of the source metadata
(``minari/episode_seed``, ``roboset/episode_file``, ``ogbench/episode_file``) keeps the kept
episodes' rows, row for row, and ``rlds inspect --check`` passes on the subset (the source's
declared totals are scaled to the selection).

Sources are written the way users write them: minari's ``DataCollector`` with its default
(unseeded) resets, RoboHive-schema files with h5py, OGBench files with ``np.savez_compressed``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import InvalidSelectionError
from rlds_cli.formats.select import parse_episodes
from rlds_cli.inspection.validate import check_dataset
from tests.cli_fixtures import download_ok
from tests.dataset_fixtures import rewrite_manifest
from tests.formats_fixtures import golden_roboset, ogbench_arrays, write_ogbench
from tests.minari_fixtures import record_random

runner = CliRunner()


def _check_passes(name: str) -> None:
    result = runner.invoke(app, ["inspect", name, "--check"])
    assert result.exit_code == 0, result.output
    assert "check passed" in result.output


def _same_episodes(sub: str, full: str, first: int) -> None:
    """The subset's episodes are the full conversion's ``first, first + 1, ...``, step for step."""
    a, b = open_dataset(sub), open_dataset(full)
    for e in range(a.num_episodes):
        start, length = int(a.episodes["start"][e]), int(a.episodes["length"][e])
        f_start = int(b.episodes["start"][first + e])
        assert length == int(b.episodes["length"][first + e])
        got = a.gather(np.arange(start, start + length))
        want = b.gather(np.arange(f_start, f_start + length))
        for key in got:
            if key not in ("index", "episode"):
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)


# ----------------------------------------------------------------------------- Minari


@pytest.fixture
def minari_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Any]]:
    """Five Pendulum episodes recorded by minari's DataCollector with unseeded resets (so the
    seeds are 64-bit random, about half of them >= 2**63); also minari's own per-episode seeds."""
    minari = pytest.importorskip("minari")
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    with pytest.warns(UserWarning):  # no eval_env given
        record_random(
            gym.make("Pendulum-v1", max_episode_steps=3),
            "rlds/pendulum/subset-v0",
            5,
            unseeded=True,
            code_permalink="tests/sources/test_subsets.py",
            description="subsets",
        )
    dataset = minari.load_dataset("rlds/pendulum/subset-v0")
    seeds = [m.get("seed") for m in dataset.storage.get_episode_metadata(range(5))]
    return tmp_path / "minari" / "rlds" / "pendulum" / "subset-v0", seeds


def test_minari_subset_keeps_its_seeds_and_checks(minari_source: tuple[Path, list[Any]]) -> None:
    source, seeds = minari_source
    download_ok(source, "full")
    download_ok(source, "sub", "--episodes", "1:3")
    download_ok(source, "tail", "--episodes", "3:")
    full = open_dataset("full").source_arrays
    assert full["minari/episode_seed"].tolist() == [int(s) for s in seeds]
    for name, first, stop in (("sub", 1, 3), ("tail", 3, 5)):
        ds = open_dataset(name)
        assert ds.num_episodes == stop - first
        arrays = ds.source_arrays
        for key, value in full.items():
            np.testing.assert_array_equal(arrays[key], value[first:stop], err_msg=key)
            assert arrays[key].dtype == value.dtype
        _same_episodes(name, "full", first)
        _check_passes(name)


# ----------------------------------------------------------------------------- Roboset, OGBench


def test_roboset_subset_keeps_each_episodes_file(tmp_path: Path) -> None:
    source = golden_roboset(tmp_path / "roboset")  # a_trace.h5: Trial0, Trial2; b_trace.h5: Trial60
    download_ok(source, "full")
    download_ok(source, "sub", "--episodes", "1:3")
    assert open_dataset("full").source_arrays["roboset/episode_file"].tolist() == [0, 0, 1]
    ds = open_dataset("sub")
    assert ds.source_arrays["roboset/episode_file"].tolist() == [0, 1]
    assert ds.episodes["source_id"].tolist() == [2, 60]
    _same_episodes("sub", "full", 1)
    _check_passes("sub")


def test_ogbench_subset_keeps_each_episodes_file(tmp_path: Path) -> None:
    (tmp_path / "og").mkdir()
    write_ogbench(tmp_path / "og" / "task.npz", ogbench_arrays([2, 5], 6))
    write_ogbench(tmp_path / "og" / "task-val.npz", ogbench_arrays([2, 5], 6))
    download_ok(tmp_path / "og", "full", "--format", "ogbench")
    download_ok(tmp_path / "og", "sub", "--format", "ogbench", "--episodes", "1:3")
    assert open_dataset("full").source_arrays["ogbench/episode_file"].tolist() == [0, 0, 1, 1]
    assert open_dataset("sub").source_arrays["ogbench/episode_file"].tolist() == [0, 1]
    _same_episodes("sub", "full", 1)
    _check_passes("sub")


# ----------------------------------------------------------------------------- the check itself


def test_check_reports_a_per_episode_array_out_of_step(tmp_path: Path) -> None:
    download_ok(golden_roboset(tmp_path / "roboset"), "r", "--episodes", "0:2")
    ds = open_dataset("r")
    assert check_dataset(ds).ok
    path = ds.directory / "source_metadata.npz"
    np.savez(path, roboset__episode_file=np.array([0, 0, 1]))  # one row too many
    report = check_dataset(open_dataset("r"))
    # the file was rewritten after the dataset was: its content digest says so too
    assert [v.check for v in report.violations] == ["counts", "digest"]
    assert "'roboset/episode_file' has 3 rows for 2 episodes" in report.violations[0].message


@pytest.mark.parametrize("spec", [[None, 2], [0, 2, 4], ["0", 2], [0, "2"], 3, None, {"start": 0}])
def test_a_malformed_selection_is_an_invalid_selection(spec: Any) -> None:
    """A selection read back from a manifest may be anything: it is refused as not ``A:B``
    (it raised TypeError, AttributeError or ValueError, which crashed the check)."""
    with pytest.raises(InvalidSelectionError, match="is not of the form A:B"):
        parse_episodes(spec)
    assert parse_episodes([1, None]) == (1, None) and parse_episodes((0, np.int64(2))) == (0, 2)


def test_a_conversions_range_hint_gives_no_range_it_would_refuse() -> None:
    """``--episodes abc``: the hint's example is one a conversion takes (``-100:``, a view's
    example, is refused by a stream that cannot count from the end)."""
    with pytest.raises(InvalidSelectionError) as caught:
        parse_episodes("abc")
    hint = caught.value.hint or ""
    assert "0:500" in hint and "-100" not in hint
    for example in ("0:500", "100:"):
        parse_episodes(example)


def test_check_reports_a_malformed_selection_in_the_manifest(tmp_path: Path) -> None:
    download_ok(golden_roboset(tmp_path / "roboset"), "r", "--episodes", "0:2")
    path = open_dataset("r").directory / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["source"]["options"]["episodes"] in ([0, 2], "0:2")
    manifest["source"]["options"]["episodes"] = [None, 2]
    path.write_text(json.dumps(manifest))
    rewrite_manifest(path)
    report = check_dataset(open_dataset("r"))
    assert "the manifest's episode selection [None, 2] is not A:B" in [v.message for v in report.violations]
