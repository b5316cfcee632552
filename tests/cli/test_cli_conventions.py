"""The conventions of docs/cli.md ("Conventions"), checked over every command of the app.

The app is introspected (typer -> click), so a command added later is held to the same rules:
``-h``; ``--json``, ``-q`` and ``-v`` everywhere; ``-f`` is ``--force``; a new dataset's name is
``--name/-n``; usage errors exit 2 as the docs say; old spellings are hidden but still work.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from rlds_cli.cli import output
from rlds_cli.cli.app import app
from tests.d4rl_fixtures import golden_three_episodes

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def commands() -> dict[str, Any]:
    """The app's commands, as the click commands typer builds (typer vendors its own click)."""
    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def options(command: Any) -> dict[str, Any]:
    """Every option spelling (long and short) of a command, to its option."""
    found: dict[str, Any] = {}
    for param in command.params:
        if param.param_type_name == "option":
            for spelling in (*param.opts, *param.secondary_opts):
                found[spelling] = param
    return found


@pytest.fixture
def restore_logging() -> Iterator[None]:
    logger = logging.getLogger("rlds_cli")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def test_the_app_has_the_commands_the_docs_list() -> None:
    assert len(commands()) >= 14
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in commands():
        assert f"## rlds {name}\n" in page, name


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_on_every_command(flag: str) -> None:
    root = runner.invoke(app, [flag])
    assert root.exit_code == 0 and "Usage: " in root.stdout, root.output
    for name in commands():
        result = runner.invoke(app, [name, flag])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage: " in result.stdout and "-h, --help" in result.stdout, name


def test_json_quiet_verbose_root_on_every_command() -> None:
    for name, command in commands().items():
        opts = options(command)
        for spelling in ("--json", "--quiet", "-q", "--verbose", "-v", "--root"):
            assert spelling in opts, f"rlds {name} has no {spelling}"
        assert opts["-q"] is opts["--quiet"] and opts["-v"] is opts["--verbose"], name


def test_short_options_mean_the_same_everywhere() -> None:
    meaning = {"-f": "--force", "-n": "--name", "-q": "--quiet", "-v": "--verbose", "-y": "--yes"}
    for name, command in commands().items():
        opts = options(command)
        for short, long in meaning.items():
            if short in opts:
                assert long in opts[short].opts, f"rlds {name}: {short} is not {long}"
        if "--force" in opts:
            assert "-f" in opts["--force"].opts, f"rlds {name}: --force has no -f"
        if "--format" in opts:
            assert opts["--format"].opts == ["--format"], f"rlds {name}: --format has a short form"
        if "--name" in opts and not opts["--name"].hidden:
            assert "-n" in opts["--name"].opts, f"rlds {name}: --name has no -n"


def test_commands_that_make_a_dataset_take_name_n() -> None:
    for name in ("download", "preprocess", "view", "split"):
        opts = options(commands()[name])
        assert opts["--name"].opts == ["--name", "-n"] and not opts["--name"].hidden, name


def test_storage_and_executor_are_spelled_once() -> None:
    cmds = commands()
    for name in ("download", "demo", "preprocess"):
        opts = options(cmds[name])
        assert not opts["--storage"].hidden, name
        assert "--backend" not in opts, name  # one word per meaning: no old spellings
        help_text = runner.invoke(app, [name, "-h"]).stdout
        assert "--storage" in help_text and "--backend" not in help_text, name
    assert "--executor" in runner.invoke(app, ["preprocess", "-h"]).stdout
    for name, old in (("preprocess", "--out"), ("split", "--train-name"), ("split", "--val-name")):
        assert old not in options(cmds[name]), (name, old)


def test_spellings_no_release_ever_had_are_usage_errors(tmp_path: Path) -> None:
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    result = runner.invoke(app, ["download", str(src), "--name", "g", "--backend", "zarr"])
    assert result.exit_code == 2 and "No such option" in result.stderr
    assert runner.invoke(app, ["download", str(src), "--name", "g", "-q"]).exit_code == 0
    result = runner.invoke(app, ["view", "g", "first", "--episodes", "0:1"])  # a positional NAME
    assert result.exit_code == 2, result.output


def test_verbose_works_after_the_command(restore_logging: None) -> None:
    result = runner.invoke(app, ["list", "-v"])
    assert result.exit_code == 0, result.output
    assert logging.getLogger("rlds_cli").level == logging.INFO
    result = runner.invoke(app, ["du", "-vv"])
    assert result.exit_code == 0, result.output
    assert logging.getLogger("rlds_cli").level == logging.DEBUG


def test_usage_errors_exit_2_everywhere_as_documented() -> None:
    for name in commands():
        result = runner.invoke(app, [name, "--no-such-option"])
        assert result.exit_code == 2, (name, result.output)
        assert "No such option" in result.stderr, name
    assert runner.invoke(app, ["no-such-command"]).exit_code == 2
    assert runner.invoke(app, ["split", "x", "--val", "1.5"]).exit_code == 2
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "`2` a usage error" in page
    assert "`1` an error" in page and "`130` interrupted" in page


def test_quiet_prints_only_names(tmp_path: Path) -> None:
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    assert runner.invoke(app, ["download", str(src), "-n", "g", "-q"]).stdout == "g\n"
    assert runner.invoke(app, ["download", "demo", "-q"]).stdout == "pointmass-demo-v0\n"
    assert runner.invoke(app, ["list", "-q"]).stdout == "g\npointmass-demo-v0\n"
    assert runner.invoke(app, ["list", "point*", "-q"]).stdout == "pointmass-demo-v0\n"
    assert runner.invoke(app, ["info", "demo", "-q"]).stdout == "pointmass-demo-v0\n"
    remote = runner.invoke(app, ["list", "--remote", "door/human", "-q"]).stdout.split()
    assert remote == ["D4RL/door/human-v2"]
    assert runner.invoke(app, ["view", "g", "-e", "0:1", "-n", "v", "-q"]).stdout == "v\n"
    assert runner.invoke(app, ["inspect", "g", "-q"]).stdout == ""
    assert runner.invoke(app, ["du", "-q"]).stdout == ""
    assert runner.invoke(app, ["rm", "v", "g", "--yes", "-q"]).stdout == "v\ng\n"


def test_json_is_one_document_on_every_reporting_command(tmp_path: Path) -> None:
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    for args in (
        ["download", str(src), "--name", "g"],
        ["list"],
        ["list", "--remote", "demo"],
        ["inspect", "g", "--no-stats"],
        ["info", "demo"],
        ["path", "g"],
        ["du"],
        ["gc"],
        ["view", "g", "--episodes", "0:1", "--name", "v"],
        ["split", "g", "--val", "0.4"],
        ["export", "g", str(tmp_path / "g.npz"), "--to", "npz"],
        ["rm", "v", "--yes"],
    ):
        result = runner.invoke(app, [*args, "--json"])
        assert result.exit_code == 0, (args, result.output)
        json.loads(result.stdout)


def test_gc_shows_sizes(isolated_cache: Path) -> None:
    stale = isolated_cache / "tmp" / "ghost.0123456789ab.incomplete"
    stale.mkdir(parents=True)
    (stale / "column.npy").write_bytes(b"\0" * 40_000)
    size = (stale / "column.npy").stat().st_blocks * 512
    dry = json.loads(runner.invoke(app, ["gc", "--dry-run", "--json"]).stdout)
    assert dry["removed"] == [str(stale)]
    assert dry["removed_bytes"] == {str(stale): size} and dry["total_bytes"] == size
    assert dry["kept_jobs"] == []
    human = runner.invoke(app, ["gc"]).stdout
    assert f"removed {stale} ({output.human_bytes(size)})" in human
    assert f"freed {output.human_bytes(size)} in 1 path(s)" in human
    assert not stale.exists()


def test_du_counts_allocated_blocks_of_sparse_files(isolated_cache: Path) -> None:
    folder = isolated_cache / "raw" / "sparse"
    folder.mkdir(parents=True)
    with open(folder / "big.bin", "wb") as fh:
        fh.truncate(64 << 20)  # 64 MiB long, nothing written
    if (folder / "big.bin").stat().st_blocks * 512 >= 64 << 20:
        pytest.skip("this filesystem does not make sparse files")
    usage = json.loads(runner.invoke(app, ["du", "--json"]).stdout)
    assert usage["raw_bytes"] < 1 << 20  # the apparent size would be 64 MiB


def test_plot_says_where_it_wrote(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    assert runner.invoke(app, ["download", str(src), "--name", "g"]).exit_code == 0
    png = tmp_path / "fig" / "g.png"
    result = runner.invoke(app, ["inspect", "g", "--no-stats", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert f"plot written to {png}" in result.stdout
    assert png.is_file()


def test_progress_and_log_lines_carry_no_source_location(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    """Rich's ``Progress.log`` appends the caller's ``file.py:line``; log records and warnings
    printed by the CLI must not show where in rlds they came from."""
    buffer = io.StringIO()
    monkeypatch.setattr(
        output, "err_console", Console(file=buffer, force_terminal=True, width=200, color_system=None)
    )
    with output.conversion_progress(enabled=True) as progress:
        progress("hash", 2048)
    output.configure_logging(0)
    logging.getLogger("rlds_cli.net.http").warning("GET http://x/f: refused; retry 1/5 in 0.5 s")
    logging.getLogger("rlds_cli.net.http").info("not shown without -v")
    output.format_warning(UserWarning("a library warning"), UserWarning, "/x/lib.py", 12)
    text = buffer.getvalue()
    assert "hashed source (2.0 KiB)" in text
    assert "warning: GET http://x/f: refused; retry 1/5 in 0.5 s" in text
    assert "warning: a library warning" in text
    assert "not shown" not in text
    assert not re.search(r"\w+\.py:\d+", text), text


def test_a_missing_torch_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # 'import torch' raises ModuleNotFoundError
        "from rlds_cli.cli.app import main; sys.argv = ['rlds', 'demo', '--batches', '1']; main()"
    )
    env = {**os.environ, "RLDS_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-2] == "error: the rlds loader needs torch, which is not installed", done.stderr
    assert lines[-1].startswith("hint: install PyTorch first: pip install torch"), done.stderr
    assert "unexpected" not in done.stderr and "Traceback" not in done.stderr


_BLAS_PROBE = """
import os, sys
from rlds_cli.cli.app import main
sys.argv = ['rlds', *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
import numpy  # imported by the command: OpenBLAS sized its pool then
print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("2", "2")])
def test_commands_start_numpy_with_one_blas_thread_unless_the_user_sized_it(
    tmp_path: Path, given: str | None, expected: str
) -> None:
    source = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "RLDS_HOME")}
    env |= {"RLDS_HOME": str(tmp_path / "home"), **({"OPENBLAS_NUM_THREADS": given} if given else {})}
    cmd = [sys.executable, "-c", _BLAS_PROBE, "download", str(source), "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    value, threads = done.stdout.split()[-2:]
    assert value == expected
    if given is None:  # no OpenBLAS thread beside the command's own (its pools have ended)
        assert int(threads) == 1, threads


def test_preprocess_gives_the_users_function_blas_threads(tmp_path: Path) -> None:
    """The user's function (run in the command's process with --workers 1) sees the environment as
    the user left it: rlds's one-thread OpenBLAS is for its own commands."""
    source = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    seen = tmp_path / "seen.txt"
    fn = tmp_path / "probe_fn.py"
    fn.write_text(
        "import os\n"
        "def probe(batch):\n"
        f"    open({str(seen)!r}, 'a').write(repr(os.environ.get('OPENBLAS_NUM_THREADS')))\n"
        "    return batch\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "RLDS_HOME")}
    env["RLDS_HOME"] = str(tmp_path / "home")
    for args in (
        ["download", str(source), "-q"],
        ["preprocess", "g", "--fn", f"{fn}:probe", "-n", "p", "-w", "1"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "rlds_cli.cli.app", *args], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
    assert seen.read_text() and set(seen.read_text().split("None")) == {""}, seen.read_text()


def test_counting_progress_notes_and_bar_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's one counted progress bar: notes print on a terminal, nothing at all elsewhere."""
    for terminal in (True, False):
        buffer = io.StringIO()
        console = Console(file=buffer, force_terminal=terminal, width=200, color_system=None)
        monkeypatch.setattr(output, "err_console", console)
        notes = {"resume": lambda done: f"resuming: {done:,} done"}
        with output.counting_progress(True, "copying", notes=notes) as progress:
            progress("advance", 1)  # before "start": nothing to advance
            progress("start", 10_000)
            progress("resume", 4_000)
            progress("advance", 3_000)
        text = buffer.getvalue()
        assert ("resuming: 4,000 done" in text) is terminal, text
        assert ("copying" in text) is terminal, text


def test_a_cache_root_under_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    root = tmp_path / "afile" / "sub"
    for args in (["download", str(golden_three_episodes(tmp_path / "g.hdf5", with_next=False))], ["list"]):
        result = runner.invoke(app, [*args, "--root", str(root)])
        assert result.exit_code == 1, result.output
        line = result.stderr.splitlines()[0]
        assert line == f"error: the cache root {root} lies under {tmp_path / 'afile'}, which is a file", line


@pytest.mark.parametrize("folder", ["datasets", "tmp", "locks", "raw"])
def test_a_cache_root_whose_own_folder_is_a_file_is_one_line(tmp_path: Path, folder: str) -> None:
    """``demo`` failed with "unexpected FileExistsError"; ``list``, ``du`` and ``gc`` said the
    cache was empty."""
    (tmp_path / folder).write_text("")
    for args in (["demo"], ["list"], ["du"], ["gc"]):
        result = runner.invoke(app, [*args, "--root", str(tmp_path)])
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.splitlines() == [
            f"error: the cache root {tmp_path} is damaged: its {folder} folder is a file",
            f"hint: move {tmp_path / folder} away (rlds makes the folder again)",
        ], args


def test_a_cache_root_of_a_user_without_a_home_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``~nosuchuser/x`` was "unexpected RuntimeError: Could not determine home directory."."""
    for via_env in (True, False):
        if via_env:
            monkeypatch.setenv("RLDS_HOME", "~rlds-no-such-user/x")
        result = runner.invoke(app, ["list"] if via_env else ["list", "--root", "~rlds-no-such-user/x"])
        assert result.exit_code == 1, result.output
        given = "RLDS_HOME" if via_env else "--root"
        assert result.stderr.splitlines()[0] == (
            f"error: {given} is '~rlds-no-such-user/x', whose home folder (~rlds-no-such-user) is unknown "
            "on this machine"
        )


@pytest.mark.parametrize(
    "args", [["merge", "a", "b"], ["drop", "a", "-e", "0"], ["trim", "a"], ["downsample", "a", "-k", "2"]]
)
def test_a_required_name_says_so_in_the_help(args: list[str]) -> None:
    """These commands refused a missing --name, but their help did not mark it required."""
    help_text = " ".join(runner.invoke(app, [args[0], "--help"]).stdout.split())
    assert "-n, --name <str> Name of the new dataset in the cache. [required]" in help_text
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "Missing option '--name' / '-n'" in result.stderr, result.output


def test_a_demo_batch_too_large_for_memory_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--batch-size", "99999999999", "--root", str(tmp_path / "h")])
    assert result.exit_code == 2, result.output
    assert "Error: Invalid value for --batch-size: batch_size=99999999999" in result.stderr
    assert "unexpected" not in result.output and "lower batch_size" in " ".join(result.output.split())


def test_score_refuses_a_return_that_is_not_finite() -> None:
    for value in ("nan", "inf"):
        result = runner.invoke(app, ["score", "hopper-medium-v2", value])
        assert result.exit_code == 2, result.output
        assert f"{float(value)} is not a finite return" in result.stderr, result.stderr


def test_a_reader_that_closes_the_pipe_early_ends_the_output_not_the_command(tmp_path: Path) -> None:
    """``rlds inspect NAME | head -1`` exited 1 without a word (rich's broken-pipe rule): a
    ``set -o pipefail`` script reading a first line stopped there."""
    source = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    env = {k: v for k, v in os.environ.items() if k != "RLDS_HOME"} | {"RLDS_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-c", "from rlds_cli.cli.app import main; main()"]
    made = subprocess.run([*cli, "download", str(source), "--name", "g", "-q"], env=env, cwd=ROOT)
    assert made.returncode == 0
    for args in (["inspect", "g"], ["inspect", "g", "--json"], ["path", "g"], ["list"]):
        child = subprocess.Popen(
            [*cli, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT
        )
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # the reader is gone before the command writes a line
        err = child.stderr.read()
        assert child.wait() == 0, (args, err)
        assert err == b"", (args, err)
