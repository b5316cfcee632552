"""``rlds inspect``: per-key statistics, NaN/inf counts, histograms, compression, --plot."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.blocks import Budget
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.inspection.summary import describe, histogram, key_statistics, length_histogram
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl

runner = CliRunner()


pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(200, 200)]


def _file_with_nans(path: Path) -> Path:
    rng = np.random.default_rng(3)
    n = 400
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    obs[5, 1] = np.nan
    obs[9, 0] = np.inf
    obs[11, 2] = -np.inf
    timeouts = np.zeros(n, bool)
    timeouts[99::100] = True
    return write_d4rl(
        path,
        observations=obs,
        actions=rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        rewards=rng.normal(size=n).astype(np.float32),
        terminals=np.zeros(n, bool),
        timeouts=timeouts,
        next_observations=np.concatenate([obs[1:], obs[:1]]),
    )


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_key_statistics_match_numpy(tmp_path: Path, backend: str) -> None:
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f", backend=backend)
    ds = open_dataset("f")
    raw = np.asarray(ds.column("observation"), np.float64)
    finite = raw[np.isfinite(raw)]
    budget = Budget(100)  # many blocks (a zarr column's: whole chunks): the merge must be exact
    stats = key_statistics(ds, "observation", budget)
    assert budget.blocks > (100 if backend == "memmap" else 0)
    assert stats["count"] == raw.size
    assert (stats["nan"], stats["posinf"], stats["neginf"]) == (1, 1, 1)
    assert stats["min"] == finite.min() and stats["max"] == finite.max()
    assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert stats["std"] == pytest.approx(finite.std(), rel=1e-12)
    flags = key_statistics(ds, "next/truncated")
    assert flags == {"count": 400, "true": 4}


def test_histogram() -> None:
    assert histogram(np.array([1.0, 1.0, 2.0, 4.0]), bins=3) == {
        "counts": [2, 1, 1],
        "edges": [1.0, 2.0, 3.0, 4.0],
    }
    assert histogram(np.array([])) == {"counts": [], "edges": []}


def test_returns_past_what_float64_can_subtract_are_shown(tmp_path: Path) -> None:
    """Returns -1e308 and 1e308 (finite, their range is not): "unexpected ValueError: Too many
    bins"; the min printed as 309 digits; inf returns warned from inside numpy."""
    hist = histogram(np.array([-1e308, 1e308, 0.0, 0.0]), bins=4)
    assert hist["counts"] == [1, 0, 2, 1] and hist["edges"][0] == -1e308 and hist["edges"][-1] == 1e308
    path = tmp_path / "wide.hdf5"
    with h5py.File(path, "w") as f:  # three one-step episodes
        f["observations"] = np.zeros((3, 2), np.float32)
        f["actions"] = np.zeros((3, 1), np.float32)
        f["rewards"] = np.array([-1e308, 1e308, np.inf])
        f["terminals"] = np.ones(3, bool)
        f["timeouts"] = np.zeros(3, bool)
    convert(path, "wide")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = runner.invoke(app, ["inspect", "wide"])
    assert result.exit_code == 0, result.output
    assert "episode return  min -1e+308  mean inf  max inf  std nan" in result.stdout
    assert sum(json.loads(runner.invoke(app, ["inspect", "wide", "--json"]).stdout)["histograms"]
               ["episode_return"]["counts"]) == 2  # fmt: skip


def test_length_bins_are_whole_numbers_and_end_at_the_longest() -> None:
    """Lengths 10..100 in 20 bins of 5: the last bin was drawn "100 .. 104" (no episode is longer
    than 100)."""
    lengths = np.array([10, 11, 25, 60, 100, 100])
    hist = length_histogram(lengths, bins=20)
    edges = np.array(hist["edges"])
    assert edges[0] == 9.5 and edges[-1] == 100.5
    assert np.all(np.diff(edges)[:-1] == 5) and 0 < edges[-1] - edges[-2] <= 5
    assert sum(hist["counts"]) == 6 and hist["counts"][-1] == 2
    assert length_histogram(np.array([7, 7]))["edges"] == [6.5, 7.5]


def test_describe_histograms_and_compression(tmp_path: Path) -> None:
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f", backend="zarr")
    info = describe(open_dataset("f"))
    lengths = info["histograms"]["episode_length"]
    assert max(lengths["counts"]) == 4  # four 100-step episodes, all in one bin
    assert lengths["edges"][0] < 100 < lengths["edges"][-1]
    assert sum(info["histograms"]["episode_return"]["counts"]) == 4
    obs = info["stored"]["observation"]
    assert obs["logical_bytes"] == (400 + 4) * 3 * 4
    assert obs["compression_ratio"] == pytest.approx(obs["logical_bytes"] / obs["bytes"])
    assert "stats" not in describe(open_dataset("f"), statistics=False)["stored"]["observation"]


def test_cli_inspect_shows_stats_and_histograms(tmp_path: Path) -> None:
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f")
    result = runner.invoke(app, ["inspect", "f"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "episode lengths" in out and "episode returns" in out
    assert "statistics (all elements)" in out
    assert "= observation[t+1]" in out
    data = json.loads(runner.invoke(app, ["inspect", "f", "--json"]).stdout)
    assert data["stored"]["observation"]["stats"]["nan"] == 1
    quick = json.loads(runner.invoke(app, ["inspect", "f", "--json", "--no-stats"]).stdout)
    assert "stats" not in quick["stored"]["observation"]


def test_cli_inspect_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f")
    png = tmp_path / "fig" / "f.png"
    result = runner.invoke(app, ["inspect", "f", "--plot", str(png), "--json", "--no-stats"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("name", "needle"),
    [("x.txt", "ends .txt, which is no image format"), ("d", "is a folder"), ("p", "has no image suffix")],
)
def test_cli_inspect_plot_names_what_it_cannot_write(tmp_path: Path, name: str, needle: str) -> None:
    """'.txt' gave "unexpected ValueError: Format 'txt' is not supported"; a name without a
    suffix said "plot written to p" and wrote p.png."""
    pytest.importorskip("matplotlib")
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f")
    (tmp_path / "d").mkdir()
    result = runner.invoke(app, ["inspect", "f", "--plot", str(tmp_path / name), "--no-stats"])
    assert result.exit_code == 1 and needle in result.stderr.splitlines()[0], result.output
    assert "unexpected" not in result.output and not (tmp_path / "p.png").exists()


def test_cli_inspect_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import finds where it is not installed
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    result = runner.invoke(app, ["inspect", "f", "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: --plot needs matplotlib, which is not installed"
    assert "rlds-cli[plot]" in result.stderr


def test_inspect_json_is_strict_json_when_a_return_is_nan(tmp_path: Path) -> None:
    """A NaN reward makes an episode's return NaN: --json writes null (strict parsers refuse NaN)."""
    import rlds_cli

    with rlds_cli.DatasetWriter("f", mode="create") as writer:
        for reward in (1.0, np.nan):
            writer.add_episode({
                "observation": np.arange(3, dtype=np.float32)[:, None],
                "next/observation": np.arange(1, 4, dtype=np.float32)[:, None],
                "action": np.zeros((3, 1), np.float32),
                "next/reward": np.full(3, reward, np.float32),
                "next/terminated": np.array([False, False, True]),
                "next/truncated": np.zeros(3, bool),
            })  # fmt: skip
    result = runner.invoke(app, ["inspect", "f", "--json"])
    assert result.exit_code == 0, result.output
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout

    def refuse(token: str) -> None:
        raise ValueError(token)

    json.loads(result.stdout, parse_constant=refuse)


def test_a_complex_key_counts_its_nan_and_infinite_values(isolated_cache: Path) -> None:
    """A complex key was never scanned: ``inspect`` showed 0 NaN for one holding a NaN, and the
    audit never flagged it ``nonfinite``."""
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.cache.ted import StepBlock
    from rlds_cli.inspection.audit import audit

    c = np.array([[1 + 1j], [np.nan + 0j], [2 - 1j], [complex(np.inf, 1)]], np.complex64)
    steps = {
        "action": np.zeros((4, 1), np.float32),
        "next/reward": np.ones(4, np.float32),
        "info/c": c,
        "next/terminated": np.array([0, 1, 0, 1], bool),
        "next/truncated": np.zeros(4, bool),
    }
    with DatasetBuilder("cnan", backend="memmap", replace=True) as builder:
        builder.append(
            StepBlock(
                steps=steps, observations={"observation": np.zeros((6, 1), np.float32)}, ends=np.array([1, 3])
            )
        )
        builder.commit()
    ds = open_dataset("cnan")
    found = key_statistics(ds, "info/c")
    assert (found["count"], found["nan"], found["posinf"], found["neginf"]) == (4, 1, 1, 0)
    assert found["mean"] is None
    report = audit(ds)
    assert report.flags["nonfinite"].tolist() == [0, 1]


def test_a_dataset_of_no_episode_yet_shows_no_figures(isolated_cache: Path, tmp_path: Path) -> None:
    """A writer's dataset with a schema and no episode: ``inspect`` printed episode lengths and
    returns of 0 (read as real figures) and ``show`` asked for "an episode from 0 to -1"."""
    from rlds_cli.write.writer import DatasetWriter

    schema = {
        "observation": ((2,), "float32"),
        "next/observation": ((2,), "float32"),
        "action": ((1,), "float32"),
        "next/reward": ((1,), "float32"),
        "next/terminated": ((1,), "bool"),
        "next/truncated": ((1,), "bool"),
    }
    DatasetWriter("empty0", schema=schema).close()
    info = describe(open_dataset("empty0"), statistics=False)
    assert info["episode_length"] == {"min": None, "max": None, "mean": None, "std": None}
    assert info["episode_return"]["mean"] is None
    shown = runner.invoke(app, ["inspect", "empty0", "--no-stats"])
    assert shown.exit_code == 0 and "episode length  - (no episode)" in shown.stdout
    page = runner.invoke(app, ["show", "empty0", "-o", str(tmp_path / "e.html")])
    assert page.exit_code == 1
    assert page.stderr.splitlines()[0] == "error: dataset 'empty0' holds no episode yet: nothing to show"


@pytest.mark.parametrize("command", ["show", "stats", "plot"])
def test_a_page_table_or_plot_is_never_written_into_the_cache(tmp_path: Path, command: str) -> None:
    """`show -o` and `stats --normalization-table` wrote over a dataset's manifest or episode
    index, said they wrote, and left the dataset unreadable (`export` refused the same paths)."""
    if command == "plot":
        pytest.importorskip("matplotlib")
    convert(_file_with_nans(tmp_path / "f.hdf5"), "f")
    victim = open_dataset("f").directory / ("plot.png" if command == "plot" else "manifest.json")
    before = {p: p.read_bytes() for p in victim.parent.rglob("*") if p.is_file()}
    args = {
        "show": ["show", "f", "-o", str(victim)],
        "stats": ["stats", "f", "--key", "action", "--normalization-table", str(victim)],
        "plot": ["inspect", "f", "--plot", str(victim)],
    }[command]
    result = runner.invoke(app, args)
    assert (
        result.exit_code == 1
        and f"to {victim}: it lies inside the rlds cache's datasets/ folder" in result.stderr
    )
    assert {p: p.read_bytes() for p in victim.parent.rglob("*") if p.is_file()} == before
    assert check_dataset(open_dataset("f")).ok
