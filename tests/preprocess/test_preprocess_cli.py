"""``rlds preprocess`` end to end: the CLI, worker processes, a job SIGKILLed halfway and
resumed (the Ray executor is tested in tests/preprocess/test_preprocess_ray.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from rlds_cli import preprocess
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from tests.dataset_fixtures import everything, make_dataset
from tests.waits import HANG_SECONDS

REPO = Path(__file__).resolve().parents[2]
FNS = "tests.preprocess_fns"
runner = CliRunner()


pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


def invoke(*args: str) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


# --------------------------------------------------------------------------- CLI


def test_cli_end_to_end_on_the_demo_with_two_workers() -> None:
    from rlds_cli.sources.download import download

    name = download("demo").manifest.name
    result = invoke("preprocess", name, "--fn", f"{FNS}:normalize", "--name", "demo-norm", "--workers", "2")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "demo-norm: 5,000 steps, 94 episodes from 2 chunks" in result.stdout
    src, out = open_dataset(name)[:], open_dataset("demo-norm")[:]
    assert np.array_equal(out["observation"], ((src["observation"] - 1.5) / 2).astype(np.float32))
    assert np.array_equal(out["next/observation"], ((src["next/observation"] - 1.5) / 2).astype(np.float32))
    assert np.array_equal(out["action"], src["action"])
    shown = invoke("inspect", "demo-norm")
    assert shown.exit_code == 0
    assert f"derived from {name}" in shown.stdout and f"by {FNS}:normalize" in shown.stdout
    again = invoke("preprocess", name, "--fn", f"{FNS}:normalize", "--name", "demo-norm", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["reused"] is True


def test_a_merge_and_a_trim_are_preprocessed_like_any_dataset() -> None:
    """The workers opened a merge or trim as a stored dataset: 'array file .../arrays/action.npy
    is missing' (verify passed), and the job's folder was left in tmp/."""
    from rlds_cli.sources.download import download

    name = download("demo").manifest.name
    assert invoke("view", name, "-e", "0:5", "-n", "a").exit_code == 0
    assert invoke("merge", "a", name, "-n", "m").exit_code == 0
    assert invoke("trim", name, "--start", "1", "--end", "1", "-n", "t").exit_code == 0
    for source in ("m", "t"):
        result = invoke("preprocess", source, "--fn", f"{FNS}:identity", "--name", f"{source}-pp")
        assert result.exit_code == 0, (result.stdout, result.stderr)
        src, out = open_dataset(source), open_dataset(f"{source}-pp")
        assert out.num_episodes == src.num_episodes
        for key, values in src[:].items():
            assert np.array_equal(out[:][key], values), (source, key)


def test_cli_json_stats_and_dry_run() -> None:
    make_dataset("small", [5, 6, 7])
    dry = invoke("preprocess", "small", "--fn", f"{FNS}:add_features", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.stderr
    info = json.loads(dry.stdout)
    assert info["output"]["obs_norm"] == {"shape": [1], "dtype": "float32", "storage": "step"}
    assert not (Path(os.environ["RLDS_HOME"]) / "datasets" / "out").exists()
    shown = invoke("preprocess", "small", "--fn", f"{FNS}:add_features", "--dry-run")
    assert "output schema" in shown.stdout and "obs_norm" in shown.stdout
    done = invoke(
        "preprocess", "small", "--fn", f"{FNS}:identity", "--name", "out", "--stats", "-w", "1", "--json"
    )
    assert done.exit_code == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["num_steps"] == 18 and data["lineage"][0]["name"] == "small"
    assert data["stats"]["keys"]["observation"]["count"] == 18


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("nope_pkg.mod:f", "error: --fn 'nope_pkg.mod:f': no module named 'nope_pkg'"),
        (f"{FNS}:missing", f"error: --fn '{FNS}:missing': '{FNS}' has no attribute 'missing'"),
        (f"{FNS}:NOT_CALLABLE", "is not callable"),
        ("tests/nope.py:f", "does not exist"),
    ],
)
def test_cli_import_errors_are_one_line(ref: str, message: str) -> None:
    make_dataset("small", [5, 6])
    result = invoke("preprocess", "small", "--fn", ref, "--name", "out")
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: --fn ") and lines[1].startswith("hint: ")
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_cli_user_exception_prints_the_users_traceback() -> None:
    make_dataset("small", [10, 10, 10])
    result = invoke(
        "preprocess", "small", "--fn", f"{FNS}:raises", "--name", "out", "--chunk-steps", "8", "-w", "1"
    )
    assert result.exit_code == 1
    err = result.stderr
    assert err.startswith("Traceback (most recent call last):")
    assert "preprocess_fns.py" in err and "ValueError: boom in user code" in err
    assert "rlds_cli/preprocess" not in err
    # chunks of up to 8 steps end on episode ends: 0-7, 8-9, 10-17, 18-19, ...
    assert f"error: function {FNS}:raises, chunk 3 (steps 18-19, episodes 1-1)" in err


def test_cli_needs_out_unless_dry_run() -> None:
    make_dataset("small", [5])
    result = invoke("preprocess", "small", "--fn", f"{FNS}:identity")
    assert result.exit_code == 1 and "--name NAME (the new dataset's name) is required" in result.stderr


# --------------------------------------------------------------------------- processes


def test_worker_processes_give_the_same_output_as_inline() -> None:
    make_dataset("src", [30, 1, 45, 12, 60, 2, 50])
    preprocess.run("src", f"{FNS}:normalize", "inline", workers=1, chunk_steps=16, stats=True)
    preprocess.run("src", f"{FNS}:normalize", "pool", workers=2, chunk_steps=16, stats=True)
    preprocess.run("src", f"{FNS}:drop_short_episodes", "ep-inline", by="episode", workers=1, chunk_steps=40)
    preprocess.run("src", f"{FNS}:drop_short_episodes", "ep-pool", by="episode", workers=2, chunk_steps=40)
    assert_same_arrays(everything("inline"), everything("pool"))
    assert_same_arrays(everything("ep-inline"), everything("ep-pool"))
    assert open_dataset("inline").manifest.stats == open_dataset("pool").manifest.stats


KILL_SCRIPT = """
import sys
from rlds_cli import preprocess

if __name__ == "__main__":
    preprocess.run("src", "tests.preprocess_fns:normalize_or_hang", "out", by=sys.argv[1], workers=2,
                   chunk_steps=10, stats=True)
"""


@pytest.mark.parametrize("by", ["step", "episode"])
def test_job_killed_halfway_resumes_to_the_same_arrays(
    by: str, tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dataset("src", [8] * 25)  # 200 steps: 20 chunks of 10 (per-episode: 25 chunks of 8)
    script = tmp_path / "job.py"
    script.write_text(KILL_SCRIPT)
    # the chunks before step 40 finish (4 of them per step, 5 per episode), the others hang: the
    # job is still running, whatever the machine's speed, when it is killed
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREPROCESS_TEST_HANG_FROM": "40"}
    proc = subprocess.Popen([sys.executable, str(script), by], cwd=REPO, env=env, start_new_session=True)
    chunks = isolated_cache / "tmp"
    deadline = time.monotonic() + HANG_SECONDS  # a hang guard: the chunks end the wait
    try:
        while len(list(chunks.glob("*.job-*/chunks/*.done.npz"))) < 4:
            assert proc.poll() is None, "the job ended before it could be killed"
            assert time.monotonic() < deadline, "no chunk finished: a hang"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the coordinator and its workers, mid-job
        proc.wait()
    assert not (isolated_cache / "datasets" / "out").exists()  # nothing published
    finished = len(list(chunks.glob("*.job-*/chunks/*.done.npz")))
    resumed = preprocess.run(
        "src", f"{FNS}:normalize_or_hang", "out", by=by, chunk_steps=10, stats=True, resume=True
    )
    assert resumed.resumed_chunks == finished >= 4
    assert not list(chunks.glob("*.job-*"))  # the job directory is gone once published
    preprocess.run("src", f"{FNS}:normalize_or_hang", "fresh", by=by, chunk_steps=10, stats=True, workers=1)
    assert_same_arrays(everything("out"), everything("fresh"))
    assert open_dataset("out").manifest.stats == open_dataset("fresh").manifest.stats


def test_run_without_resume_starts_over(isolated_cache: Path) -> None:
    make_dataset("src", [8] * 4)
    job = isolated_cache / "tmp" / "out.job-0123456789abcdef"
    job.mkdir(parents=True)
    preprocess.run("src", f"{FNS}:identity", "out", workers=1)
    assert open_dataset("out").num_steps == 32


def test_preprocess_help_stays_light() -> None:
    code = (
        "import sys\nfrom rlds_cli.cli.app import app\n"
        "try:\n    app(['preprocess', '--help'])\n"
        "except SystemExit as exc:\n    assert exc.code in (0, None)\n"
        "print(sorted(m for m in ('torch', 'zarr', 'h5py', 'ray') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
