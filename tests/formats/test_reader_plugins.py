"""Readers of other packages (the ``rlds_cli.readers`` entry-point group) and reader options from
the command line (``rlds download PATH --option key=value``).

The plugin is :mod:`tests.plugin_fixtures`'s tiny package with a ``*.dist-info`` folder (its
``entry_points.txt``) in a temporary folder put on ``PYTHONPATH``: exactly what ``pip install``
leaves behind, without installing anything. The CLI runs in a subprocess, so the entry points are read afresh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from tests.d4rl_fixtures import golden_three_episodes
from tests.plugin_fixtures import install_tiny_plugin

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A folder holding the package ``rlds_tiny`` and its distribution's metadata."""
    return install_tiny_plugin(tmp_path / "site")


def _rlds(args: list[str], site: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), RLDS_HOME=str(home))
    env["COLUMNS"] = "300"
    return subprocess.run(
        [sys.executable, "-m", "rlds_cli.cli.app", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_plugin_reader_converts_from_the_cli(tmp_path: Path, plugin_path: Path) -> None:
    src = tmp_path / "run.tiny"
    src.write_text("1\n2\n3\n\n10\n20\n")
    home = tmp_path / "home"
    detected = _rlds(
        ["download", str(src), "--name", "t", "--option", "scale=2", "--json"], plugin_path, home
    )
    assert detected.returncode == 0, detected.stderr
    out = json.loads(detected.stdout)
    assert (out["num_steps"], out["num_episodes"]) == (3, 2)
    ds = open_dataset("t", root=home)
    assert ds.manifest.source["format"] == "tiny"
    assert ds.manifest.source["options"] == {"scale": 2.0}  # the string, as the option's type
    assert ds[:]["observation"][:, 0].tolist() == [2.0, 4.0, 20.0]
    named = _rlds(["download", str(src), "--name", "t2", "--format", "tiny", "-q"], plugin_path, home)
    assert named.returncode == 0 and named.stdout.strip() == "t2", named.stderr
    bad = _rlds(["download", str(src), "--name", "t3", "--option", "scale=big"], plugin_path, home)
    assert bad.returncode == 1
    assert "error: scale is 'big'; the tiny format takes a number" in bad.stderr, bad.stderr


def test_without_the_plugin_the_format_is_unknown(tmp_path: Path) -> None:
    src = tmp_path / "run.tiny"
    src.write_text("1\n2\n")
    result = _rlds(["download", str(src), "--format", "tiny"], tmp_path, tmp_path / "home")
    assert result.returncode == 1 and "unknown source format 'tiny'" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("last_step=drop", ["option 'last_step' does not apply to the d4rl format", "max_episode_steps"]),
        ("block_rows=many", ["block_rows is 'many'; the d4rl format takes a whole number >= 1"]),
        # -3 was blamed on the data file ("holds no complete transition"); 0 and -5 were accepted
        ("block_rows=-3", ["block_rows is '-3'; the d4rl format takes a whole number >= 1"]),
        ("block_rows=0", ["block_rows is '0'; the d4rl format takes a whole number >= 1"]),
        ("max_episode_steps=-5", ["max_episode_steps is '-5'; the d4rl format takes a whole number >= 1"]),
        ("max_episode_steps", ["'max_episode_steps' is not key=value"]),
    ],
)
def test_a_bad_option_is_one_line_naming_it(
    tmp_path: Path, consoles: None, option: str, words: list[str]
) -> None:
    src = golden_three_episodes(tmp_path / "d.hdf5", with_next=True)
    result = CliRunner().invoke(app, ["download", str(src), "--option", option])
    assert result.exit_code == (2 if "key=value" in words[0] else 1), result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    assert "Traceback" not in result.stderr


def test_options_from_the_cli_are_typed_in_the_manifest(tmp_path: Path, consoles: None) -> None:
    src = golden_three_episodes(tmp_path / "d.hdf5", with_next=False)
    result = CliRunner().invoke(
        app,
        ["download", str(src), "--name", "d", "--option", "max_episode_steps=2", "--option", "block_rows=3"],
    )
    assert result.exit_code == 0, result.stderr
    ds = open_dataset("d")
    assert ds.manifest.source["options"] == {"max_episode_steps": 2, "block_rows": 3}


def test_a_cli_option_overrides_the_registry_entrys(consoles: None) -> None:
    """The demo entry says max_episode_steps = 100; the command line's value wins, typed."""
    result = CliRunner().invoke(
        app, ["download", "demo", "--name", "d50", "--option", "max_episode_steps=50"]
    )
    assert result.exit_code == 0, result.stderr
    assert open_dataset("d50").manifest.source["options"] == {"max_episode_steps": 50}
    assert open_dataset("d50").manifest.source["id"] == "pointmass-demo-v0"
