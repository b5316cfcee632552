"""A reader of another package runs the reader contract shipped in the package
(:mod:`rlds_cli.testing.contracts`), the way its own test suite would: the plugin installed as
``pip install`` leaves it (:mod:`tests.plugin_fixtures`: its entry point in the
``rlds_cli.readers`` group), its test file subclassing ``ReaderContract``, pytest run on that file
in a fresh interpreter outside rlds's ``tests/`` (no conftest of ours, no ``tests`` package on
the path). A sound reader passes every test; a reader with a bug fails the test of that promise,
so the shipped suite can fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlds_cli.testing.contracts import ReaderContract
from tests.plugin_fixtures import PLUGIN, install_tiny_plugin

REPO = Path(__file__).resolve().parents[2]

#: The plug-in's own test file, as its authors would write it.
PLUGIN_TESTS = """
from pathlib import Path

from rlds_cli.testing.contracts import ReaderContract
from rlds_tiny.reader import TinyReader


class TestTinyReader(ReaderContract):
    reader_cls = TinyReader

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        (tmp_path / "run.tiny").write_text("1\\n2\\n3\\n\\n10\\n20\\n")
        return tmp_path / "run.tiny"
"""

#: A bug a reader can have: the blocks leave out each episode's final observation.
FINAL_OBSERVATION_LEFT_OUT = ('observations={"observation": obs}', 'observations={"observation": obs[:-1]}')


#: pytest plugins of this environment the plug-in's run does without (no cache folder written).
PLUGINS_OFF = ("-p", "no:cacheprovider", "-p", "no:xdist")


def run_plugin_tests(tmp_path: Path, reader_source: str) -> subprocess.CompletedProcess[str]:
    """pytest on the plug-in's test file, in ``tmp_path/project``, the plug-in on the path."""
    site = install_tiny_plugin(tmp_path / "site", reader_source)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_tiny.py").write_text(PLUGIN_TESTS)
    # rlds_cli from this checkout (the package's own folder only: not the repository's tests/)
    shim = tmp_path / "rlds-only"
    shim.mkdir()
    (shim / "rlds_cli").symlink_to(REPO / "rlds_cli", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLDS_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(shim)])
    env["RLDS_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", *PLUGINS_OFF, "test_tiny.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


#: The tests of the shipped reader suite: every one must run for a plug-in (none skipped).
CONTRACT_TESTS = sum(name.startswith("test_") for name in dir(ReaderContract))


def test_a_third_party_reader_passes_the_shipped_suite(tmp_path: Path) -> None:
    proc = run_plugin_tests(tmp_path, PLUGIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # every test of the contract ran (none skipped or deselected): it is registered, sniffs its
    # own file, refuses others, and its blocks are consistent
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{CONTRACT_TESTS} passed in "), proc.stdout


def test_the_shipped_suite_fails_a_broken_reader(tmp_path: Path) -> None:
    old, new = FINAL_OBSERVATION_LEFT_OUT
    assert old in PLUGIN
    proc = run_plugin_tests(tmp_path, PLUGIN.replace(old, new))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # the promise the broken reader breaks fails (a window of episodes reads the same broken
    # blocks, so that test may fail too)
    summary = proc.stdout.strip().splitlines()[-1]
    assert " failed, " in summary and "skipped" not in summary, proc.stdout
    failed = "FAILED test_tiny.py::TestTinyReader::test_blocks_are_step_blocks_of_consistent_lengths"
    assert failed in proc.stdout, proc.stdout
