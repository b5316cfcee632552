"""The files a command writes where the user names them (``rlds show -o``, ``show --rerun``,
``inspect --plot``, ``stats --normalization-table``): written over only where an earlier run wrote
them. Each replaced any file there, exit 0: ``rlds show -o data.hdf5`` put a page over a
dataset's source file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlds_cli.cli.app import app
from tests.dataset_fixtures import make_dataset

pytestmark = pytest.mark.usefixtures("consoles")
runner = CliRunner()

#: command arguments before the output path, the output's name, and what the message calls it
OUTPUTS = {
    "page": (["show", "d", "-o"], "out.html", "the page"),
    "plot": (["inspect", "d", "--no-stats", "--plot"], "out.png", "the plot"),
    "plot (pdf)": (["inspect", "d", "--no-stats", "--plot"], "out.pdf", "the plot"),
    "table": (["stats", "d", "--normalization-table"], "out.json", "the normalization table"),
    "recording": (["show", "d", "--rerun"], "out.rrd", "the recording"),
}


@pytest.fixture
def dataset(isolated_cache: Path) -> Path:
    make_dataset("d", [4, 5, 3])
    return isolated_cache


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_an_output_is_written_over_only_where_an_earlier_run_wrote_it(
    dataset: Path, tmp_path: Path, kind: str
) -> None:
    before, name, what = OUTPUTS[kind]
    if kind == "plot" or kind == "plot (pdf)":
        pytest.importorskip("matplotlib")
    if kind == "recording":
        pytest.importorskip("rerun")
    folder = tmp_path / "outputs"
    folder.mkdir()
    out = folder / name
    for _ in range(2):  # the second run writes over the first's file
        result = runner.invoke(app, [*before, str(out)])
        assert result.exit_code == 0, result.output
    written = out.read_bytes()
    assert written
    mine = folder / f"mine{out.suffix}"
    mine.write_bytes(b"the user's own bytes\n")
    empty = folder / f"empty{out.suffix}"
    empty.write_bytes(b"")
    result = runner.invoke(app, [*before, str(mine)])
    assert result.exit_code == 1, result.output
    assert f"cannot write {what} to {mine}: the file there is not one this command wrote" in result.output
    assert "remove it first, or name another file" in result.output and "Traceback" not in result.output
    assert mine.read_bytes() == b"the user's own bytes\n"
    assert runner.invoke(app, [*before, str(empty)]).exit_code == 0  # nothing there to lose
    assert sorted(p.name for p in folder.iterdir()) == sorted({out.name, mine.name, empty.name})


def test_a_plot_in_a_format_that_keeps_no_mark_is_written_only_where_no_file_is(
    dataset: Path, tmp_path: Path
) -> None:
    """A JPEG keeps no creator: a plot there is written once, then refused like any file."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot.jpg"
    assert runner.invoke(app, ["inspect", "d", "--no-stats", "--plot", str(out)]).exit_code == 0
    result = runner.invoke(app, ["inspect", "d", "--no-stats", "--plot", str(out)])
    assert result.exit_code == 1 and "is not one this command wrote" in result.output, result.output


@pytest.mark.parametrize("below", ["afile", "afile/sub"])
def test_a_plot_below_a_file_is_one_line(dataset: Path, tmp_path: Path, below: str) -> None:
    """A file where a folder of the path should be (the folder holding the plot, or one above
    it): "unexpected FileExistsError"."""
    pytest.importorskip("matplotlib")
    (tmp_path / "afile").write_bytes(b"x")
    out = tmp_path / below / "x.png"
    result = runner.invoke(app, ["inspect", "d", "--no-stats", "--plot", str(out)])
    assert result.exit_code == 1, result.output
    line = f"error: {out}: a part of the path ({out.parent}) is a file, not a folder"
    assert result.stderr.splitlines()[0] == line, result.output
    assert (tmp_path / "afile").read_bytes() == b"x"


def test_a_recording_below_a_file_is_one_line(dataset: Path, tmp_path: Path) -> None:
    """It said the folder "does not exist"."""
    pytest.importorskip("rerun")
    (tmp_path / "afile").write_bytes(b"x")
    result = runner.invoke(app, ["show", "d", "--rerun", str(tmp_path / "afile" / "x.rrd")])
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'afile'} is a file, not a folder" in result.output
