"""Import hygiene: ``import rlds_cli`` and ``rlds --help`` stay light (no torch, zarr, h5py or pytest),
and the lazy public names resolve. The ``sys.modules`` checks run in fresh interpreters."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlds_cli

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "zarr", "h5py", "pytest")  # pytest: only rlds_cli.testing imports it


def run_python(code: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["RLDS_HOME"] = str(tmp_path / "rlds-home")
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def loaded_heavy(code: str, tmp_path: Path) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter; each ``mark(label)`` in it records which heavy
    modules are loaded at that point. Returns label -> loaded heavy modules."""
    prologue = (
        f"import json, sys\nHEAVY = {HEAVY!r}\nreport = {{}}\n"
        "def mark(label):\n    report[label] = sorted(m for m in HEAVY if m in sys.modules)\n"
    )
    epilogue = "\nprint('REPORT ' + json.dumps(report))\n"
    proc = run_python(prologue + textwrap.dedent(code) + epilogue, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def test_import_package_and_cli_is_light(tmp_path: Path) -> None:
    report = loaded_heavy(
        """
        mark("start")
        import rlds_cli
        mark("rlds_cli")
        import rlds_cli.cli.app
        assert rlds_cli.cli.app.app is not None
        mark("cli.app")
        """,
        tmp_path,
    )
    assert report == {"start": [], "rlds_cli": [], "cli.app": []}


def test_help_does_not_import_torch(tmp_path: Path) -> None:
    report = loaded_heavy(
        """
        from rlds_cli.cli.app import app
        for argv in (["--help"], ["download", "--help"], ["list", "--help"], ["inspect", "--help"],
                     ["demo", "--help"], ["--version"]):
            try:
                app(argv)
            except SystemExit as exc:
                assert exc.code in (0, None), (argv, exc.code)
            else:
                raise AssertionError(f"{argv} did not exit")
            mark(" ".join(argv))
        """,
        tmp_path,
    )
    assert report, report
    for label, heavy in report.items():
        assert heavy == [], (label, heavy)


def test_list_on_empty_cache_does_not_import_torch(tmp_path: Path) -> None:
    report = loaded_heavy(
        """
        from rlds_cli.cli.app import app
        try:
            app(["list", "--json"])
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        mark("list")
        """,
        tmp_path,
    )
    assert "torch" not in report["list"]


def test_python_m_help(tmp_path: Path) -> None:
    proc = run_python("", "-m", "rlds_cli.cli.app", "--help", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for command in ("download", "list", "inspect", "demo"):
        assert command in proc.stdout
    version = run_python("", "-m", "rlds_cli.cli.app", "--version", tmp_path=tmp_path)
    assert version.stdout == f"rlds-cli {rlds_cli.__version__}\n"


def test_lazy_attributes_load_only_what_they_need(tmp_path: Path) -> None:
    report = loaded_heavy(
        """
        import rlds_cli
        from rlds_cli.loader import opening
        from rlds_cli.cache import dataset
        assert rlds_cli.open_dataset is opening.open_dataset
        assert rlds_cli.Dataset is dataset.Dataset
        mark("open_dataset")
        from rlds_cli.cache import root, ted
        assert rlds_cli.CacheRoot is root.CacheRoot
        assert rlds_cli.TedBatch is ted.TedBatch
        from rlds_cli.sources.convert import convert
        assert callable(convert)
        mark("convert")
        import rlds_cli.loader as loader
        mark("loader module")
        assert rlds_cli.Loader is loader.Loader
        assert rlds_cli.UniformSampler is loader.UniformSampler
        mark("Loader")
        """,
        tmp_path,
    )
    assert "torch" not in report["open_dataset"]
    assert "torch" not in report["convert"]
    assert "torch" in report["Loader"]


@pytest.mark.slow
def test_public_names_are_not_shadowed_by_submodules(tmp_path: Path) -> None:
    """Every name in ``rlds_cli.__all__`` is the same object before and after the package's
    submodules are imported (a submodule of the same name would replace a lazy attribute)."""
    submodules = (
        "rlds_cli.cli.app, rlds_cli.sources.convert, rlds_cli.sources.download, rlds_cli.loader, "
        "rlds_cli.inspection.summary"
    )
    for code in (
        # names first, then submodules
        f"""
        import types
        import rlds_cli
        before = {{name: getattr(rlds_cli, name) for name in rlds_cli.__all__}}
        import {submodules}
        for name, value in before.items():
            assert not isinstance(value, types.ModuleType), name
            assert getattr(rlds_cli, name) is value, name
        print("OK")
        """,
        # submodules first (as in the CLI), then names
        f"""
        import types
        import rlds_cli
        import {submodules}
        for name in rlds_cli.__all__:
            assert not isinstance(getattr(rlds_cli, name), types.ModuleType), name
        print("OK")
        """,
    ):
        proc = run_python(code, tmp_path=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "OK\n"


def test_lazy_attributes_in_process() -> None:
    from rlds_cli.loader import Loader
    from rlds_cli.loader.opening import open_dataset

    assert rlds_cli.open_dataset is open_dataset
    assert rlds_cli.Loader is Loader
    assert set(rlds_cli.__all__) >= {"open_dataset", "Loader", "Dataset", "CacheRoot", "__version__"}
    assert set(dir(rlds_cli)) == set(rlds_cli.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        _ = rlds_cli.no_such_thing
    assert not hasattr(rlds_cli, "also_missing")
    with pytest.raises(ImportError):
        from rlds_cli import not_here  # noqa: F401


@pytest.mark.parametrize("package", ["rlds_cli", "rlds_cli.cache", "rlds_cli.loader"])
def test_every_lazy_public_name_resolves(package: str) -> None:
    """A lazy package lists exactly the names it can import, and each one imports."""
    module = importlib.import_module(package)
    assert set(module.__all__) - {"__version__"} == set(module._LAZY)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = module.missing


def test_version_is_consistent() -> None:
    from rlds_cli._version import __version__

    assert rlds_cli.__version__ == __version__
    parts = __version__.split(".")
    assert len(parts) >= 3 and all(p.isdigit() for p in parts[:2])


def _modules_loaded(code: str, modules: tuple[str, ...], tmp_path: Path) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    proc = run_python(
        f"{code}\nimport sys\nprint(sorted(m for m in {modules!r} if m in sys.modules))", tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_spawned_preprocess_workers_import_little(tmp_path: Path) -> None:
    """A worker imports the pool module and the cache's read path, not the coordinator's
    modules, the CLI, locking, zarr or torch."""
    heavy = (
        "rlds_cli.preprocess.job", "rlds_cli.preprocess.output", "rlds_cli.cli", "filelock",
        "typer", "rich", "zarr", "torch", "h5py", "concurrent.futures",
    )  # fmt: skip
    assert _modules_loaded("import rlds_cli.preprocess.pool", heavy, tmp_path) == []


@pytest.mark.slow
def test_numba_is_imported_only_by_a_sum_tree(tmp_path: Path) -> None:
    """The compiled kernels' numba (~0.3 s to import) loads only when a prioritized sampler is made."""
    pytest.importorskip("numba")
    assert _modules_loaded("import rlds_cli.loader", ("numba",), tmp_path) == []
    assert _modules_loaded("from rlds_cli.loader import SumTree\nSumTree(10)", ("numba",), tmp_path) == [
        "numba"
    ]


def test_the_numpy_samplers_import_without_torch(tmp_path: Path) -> None:
    """The samplers only draw indices: importing them (which runs ``rlds_cli/loader/__init__``)
    loads neither torch nor the package's torch-using modules."""
    code = "import rlds_cli.loader.samplers, rlds_cli.loader.epoch"
    assert _modules_loaded(code, ("torch", "rlds_cli.loader.loader"), tmp_path) == []
    # the package's names from its torch-free modules skip the torch check too
    code = "from rlds_cli.loader import UniformSampler, EpochSampler, FrameStack, compute_stats"
    assert _modules_loaded(code, ("torch",), tmp_path) == []


def test_the_package_is_marked_typed() -> None:
    """PEP 561: ``py.typed`` ships (the wheel packs every file under rlds_cli/), so type checkers
    of code that uses rlds_cli read its annotations."""
    assert (Path(rlds_cli.__file__).parent / "py.typed").is_file()


def test_fsspec_is_imported_only_by_a_transfer(tmp_path: Path) -> None:
    """``rlds --help``, ``rlds push -h``/``pull -h`` and the remote modules themselves never
    import fsspec (or s3fs): only a push or pull that runs does."""
    remote = ("fsspec", "s3fs", "aiobotocore", "botocore")
    code = """
        from rlds_cli.cli.app import app
        for argv in (["--help"], ["push", "--help"], ["pull", "-h"]):
            try:
                app(argv)
            except SystemExit as exc:
                assert exc.code in (0, None), (argv, exc.code)
        import rlds_cli.remote.push, rlds_cli.remote.pull, rlds_cli.remote.store
        """
    assert _modules_loaded(textwrap.dedent(code), remote, tmp_path) == []
    pytest.importorskip("fsspec")
    pull = "from rlds_cli.remote.store import open_url\nopen_url('memory://x/y')"
    assert _modules_loaded(pull, ("fsspec",), tmp_path) == ["fsspec"]
