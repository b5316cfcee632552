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
    ],
)
def test_refusals(robots: list[str], args: list[str], message: str) -> None:
    result = invoke("stats", *args)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert message in lines[0] and len(lines) <= 2 and "Traceback" not in result.stderr
