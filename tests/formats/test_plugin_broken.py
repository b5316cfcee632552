"""A reader plugin that cannot be used (its ``rlds_cli.readers`` entry point names a module that
is not installed, or its ``sniff`` raises) is left out of format detection with one warning
naming it; the other plugins and the built-in formats are still asked, and a file that none of
them recognises gets the usual "cannot tell the format" error. ``--format`` naming the broken
plugin is an error naming it.

The plugins are installed the way ``pip install`` leaves them (a ``*.dist-info`` folder with an
``entry_points.txt``) in a temporary folder put on ``sys.path`` (or ``PYTHONPATH`` for the CLI
run in a subprocess, through ``main``, which renders warnings as ``warning:`` lines).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rlds_cli.cli import output
from rlds_cli.cli.app import app
from rlds_cli.errors import UnknownFormatError
from rlds_cli.formats import detect_format, reader_class
from tests.plugin_fixtures import install_tiny_plugin

REPO = Path(__file__).resolve().parents[2]

#: A reader whose ``sniff`` fails on every file (a bug of its package).
BOOM = """
from rlds_cli.formats.base import Reader


class BoomReader(Reader):
    format_name = "boom"

    @staticmethod
    def sniff(path):
        raise RuntimeError("boom went the sniff")
"""


def _dist(site: Path, dist: str, entry: str) -> None:
    """The metadata of the distribution ``dist`` registering ``entry`` (``name = module:Class``)."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rlds_cli.readers]\n{entry}\n")


def _gone(site: Path) -> Path:
    """``site`` holding the distribution ``rlds-gone``, whose entry point names the module
    ``rlds_gone.reader``, which is not there (a package removed by hand, a half-done install)."""
    _dist(site, "rlds-gone", "gone = rlds_gone.reader:GoneReader")
    return site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty folder on ``sys.path``; the plugin modules imported from it are forgotten after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for module in [m for m in sys.modules if m.split(".")[0] in ("rlds_tiny", "rlds_boom")]:
        del sys.modules[module]


@pytest.fixture
def stray(tmp_path: Path) -> Path:
    """A file that no built-in format recognises."""
    path = tmp_path / "run.xyz"
    path.write_text("1 2 3\n")
    return path


def _one_warning(record: list[warnings.WarningMessage], *words: str) -> str:
    texts = [str(w.message) for w in record]
    assert len(texts) == 1, texts
    for word in words:
        assert word in texts[0], (word, texts[0])
    return texts[0]


def test_a_plugin_whose_module_is_missing_is_named_and_detection_goes_on(site: Path, stray: Path) -> None:
    _gone(site)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(UnknownFormatError, match="cannot tell the format of"):
            detect_format(stray)
    text = _one_warning(
        record, "'gone'", "rlds_gone.reader:GoneReader", "module 'rlds_gone' is not installed"
    )
    assert "rlds-gone" in text and "format detection goes on without it" in text


def test_the_other_plugins_are_still_asked(site: Path, tmp_path: Path) -> None:
    """``gone`` sorts before ``tiny``: the broken plugin is met first, and skipped."""
    install_tiny_plugin(site)
    _gone(site)
    src = tmp_path / "run.tiny"
    src.write_text("1\n2\n")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert detect_format(src) == "tiny"
    _one_warning(record, "'gone'", "rlds_gone")


def test_a_plugin_whose_sniff_raises_is_named_and_skipped(site: Path, stray: Path) -> None:
    (site / "rlds_boom").mkdir()
    (site / "rlds_boom" / "__init__.py").write_text("")
    (site / "rlds_boom" / "reader.py").write_text(textwrap.dedent(BOOM))
    _dist(site, "rlds-boom", "boom = rlds_boom.reader:BoomReader")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(UnknownFormatError, match="cannot tell the format of"):
            detect_format(stray)
    _one_warning(record, "'boom'", str(stray), "RuntimeError: boom went the sniff", "rlds-boom")


def test_format_naming_the_broken_plugin_is_an_error_naming_it(site: Path) -> None:
    _gone(site)
    with pytest.raises(UnknownFormatError) as caught:
        reader_class("gone")
    assert "reader plugin 'gone'" in caught.value.message
    assert "module 'rlds_gone' is not installed" in caught.value.message
    assert "rlds-gone" in caught.value.hint


@pytest.fixture
def cli_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warnings rendered as the console entry point renders them (``main`` sets this), on a
    stderr wide enough that one line stays one line."""
    monkeypatch.setattr(output, "err_console", Console(stderr=True, highlight=False, width=400))
    monkeypatch.setattr(warnings, "showwarning", output.format_warning)


def test_download_names_the_plugin_then_says_the_format_is_unknown(
    site: Path, stray: Path, cli_warnings: None
) -> None:
    _gone(site)
    result = CliRunner().invoke(app, ["download", str(stray), "--name", "x"])
    assert result.exit_code == 1, (result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["warning", "error", "hint"], lines
    assert "'gone'" in lines[0] and "module 'rlds_gone' is not installed" in lines[0], lines[0]
    assert lines[1] == f"error: cannot tell the format of {stray}", lines[1]
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr


def test_the_console_entry_point_prints_the_same(site: Path, stray: Path, tmp_path: Path) -> None:
    """Through ``main`` in a process of its own: the entry points are read afresh, and warnings
    reach stderr as ``main`` renders them."""
    _gone(site)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), COLUMNS="400")
    env["RLDS_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-m", "rlds_cli.cli.app", "download", str(stray), "--name", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["warning", "error", "hint"], lines
    assert "'gone'" in lines[0] and "rlds_gone" in lines[0], lines[0]
    assert lines[1] == f"error: cannot tell the format of {stray}"
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr
