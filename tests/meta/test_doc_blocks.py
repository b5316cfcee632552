"""Every code block of README.md and docs/*.md runs as written (see tests/doc_blocks.py).

Each page runs as one session with a fresh cache. The pages a newcomer follows after ``make demo``
(:data:`FRONT_DOOR`) run in a fresh copy of the checkout whose ``.venv`` ``make demo`` made
(tests/doc_checkout.py: only what ``make demo`` installs, so a block that needs more must install
it, as the reader would), and must leave that copy as they found it. The other pages run in a
directory that looks like the checkout's root (the suite's ``.venv``, ``Makefile``,
``pyproject.toml`` and ``docs/`` linked in). Bash blocks run offline (``RLDS_OFFLINE=1``); a
block marked ``network`` runs with an HTTP proxy on 127.0.0.1 that serves generated stand-ins
for the real files it asks for, so the commands run exactly as printed and nothing leaves the
machine. Files the blocks write outside the cache go under ``TMPDIR``, a folder of the test's
(removed after the page).
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest

from tests.d4rl_fixtures import write_d4rl
from tests.doc_blocks import CODE_LANGUAGES, Block, blocks, runnable_script
from tests.doc_checkout import fresh_checkout, left_behind
from tests.http_faults import FaultServer
from tests.hub_standin import HubStandin, folder_files, hub_env, record_minari
from tests.waits import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The pages that run after ``make demo`` alone, in a fresh checkout (the README's walk through
#: and the guides it sends a newcomer to first).
FRONT_DOOR = [
    ROOT / "README.md",
    *(ROOT / "docs" / name for name in ("getting-started.md", "recording.md", "loader.md")),
]

#: What the network blocks download, by URL (the registry's real URLs): small stand-ins.
#: The write token of the Hub stand-in, in ``HF_TOKEN`` for the blocks marked ``hub``.
DOC_TOKEN = "hf_docStandinWriteToken000000000000"
HOPPER_URL = "http://rail.eecs.berkeley.edu/datasets/offline_rl/gym_mujoco_v2/hopper_medium-v2.hdf5"


def _hopper_stand_in(path: Path) -> bytes:
    """A D4RL file shaped like hopper-medium-v2 (11-d observations, 3-d actions), 3,000 steps:
    episodes ended by a time limit, by termination, and one cut by the end of the file."""
    rng = np.random.default_rng(0)
    n = 3000
    terminals = np.zeros(n, bool)
    timeouts = np.zeros(n, bool)
    terminals[1449] = True  # an episode of 450 steps that fell
    timeouts[[999, 2449, n - 1]] = True
    write_d4rl(
        path,
        observations=rng.normal(size=(n, 11)).astype(np.float32),
        actions=rng.uniform(-1, 1, size=(n, 3)).astype(np.float32),
        rewards=rng.normal(1.0, 0.5, size=n).astype(np.float32),
        terminals=terminals,
        timeouts=timeouts,
    )
    return path.read_bytes()


def _page_id(page: Path) -> str:
    return page.name


def _pages_with_blocks() -> list[Path]:
    return [p for p in PAGES if any(b.language in CODE_LANGUAGES for b in blocks(p))]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    """A plain-HTTP proxy on 127.0.0.1: requests sends it absolute URLs, which it serves from
    ``files`` by the full URL."""
    server = FaultServer()
    server.files[HOPPER_URL] = _hopper_stand_in(tmp_path_factory.mktemp("proxy") / "h.hdf5")
    with server:
        yield server


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    """The Hub stand-in with the repos docs/downloads.md names: ``my-org/offline-rl`` (the push
    examples' repo; writes need :data:`DOC_TOKEN`, which hub blocks get in ``HF_TOKEN``),
    ``lerobot/pusht`` (the LeRobot fixture written by lerobot) and ``farama-minari/D4RL``
    (``door/human-v2``: a dataset written by minari's DataCollector; the content is a stand-in,
    the layout is the real repo's)."""
    # not conftest's hub: one stand-in for the module, its client settings go to each block's process
    with HubStandin(token=DOC_TOKEN) as server:
        # the repo the push examples write to, as the Hub makes a new one
        hub_files = {".gitattributes": b"*.npy filter=lfs diff=lfs merge=lfs -text\n", "README.md": b"# rl\n"}
        server.add_repo("my-org/offline-rl", hub_files)
        server.add_repo("lerobot/pusht", folder_files(ROOT / "tests" / "fixtures" / "lerobot-v3-tiny"))
        if _has_minari_create():
            local = record_minari(tmp_path_factory.mktemp("minari"), "rlds/door/human-v2")
            server.add_repo("farama-minari/D4RL", folder_files(local, "door/human-v2/"))
        yield server


def _has_minari_create() -> bool:
    try:
        import jax  # noqa: F401
        import minari  # noqa: F401
    except ImportError:
        return False
    return True


def _session_dir(tmp_path: Path) -> Path:
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("Makefile", "docs"):
        (work / name).symlink_to(ROOT / name)
    (work / ".venv").symlink_to(Path(sys.prefix))
    # a copy older than every install stamp: `make demo` here must never reinstall into the
    # suite's own venv (from this temporary directory)
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    os.utime(work / "pyproject.toml", (0, 0))
    return work


def _make_would_install(work: Path, env: dict[str, str]) -> bool:
    """Whether `make` in the session would (re)install packages (a venv not made by make)."""
    probe = subprocess.run(["make", "-q", "install"], cwd=work, env=env, capture_output=True)
    return probe.returncode != 0


def _env(
    home: Path, python: Path, scratch: Path, *, proxy_url: str | None, hub_url: str | None = None
) -> dict[str, str]:
    """A block's environment: the cache at ``home``, ``python``'s venv first on ``PATH`` (as after
    ``source .venv/bin/activate``), ``TMPDIR`` at ``scratch``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RLDS_", "HF_")) and "proxy" not in k.lower()
    }
    env.update(RLDS_HOME=str(home), RLDS_FSYNC="0", NO_COLOR="1", COLUMNS="120", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(python.parent.parent)
    env["TMPDIR"] = str(scratch)
    env["HF_HOME"] = str(home.parent / "hf-home")  # no token file of the machine's user
    if hub_url is not None:
        env.update(hub_env(hub_url, home.parent / "hf-home", DOC_TOKEN))
    elif proxy_url is None:
        env["RLDS_OFFLINE"] = "1"
    else:
        env["http_proxy"] = env["HTTP_PROXY"] = proxy_url
    return env


class PythonSession:
    """The page's Python process (tests/doc_session.py), started at its first python block."""

    def __init__(self, python: Path, cwd: Path, env: dict[str, str], log: IO[str]) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "tests" / "doc_session.py")],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )

    def run(self, block: Block) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        code = block.code.encode()
        self.proc.stdin.write(f"{block.where} {len(code)}\n".encode() + code)
        self.proc.stdin.flush()
        # a hang guard only (a block that waits forever, e.g. on a worker that died): the reply
        # line ends the wait whatever the machine's speed
        ready, _, _ = select.select([self.proc.stdout], [], [], HANG_SECONDS)
        if not ready:
            self.proc.kill()
            return {"ok": False, "error": f"no reply in {HANG_SECONDS:.0f} s: a hang"}
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"the Python session died (exit {self.proc.wait()})"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _run_bash(block: Block, work: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", runnable_script(block)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,  # a hang guard: the block's end ends the wait
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]


def _run_page(
    page: Path, work: Path, python: Path, tmp_path: Path, proxy: FaultServer, hub: HubStandin | None
) -> None:
    """Run every block of ``page`` in order in ``work`` with ``python``'s venv, the cache in
    ``tmp_path``; fails the test at the first block that does not do what it shows."""
    home = tmp_path / "rlds-home"
    # the blocks' TMPDIR: short, for the AF_UNIX sockets multiprocessing makes there (at most 107
    # bytes: under pytest's tmp_path, torch's DataLoader workers failed to share tensors)
    scratch = Path(tempfile.mkdtemp(prefix="rlds-doc-"))
    python_log = (tmp_path / "python.log").open("w")
    session: PythonSession | None = None
    try:
        for block in blocks(page):
            if block.language not in CODE_LANGUAGES or "skip" in block.options:
                continue
            if block.language == "json":
                json.loads(block.code)
            elif block.language == "toml":
                tomllib.loads(block.code)
            elif block.language == "bash":
                if "hub" in block.options:
                    assert hub is not None, f"{block.where}: a hub block on a page run without the stand-in"
                env = _env(
                    home,
                    python,
                    scratch,
                    proxy_url=proxy.base if "network" in block.options else None,
                    hub_url=hub.endpoint if hub is not None and "hub" in block.options else None,
                )
                if "make " in runnable_script(block) and _make_would_install(work, env):
                    pytest.skip(f"{block.where}: the venv was not made by `make install`")
                code, output = _run_bash(block, work, env)
                expected = int(block.options.get("expect-exit", "0"))
                assert code == expected, f"{block.where} exited {code}, not {expected}:\n{output}"
            else:
                if session is None:  # a page with hub blocks reads the stand-in from Python too
                    on_hub = hub is not None and any("hub" in b.options for b in blocks(page))
                    env = _env(
                        home, python, scratch, proxy_url=None, hub_url=hub.endpoint if on_hub else None
                    )
                    session = PythonSession(python, work, env, python_log)
                reply = session.run(block)
                if not reply["ok"]:
                    python_log.flush()
                    printed = (tmp_path / "python.log").read_text()[-3000:]
                    pytest.fail(f"{block.where} failed:\n{reply['error']}\nprinted:\n{printed}")
    finally:
        if session is not None:
            session.close()
        python_log.close()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("page", FRONT_DOOR, ids=_page_id)
def test_front_door_pages_run_after_make_demo_alone(page: Path, tmp_path: Path, proxy: FaultServer) -> None:
    """A fresh checkout, ``make demo``, then every block of the page, in order, in the venv
    ``make demo`` made; the checkout is left as it was (no ``minari/``, no exported file)."""
    work = fresh_checkout(tmp_path / "checkout", tmp_path / "rlds-home")
    _run_page(page, work, work / ".venv" / "bin" / "python", tmp_path, proxy, hub=None)
    assert left_behind(work) == [], f"{page.name}'s blocks wrote into the checkout"


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in _pages_with_blocks() if p not in FRONT_DOOR], ids=_page_id)
def test_every_other_block_runs_as_written(
    page: Path, tmp_path: Path, proxy: FaultServer, hub: HubStandin
) -> None:
    _run_page(page, _session_dir(tmp_path), Path(sys.executable), tmp_path, proxy, hub)


def test_the_front_door_pages_have_blocks() -> None:
    assert all(p in _pages_with_blocks() for p in FRONT_DOOR)


def test_skipped_blocks_are_few_and_say_why() -> None:
    skipped = [b for p in PAGES for b in blocks(p) if "skip" in b.options]
    assert all(b.options["skip"] for b in skipped), [b.where for b in skipped if not b.options["skip"]]
    assert len(skipped) <= 3, [b.where for b in skipped]


def _datasets_downloaded(script: str) -> set[str]:
    """The cache names the ``rlds download`` lines of a script make: ``--name``, else the id."""
    names: set[str] = set()
    for line in script.splitlines():
        if not line.startswith("rlds download "):
            continue
        args = shlex.split(line.split(" #")[0])[2:]
        if "--name" in args:
            names.add(args[args.index("--name") + 1])
        else:
            names.update(a for a in args[:1] if not a.startswith("-"))
    return names


def _stranded(pages: list[Path]) -> list[str]:
    """``page:line: name`` for each block that uses a dataset only a ``network`` block made."""
    stranded: list[str] = []
    for page in pages:
        online: set[str] = set()
        for block in blocks(page):
            if block.language not in ("bash", "python") or "skip" in block.options:
                continue
            code = runnable_script(block) if block.language == "bash" else block.code
            if "network" in block.options:
                online |= _datasets_downloaded(code)
                continue
            online -= _datasets_downloaded(code)  # made offline too, from then on
            stranded += [
                f"{block.where}: {name}"
                for name in sorted(online)
                if re.search(rf"(?<![\w./-]){re.escape(name)}(?![\w-])", code)
            ]
    return stranded


def test_pages_can_be_followed_offline() -> None:
    """A reader without a network skips the blocks marked ``network``: no later block may use a
    dataset that only such a block downloads (getting-started once converted an offline file,
    then inspected and opened ``hopper-medium-v2``, which only its download made)."""
    assert _stranded(PAGES) == [], "blocks that need a dataset only a network block downloads"


def test_the_offline_check_finds_a_stranded_dataset(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- doc-test: network -->\n```bash\nrlds download hopper-medium-v2\n```\n\n"
        "```python\nds = rlds_cli.open_dataset('hopper-medium-v2')\n```\n\n"
        "```bash\nrlds download ./f.hdf5 --name hopper-medium-v2\nrlds inspect hopper-medium-v2\n```\n",
        encoding="utf-8",
    )
    assert _stranded([page]) == ["page.md:6: hopper-medium-v2"]  # the last block makes it offline
    assert _datasets_downloaded("rlds download ./f.hdf5 --format d4rl --name my-data  # x") == {"my-data"}
    assert _datasets_downloaded("rlds download 'DAPG(expert)/door_v2d-v1'") == {"DAPG(expert)/door_v2d-v1"}


def test_fenced_code_has_a_language() -> None:
    """A fence without a language would escape the runner: shown output is marked ``text``."""
    bare = [b.where for p in PAGES for b in blocks(p) if not b.language]
    assert not bare, f"fences without a language (use text for shown output): {bare}"


def test_the_manifest_example_is_a_real_manifest(tmp_path: Path) -> None:
    """docs/cache-format.md shows a manifest: it has the keys a real one has (and no others),
    and each nested entry names only keys a real one has."""
    from rlds_cli.sources.download import download

    (example,) = [b for b in blocks(ROOT / "docs" / "cache-format.md") if b.language == "json"]
    shown = json.loads(example.code)
    result = download("demo", root=tmp_path / "home")
    real = json.loads((result.path / "manifest.json").read_text())
    assert sorted(shown) == sorted(real)
    for key in ("source", "conversion", "content_digest"):
        assert set(shown[key]) <= set(real[key]), key
    for name, spec in shown["fields"].items():
        assert spec == real["fields"][name], name
    assert (shown["name"], shown["num_steps"], shown["num_episodes"]) == (
        real["name"],
        real["num_steps"],
        real["num_episodes"],
    )
