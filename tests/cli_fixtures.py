"""``rlds download`` run in-process for the format tests: one helper instead of a copy per test
module (the result is returned for the test to check; :func:`download_ok` checks the exit)."""

from __future__ import annotations

from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from rlds_cli.cli.app import app


def download(source: Path | str, name: str, *extra: str) -> Result:
    """``rlds download SOURCE --name NAME EXTRA...`` through typer's ``CliRunner``."""
    return CliRunner().invoke(app, ["download", str(source), "--name", name, *extra])


def download_ok(source: Path | str, name: str, *extra: str) -> Result:
    """:func:`download`, which must succeed (the output is the assertion's message)."""
    result = download(source, name, *extra)
    assert result.exit_code == 0, (result.output, result.exception)
    return result
