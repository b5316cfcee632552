"""A LeRobot ``meta/info.json`` that contradicts the dataset's own tables and files, converted
from the CLI (``rlds download PATH --name N``) on a copy of the golden fixture (3 episodes, 75
frames, written by lerobot itself) whose info.json a test edits.

* ``total_episodes`` / ``total_frames`` that are not counts, or not what the episodes table
  holds: refused in one line naming the file, the field and both values, with a hint; nothing
  published. A declared 10**12 is compared, never sized by (the refusal is immediate).
* ``chunks_size`` that no layout can have (0, negative, not an integer): refused, naming it,
  though v3.0 does not read it.
* v2.1 ``total_chunks`` that differs from the chunk folders the episodes lie in: converted, with
  a warning naming both values (paths come from ``chunks_size``).
* A feature's declared ``dtype`` other than its parquet column's: converted as the parquet holds
  it, with a warning naming both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result

from rlds_cli.cache import open_dataset
from tests.cli_fixtures import download
from tests.formats_fixtures import refused
from tests.lerobot_fixtures import LENGTHS, v21_tree, writable_v3

pytest.importorskip("pyarrow")
pytest.importorskip("av")


#: wide consoles: one error line stays one line
pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(400, 400)]


@pytest.fixture
def v3(tmp_path: Path) -> Path:
    """A writable copy of the golden v3.0 tree."""
    return writable_v3(tmp_path)


def _edit_info(root: Path, **fields: Any) -> Path:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info.update(fields)
    path.write_text(json.dumps(info, indent=4))
    return path


def _refused(result: Result, *needles: str) -> tuple[str, str]:
    """:func:`refused` with the hint every contradiction carries: (error line, hint line)."""
    return refused(result, *needles, hint=True), result.stderr.splitlines()[1]


@pytest.mark.parametrize(
    ("field", "value", "held"),
    [
        ("total_episodes", 10**12, "lists 3 episode(s)"),
        ("total_episodes", 2, "lists 3 episode(s)"),
        ("total_frames", 10**12, f"sums to {sum(LENGTHS)} frames"),
    ],
)
def test_a_declared_total_other_than_the_tables_is_refused(
    v3: Path, field: str, value: int, held: str
) -> None:
    info = _edit_info(v3, **{field: value})
    _, hint = _refused(download(v3, "lr"), str(info), f"says {field}={value}", held)
    assert "download the whole dataset folder again" in hint


@pytest.mark.parametrize("value", ["3", 3.0, -1, None])
def test_a_total_that_is_not_a_count_is_refused(v3: Path, value: object) -> None:
    info = _edit_info(v3, total_episodes=value)
    _, hint = _refused(download(v3, "lr"), str(info), f"total_episodes is {value!r}, not an integer >= 0")
    assert "download the whole dataset folder again" in hint


@pytest.mark.parametrize("value", [0, -5, 1000.5, "1000"])
def test_a_chunks_size_no_layout_can_have_is_refused(v3: Path, value: object) -> None:
    info = _edit_info(v3, chunks_size=value)
    _, hint = _refused(download(v3, "lr"), str(info), f"chunks_size is {value!r}, not an integer >= 1")
    assert "chunks_size is how many" in hint and "lerobot writes 1000" in hint


def test_a_v21_total_chunks_other_than_the_layout_is_a_warning(v3: Path, tmp_path: Path) -> None:
    src = v21_tree(v3, tmp_path / "v21")
    info = _edit_info(src, total_chunks=7)
    result = download(src, "lr21")
    assert result.exit_code == 0, (result.output, result.exception)
    warned = [line for line in result.stderr.splitlines() if "total_chunks" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: "), result.stderr
    assert f"{info} says total_chunks=7" in warned[0] and "1 chunk folder(s) of chunks_size 1000" in warned[0]
    ds = open_dataset("lr21")
    assert (ds.num_episodes, ds.num_steps) == (3, sum(LENGTHS))
    assert any("total_chunks=7" in note for note in ds.manifest.conversion["notes"])


def test_a_declared_dtype_other_than_the_parquets_is_a_warning(v3: Path) -> None:
    info = json.loads((v3 / "meta" / "info.json").read_text())
    state = info["features"]["observation.state"]
    assert state["dtype"] == "float32"
    state["dtype"] = "int64"
    _edit_info(v3, features=info["features"])
    result = download(v3, "d")
    assert result.exit_code == 0, result.output
    said = "'observation.state' holds float32, meta/info.json declares int64: the parquet's values are kept"
    assert result.stderr.count(said) == 1
    assert open_dataset("d")[:]["observation/state"].dtype == np.float32
