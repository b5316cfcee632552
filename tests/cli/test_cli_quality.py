"""CLI conventions: -v logging, NO_COLOR, plain output when not on a terminal."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlds_cli.cli.app import app
from tests.d4rl_fixtures import golden_three_episodes

runner = CliRunner()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    logger = logging.getLogger("rlds_cli")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def test_verbose_logs_to_stderr(tmp_path: Path, restore_logging: None) -> None:
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    result = runner.invoke(app, ["-v", "download", str(src), "--name", "g", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "converting" in result.stderr and "published 'g'" in result.stderr
    assert result.stdout == "g\n"  # -q: only the name
    again = runner.invoke(app, ["-v", "download", str(src), "--name", "g", "--quiet"])
    assert "reused" in again.stderr
    assert logging.getLogger("rlds_cli").level == logging.INFO
    runner.invoke(app, ["-vv", "list"])
    assert logging.getLogger("rlds_cli").level == logging.DEBUG


def test_no_color_and_no_progress_when_piped(tmp_path: Path) -> None:
    """A real process whose output is a pipe: no escape codes at all (progress bars off, and
    NO_COLOR honoured by rich)."""
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    env = {**os.environ, "NO_COLOR": "1", "RLDS_HOME": str(tmp_path / "home"), "FORCE_COLOR": ""}
    code = "from rlds_cli.cli.app import main; main()"
    for args in (["download", str(src), "--name", "g"], ["inspect", "g"], ["list"]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        assert "\x1b[" not in done.stdout + done.stderr, args
