"""The ``rlds`` command line, end to end through typer's CliRunner (no subprocess, no network).

Errors go to stderr as ``error: ...`` + ``hint: ...`` with exit code 1; results to stdout.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from rlds_cli import errors
from rlds_cli._version import __version__
from rlds_cli.cli import output
from rlds_cli.cli.app import app
from tests.d4rl_fixtures import GOLDEN_TED_FIELDS, golden_expected, golden_three_episodes, write_d4rl

runner = CliRunner()


# stdout wide, so tables never truncate what the tests look for; stderr narrow, so a message that Rich
# would wrap shows up as a second line
pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(250, 40)]


#: ``rlds inspect --json``'s fields of the golden file: the golden table's TED fields.
GOLDEN_FIELDS = {
    key: {"shape": list(shape), "dtype": dtype, "codec": "raw"}
    for key, (shape, dtype) in GOLDEN_TED_FIELDS.items()
}


def golden_facts(with_next: bool) -> dict[str, Any]:
    """Expected ``rlds inspect --json`` facts of the golden file, read off the golden table (see
    d4rl_fixtures): without next_observations the timeout row 5 and the last row 7 are dropped
    (their next state is unknown), so episodes keep rows 0-2, 3-4 and 6; with them every row stays."""
    exp = golden_expected(with_next)
    columns = {key: np.asarray(values) for key, values in exp["columns"].items()}
    last = np.asarray(exp["start"]) + np.asarray(exp["length"]) - 1
    return {
        "num_steps": exp["num_steps"],
        "num_episodes": exp["num_episodes"],
        "episodes_terminated": int(columns["next/terminated"][last].sum()),
        "episodes_truncated": int(columns["next/truncated"][last].sum()),
        "final_observations_synthesized": exp["conversion"]["synthesized_final_observations"],
        "lengths": exp["length"],
        "returns": [
            float(columns["next/reward"][start : start + n].sum())
            for start, n in zip(exp["start"], exp["length"], strict=True)
        ],
        "dropped_rows": exp["conversion"]["dropped_rows"],
    }


def stats(values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    return {
        "min": float(min(values)),
        "max": float(max(values)),
        "mean": mean,
        "std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)),
    }


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, [str(a) for a in args], env=env)


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


def error_line(result: Result) -> str:
    """Assert a clean failure (exit 1, ``error:`` line, optional ``hint:`` line) and return the
    error line."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert lines, "nothing on stderr"
    assert lines[0].startswith("error: "), lines
    assert len(lines) <= 2, lines
    if len(lines) == 2:
        assert lines[1].startswith("hint: "), lines
    assert "Traceback" not in result.stderr
    return lines[0]


def hint_line(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 2, lines
    return lines[1]


def assert_nothing_published(root: Path) -> None:
    for sub in ("datasets", "tmp"):
        folder = root / sub
        assert not folder.exists() or list(folder.iterdir()) == [], (sub, list(folder.iterdir()))


def _arrays(n: int = 8) -> dict[str, np.ndarray]:
    return {
        "observations": np.stack([np.arange(n), np.arange(n)], axis=1).astype(np.float32),
        "actions": np.zeros((n, 1), np.float32),
        "rewards": np.ones(n, np.float32),
        "terminals": np.zeros(n, bool),
        "timeouts": np.eye(n, dtype=bool)[n // 2 - 1],
    }


# --------------------------------------------------------------------------- download + inspect


@pytest.mark.parametrize("with_next", [False, True], ids=["no-next", "with-next"])
def test_download_then_inspect_json_golden(tmp_path: Path, isolated_cache: Path, with_next: bool) -> None:
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=with_next)
    ok("download", src, "--format", "d4rl", "--name", "golden")
    info = ok_json("inspect", "golden")
    exp = golden_facts(with_next)
    assert info["name"] == "golden"
    assert info["path"] == str(isolated_cache / "datasets" / "golden")
    assert info["backend"] == "memmap"
    assert info["num_steps"] == exp["num_steps"]
    assert info["num_episodes"] == exp["num_episodes"]
    assert info["fields"] == GOLDEN_FIELDS
    assert list(info["fields"]) == list(GOLDEN_FIELDS)  # next/* after the others, sorted
    assert info["size_bytes"] > 0
    # disk use, as `du` and `rlds list` count it: allocated blocks
    files = [p for p in Path(info["path"]).rglob("*") if p.is_file()]
    assert info["size_bytes"] == sum(p.stat().st_blocks * 512 for p in files)
    assert info["episodes_terminated"] == exp["episodes_terminated"]
    assert info["episodes_truncated"] == exp["episodes_truncated"]
    assert info["final_observations_synthesized"] == exp["final_observations_synthesized"]
    assert info["episode_length"] == pytest.approx(stats(exp["lengths"]))
    assert info["episode_return"] == pytest.approx(stats(exp["returns"]))
    assert info["conversion"]["source_rows"] == 8
    assert info["conversion"]["dropped_rows"] == exp["dropped_rows"]
    assert info["source"]["format"] == "d4rl"
    assert info["source"]["path"] == str(src.resolve())
    assert info["source"]["size"] == src.stat().st_size
    assert info["source"]["metadata"] == {"metadata/algorithm": "SAC", "metadata/iteration": 3}
    assert info["created_by"] == f"rlds-cli {__version__}"
    assert info["lineage"] == []


def test_golden_exact_stat_values(golden_file: Path) -> None:
    """The same numbers as above, written out, so a bug in ``stats`` cannot hide one in describe."""
    ok("download", golden_file, "--format", "d4rl", "--name", "golden")
    info = ok_json("inspect", "golden")
    assert info["episode_length"] == pytest.approx(
        {"min": 1.0, "max": 3.0, "mean": 2.0, "std": math.sqrt(2 / 3)}
    )
    assert info["episode_return"] == pytest.approx(
        {"min": 6.0, "max": 9.0, "mean": 22 / 3, "std": math.sqrt(14 / 9)}
    )


def test_download_json_output(golden_file: Path, isolated_cache: Path) -> None:
    out = ok_json("download", golden_file, "--format", "d4rl", "--name", "golden")
    assert out["name"] == "golden"
    assert out["path"] == str(isolated_cache / "datasets" / "golden")
    assert out["reused"] is False
    assert (out["num_steps"], out["num_episodes"], out["backend"]) == (6, 3, "memmap")
    assert out["conversion"]["dropped_rows"] == 2
    assert out["conversion"]["synthesized_final_observations"] == 1
    again = ok_json("download", golden_file, "--format", "d4rl", "--name", "golden")
    assert again["reused"] is True
    assert again["num_steps"] == 6


def test_download_detects_format_and_names_after_the_file(golden_file: Path) -> None:
    result = ok("download", golden_file)
    assert result.stdout.startswith("golden: converted: 6 steps, 3 episodes, storage memmap -> ")
    assert ok_json("inspect", "golden")["source"]["format"] == "d4rl"


def test_list_json_and_human(golden_file: Path, golden_next_file: Path, isolated_cache: Path) -> None:
    assert ok_json("list") == {"root": str(isolated_cache), "datasets": []}
    assert "no datasets in" in ok("list").stdout
    ok("download", golden_file, "--format", "d4rl", "--name", "golden")
    ok("download", golden_next_file, "--format", "d4rl", "--name", "golden-next")
    listing = ok_json("list")
    assert listing["root"] == str(isolated_cache)
    rows = {r["name"]: r for r in listing["datasets"]}
    assert [r["name"] for r in listing["datasets"]] == ["golden", "golden-next"]
    assert (rows["golden"]["num_steps"], rows["golden"]["num_episodes"]) == (6, 3)
    assert (rows["golden-next"]["num_steps"], rows["golden-next"]["num_episodes"]) == (8, 3)
    for row in rows.values():
        assert row["backend"] == "memmap"
        assert row["format"] == "d4rl"
        assert row["size_bytes"] > 0
        assert row["derived_from"] == []
    assert rows["golden"]["source"] == str(golden_file.resolve())

    human = ok("list").stdout  # not a terminal: plain, complete, aligned lines
    lines = human.splitlines()
    assert lines[0] == f"datasets in {isolated_cache}"
    assert lines[1].split() == ["name", "steps", "episodes", "size", "storage", "source"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["golden"][1:3] == ["6", "3"]
    assert rows["golden-next"][1:3] == ["8", "3"]
    assert rows["golden"][-1] == str(golden_file.resolve())  # a long source path, whole
    assert "│" not in human and "…" not in human


def test_inspect_human(golden_file: Path, isolated_cache: Path) -> None:
    ok("download", golden_file, "--format", "d4rl", "--name", "golden")
    out = ok("inspect", "golden").stdout
    lines = out.splitlines()
    assert lines[0].startswith("golden  (memmap, ")
    assert lines[0].endswith(str(isolated_cache / "datasets" / "golden"))
    assert lines[1] == "steps 6   episodes 3   terminated 1   truncated 2"
    assert lines[2] == "episode length  min 1  mean 2.0  max 3  std 0.8"
    assert lines[3] == "episode return  min 6.00  mean 7.33  max 9.00  std 1.25"
    keys = {line.split()[0] for line in lines if line.strip()}
    for key in GOLDEN_FIELDS:
        assert key in keys
    assert "dropped rows 2, synthesized final observations 1" in out
    assert f"source  d4rl: {golden_file.resolve()}" in out


def test_download_human_output_and_reuse(golden_file: Path, isolated_cache: Path) -> None:
    first = ok("download", golden_file, "--format", "d4rl", "--name", "golden")
    path = isolated_cache / "datasets" / "golden"
    assert first.stdout == f"golden: converted: 6 steps, 3 episodes, storage memmap -> {path}\n"
    assert first.stderr == ""
    manifest = (path / "manifest.json").read_bytes()
    second = ok("download", golden_file, "--format", "d4rl", "--name", "golden")
    assert second.stdout == f"golden: already in the cache: 6 steps, 3 episodes, storage memmap -> {path}\n"
    assert (path / "manifest.json").read_bytes() == manifest  # untouched


def test_download_summary_is_one_line_on_a_narrow_terminal(
    golden_file: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "console", Console(highlight=False, width=30))
    out = ok("download", golden_file, "--name", "golden").stdout
    path = isolated_cache / "datasets" / "golden"
    assert out == f"golden: converted: 6 steps, 3 episodes, storage memmap -> {path}\n"


def test_download_same_name_other_file_needs_force(golden_file: Path, golden_next_file: Path) -> None:
    ok("download", golden_file, "--format", "d4rl", "--name", "golden")
    result = invoke("download", golden_next_file, "--format", "d4rl", "--name", "golden")
    line = error_line(result)
    assert "'golden'" in line and "already exists" in line
    assert "--force" in hint_line(result)
    assert ok_json("inspect", "golden")["num_steps"] == 6  # the old one is still there

    forced = ok("download", golden_next_file, "--format", "d4rl", "--name", "golden", "--force")
    assert "golden: converted: 8 steps, 3 episodes" in forced.stdout
    info = ok_json("inspect", "golden")
    assert info["num_steps"] == 8
    assert info["source"]["path"] == str(golden_next_file.resolve())
    assert [r["name"] for r in ok_json("list")["datasets"]] == ["golden"]


def test_force_on_same_file_rebuilds(golden_file: Path) -> None:
    ok("download", golden_file, "--name", "golden")
    out = ok_json("download", golden_file, "--name", "golden", "--force")
    assert out["reused"] is False
    assert out["num_steps"] == 6


def test_backend_zarr(golden_file: Path, isolated_cache: Path) -> None:
    ok("download", golden_file, "--format", "d4rl", "--name", "golden", "--storage", "zarr")
    info = ok_json("inspect", "golden")
    assert info["backend"] == "zarr"
    assert (info["num_steps"], info["num_episodes"]) == (6, 3)
    assert info["fields"] == GOLDEN_FIELDS
    assert info["episode_return"] == pytest.approx(stats(golden_facts(False)["returns"]))
    directory = isolated_cache / "datasets" / "golden"
    assert [p.name for p in directory.rglob("*.npy")] == ["episodes.npy"]  # no memmap columns
    assert (directory / "arrays" / "zarr.json").is_file()
    assert ok_json("list")["datasets"][0]["backend"] == "zarr"


def test_root_option_overrides_rlds_home(golden_file: Path, tmp_path: Path, isolated_cache: Path) -> None:
    other = tmp_path / "other-root"
    out = ok_json("download", golden_file, "--name", "golden", "--root", other)
    assert out["path"] == str(other / "datasets" / "golden")
    assert (other / "datasets" / "golden" / "manifest.json").is_file()
    assert not (isolated_cache / "datasets").exists()
    assert ok_json("list")["datasets"] == []
    listing = ok_json("list", "--root", other)
    assert listing["root"] == str(other)
    assert [r["name"] for r in listing["datasets"]] == ["golden"]
    assert ok_json("inspect", "golden", "--root", other)["num_steps"] == 6
    assert "no dataset named 'golden'" in error_line(invoke("inspect", "golden"))


def test_paths_with_brackets_are_printed_verbatim(tmp_path: Path) -> None:
    """Rich markup in paths (``[bold]``, ``[/x]``) must be printed as text, not interpreted."""
    root = tmp_path / "[bold]root"
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    out = ok("download", src, "--name", "g", "--root", root).stdout
    assert f"-> {root / 'datasets' / 'g'}" in out
    assert str(root) in ok("list", "--root", root).stdout
    assert str(root) in ok("inspect", "g", "--root", root).stdout
    missing = tmp_path / "a[/b]" / "x.hdf5"
    assert str(missing) in error_line(invoke("download", missing))


# --------------------------------------------------------------------------- bad inputs


def test_truncated_hdf5(golden_file: Path, tmp_path: Path, isolated_cache: Path) -> None:
    data = golden_file.read_bytes()
    for cut in (len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.hdf5"
        bad.write_bytes(data[:cut])
        line = error_line(invoke("download", bad, "--format", "d4rl", "--name", "cut"))
        assert str(bad) in line
        assert "truncated or corrupt" in line
        # without --format too: detection must not hide the reason
        assert str(bad) in error_line(invoke("download", bad, "--name", "cut"))
    assert_nothing_published(isolated_cache)


def test_not_hdf5_at_all(tmp_path: Path, isolated_cache: Path) -> None:
    bad = tmp_path / "junk.hdf5"
    bad.write_bytes(b"this is not an HDF5 file\n" * 100)
    line = error_line(invoke("download", bad, "--format", "d4rl"))
    assert str(bad) in line and "HDF5" in line
    assert_nothing_published(isolated_cache)


def test_missing_key(tmp_path: Path, isolated_cache: Path) -> None:
    src = write_d4rl(tmp_path / "noact.hdf5", **_arrays(), omit=("actions",))
    line = error_line(invoke("download", src, "--format", "d4rl", "--name", "noact"))
    assert str(src) in line
    assert "'actions'" in line
    # format detection cannot tell it is D4RL; the error still names the file
    result = invoke("download", src, "--name", "noact")
    assert str(src) in error_line(result)
    assert "--format" in hint_line(result)
    assert_nothing_published(isolated_cache)


def test_mismatched_lengths(tmp_path: Path, isolated_cache: Path) -> None:
    arrays = _arrays()
    arrays["rewards"] = arrays["rewards"][:7]
    src = write_d4rl(tmp_path / "mismatch.hdf5", **arrays)
    line = error_line(invoke("download", src, "--format", "d4rl", "--name", "mismatch"))
    assert str(src) in line
    assert "'rewards' has 7 rows" in line and "8" in line
    assert_nothing_published(isolated_cache)


def test_failure_midway_publishes_nothing_and_keeps_the_old_dataset(
    golden_file: Path, golden_next_file: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli.formats import d4rl
    from rlds_cli.formats.hdf5_util import read_error

    ok("download", golden_file, "--name", "golden")
    manifest = (isolated_cache / "datasets" / "golden" / "manifest.json").read_bytes()
    real_blocks = d4rl.D4RLReader.blocks

    def failing_blocks(self: Any, progress: Any = None) -> Any:
        yield from itertools.islice(real_blocks(self, progress), 1)  # one block is written, then
        raise read_error(self.path, "observations", OSError("Can't read data (wrong B-tree signature)"))

    monkeypatch.setattr(d4rl.D4RLReader, "blocks", failing_blocks)
    for name, extra in (("fresh", []), ("golden", ["--force"])):
        result = invoke("download", golden_next_file, "--name", name, "--format", "d4rl", *extra)
        line = error_line(result)
        assert str(golden_next_file) in line and "'observations'" in line
    assert [p.name for p in (isolated_cache / "datasets").iterdir()] == ["golden"]
    assert (isolated_cache / "datasets" / "golden" / "manifest.json").read_bytes() == manifest
    assert list((isolated_cache / "tmp").iterdir()) == []
    assert ok_json("inspect", "golden")["num_steps"] == 6


@pytest.mark.parametrize("relative", [False, True])
def test_nonexistent_path(
    tmp_path: Path, isolated_cache: Path, relative: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = "nope/missing.hdf5" if relative else str(tmp_path / "missing.hdf5")
    result = invoke("download", missing)
    line = error_line(result)
    assert "missing.hdf5" in line and "does not exist" in line
    assert_nothing_published(isolated_cache)


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("", "error: the source is empty"),
        ("~no-such-user-here/x.hdf5", "no home folder for '~no-such-user-here'"),
    ],
)
def test_an_empty_source_or_an_unknown_users_home_is_one_line(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, source: str, said: str
) -> None:
    """``""`` converted the working directory (Path("") is "."); ``~user`` of no such user was
    "unexpected RuntimeError"."""
    demo = Path(__file__).resolve().parents[2] / "rlds_cli" / "data" / "pointmass-demo-v0.hdf5"
    (tmp_path / "demo.hdf5").write_bytes(demo.read_bytes())  # what "" converted
    monkeypatch.chdir(tmp_path)
    result = invoke("download", source)
    assert said in error_line(result)
    assert_nothing_published(isolated_cache)


def test_unknown_dataset_id(isolated_cache: Path) -> None:
    result = invoke("download", "no-such-id")
    assert error_line(result) == "error: unknown dataset id 'no-such-id'"
    assert "rlds list --remote" in hint_line(result)
    assert_nothing_published(isolated_cache)


def test_inspect_unknown_name(isolated_cache: Path) -> None:
    result = invoke("inspect", "nothing-here")
    line = error_line(result)
    assert line == f"error: no dataset named 'nothing-here' in the cache at {isolated_cache}"
    assert "rlds list" in hint_line(result)


def test_unknown_format(golden_file: Path, isolated_cache: Path) -> None:
    result = invoke("download", golden_file, "--format", "parquet-xyz")
    assert "'parquet-xyz'" in error_line(result)
    assert "d4rl" in hint_line(result)
    assert_nothing_published(isolated_cache)


def test_invalid_backend(golden_file: Path, isolated_cache: Path) -> None:
    result = invoke("download", golden_file, "--storage", "tape")
    assert "'tape'" in error_line(result)
    assert "memmap" in hint_line(result) and "zarr" in hint_line(result)
    assert_nothing_published(isolated_cache)


@pytest.mark.parametrize("name", ["a b", "a--b", "/abs", "-dash", "x/../y"])
def test_invalid_name(golden_file: Path, isolated_cache: Path, name: str) -> None:
    result = invoke("download", golden_file, "--name", name)
    assert error_line(result) == f"error: invalid dataset name {name!r}"
    assert_nothing_published(isolated_cache)


@pytest.mark.parametrize("command", ["verify", "stats", "audit", "inspect"])
def test_a_url_or_a_path_where_a_name_goes_says_what_reads_it(command: str, tmp_path: Path) -> None:
    """The hint listed the characters of a name: a URL or a path given to a command of the
    cache's datasets got no word of 'rlds pull' or 'rlds download'."""
    if command != "inspect":  # inspect reads URLs where they lie
        result = invoke(command, "s3://bucket/data")
        assert error_line(result) == "error: invalid dataset name 's3://bucket/data'"
        assert "'rlds pull URL --name NAME' copies it in" in hint_line(result)
    result = invoke(command, str(tmp_path))
    assert "'rlds download PATH' converts a file into it" in hint_line(result)
    assert f"read as file://{tmp_path}" in hint_line(result)


def test_no_timeouts_no_next_needs_max_episode_steps(golden_file: Path, isolated_cache: Path) -> None:
    with h5py.File(golden_file, "a") as f:
        del f["timeouts"]
    result = invoke("download", golden_file, "--format", "d4rl", "--name", "nt")
    line = error_line(result)
    assert str(golden_file) in line and "'timeouts'" in line
    assert "--max-episode-steps" in hint_line(result)
    assert_nothing_published(isolated_cache)

    done = ok("download", golden_file, "--format", "d4rl", "--name", "nt", "--max-episode-steps", "3")
    # the time limit cuts rows 3-5 after row 5, exactly where the timeout was
    assert "nt: converted: 6 steps, 3 episodes" in done.stdout
    assert "warning: no 'timeouts' in the file" in done.stderr
    assert "warning: 1 episode boundaries were not flagged" in done.stderr
    info = ok_json("inspect", "nt")
    assert info["conversion"]["inferred_boundaries"] == 1
    assert info["source"]["options"] == {"max_episode_steps": 3}
    assert info["episode_return"] == pytest.approx(stats(golden_facts(False)["returns"]))
    # the same file with the same option is reused; with another option it is another dataset
    assert ok_json("download", golden_file, "--name", "nt", "--max-episode-steps", "3")["reused"] is True
    assert "--force" in hint_line(invoke("download", golden_file, "--name", "nt", "--max-episode-steps", "4"))


def test_hf_url_that_names_no_dataset_repo(isolated_cache: Path) -> None:
    """hf:// URLs name dataset repos (tests/sources/test_hub_download.py downloads them); another shape
    is one line saying which shape, before any request."""
    result = invoke("download", "hf://org/x")
    assert error_line(result) == (
        "error: cannot read 'hf://org/x': rlds fetches Hub dataset repos named "
        "hf://datasets/ORG/REPO[/PATH][@REVISION]"
    )
    assert "hf://datasets/lerobot/pusht" in hint_line(result)
    assert_nothing_published(isolated_cache)


@pytest.mark.parametrize("url", ["http://example.org/x.hdf5", "https://example.org/x.hdf5"])
def test_url_offline(url: str, isolated_cache: Path) -> None:
    """URLs are downloaded (tests/sources/test_download.py); offline, they fail before any request."""
    result = invoke("download", url, "--offline")
    assert error_line(result).startswith("error: x.hdf5 is not downloaded")
    assert "offline" in error_line(result)
    assert_nothing_published(isolated_cache)


def test_usage_errors_exit_2(golden_file: Path) -> None:
    assert invoke("download", golden_file, "--max-episode-steps", "0").exit_code == 2
    assert invoke("download").exit_code == 2
    assert invoke("no-such-command").exit_code == 2


def test_debug_lets_the_exception_through(tmp_path: Path) -> None:
    src = write_d4rl(tmp_path / "noact.hdf5", **_arrays(), omit=("actions",))
    result = invoke("download", src, "--format", "d4rl", env={"RLDS_DEBUG": "1"})
    assert isinstance(result.exception, errors.SourceFormatError)
    assert "'actions'" in str(result.exception)
    assert result.exit_code == 1
    assert "error:" not in result.stderr

    missing = invoke("inspect", "nope", env={"RLDS_DEBUG": "1"})
    assert isinstance(missing.exception, errors.DatasetNotFoundError)
    # RLDS_DEBUG=0 is off
    assert error_line(invoke("inspect", "nope", env={"RLDS_DEBUG": "0"}))


def test_unexpected_exception_is_one_line(monkeypatch: pytest.MonkeyPatch, golden_file: Path) -> None:
    import rlds_cli.sources.download

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(rlds_cli.sources.download, "download", boom)
    result = invoke("download", golden_file)
    assert error_line(result) == "error: unexpected RuntimeError: disk on fire"
    assert "RLDS_DEBUG=1" in hint_line(result)
    debug = invoke("download", golden_file, env={"RLDS_DEBUG": "1"})
    assert isinstance(debug.exception, RuntimeError)


def test_keyboard_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch, golden_file: Path) -> None:
    import rlds_cli.sources.download

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rlds_cli.sources.download, "download", interrupted)
    result = invoke("download", golden_file)
    assert result.exit_code == 130
    assert result.stderr.splitlines()[0] == "error: interrupted; nothing was published"


def test_an_interrupted_preprocess_says_how_to_keep_its_chunks(
    monkeypatch: pytest.MonkeyPatch, golden_file: Path
) -> None:
    import rlds_cli.preprocess

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    assert invoke("download", golden_file, "--name", "g").exit_code == 0
    monkeypatch.setattr(rlds_cli.preprocess, "run", interrupted)
    result = invoke("preprocess", "g", "--fn", "tests.preprocess_fns:identity", "--name", "out")
    assert result.exit_code == 130
    assert result.stderr.splitlines() == [
        "error: interrupted; nothing was published",
        "hint: run the same command with --resume to keep the chunks that finished",
    ]


def test_an_interrupted_push_does_not_say_nothing_was_published(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its commit may have reached the remote before the answer came back: the remote then holds
    the whole dataset, which 'nothing was published' denied."""
    import rlds_cli.remote.push

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rlds_cli.remote.push, "push", interrupted)
    result = invoke("push", "anything", "s3://bucket/x")
    assert result.exit_code == 130
    assert result.stderr.splitlines() == [
        "error: interrupted; the remote holds the earlier version or this one whole, never a part",
        "hint: run the same push again: it uploads only what is missing",
    ]


@pytest.mark.parametrize(
    ("command", "target", "said"),
    [
        (
            ["rm", "g", "--yes"],
            "rlds_cli.cache.manage.remove_datasets",
            "each dataset named is still there whole",
        ),
        (["verify", "g"], "rlds_cli.sources.verify.verify", "nothing was changed"),
        (
            ["stats", "g"],
            "rlds_cli.loader.normalization_table.NormalizationTable.from_datasets",
            "nothing was written",
        ),
    ],
)
def test_an_interrupted_command_says_what_it_changed(
    monkeypatch: pytest.MonkeyPatch, golden_file: Path, command: list[str], target: str, said: str
) -> None:
    """'nothing was published' is said by the commands that publish; an interrupted rm may have
    removed some of its datasets, one that only reads published nothing to begin with."""

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    assert invoke("download", golden_file, "--name", "g").exit_code == 0
    monkeypatch.setattr(target, interrupted)
    result = invoke(*command)
    assert result.exit_code == 130
    assert result.stderr.splitlines()[0].startswith(f"error: interrupted; {said}")


# --------------------------------------------------------------------------- app-level


def test_version() -> None:
    result = ok("--version")
    assert result.stdout == f"rlds-cli {__version__}\n"


def test_help_lists_commands() -> None:
    out = ok("--help").stdout
    commands = out.split("Commands:", 1)[1]
    for command in ("download", "list", "inspect", "demo"):
        assert f"  {command} " in commands
    for command in ("download", "list", "inspect", "demo"):
        assert "Usage: " in ok(command, "--help").stdout


def test_no_args_shows_help() -> None:
    result = invoke()
    assert "Commands:" in result.stdout + result.stderr


# --------------------------------------------------------------------------- demo


@pytest.mark.console_widths(80, 40)  # a pipe's width: nothing may break at it
def test_demo_runs_and_reuses(tmp_path: Path, isolated_cache: Path) -> None:
    root = tmp_path / "demo-root"
    first = ok("demo", "--root", root, "--batches", "2", "--batch-size", "8").stdout
    for stage in (
        "1. download + convert (bundled registry entry, no network)",
        "2. inspect",
        "3. sample through the loader (torch)",
    ):
        assert stage in first
    assert first.index("1. download") < first.index("2. inspect") < first.index("3. sample")
    path = root / "datasets" / "pointmass-demo-v0"
    assert f"converted pointmass-demo-v0 into {path}" in first
    assert "steps 5,000   episodes 94" in first
    assert "batch 0: action (8, 2), observation (8, 6), next/observation (8, 6), next/reward (8, 1)" in first
    assert "batch 1: " in first and "batch 2: " not in first
    batch_lines = [line for line in first.splitlines() if line.startswith("batch ")]
    assert len(batch_lines) == 2 and all(line.endswith(" episodes") for line in batch_lines)  # unwrapped
    assert f"demo done: cache at {root}\n" in first
    assert not (isolated_cache / "datasets").exists()  # --root was honoured
    manifest = (path / "manifest.json").read_bytes()

    second = ok("demo", "--root", root, "--batches", "1", "--batch-size", "4").stdout
    assert f"reused the cached copy of pointmass-demo-v0 into {path}" in second
    assert "batch 0: action (4, 2)" in second and "batch 1: " not in second
    assert (path / "manifest.json").read_bytes() == manifest
    # the loader is seeded: the same arguments give the same batches
    third = ok("demo", "--root", root, "--batches", "2", "--batch-size", "8").stdout
    assert third.split("3. sample")[1] == first.split("3. sample")[1]


def test_demo_rejects_zero_batches(tmp_path: Path) -> None:
    assert invoke("demo", "--root", tmp_path / "r", "--batches", "0").exit_code == 2


# --------------------------------------------------------------------------- tables and encodings


def _terminal(monkeypatch: pytest.MonkeyPatch, width: int) -> io.StringIO:
    """Make stdout a terminal of ``width`` columns; return what gets printed."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=width, highlight=False, color_system=None)
    monkeypatch.setattr(output, "console", console)
    return buffer


def _has_token(text: str, token: str) -> bool:
    """Whether ``token`` is printed whole (not cut, not folded over two lines)."""
    return re.search(rf"(^|[\s│|]){re.escape(token)}($|[\s│|])", text, re.M) is not None


@pytest.mark.parametrize("width", [40, 60, 200, None], ids=["w40", "w60", "w200", "piped"])
def test_tables_never_cut_an_identifier(
    golden_file: Path, monkeypatch: pytest.MonkeyPatch, width: int | None
) -> None:
    long_name = "a-rather-long-dataset-name/with-a-namespace-v0"
    ok("download", golden_file, "--name", long_name)
    ok("download", "demo")
    buffer = _terminal(monkeypatch, width) if width else None
    local = ok("list").stdout if buffer is None else (ok("list"), buffer.getvalue())[1]
    for name in (long_name, "pointmass-demo-v0"):
        assert _has_token(local, name), local
    if buffer is not None:
        buffer.truncate(0)
        buffer.seek(0)
    remote_result = ok("list", "--remote")
    remote = remote_result.stdout if buffer is None else buffer.getvalue()
    from rlds_cli.catalog import registry

    ids = [e.id for e in registry.entries()]
    missing = [i for i in ids if not _has_token(remote, i)]
    assert not missing, (len(missing), missing[:5])
    assert "…" not in local + remote and "?" not in remote.replace("'rlds info ID'", "")
    if buffer is None:  # piped: plain lines, no box drawing
        assert "│" not in remote and "┃" not in remote
        assert remote.splitlines()[1].split() == [
            "id",
            "format",
            "size",
            "steps",
            "local",
            "hub",
            "description",
        ]


def test_a_narrow_terminal_leaves_out_optional_columns_not_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = _terminal(monkeypatch, 60)
    ok("list", "--remote", "hopper-m")
    out = buffer.getvalue()
    assert "┃ id " in out  # a real table: the ids fit
    assert all(len(line) <= 60 for line in out.splitlines())
    hopper = [line for line in out.splitlines() if "hopper-medium" in line]
    assert len(hopper) == len({line.split("│")[1].strip() for line in hopper}) == 12  # all distinct
    assert "description left out: the terminal is 60 columns wide" in " ".join(out.split())


def test_ascii_output_encoding(tmp_path: Path) -> None:
    """``PYTHONIOENCODING=ascii``: every command prints ASCII stand-ins instead of crashing."""
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "RLDS_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    code = "import sys; from rlds_cli.cli.app import main; sys.argv[0] = 'rlds'; main()"
    for args in (
        ["demo", "--batches", "1", "--batch-size", "4"],
        ["list"],
        ["inspect", "demo"],
        ["list", "--remote", "door"],
    ):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, env=env)
        assert done.returncode == 0, (args, done.stderr.decode())
        assert done.stdout.isascii() and done.stderr.isascii(), args
        if args[0] in ("demo", "inspect"):
            assert b"#" in done.stdout  # the histogram bars, in ASCII
    assert output.glyph("block", Console(file=io.StringIO())) in ("█", "#")


def test_ascii_terminal_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")  # strict: a non-ASCII glyph would raise
    console = Console(file=stream, force_terminal=True, width=120, color_system=None)
    monkeypatch.setattr(output, "console", console)
    ok("download", "demo")
    ok("inspect", "demo")
    stream.flush()
    text = raw.getvalue().decode("ascii")
    assert "| observation " in text and "#" in text  # ASCII box lines, ASCII histogram bars


# --------------------------------------------------------------------------- list --remote


def test_remote_list_filters_and_describes() -> None:
    hopper = ok_json("list", "--remote", "hopper")
    assert hopper["pattern"] == "hopper"
    assert hopper["datasets"] and all(
        "hopper" in (r["id"] + " ".join(r["aliases"]) + r["description"]).lower() for r in hopper["datasets"]
    )
    assert "hopper-medium-v2" in [r["id"] for r in hopper["datasets"]]
    door = [r["id"] for r in ok_json("list", "--remote", "D4RL/door/*")["datasets"]]
    assert door == ["D4RL/door/cloned-v2", "D4RL/door/expert-v2", "D4RL/door/human-v2"]
    assert [r["id"] for r in ok_json("list", "--remote", "pointmass")["datasets"]] == ["pointmass-demo-v0"]
    out = ok("list", "--remote", "gym_mujoco_v2").stdout  # found by its description
    assert "hopper-medium-v2" in out and "D4RL, gym_mujoco_v2 suite" in out
    assert "no registry id, alias or description matches 'zzz'" in ok("list", "--remote", "zzz").stdout


def test_remote_list_sizes_steps_and_unknowns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {r["id"]: r for r in ok_json("list", "--remote")["datasets"]}
    cloned = rows["D4RL/door/cloned-v2"]  # published, rounded (Minari's table)
    assert (cloned["approx_num_steps"], cloned["approx_size_bytes"], cloned["num_episodes"]) == (
        1_000_000,
        1_077_700_000,
        4356,
    )
    assert cloned["size_bytes"] is None and "Minari" in cloned["published"]["source"]
    lines = {line.split()[0]: line.split() for line in ok("list", "--remote").stdout.splitlines()[2:-1]}
    assert lines["D4RL/door/cloned-v2"][2:5] == ["~1.0", "GiB", "~1M"]
    assert lines["hopper-medium-v2"][2:4] == ["-", "-"]  # nothing published: '-', never '?'

    # an entry without published counts shows '-' until converted, then the cache's exact count
    extra = tmp_path / "extra.toml"
    demo = Path(__file__).resolve().parents[2] / "registry" / "demo.toml"
    text = demo.read_text().replace('id = "pointmass-demo-v0"', 'id = "points-v9"')
    text = text.replace('aliases = ["demo", "rlds/pointmass-demo-v0"]', "aliases = []")
    extra.write_text(text.replace("source_rows = 5000\n", "").replace("num_episodes = 94\n", ""))
    monkeypatch.setenv("RLDS_REGISTRY", str(extra))
    from rlds_cli.catalog import registry

    registry._load.cache_clear()
    try:
        before = ok_json("list", "--remote", "points-v9")["datasets"][0]
        assert (before["num_steps"], before["cached"]) == (None, False)
        ok("download", "points-v9")
        after = ok_json("list", "--remote", "points-v9")["datasets"][0]
        assert (after["num_steps"], after["num_episodes"], after["num_steps_origin"]) == (5000, 94, "cache")
        listing = ok("list", "--remote", "points-v9").stdout.splitlines()
        row = next(line for line in listing if line.startswith("points-v9"))
        assert row.split()[4:6] == ["5,000", "converted"]
    finally:
        registry._load.cache_clear()


# --------------------------------------------------------------------------- names


def test_registry_aliases_work_in_every_command(tmp_path: Path, isolated_cache: Path) -> None:
    ok("download", "demo")
    assert ok_json("inspect", "demo", "--no-stats")["name"] == "pointmass-demo-v0"
    assert ok("path", "demo").stdout == f"{isolated_cache / 'datasets' / 'pointmass-demo-v0'}\n"
    assert ok_json("view", "demo", "--episodes", "0:2", "--name", "first2")["parent"] == "pointmass-demo-v0"
    split = ok_json("split", "demo", "--val", "0.1", "--name", "d")
    assert [r["name"] for r in split] == ["d-train", "d-val"]
    assert ok_json("export", "demo", tmp_path / "d.npz", "--to", "npz")["num_steps"] == 5000
    dry = ok_json("preprocess", "demo", "--fn", "tests.preprocess_fns:identity", "--dry-run")
    assert dry["steps"] == 5000
    assert ok("rm", "first2", "d-train", "d-val", "demo", "--yes", "-q").stdout.split() == [
        "first2",
        "d-train",
        "d-val",
        "pointmass-demo-v0",
    ]


def test_resolve_name(isolated_cache: Path, golden_file: Path) -> None:
    import rlds_cli
    from rlds_cli.catalog.registry import resolve_name

    assert rlds_cli.resolve_name is resolve_name
    with pytest.raises(errors.DatasetNotFoundError) as missing:
        resolve_name("demo")
    assert "registry id 'pointmass-demo-v0', not downloaded yet" in str(missing.value)
    assert missing.value.hint == "download and convert it first: rlds download demo"
    ok("download", "demo")
    assert resolve_name("demo") == resolve_name("rlds/pointmass-demo-v0") == "pointmass-demo-v0"
    from rlds_cli import Loader, open_dataset

    assert open_dataset("demo").name == "pointmass-demo-v0"  # the library follows the same rule
    assert len(Loader("demo", batch_size=10)) == open_dataset("demo").num_steps // 10
    ok("download", golden_file, "--name", "demo")  # a local name wins over the alias
    assert resolve_name("demo") == "demo"
    with pytest.raises(errors.DatasetNotFoundError) as typo:
        resolve_name("pointmass-demo-v1")
    assert "did you mean 'pointmass-demo-v0'" in typo.value.hint
    with pytest.raises(errors.DatasetNotFoundError, match="not downloaded yet"):
        resolve_name("DAPG(expert)/door_v2d-v1")  # not a valid cache name, but a registry id


# --------------------------------------------------------------------------- hints


def test_split_hints(golden_next_file: Path, isolated_cache: Path) -> None:
    ok("download", golden_next_file, "--name", "g")
    bad = invoke("split", "g", "--val", "1.5")
    assert bad.exit_code == 2 and "not between 0 and 1" in bad.stderr and "episode range" not in bad.stderr
    from rlds_cli.cache.derive import split_dataset

    with pytest.raises(errors.InvalidSelectionError) as fraction:
        split_dataset("g", 1.5)
    assert "fraction of episodes" in fraction.value.hint and "A:B" not in fraction.value.hint
    ok("view", "g", "--episodes", "0:1", "--name", "g-val")
    taken = invoke("split", "g", "--val", "0.4")
    assert "'g-val' already exists" in error_line(taken)
    assert "--name BASE" in hint_line(taken)
    assert not (isolated_cache / "datasets" / "g-train").exists()  # neither view was made
    assert [r["name"] for r in ok_json("split", "g", "--val", "0.4", "-n", "h")] == ["h-train", "h-val"]


def test_info_on_a_cached_dataset_is_not_a_path_hint(golden_file: Path) -> None:
    ok("download", golden_file, "--name", "hopper-norm")
    result = invoke("info", "hopper-norm")
    assert error_line(result) == "error: 'hopper-norm' is a dataset in the cache, not a registry id"
    assert "rlds inspect hopper-norm" in hint_line(result) and "local path" not in result.stderr
    ok("download", "demo", "--name", "mine")
    assert "registry id 'pointmass-demo-v0'" in hint_line(invoke("info", "mine"))
    typo = invoke("info", "hoper-medium-v2")
    assert error_line(typo) == "error: unknown dataset id 'hoper-medium-v2'"
    assert "did you mean 'hopper-medium-v2'" in hint_line(typo)


def test_hints_name_no_docs_file_a_wheel_lacks() -> None:
    """A wheel ships no docs/: default hints point at --help or commands instead."""
    found = [
        cls.__name__
        for cls in _all_subclasses(errors.RldsError)
        if "docs/" in cls.default_hint or ".md" in cls.default_hint
    ]
    assert not found, found
    assert "returns a mapping of TED keys" in " ".join(ok("preprocess", "--help").stdout.split())


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


# --------------------------------------------------------------------------- rm


@pytest.fixture
def family(golden_next_file: Path) -> Path:
    """``base`` and a view ``child`` of it."""
    ok("download", golden_next_file, "--name", "base")
    ok("view", "base", "--episodes", "0:1", "--name", "child")
    return golden_next_file


def test_rm_refuses_before_asking(family: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlds_cli.cli.manage._can_ask", lambda: True)
    result = invoke_input(["rm", "base"], "y\n")
    assert error_line(result) == "error: dataset 'base' is the parent of child"
    assert "remove base" not in result.output  # never asked
    declined = invoke_input(["rm", "child"], "n\n")
    assert declined.exit_code == 1
    assert "kept child: nothing was removed" in declined.stderr
    both = invoke_input(["rm", "base", "child"], "y\n")  # a parent with its children: no --force
    assert both.exit_code == 0, both.output
    removed = [line for line in both.stdout.splitlines() if "removed" in line]
    assert removed == ["removed child", "removed base"]
    assert ok_json("list")["datasets"] == []


def test_replacing_a_parent_names_the_children_it_leaves_unreadable(family: Path) -> None:
    """``download --force`` of a parent said nothing while its views stopped reading; the hint of
    ``rlds rm`` of a parent named a command that works. A preprocessed copy keeps reading: it was
    said to refuse too."""
    ok("preprocess", "base", "--fn", "tests.preprocess_fns:identity", "--name", "copy", "--workers", "1")
    result = invoke("download", str(family), "--name", "base", "--force", "--json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout stays one JSON document
    warning = " ".join(result.stderr.split())
    assert "1 dataset(s) made from the replaced 'base' now refuse to read: child;" in warning
    assert "1 dataset(s) were made from the old 'base' and still read as they were: copy;" in warning
    assert ok_json("inspect", "copy")["num_steps"] > 0
    refused = invoke("rm", "base", "--yes")
    assert "rlds rm base child copy --yes" in refused.stderr
    ok("rm", "base", "child", "copy", "--yes")  # the hint, run as written


def test_preprocess_force_over_a_parent_names_the_views_it_leaves_unreadable(family: Path) -> None:
    """``rlds preprocess child ... --name base --force`` replaced the view's own parent without a
    word (``download --force`` warns)."""
    result = invoke(
        "preprocess", "child", "--fn", "tests.preprocess_fns:identity", "--name", "base", "--force",
        "--workers", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 dataset(s) made from the replaced 'base' now refuse to read: child;" in " ".join(
        result.stderr.split()
    )


def test_rm_tells_about_the_raw_download_and_removes_it_with_raw(
    golden_file: Path, isolated_cache: Path
) -> None:
    from rlds_cli.sources.convert import convert

    raw = isolated_cache / "raw" / "g"
    raw.mkdir(parents=True)
    (raw / "g.hdf5").write_bytes(golden_file.read_bytes())
    convert(raw / "g.hdf5", "one", source_info={"raw_dir": str(raw)})
    convert(raw / "g.hdf5", "two", source_info={"raw_dir": str(raw)}, options={"block_rows": 2})
    kept = ok("rm", "one", "--yes")
    assert "the downloaded files" in kept.stderr and str(raw) in kept.stderr and "--raw" in kept.stderr
    ok("download", "demo")  # unrelated
    result = ok_json("rm", "two", "--yes", "--raw")
    assert result["removed"] == ["two"] and result["removed_raw"] == [str(raw)]
    assert not raw.exists()
    assert ok_json("list")["datasets"][0]["name"] == "pointmass-demo-v0"


def test_rm_raw_keeps_files_another_dataset_uses(golden_file: Path, isolated_cache: Path) -> None:
    from rlds_cli.sources.convert import convert

    raw = isolated_cache / "raw" / "g"
    raw.mkdir(parents=True)
    (raw / "g.hdf5").write_bytes(golden_file.read_bytes())
    convert(raw / "g.hdf5", "one", source_info={"raw_dir": str(raw)})
    convert(raw / "g.hdf5", "two", source_info={"raw_dir": str(raw)}, options={"block_rows": 2})
    result = ok_json("rm", "one", "--yes", "--raw")
    assert result["removed_raw"] == [] and result["kept_raw"] == [str(raw)]
    assert raw.is_dir()


def invoke_input(args: list[str], text: str) -> Result:
    return runner.invoke(app, args, input=text)


# --------------------------------------------------------------------------- names of new datasets, -f


def test_archive_default_name_strips_every_suffix(golden_file: Path, tmp_path: Path) -> None:
    archive = tmp_path / "x.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(golden_file, arcname="golden.hdf5")
    assert ok_json("download", archive)["name"] == "x"


def test_short_f_is_force(golden_file: Path) -> None:
    ok("download", golden_file, "--name", "g")
    assert ok_json("download", golden_file, "--name", "g", "-f")["reused"] is False
    bad = invoke("download", golden_file, "-f", "d4rl")  # not --format any more: 'd4rl' is an extra argument
    assert bad.exit_code == 2
