"""The local worker processes of ``rlds preprocess`` (``rlds_cli.preprocess.pool``): chunks
claimed by the coordinator and the spawned workers, the workers' thread limits, a worker that
dies, and no process left behind (the workers' light import is in ``test_imports``).

The functions below run in the worker processes (imported as ``tests.preprocess.test_preprocess_pool``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli import preprocess
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import FunctionImportError, PreprocessError, UserFunctionError
from rlds_cli.preprocess.pool import THREAD_VARIABLES
from tests.dataset_fixtures import make_dataset
from tests.waits import HANG_SECONDS

HERE = "tests.preprocess.test_preprocess_pool"
REPO = Path(__file__).resolve().parents[2]


#: The folder where a worker leaves a mark when it takes a chunk (set per test, inherited by the
#: spawned workers).
MARKS = "POOL_TEST_MARKS"


def _in_worker() -> bool:
    return multiprocessing.parent_process() is not None


def _a_worker_takes_a_chunk(batch: Any) -> None:
    """In a worker: leave a mark. In the coordinator, for a chunk after step 0 (not schema
    inference, nor its first chunk): wait for a worker's mark, so that both run chunks whatever
    the machine's speed (the mark ends the wait; the deadline only bounds a hang)."""
    marks = Path(os.environ[MARKS])
    if _in_worker():
        (marks / str(os.getpid())).touch()
        return
    if batch["index"][0] == 0:
        return
    deadline = time.monotonic() + HANG_SECONDS
    while not any(marks.iterdir()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no worker took a chunk in {HANG_SECONDS:.0f} s: a hang")
        time.sleep(0.01)


def worker_facts(batch: Any) -> Any:
    """Records, per step, the process that ran the chunk and the thread limits it started with
    (-1: unset)."""
    _a_worker_takes_a_chunk(batch)
    out = dict(batch)
    rows = len(batch["index"])
    out["pid"] = np.full((rows, 1), os.getpid(), np.int64)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        out[name.lower()] = np.full((rows, 1), int(os.environ.get(name, "-1")), np.int64)
    return out


def dies_in_a_worker(batch: Any) -> Any:
    """Killed like the out-of-memory killer would, in a spawned worker only."""
    _a_worker_takes_a_chunk(batch)
    if _in_worker():
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


def exits_in_a_worker(batch: Any) -> Any:
    """Ends its spawned worker with exit code 0 (os._exit: no error, no traceback)."""
    _a_worker_takes_a_chunk(batch)
    if _in_worker():
        os._exit(0)
    return batch


class _Unconvertible:
    """An output value numpy cannot convert: the error is raised by rlds's own code, after the
    user's function has returned (so it is not a UserFunctionError)."""

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise LookupError("this value refuses to become an array")  # no conversion error rlds words


def bad_output_in_a_worker(batch: Any) -> Any:
    _a_worker_takes_a_chunk(batch)
    out = dict(batch)
    if _in_worker():
        out["observation"] = _Unconvertible()
    return out


@pytest.fixture(autouse=True)
def no_thread_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def marks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty folder for the workers' marks (:func:`_a_worker_takes_a_chunk`)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(MARKS, str(marks))


def test_coordinator_and_worker_share_the_chunks_with_thread_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user: kept
    make_dataset("src", [10] * 20)  # 200 steps: 20 chunks of 10
    preprocess.run("src", f"{HERE}:worker_facts", "out", workers=2, chunk_steps=10)
    out = open_dataset("out")[:]
    pid = out["pid"][:, 0]
    mine = pid == os.getpid()
    assert mine.any() and (~mine).any() and len(np.unique(pid[~mine])) == 1
    assert np.array_equal(out["observation"], open_dataset("src")[:]["observation"])
    expected = max(1, (os.cpu_count() or 1) // 2)  # the cores, shared by 2 processes
    assert set(out["openblas_num_threads"][~mine, 0]) == {expected}
    assert set(out["omp_num_threads"][~mine, 0]) == {3}
    assert set(out["openblas_num_threads"][mine, 0]) == {-1}  # this process is left alone
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["OMP_NUM_THREADS"] == "3"
    assert multiprocessing.active_children() == []


def test_a_worker_killed_in_a_chunk_stops_the_job_and_names_the_chunk(isolated_cache: Path) -> None:
    make_dataset("src", [10] * 20)
    with pytest.raises(
        PreprocessError, match=r"a worker process died in chunk \d+ \(steps \d+-\d+\)"
    ) as info:
        preprocess.run("src", f"{HERE}:dies_in_a_worker", "out", workers=2, chunk_steps=10)
    assert "(exit code -9)" in info.value.message and "out of memory" in info.value.hint
    assert not (isolated_cache / "datasets" / "out").exists()
    assert multiprocessing.active_children() == []


def test_a_worker_that_exits_without_an_error_is_not_said_to_have_a_traceback(isolated_cache: Path) -> None:
    """Exit code 0 was reported with "its traceback is printed above": there was none."""
    make_dataset("src", [10] * 20)
    with pytest.raises(PreprocessError, match=r"\(exit code 0\)") as info:
        preprocess.run("src", f"{HERE}:exits_in_a_worker", "out", workers=2, chunk_steps=10)
    assert "traceback" not in info.value.hint and "without an error" in info.value.hint
    assert multiprocessing.active_children() == []


def test_an_unexpected_error_in_a_worker_is_reported_with_its_chunk(
    isolated_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_dataset("src", [10] * 20)
    caplog.set_level("DEBUG", logger="rlds_cli.preprocess.job")
    with pytest.raises(PreprocessError) as info:
        preprocess.run("src", f"{HERE}:bad_output_in_a_worker", "out", workers=2, chunk_steps=10)
    message = str(getattr(info.value, "message", info.value))
    assert "this value refuses to become an array" in message, message
    assert "exit code" not in message  # reported by the worker, which did not die
    assert "__array__" in caplog.text  # the worker's traceback, logged for -vv
    assert not (isolated_cache / "datasets" / "out").exists()
    assert multiprocessing.active_children() == []


def test_no_process_is_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    make_dataset("src", [7, 13, 1, 20, 9, 30, 4])
    with pytest.raises(UserFunctionError, match="boom in user code"):  # a chunk fails
        preprocess.run("src", "tests.preprocess_fns:raises", "out", workers=2, chunk_steps=16)
    assert multiprocessing.active_children() == []
    with pytest.raises(FunctionImportError):  # before the lock: the workers are starting up
        preprocess.run("src", "tests.preprocess_fns:no_such_function", "out", workers=2, chunk_steps=16)
    assert multiprocessing.active_children() == []
    first = preprocess.run("src", "tests.preprocess_fns:normalize", "out", workers=2, chunk_steps=16)
    terminated: list[int | None] = []
    terminate = multiprocessing.process.BaseProcess.terminate

    def spy(proc: multiprocessing.process.BaseProcess) -> None:
        terminated.append(proc.pid)
        terminate(proc)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate", spy)
    again = preprocess.run("src", "tests.preprocess_fns:normalize", "out", workers=2, chunk_steps=16)
    assert again.reused and not first.reused
    assert len(terminated) == 1  # the unused worker was terminated, not awaited while it imports
    assert multiprocessing.active_children() == []


def test_a_function_that_cannot_be_sent_to_workers_is_one_clear_error(isolated_cache: Path) -> None:
    """A lambda with workers=2 raised a raw PicklingError from the pool's pipe."""
    make_dataset("src", [10] * 4)
    with pytest.raises(FunctionImportError, match="cannot be sent to worker processes") as info:
        preprocess.run("src", lambda b: b, "out", workers=2, chunk_steps=10)
    assert "workers=1" in (info.value.hint or "")
    assert not (isolated_cache / "datasets" / "out").exists()
    assert not list((isolated_cache / "tmp").glob("out.job-*"))  # refused before the job's folder
    assert preprocess.run("src", lambda b: b, "out", workers=1, chunk_steps=10).manifest.num_steps == 40
