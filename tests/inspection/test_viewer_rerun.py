"""``rlds show --rerun FILE.rrd`` / :func:`rlds_cli.inspection.viewer.write_rerun`: the
recording, read back with rerun's own ``RrdReader``, holds each camera's stored image files on
the ``step`` timeline, every plotted dimension, the audit's marks and the statistics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import MissingExtraError, ViewerError
from rlds_cli.inspection.viewer import write_rerun
from tests.formats_fixtures import refused
from tests.inspection.viewer_fixtures import build_viewer_dataset, stored_frames

pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(250, 250)]
runner = CliRunner()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("viewer-rerun")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        build_viewer_dataset(folder, "faulty")
    return folder


def invoke(*args: object) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def entities(path: Path) -> dict[str, Any]:
    """entity path -> its rows (pyarrow record batches joined as Python lists by column)."""
    chunk = pytest.importorskip("rerun.chunk", reason="rerun-sdk is not installed")
    out: dict[str, dict[str, list[Any]]] = {}
    for ch in chunk.RrdReader(str(path)).stream():
        batch = ch.to_record_batch()
        rows = out.setdefault(ch.entity_path, {})
        for name in batch.schema.names:
            if name in ("time", "log_time"):  # durations in ns: pyarrow will not make timedeltas
                continue
            rows.setdefault(name, []).extend(batch.column(name).to_pylist())
    return out


def test_the_recording_holds_frames_series_marks_and_stats(root: Path, tmp_path: Path) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    out = tmp_path / "e.rrd"
    summary = write_rerun("faulty", out, episodes=[4, 6], root=root)
    assert (
        summary.episodes == [4, 6] and summary.cameras == ["pixels"] and summary.nbytes == out.stat().st_size
    )
    got = entities(out)
    ds = open_dataset("faulty", root)
    for pos in (4, 6):
        cam = got[f"/episode/{pos}/pixels"]
        order = np.argsort(cam["step"])
        assert [bytes(cam["EncodedImage:blob"][i][0]) for i in order] == stored_frames(ds, "pixels", pos)
        assert {m for row in cam["EncodedImage:media_type"] for m in row} == {"image/png"}
        action = np.asarray(ds.episode(pos, ["action"])["action"])
        for d in range(action.shape[1]):
            series = got[f"/episode/{pos}/action/{d}"]
            values = np.array([v[0] for v in series["Scalars:scalars"]])[np.argsort(series["step"])]
            np.testing.assert_allclose(values, action[:, d], rtol=1e-5)
    audit = got["/episode/4/audit"]
    frozen = [t for row in audit["TextLog:text"] for t in row if t.startswith("frozen pixels")]
    assert frozen == ["frozen pixels (frame repeated while moving): steps 21 to 30"]
    assert "audit flags: frozen:pixels" in str(got["/episode/4/stats"]["TextDocument:text"])
    assert "audit flags: spike" in str(got["/episode/6/stats"]["TextDocument:text"])


def test_cli_writes_the_recording_and_the_page_with_o(root: Path, tmp_path: Path) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    rrd, page = tmp_path / "a.rrd", tmp_path / "a.html"
    only = invoke("show", "faulty", "-e", "2", "--rerun", rrd, "--root", root, "--json")
    assert only.exit_code == 0, only.output
    info = json.loads(only.stdout)
    steps = int(open_dataset("faulty", root).episode_index["length"][2])
    assert info == {"rerun": {"path": str(rrd), "bytes": rrd.stat().st_size, "episodes": [2], "steps": steps}}
    assert not page.exists() and "/episode/2/pixels" in entities(rrd)
    both = invoke("show", "faulty", "-e", "2", "--rerun", rrd, "-o", page, "--root", root)
    assert both.exit_code == 0 and "open it with 'rerun" in both.stdout and page.is_file()


def test_without_rerun_sdk_one_line_says_what_to_install(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rerun", None)  # import rerun fails, as where it is absent
    with pytest.raises(MissingExtraError, match="rerun-sdk"):
        write_rerun("faulty", tmp_path / "x.rrd", root=root)
    result = invoke("show", "faulty", "--rerun", tmp_path / "x.rrd", "--root", root)
    refused(result, "--rerun needs rerun-sdk", hint=True, home=tmp_path / "none")
    assert "rlds-cli[rerun]" in result.stderr and not (tmp_path / "x.rrd").exists()


def test_refusals_write_nothing(root: Path, tmp_path: Path) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    with pytest.raises(ViewerError, match="does not exist"):
        write_rerun("faulty", tmp_path / "no" / "x.rrd", root=root)
    result = invoke("show", "faulty", "-e", "99", "--rerun", tmp_path / "x.rrd", "--root", root)
    refused(result, "episode 99 is outside", home=tmp_path / "none")
    assert list(tmp_path.iterdir()) == []
