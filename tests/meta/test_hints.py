"""Hints that fit the case (issue 17, items 11 and 13): who gave a mismatching sha256, what a
missing optional module is and how to install it, a folder of several D4RL files, default names
of archives, no hint that points at a docs/ file a wheel does not ship, and log lines without
source locations."""

from __future__ import annotations

import ast
import errno
import hashlib
import os
import re
import socket
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from rlds_cli import errors
from rlds_cli.catalog import registry
from rlds_cli.cli.app import app
from rlds_cli.sources.download import default_name
from tests.d4rl_fixtures import golden_three_episodes
from tests.http_faults import Fault, FaultServer, serving

ROOT = Path(__file__).resolve().parents[2]
DEMO = registry.resolve("demo").files[0].bundled_path().read_bytes()
DEMO_SHA = hashlib.sha256(DEMO).hexdigest()
OTHER = DEMO[:1000] + bytes([DEMO[1000] ^ 0xFF]) + DEMO[1001:]  # same size, other bytes
WRONG_SHA = "0" * 64
ONE_AT_A_TIME = "the d4rl format reads one file at a time"


# wide consoles: a message is one line whatever its length, so line counts mean something
pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(400, 400)]


def invoke(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def failure(result: Result) -> tuple[str, str]:
    """The ``error:`` and ``hint:`` lines of a clean failure (exit 1, two lines, no traceback)."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    return lines[0], lines[1]


def registry_toml(base: str) -> str:
    return f"""
[[dataset]]
id = "hint-corrupt-v0"
format = "d4rl"
max_episode_steps = 100

[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{base}/a/other.hdf5"]
sha256 = "{DEMO_SHA}"

[[dataset]]
id = "hint-pinned-v0"
format = "d4rl"
max_episode_steps = 100

[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{base}/a/changing.hdf5", "{base}/b/changing.hdf5"]
"""


@pytest.fixture
def server(server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    # conftest's server with these files, and the downloader pointed at it by a registry
    files = {"/a/demo.hdf5": DEMO, "/a/other.hdf5": OTHER, "/a/changing.hdf5": DEMO, "/b/changing.hdf5": DEMO}
    with serving(server, files, monkeypatch, registry=registry_toml, where=tmp_path):
        yield server


# --------------------------------------------------------------------------- 1: whose sha256


def test_a_wrong_sha256_given_for_a_url_blames_that_value(server: FaultServer) -> None:
    result = invoke("download", server.url("/a/demo.hdf5"), "--sha256", WRONG_SHA, "--max-episode-steps", 100)
    error, hint = failure(result)
    assert f"expected {WRONG_SHA} (given with --sha256)" in error
    assert "sha256 you gave" in hint and "--sha256" in hint and "registry" not in hint


def test_a_wrong_sha256_given_for_a_local_file_blames_that_value(tmp_path: Path) -> None:
    golden = golden_three_episodes(tmp_path / "golden.hdf5", with_next=False)
    error, hint = failure(invoke("download", golden, "--sha256", WRONG_SHA))
    assert f"expected {WRONG_SHA} (given with --sha256)" in error and str(golden) in error
    assert "sha256 you gave" in hint and "--sha256" in hint and "registry" not in hint


def test_a_registry_hash_mismatch_keeps_the_registry_wording(server: FaultServer) -> None:
    error, hint = failure(invoke("download", "hint-corrupt-v0"))
    assert f"expected {DEMO_SHA} (from the registry)" in error
    assert "registry" in hint and "--sha256" not in hint


def test_a_pinned_hash_mismatch_says_how_to_pin_again(
    server: FaultServer, isolated_cache: Path, tmp_path: Path
) -> None:
    assert invoke("download", "hint-pinned-v0").exit_code == 0  # first download: its hash is pinned
    new = golden_three_episodes(tmp_path / "new.hdf5", with_next=False).read_bytes()
    new += bytes(len(DEMO) - len(new))  # the same size (HDF5 ignores bytes past its end): the hash decides
    server.files["/a/changing.hdf5"] = new  # upstream regenerated the file, on both mirrors
    server.files["/b/changing.hdf5"] = new
    error, hint = failure(invoke("download", "hint-pinned-v0", "--force"))
    assert "every mirror of pointmass.hdf5 failed verification" in error
    assert "(recorded at the first download)" in error
    hashes = isolated_cache / "raw" / "hint-pinned-v0" / ".rlds" / "hashes.json"
    assert "pinned at its first download" in hint and f"delete {hashes}" in hint
    assert "registry" not in hint and "--sha256" not in hint
    hashes.unlink()  # what the hint says: the next download pins the new version
    again = invoke("download", "hint-pinned-v0", "--force")
    assert again.exit_code == 0, again.stderr


def test_a_damaged_hdf5_header_is_a_source_error_not_unexpected(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.hdf5"
    damaged.write_bytes(OTHER)  # one byte of a dataset header flipped: h5py raises RuntimeError
    error, hint = failure(invoke("download", damaged, "--max-episode-steps", 100))
    assert error.startswith(f"error: {damaged}: reading 'observations' failed (file truncated or corrupt?)")
    assert "unexpected" not in error and "re-download" in hint


# --------------------------------------------------------------------------- 3: no docs/ in hints


def _runtime_strings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string literal of a module that can reach a user (docstrings and comments left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


#: The module whose strings name .md files on purpose: the one that writes a pushed dataset's card,
#: README.md.
_WRITES_DOCS = {"rlds_cli/remote/hub_push.py"}


def test_no_message_or_hint_points_at_a_docs_file() -> None:
    """A wheel ships no docs/: a hint says what to do itself, or names a command (``--help``)."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
        for path in sorted((ROOT / "rlds_cli").rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in _WRITES_DOCS
        for line, text in _runtime_strings(path)
        if re.search(r"docs/|\b[\w-]+\.md\b", text)
    ]
    assert not found, found


def test_a_folder_without_files_of_the_format_says_what_they_look_like(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "notes.txt").write_text("not a dataset")
    error, hint = failure(invoke("download", tmp_path / "src", "--format", "ogbench"))
    assert error == f"error: {tmp_path / 'src'} holds no ogbench source files"
    assert "the ogbench format reads .npz files with observations, actions and terminals" in hint
    assert "--format" in hint


# --------------------------------------------------------------------------- 4: missing extras


def _run_cli(code: str, tmp_path: Path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RLDS_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "400"}
    env.pop("RLDS_DEBUG", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)


def test_a_missing_torch_is_one_line_saying_what_to_install(tmp_path: Path) -> None:
    done = _run_cli(
        "import sys; sys.modules['torch'] = None\n"  # 'import torch' raises ModuleNotFoundError
        "from rlds_cli.cli.app import main; sys.argv = ['rlds', 'demo', '-q']; main()",
        tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: the rlds loader needs torch, which is not installed",
        "hint: install PyTorch first: pip install torch (any 2.x from 2.3 on), then run the command again",
    ]


def test_a_broken_torch_install_is_one_line_not_unexpected(tmp_path: Path) -> None:
    """A torch that is there but fails to import (a CUDA library missing) raises a plain
    ImportError, not ModuleNotFoundError: still no 'unexpected ImportError'."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    broken = "libcudart.so.12: cannot open shared object file"
    (fake / "__init__.py").write_text(f"raise ImportError({broken!r})\n")
    done = _run_cli(
        "import sys; from rlds_cli.cli.app import main; sys.argv = ['rlds', 'demo', '-q']; main()",
        tmp_path,
        pythonpath=str(tmp_path / "site"),
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"error: torch is installed but cannot be imported: {broken}"
    assert len(lines) == 2 and "pip install --force-reinstall torch" in lines[1], lines


def test_the_library_loader_says_torch_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "rlds_cli.loader" or m.startswith("rlds_cli.loader.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)
    import rlds_cli.loader.samplers  # noqa: F401  (numpy only: no torch needed)

    with pytest.raises(errors.MissingExtraError, match="the rlds loader needs torch") as info:
        from rlds_cli.loader import Loader  # noqa: F401
    assert isinstance(info.value, ImportError) and "pip install torch" in info.value.hint


def test_ray_missing_names_the_executor_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlds_cli.preprocess.executors import run_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(errors.PreprocessError) as info:
        run_ray({}, [], lambda _: None, None, None)
    assert str(info.value) == "--executor ray needs Ray, which is not installed"  # not --backend
    assert info.value.hint == "pip install 'rlds-cli[ray]'"


@pytest.mark.parametrize(
    ("missing", "call", "message", "hint"),
    [
        (
            "tensordict",
            lambda: __import__("rlds_cli.loader.tensors", fromlist=["x"])._tensordict_class(),
            "as_tensordict=True needs tensordict, which is not installed",
            "rlds-cli[torchrl]",
        ),
        (
            "av",
            lambda: __import__("rlds_cli.export.lerobot_common", fromlist=["x"]).import_writers(),
            "exporting to LeRobot needs av, which is not installed",
            "rlds-cli[lerobot]",
        ),
        (
            "pyarrow.parquet",
            lambda: __import__("rlds_cli.export.lerobot_common", fromlist=["x"]).import_writers(),
            "exporting to LeRobot needs pyarrow, which is not installed",
            "rlds-cli[lerobot]",
        ),
        (
            "huggingface_hub",
            lambda: __import__("rlds_cli.net.hub", fromlist=["x"]).hf_api(),
            "reading Hub repos (hf:// sources, and registry ids whose files are listed from the Hub) "
            "needs huggingface_hub, which is not installed",
            "pip install huggingface_hub",
        ),
    ],
)
def test_a_missing_extra_names_what_needs_it_and_what_to_install(
    monkeypatch: pytest.MonkeyPatch, missing: str, call: Callable[[], Any], message: str, hint: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # what an import finds where it is not installed
    with pytest.raises(errors.MissingExtraError) as info:
        call()
    assert str(info.value) == message and hint in info.value.hint
    assert isinstance(info.value, ImportError)  # callers catching ImportError still do


def test_minari_export_without_minari_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlds_cli.sources.convert import convert

    monkeypatch.setenv("RLDS_HOME", str(tmp_path / "home"))
    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=False), "g")
    monkeypatch.setitem(sys.modules, "minari", None)
    result = CliRunner().invoke(app, ["export", "g", str(tmp_path / "out"), "--to", "minari"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == "error: exporting to Minari needs minari, which is not installed"
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 5: log lines


def test_a_retried_failure_is_printed_once_without_source_location(
    server: FaultServer, tmp_path: Path
) -> None:
    server.add_faults("/a/demo.hdf5", Fault("status", code=503))
    url = server.url("/a/demo.hdf5")
    done = _run_cli(
        "import sys; from rlds_cli.cli.app import main; "
        f"sys.argv = ['rlds', 'download', {url!r}, '--max-episode-steps', '100', '-q']; main()",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    retry = f"warning: GET {url}: HTTP 503 Service Unavailable; retry 1/"
    assert [line for line in done.stderr.splitlines() if line.startswith(retry)] != []
    assert done.stderr.count("HTTP 503") == 1, done.stderr
    assert not re.search(r"\w+\.py:\d+", done.stderr), done.stderr


# --------------------------------------------------------------------------- 6: several D4RL files


def test_a_folder_of_d4rl_files_names_them_and_says_convert_each(
    tmp_path: Path, isolated_cache: Path
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    golden_three_episodes(folder / "a.hdf5", with_next=False)
    golden_three_episodes(folder / "b.hdf5", with_next=True)
    error, hint = failure(invoke("download", folder))
    assert error == f"error: {folder} holds 2 D4RL files (a.hdf5, b.hdf5); {ONE_AT_A_TIME}"
    assert f"'rlds download {folder / 'a.hdf5'}' then 'rlds download {folder / 'b.hdf5'}'" in hint
    assert "re-download" not in hint and "corrupt" not in error
    assert not (isolated_cache / "datasets").exists() or not any((isolated_cache / "datasets").iterdir())


def test_an_archive_of_d4rl_files_says_unpack_and_convert_each(tmp_path: Path) -> None:
    for name in ("a", "b"):
        golden_three_episodes(tmp_path / f"{name}.hdf5", with_next=False)
    archive = tmp_path / "runs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "a.hdf5", arcname="a.hdf5")
        tar.add(tmp_path / "b.hdf5", arcname="b.hdf5")
    error, hint = failure(invoke("download", archive))
    assert error == f"error: {archive} holds 2 D4RL files (a.hdf5, b.hdf5); {ONE_AT_A_TIME}"
    assert "unpack runs.tar.gz and convert each file on its own" in hint


def test_a_folder_with_one_d4rl_file_and_notes_converts(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    golden_three_episodes(folder / "a.hdf5", with_next=False)
    (folder / "README.txt").write_text("how this file was made")
    result = invoke("download", folder, "-q")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "run"


@pytest.mark.parametrize(
    "file_name",
    [
        "x.tar.gz",
        "x.tgz",
        "x.tar.bz2",
        "x.tbz2",
        "x.tbz",
        "x.tar.xz",
        "x.txz",
        "x.zip",
        "x.tar",
        "x.hdf5.zip",
        "x.hdf5.txz",
        "x.hdf5.tbz2",
    ],
)
def test_archive_default_names_drop_every_suffix(file_name: str) -> None:
    assert default_name(Path(file_name)) == "x"


@pytest.mark.parametrize(
    ("file_name", "expected"),
    [("_x.hdf5", "x"), ("__a_b_.hdf5", "a_b_"), ("_.hdf5", "dataset"), ("_-x.hdf5", "x"), ("_.x.hdf5", "x"),
     ("__-a.npz", "a")],
)  # fmt: skip
def test_default_names_are_valid_names(file_name: str, expected: str) -> None:
    """A file named ``_x.hdf5`` gave the invalid default name ``_x`` (a part starts with a letter
    or a digit), and no hint of ``--name``."""
    from rlds_cli.cache.layout import validate_name

    assert validate_name(default_name(Path(file_name))) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [("", "repo"), ("tfds/ds/1.0.0", "ds-1.0.0"), ("1.0.0", "1.0.0"), ("my data--v2/", "my-data-v2")],
)
def test_hub_default_names_follow_the_rules_of_file_names(path: str, expected: str) -> None:
    """A Hub repo is named by its folder (a version folder with its parent), cleaned as a file
    name is: never a name the cache refuses ('--' separates a name's parts on disk)."""
    from rlds_cli.cache.layout import validate_name
    from rlds_cli.net.hub import HubPath

    name = default_name(HubPath("org/repo", path))
    assert name == expected and validate_name(name) == name


# --------------------------------------------------------------------------- 7: renamed options


def test_the_generated_registry_comments_name_the_bookkeeping_folder() -> None:
    """Hashes live in ``<raw>/<entry>/.rlds/`` (rlds_cli.net.layout), not beside the files."""
    scripts = sorted((ROOT / "scripts").glob("*registry*.py"))
    for path in [*scripts, *sorted((ROOT / "registry").glob("*.toml"))]:
        text = path.read_text(encoding="utf-8")
        assert "raw/<id>/hashes.json" not in text, path
    assert "<root>/raw/<entry>/.rlds/hashes.json" in (ROOT / "scripts" / "gen_registry.py").read_text()


# --------------------------------------------------------------------------- every error, through the CLI


def _demo() -> None:
    assert invoke("download", "demo", "-q").exit_code == 0


def _case_invalid_name(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["download", "demo", "--name", "a b"]


def _case_not_found(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["path", "nothing-here"]


def _case_exists(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    golden = golden_three_episodes(tmp / "g.hdf5", with_next=False)
    assert invoke("download", golden, "--name", "g", "-q").exit_code == 0
    return ["view", "g", "--episodes", "0:1", "--name", "g"]


def _case_corrupt(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    index = Path(os.environ["RLDS_HOME"]) / "datasets" / "pointmass-demo-v0" / "episodes.npy"
    index.write_bytes(b"garbage")  # numpy reads this as pickled data: the message must not say allow_pickle
    return ["inspect", "pointmass-demo-v0"]


def _case_in_use(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    assert invoke("view", "pointmass-demo-v0", "--episodes", "0:2", "--name", "child", "-q").exit_code == 0
    return ["rm", "pointmass-demo-v0", "--yes"]


def _case_selection(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    return ["view", "pointmass-demo-v0", "--episodes", "5:2", "--name", "v"]


def _case_location(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    (tmp / "afile").write_text("x")
    return ["list", "--root", tmp / "afile"]


def _case_source_missing(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["download", tmp / "nothing.hdf5"]


def _case_unknown_format(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    (tmp / "notes.txt").write_text("x")
    return ["download", tmp / "notes.txt"]


def _case_unknown_id(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["info", "no-such-dataset-v0"]


def _case_registry_format(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    bad = tmp / "bad.toml"
    bad.write_text("[[dataset]]\nid = 3\n")
    mp.setenv("RLDS_REGISTRY", str(bad))
    return ["info", "demo"]


def _case_unsupported(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["download", "hf://org/repo/f.hdf5"]


def _case_http_status(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["download", srv.url("/nope.hdf5")]


def _case_failed(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    srv.sticky["/a/demo.hdf5"] = [Fault("status", code=503)]
    mp.setenv("RLDS_HTTP_RETRIES", "1")
    return ["download", srv.url("/a/demo.hdf5")]


def _case_offline(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["download", "hint-pinned-v0", "--offline"]


def _case_disk(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    entry = tmp / "huge.toml"
    entry.write_text(
        f'[[dataset]]\nid = "huge-v0"\nformat = "d4rl"\n\n[[dataset.files]]\nname = "h.hdf5"\n'
        f'urls = ["{srv.url("/a/demo.hdf5")}"]\nsize = {2**60}\n'
    )
    mp.setenv("RLDS_REGISTRY", str(entry))
    return ["download", "huge-v0"]


def _case_host_not_found(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:  # an offline machine, loopback aside
        if host == "nonexistent.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kw)

    mp.setattr(socket, "getaddrinfo", getaddrinfo)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        mp.delenv(var, raising=False)
    return ["download", "http://nonexistent.invalid/d4rl/f.hdf5"]


def _case_redirect(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    srv.redirects["/loop1"] = "/loop2"
    srv.redirects["/loop2"] = "/loop1"
    return ["download", srv.url("/loop1")]


def _case_server_response(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    srv.sticky["/a/demo.hdf5"] = [Fault("wrong_range", shift=10)]
    mp.setenv("RLDS_HTTP_RETRIES", "1")
    return ["download", srv.url("/a/demo.hdf5")]


def _case_too_slow(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    srv.throttle = (1024, 0.2)
    mp.setenv("RLDS_HTTP_RETRIES", "1")
    mp.setenv("RLDS_HTTP_MIN_SPEED", "1000000")  # 1 MB/s against 5 KiB/s served
    mp.setenv("RLDS_HTTP_SPEED_WINDOW", "0.3")
    return ["download", srv.url("/a/demo.hdf5")]


def _case_checksum(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    return ["download", srv.url("/a/demo.hdf5"), "--sha256", WRONG_SHA]


def _case_source_format(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    (tmp / "d.hdf5").write_bytes(b"not an hdf5 file at all")
    return ["download", tmp / "d.hdf5"]


def _case_function_import(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    return ["preprocess", "pointmass-demo-v0", "--fn", "no_such_module_x:f", "--name", "o"]


def _case_output_schema(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    return [
        "preprocess",
        "pointmass-demo-v0",
        "--fn",
        "tests.preprocess_fns:no_action",
        "--name",
        "o",
        "-w",
        "1",
    ]


def _case_preprocess(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    return [
        "preprocess",
        "pointmass-demo-v0",
        "--fn",
        "tests.preprocess_fns:identity",
        "--name",
        "pointmass-demo-v0",
    ]


def _case_export(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    (tmp / "out.npz").write_bytes(b"x")
    return ["export", "pointmass-demo-v0", tmp / "out.npz", "--to", "npz"]


def _case_missing_extra(tmp: Path, srv: FaultServer, mp: pytest.MonkeyPatch) -> list[object]:
    _demo()
    mp.setitem(sys.modules, "matplotlib", None)  # 'import matplotlib' raises ModuleNotFoundError
    return ["inspect", "pointmass-demo-v0", "--plot", tmp / "p.png"]


#: (error class, how to make the CLI raise it): every class a user can meet from the command
#: line ends as one ``error:`` line (plus a ``hint:`` line when there is one) and exit code 1.
CLI_ERRORS = [
    (errors.InvalidNameError, _case_invalid_name),
    (errors.DatasetNotFoundError, _case_not_found),
    (errors.DatasetExistsError, _case_exists),
    (errors.CorruptDatasetError, _case_corrupt),
    (errors.DatasetInUseError, _case_in_use),
    (errors.InvalidSelectionError, _case_selection),
    (errors.CacheLocationError, _case_location),
    (errors.SourceNotFoundError, _case_source_missing),
    (errors.UnknownFormatError, _case_unknown_format),
    (errors.SourceFormatError, _case_source_format),
    (errors.ChecksumMismatchError, _case_checksum),
    (errors.UnknownDatasetIdError, _case_unknown_id),
    (errors.RegistryFormatError, _case_registry_format),
    (errors.UnsupportedSourceError, _case_unsupported),
    (errors.HTTPStatusError, _case_http_status),
    (errors.DownloadFailedError, _case_failed),
    (errors.OfflineError, _case_offline),
    (errors.DiskFullError, _case_disk),
    (errors.HostNotFoundError, _case_host_not_found),
    (errors.RedirectError, _case_redirect),
    (errors.ServerResponseError, _case_server_response),
    (errors.DownloadTooSlowError, _case_too_slow),
    (errors.FunctionImportError, _case_function_import),
    (errors.OutputSchemaError, _case_output_schema),
    (errors.PreprocessError, _case_preprocess),
    (errors.ExportError, _case_export),
    (errors.MissingExtraError, _case_missing_extra),
]


@pytest.mark.parametrize(("cls", "case"), CLI_ERRORS, ids=[c.__name__ for c, _ in CLI_ERRORS])
def test_every_error_class_is_one_line_through_the_cli(
    cls: type[errors.RldsError],
    case: Callable[[Path, FaultServer, pytest.MonkeyPatch], list[object]],
    server: FaultServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = case(tmp_path, server, monkeypatch)
    registry._load.cache_clear()
    result = invoke(*args)
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines) <= 2, lines
    assert "unexpected" not in lines[0] and "Traceback" not in result.stderr
    assert "allow_pickle" not in result.stderr  # numpy's advice: never what a user of rlds should do
    assert len(lines) == 1 or lines[1].startswith("hint: "), lines
    monkeypatch.setenv("RLDS_DEBUG", "1")  # the same failure, raised: it is this class
    raised = invoke(*args).exception
    assert isinstance(raised, cls), repr(raised)


def test_the_open_file_limit_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    """A memmap build keeps one file open per key: a source of more keys than the process may open
    (macOS's default limit is 256) failed with 'unexpected OSError: Too many open files'."""
    import h5py
    import numpy as np

    source = golden_three_episodes(tmp_path / "many.hdf5", with_next=False)
    with h5py.File(source, "a") as f:
        rows = len(f["rewards"])
        for i in range(80):
            f[f"infos/k{i}"] = np.zeros(rows, np.float32)
    script = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); "
        "from rlds_cli.cli.app import main; "
        "sys.argv = ['rlds', 'download', sys.argv[1], '--name', 'many', '-q']; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(source)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "RLDS_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: too many open files (the process's limit) at: "), lines
    assert lines[1].startswith("hint: raise the limit of open files (ulimit -n 8192)") and "zarr" in lines[1]
    assert not list((tmp_path / "home" / "datasets").glob("*"))


@pytest.mark.parametrize(
    ("code", "cls", "what"),
    [
        (errno.ENOSPC, errors.DiskFullError, "no space left on the device"),
        (errno.EROFS, errors.CacheNotWritableError, "read-only filesystem"),
        (errno.EACCES, errors.CacheNotWritableError, "permission denied"),
    ],
)
def test_os_errors_a_user_can_fix_are_one_line_through_the_cli(
    code: int, cls: type[errors.RldsError], what: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk or an unwritable cache met while writing (a real one is in test_trust_cache,
    which needs root to mount a small tmpfs) is one line naming the file, with what to do."""
    from rlds_cli.cache.builder import DatasetBuilder

    where = tmp_path / "cache" / "arrays" / "action.bin"

    def fail(self: DatasetBuilder, block: object) -> None:
        raise OSError(code, os.strerror(code), str(where))

    monkeypatch.setattr(DatasetBuilder, "append", fail)
    golden = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    error, hint = failure(invoke("download", golden))
    assert error == f"error: {what}: {where}"
    assert "RLDS_HOME" in hint
    translated = errors.from_os_error(OSError(code, os.strerror(code), str(where)))
    assert type(translated) is cls


def test_an_os_error_names_the_path_the_user_gave_not_a_temporary_one(tmp_path: Path) -> None:
    """A read-only or vanished export folder said ``permission denied: .../.out.npz.5388.1398.partial``:
    a hidden name the user never gave."""
    import errno

    from rlds_cli._util.io import named_by_temp, temp_path
    from rlds_cli.errors import from_os_error

    out = tmp_path / "out.npz"
    for suffix in (".tmp", ".partial"):
        assert named_by_temp(temp_path(out, suffix=suffix)) == str(out)
    assert named_by_temp(tmp_path / ".hidden.tmp") == str(tmp_path / ".hidden.tmp")  # no writer id
    assert named_by_temp("plain.txt") == "plain.txt"
    hidden = OSError(errno.EROFS, "Read-only file system", str(temp_path(out, suffix=".partial")))
    known = from_os_error(hidden, named_by_temp(hidden.filename))
    assert known is not None and known.message == f"read-only filesystem: {out}"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder that holds no new files")
def test_a_path_that_cannot_hold_files_is_one_line_naming_it(tmp_path: Path) -> None:
    """``RLDS_HOME=/proc/x rlds demo`` and ``rlds export NAME /proc/out.npz`` said "unexpected
    FileNotFoundError" (the export naming its temporary file)."""
    from rlds_cli.sources.convert import convert
    from tests.d4rl_fixtures import golden_three_episodes

    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=False), "g")
    runner = CliRunner()
    result = runner.invoke(app, ["export", "g", "/proc/out.npz", "--to", "npz"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == "error: no such file or folder: /proc/out.npz"
    result = runner.invoke(app, ["download", str(tmp_path / "g.hdf5"), "--root", "/proc/rlds-cache"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == "error: no such file or folder: /proc/rlds-cache"
