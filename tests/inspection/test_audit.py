"""``rlds audit`` / :func:`rlds_cli.audit`: injected faults found exactly (precision and recall
1.0), clean data flags nothing, pieces measure as the whole, views, ``--keep``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.blocks import Budget
from rlds_cli.cache.derive import create_selection, select_episodes
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import DatasetExistsError, InvalidSelectionError
from rlds_cli.inspection.audit import AuditReport, AuditTolerances, audit
from tests.inspection.audit_fixtures import INJECTED, NUM_EPISODES, build_audit_dataset

pytestmark = pytest.mark.usefixtures("consoles")
runner = CliRunner()


@pytest.fixture(params=[("png", "memmap"), ("raw", "memmap"), ("png", "zarr")], ids=lambda p: "-".join(p))
def faulty(request: pytest.FixtureRequest, isolated_cache: Path) -> str:
    """The faulty dataset, its camera stored as PNG files (compared as bytes) or as an array."""
    frames, backend = request.param
    build_audit_dataset(isolated_cache, "bad", faults=True, frames=frames, backend=backend)
    return "bad"


def _as_sets(report: AuditReport) -> dict[str, set[int]]:
    return {flag: set(ids.tolist()) for flag, ids in report.flags.items() if len(ids)}


def test_injected_faults_are_found_with_precision_and_recall_one(faulty: str) -> None:
    report = audit(faulty)
    found = _as_sets(report)
    for flag, expected in INJECTED.items():
        got = found.get(flag, set())
        precision = len(got & set(expected)) / max(1, len(got))
        recall = len(got & set(expected)) / len(expected)
        assert (precision, recall) == (1.0, 1.0), (flag, got, expected)
    assert set(found) == set(INJECTED)
    assert report.duplicate_of[10] == 9 and report.duplicate_of[9] == -1
    assert set(report.passing().tolist()) == set(range(NUM_EPISODES)) - {
        i for v in INJECTED.values() for i in v
    }
    e = report.episode(2)
    assert e["flags"] == ["idle"] and e["idle_fraction"] == pytest.approx(30 / (e["length"] - 1))
    assert report.episode(12)["nonfinite"] == 1


@pytest.mark.parametrize("frames", ["png", "raw"])
def test_clean_data_flags_nothing(frames: str, isolated_cache: Path) -> None:
    build_audit_dataset(isolated_cache, "good", faults=False, frames=frames)
    report = audit("good")
    assert _as_sets(report) == {}
    assert len(report.passing()) == NUM_EPISODES
    assert "empty_instruction" in report.flags  # checked: the dataset has text


def test_small_blocks_measure_as_one_pass(faulty: str) -> None:
    """Episodes read in pieces (a 20 kB budget: the 300-step episode spans several) measure
    and digest exactly as whole; the blocks stay within the budget."""
    whole = audit(faulty).measures
    budget = Budget(20_000)
    pieces = audit(faulty, budget=budget).measures
    assert pieces.digests == whole.digests and list(whole.digests) == [9, 10]
    np.testing.assert_array_equal(pieces.fingerprints, whole.fingerprints)
    for name in ("returns", "idle_steps", "first_active", "last_active", "nonfinite", "empty_text"):
        np.testing.assert_array_equal(getattr(pieces, name), getattr(whole, name), err_msg=name)
    for name in ("max_action_change", "rms_action_change", "mean_abs_jerk"):
        np.testing.assert_allclose(getattr(pieces, name), getattr(whole, name), rtol=1e-9, err_msg=name)
    np.testing.assert_array_equal(pieces.frozen["pixels"], whole.frozen["pixels"])
    assert budget.largest <= 20_000 + 4096


def test_a_view_is_audited_for_its_own_episodes(faulty: str) -> None:
    ids = [0, 2, 3, 6, 9, 10, 16, 17]
    create_selection(faulty, "some", ids)
    report = audit("some")
    assert report.num_episodes == len(ids)
    assert {f: {ids[i] for i in v} for f, v in _as_sets(report).items()} == {
        "idle": {2}, "spike": {6}, "duplicate": {10}, "return_outlier": {16},
    }  # fmt: skip
    parent = audit(faulty).measures
    np.testing.assert_array_equal(report.measures.fingerprints, parent.fingerprints[ids])
    unpublished = audit(select_episodes(open_dataset(faulty), ids))
    np.testing.assert_array_equal(unpublished.measures.fingerprints, report.measures.fingerprints)
    unpublished.keep("some-clean")  # a view of the parent: the selection was never published
    kept = open_dataset("some-clean")
    assert kept.manifest.source["parent"] == faulty
    assert kept.manifest.source["episode_ids"] == [0, 3, 9, 17]
    assert _as_sets(unpublished) == _as_sets(report)


def test_keep_publishes_what_passes_and_the_loader_samples_it(faulty: str) -> None:
    report = rlds_cli.audit(faulty)
    manifest = report.keep("bad-clean")
    kept = open_dataset("bad-clean")
    assert manifest.num_episodes == kept.num_episodes == len(report.passing())
    assert _as_sets(audit("bad-clean")) == {}
    for i, p in enumerate(report.passing().tolist()):
        np.testing.assert_array_equal(kept.episode(i)["action"], open_dataset(faulty).episode(p)["action"])
    with pytest.raises(DatasetExistsError):
        report.keep("bad-clean")
    from rlds_cli.loader import Loader

    batch = Loader("bad-clean", batch_size=64, seed=0, keys=["action", "episode"]).sample()
    assert int(batch["episode"].max()) < kept.num_episodes


def test_keep_refuses_when_nothing_passes(faulty: str) -> None:
    report = audit(faulty, max_idle=0.0, atol=10.0)  # every step is idle
    assert len(report.passing()) == 0
    with pytest.raises(InvalidSelectionError, match="no episode of 'bad' passes"):
        report.keep("none")
    assert not (Path(open_dataset(faulty).directory).parent / "none").exists()


@pytest.mark.parametrize("key", ["action", "next/reward"])
def test_an_audit_of_a_damaged_dataset_is_refused(isolated_cache: Path, key: str) -> None:
    """A flipped byte of a column: '0 flagged, 94 pass' and a view of the damage was published
    (--keep); without --keep, the damaged values were measured and shown as data (a reward's
    flipped exponent bit: a return of 1e38, flagged as an outlier episode), exit 0. The audit,
    and the viewer's pass of it, check the digests first."""
    from rlds_cli.cache.backends.base import key_path
    from rlds_cli.errors import CorruptDatasetError
    from tests.dataset_fixtures import make_dataset

    make_dataset("d", [4, 5, 3])
    column = key_path(isolated_cache / "datasets" / "d", key, ".npy")
    data = bytearray(column.read_bytes())
    data[-1] ^= 0x40  # the high byte of the last float32: its exponent
    column.write_bytes(bytes(data))
    with pytest.raises(CorruptDatasetError, match=f"dataset 'd' is damaged: '{key}'"):
        audit("d")
    for args in (
        ["audit", "d"],
        ["audit", "d", "--keep", "kept"],
        ["show", "d", "-o", str(isolated_cache / "d.html")],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert f"dataset 'd' is damaged: '{key}'" in result.output, (args, result.output)
    assert not (isolated_cache / "datasets" / "kept").exists() and not (isolated_cache / "d.html").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_idle": 1.5}, "max_idle"), ({"atol": 0}, "atol"), ({"frozen_steps": 0}, "frozen_steps")],
)
def test_bad_tolerances_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidSelectionError, match=match):
        AuditTolerances(**kwargs)  # type: ignore[arg-type]


def test_cli_table_json_and_keep(faulty: str) -> None:
    result = runner.invoke(app, ["audit", faulty, "--keep", "bad-clean"])
    assert result.exit_code == 0, result.output
    assert "9 flagged" in result.output and "duplicate (of 9)" in result.output
    assert "bad-clean: the 11 episodes that pass" in result.output
    result = runner.invoke(app, ["audit", "bad-clean", "--json"])
    data = json.loads(result.output)
    assert data["flagged"] == 0 and data["num_episodes"] == 11 and len(data["episodes"]) == 11
    result = runner.invoke(app, ["audit", faulty, "--json"])
    assert json.loads(result.output)["flags"]["spike"] == [6]
    result = runner.invoke(app, ["audit", faulty, "--keep", "bad-clean-q", "-q"])
    assert result.exit_code == 0 and result.stdout == "bad-clean-q\n"  # -q: the name made, alone


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "missing"], "no dataset named 'missing'"),
        (["audit", "bad", "--max-idle", "2"], "max_idle must be in [0, 1)"),
        (["audit", "bad", "--keep", "bad"], "already exists"),
        (["audit", "bad", "--keep", "x", "--atol", "10", "--max-idle", "0"], "passes the audit"),
    ],
)
def test_cli_errors_are_one_line(faulty: str, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_growing_dataset_is_audited_and_refuses_a_kept_view(isolated_cache: Path) -> None:
    """A dataset written by DatasetWriter (columns over segments): the audit reads it as any
    other; --keep, a view, is refused in one line (a view cannot pin a growing dataset)."""
    ted = open_dataset("ted", make_ted_root(isolated_cache))
    with rlds_cli.DatasetWriter("grow", root=isolated_cache) as writer:
        for i in range(6):
            writer.add_episode(ted.episode(i))
            writer.flush()
    report = audit("grow", root=isolated_cache)
    assert report.num_episodes == 6
    np.testing.assert_allclose(report.measures.returns, ted.episodes["return"][:6])
    with pytest.raises(InvalidSelectionError, match="growing dataset"):
        report.keep("grow-clean", root=isolated_cache)
    with pytest.raises(InvalidSelectionError, match="growing dataset"):
        select_episodes(open_dataset("grow", isolated_cache), [0, 2])  # Loader(episodes=...) too


def make_ted_root(root: Path) -> Path:
    from tests.loader_fixtures import make_ted

    folder = root.parent / "ted-root"
    folder.mkdir(exist_ok=True)
    make_ted(folder, "ted", [5, 6, 7, 8, 9, 10])
    return folder


def test_an_empty_instruction_of_any_source_is_flagged(isolated_cache: Path, tmp_path: Path) -> None:
    """Only RLDS text tables were read: an empty RoboCasa ``lang`` (or LeRobot task, or a merge's
    tables) went unflagged, and ``--keep`` kept the episode."""
    import shutil

    import h5py

    from rlds_cli.sources.convert import convert
    from tests.robomimic_fixtures import ROBOCASA

    path = tmp_path / "rc.hdf5"
    shutil.copy(ROBOCASA, path)
    with h5py.File(path, "r+") as f:
        meta = json.loads(f["data/demo_2"].attrs["ep_meta"])
        f["data/demo_2"].attrs["ep_meta"] = json.dumps({**meta, "lang": "  "})
    convert(path, "rc")
    assert audit("rc").flags["empty_instruction"].tolist() == [1]
    assert audit("rc").measures.empty_text.tolist() == [0, open_dataset("rc").episode_index["length"][1]]
