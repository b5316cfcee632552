"""A fresh checkout with the environment ``make demo`` makes: where the front-door pages run.

:func:`fresh_checkout` copies the files a commit of this working tree would hold (tracked files
and untracked ones git does not ignore, so uncommitted work is what is tested) into a new folder,
commits them there (so :func:`left_behind` can list what the blocks wrote into it), and runs
``make demo`` there with a cache of its own: a new ``.venv`` holding only what ``make demo``
installs, the demo dataset in the cache, as a newcomer has them after ``git clone`` and
``make demo``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waits import HANG_SECONDS

ROOT = Path(__file__).resolve().parent.parent


def clean_env(home: Path) -> dict[str, str]:
    """The environment of a newcomer's shell: no ``RLDS_*``/``HF_*`` setting of the suite's, no
    virtualenv active, the cache at ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLDS_", "HF_", "VIRTUAL_ENV"))}
    bin_dir = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
    env.update(RLDS_HOME=str(home), NO_COLOR="1")
    return env


def _git(args: list[str], cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def fresh_checkout(dest: Path, home: Path) -> Path:
    """This working tree, copied to ``dest`` and committed there, after ``make demo`` with the
    cache at ``home``. Fails the test with make's output when ``make demo`` fails."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files a clone would hold are unknown")
    listed = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT)
    for name in sorted(set(filter(None, listed.split("\0")))):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    _git(["init", "-q"], dest)
    _git(["add", "-A"], dest)
    _git(["-c", "user.name=rlds tests", "-c", "user.email=tests@localhost", "-c", "commit.gpgsign=false",
          "commit", "-q", "-m", "fresh clone"], dest)  # fmt: skip
    made = subprocess.run(
        ["make", "demo"],
        cwd=dest,
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,  # a hang guard: make demo takes 15-40 s here
        stdin=subprocess.DEVNULL,
    )
    output = (made.stdout + made.stderr)[-4000:]
    assert made.returncode == 0, f"make demo failed ({made.returncode}):\n{output}"
    return dest


def left_behind(checkout: Path) -> list[str]:
    """What is in ``checkout`` that its commit does not hold, ignored files aside: ``git status``
    lines (``?? minari/``), empty for a checkout as it was."""
    return _git(["status", "--porcelain", "--untracked-files=all"], checkout).splitlines()
