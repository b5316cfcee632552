"""Ctrl-C and SIGTERM stop a command in one line, with nothing published or left behind: each
signal is sent by the command's own process at a known step (``rlds_cli._util.signals``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlds_cli.preprocess.pool import sigint_held
from tests.d4rl_fixtures import golden_three_episodes

ROOT = Path(__file__).resolve().parents[2]

# the command as the `rlds` entry point runs it, after the lines each test puts before it
_MAIN = "from rlds_cli.cli import main\nsys.argv = ['rlds', *sys.argv[1:]]\nmain()\n"


def _rlds(home: Path, before: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RLDS_HOME": str(home), "NO_COLOR": "1", "RLDS_FSYNC": "0"}
    code = f"import os, signal, sys\n{before}\n{_MAIN}"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )


def _converted(tmp_path: Path) -> Path:
    """A cache under ``tmp_path / "home"`` holding the golden D4RL file converted as ``g``."""
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=False)
    home = tmp_path / "home"
    assert _rlds(home, "", "download", str(source), "--name", "g").returncode == 0
    return home


def _leftovers(home: Path) -> list[str]:
    tmp = home / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


def test_sigterm_during_a_conversion_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM (kill, timeout, docker stop, SLURM) had no handler: the command died without a
    word (143) and left its half-built dataset in the cache's tmp/."""
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=False)
    before = (
        "from rlds_cli.cache.builder import DatasetBuilder\n"
        "real = DatasetBuilder.append\n"
        "def append(self, *a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(self, *a, **k)\n"
        "DatasetBuilder.append = append\n"
    )
    home = tmp_path / "home"
    done = _rlds(home, before, "download", str(source), "--name", "g")
    assert done.returncode == 143, done.stderr
    assert done.stderr == "error: terminated (SIGTERM); nothing was published\n"
    assert _leftovers(home) == [] and not (home / "datasets" / "g").exists()
    again = _rlds(home, "", "download", str(source), "--name", "g")
    assert again.returncode == 0, again.stderr


def test_an_interrupt_a_library_drops_still_stops_the_export(tmp_path: Path) -> None:
    """Ctrl-C landing in h5py's object cleanup is dropped there ("Exception ignored in ..."): the
    robomimic export went on, placed its file and exited 0."""
    home = _converted(tmp_path)
    before = (
        "import h5py\n"
        "class Dropped:\n"
        "    def __del__(self):\n"  # the handler's KeyboardInterrupt is raised here, and dropped
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        for _ in range(10000): pass\n"
        "real = h5py.Group.create_group\n"
        "def create_group(self, *a, **k):\n"
        "    Dropped()\n"
        "    return real(self, *a, **k)\n"
        "h5py.Group.create_group = create_group\n"
    )
    out = tmp_path / "out.hdf5"
    done = _rlds(home, before, "export", "g", str(out), "--to", "robomimic")
    assert done.returncode == 130, done.stderr
    assert done.stderr == "error: interrupted; nothing was published\n"  # no "Exception ignored"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.hdf5", "home"]


def test_ctrl_c_while_the_commands_are_imported_is_one_line(tmp_path: Path) -> None:
    """The first tenths of a second (the commands' imports) printed a 30-line traceback."""
    before = (
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'rlds_cli.cli.app':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Stop())\n"
    )
    done = _rlds(tmp_path / "home", before, "list")
    assert (done.returncode, done.stderr) == (130, "error: interrupted\n")


def _blocked(queue: object) -> None:
    queue.put(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))  # type: ignore[attr-defined]


def test_preprocess_workers_start_with_ctrl_c_held_back() -> None:
    """Ctrl-C reaches the whole process group: a worker still importing printed its traceback
    above the command's one line. A worker starts with it blocked (it ignores it once started)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with sigint_held():
        proc = ctx.Process(target=_blocked, args=(queue,))
        proc.start()
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this process: as before
    assert queue.get(timeout=60) is True
    proc.join(60)


def test_an_interruption_a_library_dropped_is_raised_again_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remembered for good, one Ctrl-C made every later publish of the process fail."""
    from rlds_cli._util import signals

    monkeypatch.setattr(signals, "_received", signal.SIGTERM)
    with pytest.raises(signals.Terminated):
        signals.raise_if_interrupted()
    signals.raise_if_interrupted()  # raised once: nothing now


def test_the_application_leaves_the_signals_to_its_caller(tmp_path: Path) -> None:
    """Only the `rlds` entry point installs handlers: rlds_cli.cli.app.main, called in a thread
    of another program, failed ("signal only works in main thread") and replaced its handlers.
    (In a process of its own: the application configures logging and freezes the gc.)"""
    code = (
        "import signal, sys, threading\n"
        "from rlds_cli.cli.app import main\n"
        "before = signal.getsignal(signal.SIGTERM)\n"
        "codes = []\n"
        "def run():\n"
        "    sys.argv = ['rlds', '--version']\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as exc:\n"
        "        codes.append(exc.code)\n"
        "thread = threading.Thread(target=run)\n"
        "thread.start()\n"
        "thread.join(60)\n"
        "print(codes, signal.getsignal(signal.SIGTERM) == before)\n"
    )
    env = {**os.environ, "RLDS_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.stdout.splitlines()[-1] in ("[0] True", "[None] True"), done.stdout + done.stderr


_STALLING_SERVER = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Stall(BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "10000000")
        self.end_headers()
        self.wfile.write(b"\\0" * 100_000)
        self.wfile.flush()
        time.sleep(600)
server = ThreadingHTTPServer(("127.0.0.1", 0), Stall)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_ctrl_c_stops_a_download_of_several_files_from_a_stalled_server(tmp_path: Path) -> None:
    """Each file's worker waits in a read until the read timeout (60 s): Ctrl-C and SIGTERM
    said so at once and then waited that long, a second Ctrl-C too."""
    import time

    server = subprocess.Popen([sys.executable, "-c", _STALLING_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        files = "".join(
            f'[[dataset.files]]\nname = "{n}.hdf5"\nurls = ["http://127.0.0.1:{port}/{n}.hdf5"]\n'
            "size = 10000000\n"
            for n in "ab"
        )
        registry = tmp_path / "registry.toml"
        registry.write_text(
            '[[dataset]]\nid = "stall-v0"\nformat = "d4rl"\ndescription = "two stalling files"\n'
            f'license = "CC0-1.0"\nurl_status = "literal"\n\n{files}'
        )
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            home = tmp_path / f"home-{code}"
            env = {**os.environ, "RLDS_HOME": str(home), "RLDS_REGISTRY": str(registry), "NO_COLOR": "1"}
            env["RLDS_HTTP_TIMEOUT"] = "300"  # far past the test's own timeout
            proc = subprocess.Popen(
                [sys.executable, "-c", f"import sys\n{_MAIN}", "download", "stall-v0"],
                stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while len(list(home.rglob("*.part"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # both workers are in a read of the stalled server
            os.killpg(proc.pid, signum)
            try:
                _, err = proc.communicate(timeout=30)  # before: only after the read timeout
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            assert proc.returncode == code, err
            assert err.splitlines()[0].startswith("error: "), err
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("step", ["rename", "after"])
def test_sigterm_during_or_after_the_publish_says_it_was_published(tmp_path: Path, step: str) -> None:
    """The dataset's rename is never cut, and a signal once it has run said "nothing was
    published" of a dataset then listed (143 either way: the signal stopped the command)."""
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=False)
    target = "CacheRoot.publish" if step == "rename" else "CacheTransaction.publish"
    module = "rlds_cli.cache.root" if step == "rename" else "rlds_cli.cache.transaction"
    name = target.split(".")[0]
    before = (
        f"from {module} import {name}\n"
        f"real = {target}\n"
        "def publish(self, *a, **k):\n"
        "    out = real(self, *a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return out\n"
        f"{target} = publish\n"
    )
    home = tmp_path / "home"
    done = _rlds(home, before, "download", str(source), "--name", "g")
    assert done.returncode == 143, done.stderr
    assert done.stderr == "error: terminated (SIGTERM); dataset 'g' was published whole before it\n"
    assert (home / "datasets" / "g" / "manifest.json").is_file() and _leftovers(home) == []


def test_a_split_interrupted_between_its_renames_publishes_both_parts(tmp_path: Path) -> None:
    home = _converted(tmp_path)
    before = (
        "from rlds_cli.cache.root import CacheRoot\n"
        "real = CacheRoot.publish\n"
        "def publish(self, *a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"  # before the first part's rename
        "    return real(self, *a, **k)\n"
        "CacheRoot.publish = publish\n"
    )
    done = _rlds(home, before, "split", "g", "--val", "0.34")
    assert done.returncode == 130, done.stderr
    made = sorted(p.name for p in (home / "datasets").iterdir())
    assert len(made) == 3, made
    assert done.stderr.startswith("error: interrupted; dataset ") and "were published whole" in done.stderr
