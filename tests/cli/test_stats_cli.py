"""``rlds stats NAME... --normalization-table OUT.json``: per-source statistics, written and read
back by the library, and its refusals in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from rlds_cli.cli.app import app
from rlds_cli.loader import MixtureLoader, NormalizationTable, Normalize
from tests.mixture_fixtures import ROBOTS, write_robot

pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(250, 250)]
runner = CliRunner()


def invoke(*args: object) -> Result:
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def robots(isolated_cache: Path) -> list[str]:
    for name, (act, obs, lengths, seed) in ROBOTS.items():
        write_robot(isolated_cache, name, act, obs, lengths, seed)
    return list(ROBOTS)


def test_table_written_and_read_back(robots: list[str], tmp_path: Path) -> None:
    out = tmp_path / "norm.json"
    result = invoke("stats", *robots, "--key", "action", "--key", "observation", "--normalization-table", out)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "franka" in result.stdout and "q99" in result.stdout
    table = NormalizationTable.load(out)
    assert table.names == robots
    both = ["action", "observation"]
    mix = MixtureLoader(robots, "size", batch_size=8, keys=both, pad=True,
                        transforms={n: Normalize(keys=both) for n in robots})  # fmt: skip
    assert table.to_dict() == mix.normalization_table()  # the CLI's table is the loader's
    data = json.loads(invoke("stats", "aloha", "--json").stdout)
    assert list(data["sources"]["aloha"]["keys"]) == ["action"]  # the default key
    assert len(data["sources"]["aloha"]["keys"]["action"]["q01"]) == 14
    quiet = invoke("stats", "franka", "-q", "--normalization-table", out)
    assert quiet.stdout.strip() == str(out)
    np.testing.assert_allclose(NormalizationTable.load(out).unnormalize("franka", "action", np.zeros(14)),
                               table.statistics("franka").mean["action"], rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["franka", "--key", "gripper"], "error: dataset 'franka' stores no key 'gripper'"),
        (["ghost"], "error: no dataset named 'ghost'"),
        (
            ["franka", "--normalization-table", "/nonexistent-dir/n.json"],
            "its folder /nonexistent-dir does not exist",
        ),
        (
            ["franka", "--normalization-table", "/tmp"],
            "cannot write the normalization table to /tmp: it is a folder",
        ),
        (["franka", "--key", "episode"], "stores no key 'episode' to compute statistics of"),
        (["franka", "--key", "next/done"], "stores no key 'next/done' to compute statistics of"),
        (["franka", "franka"], "dataset 'franka' is named twice"),
    ],
)
def test_refusals(robots: list[str], args: list[str], message: str) -> None:
    result = invoke("stats", *args)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert message in lines[0] and len(lines) <= 2 and "Traceback" not in result.stderr


def test_keys_of_several_axes_and_values_that_are_not_finite(isolated_cache: Path) -> None:
    """A key of shape (2, 3) is one row an element (it crashed formatting the table); a key
    with no finite value prints '-' and its JSON has null, never NaN."""
    import rlds_cli

    rng = np.random.default_rng(0)
    with rlds_cli.DatasetWriter("grid", root=isolated_cache, mode="create") as writer:
        for n in (5, 7):
            obs = rng.normal(size=(n + 1, 3)).astype(np.float32)
            writer.add_episode({
                "observation": obs[:-1],
                "next/observation": obs[1:],
                "action": rng.normal(size=(n, 2, 3)).astype(np.float32),
                "blank": np.full((n, 2), np.nan, np.float32),
                "next/reward": np.ones(n, np.float32),
                "next/terminated": np.zeros(n, bool),
                "next/truncated": np.eye(n, dtype=bool)[-1],
            })  # fmt: skip
    result = invoke("stats", "grid", "--key", "action")
    assert result.exit_code == 0, result.stderr
    dims = [line.split()[2] for line in result.stdout.splitlines() if line.startswith("grid")]
    assert dims == ["0,0", "0,1", "0,2", "1,0", "1,1", "1,2"]
    result = invoke("stats", "grid", "--key", "blank", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert data["sources"]["grid"]["keys"]["blank"]["min"] == [None, None]
    shown = invoke("stats", "grid", "--key", "blank")
    assert "-" in shown.stdout
    # unknown statistics were shown as '-' alone: Normalize then made the whole column NaN
    assert "grid blank: 2 of its 2 dimension(s) hold NaN or infinite values (0, 1)" in shown.stderr
    assert "NaN" not in invoke("stats", "grid", "--key", "action").stderr
    rlds_cli.DatasetWriter("empty", root=isolated_cache, schema=rlds_cli.open_dataset("grid").fields).close()
    result = invoke("stats", "empty")
    assert result.exit_code == 1 and "dataset 'empty' has no steps to compute statistics of" in result.stderr
    # the loader's Normalize says the same (it said "episodes must be a non-empty list")
    with pytest.raises(ValueError, match="dataset 'empty' has no steps to compute statistics of"):
        Normalize().bind(rlds_cli.open_dataset("empty"))


def test_a_damaged_column_makes_no_table(isolated_cache: Path, tmp_path: Path) -> None:
    """A table from a changed action file un-normalized every action wrong at inference (the
    table records nothing a later check could catch)."""
    from rlds_cli.cache.opening import open_dataset
    from tests.dataset_fixtures import make_dataset

    make_dataset("d", [3, 5, 2])
    path = open_dataset("d").directory / "arrays" / "action.npy"
    actions = np.load(path, mmap_mode="r+")
    actions[0] = actions[0] + 500.0
    actions.flush()
    del actions
    out = tmp_path / "norm.json"
    result = invoke("stats", "d", "--normalization-table", out)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: dataset 'd' is damaged: 'action' (")
    assert not out.exists()
