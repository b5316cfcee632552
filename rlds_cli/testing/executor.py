"""The contract every preprocess executor keeps: a base class of tests to subclass.

Subclass, set :attr:`ExecutorContract.name` (a key of :data:`~rlds_cli.preprocess.executors.EXECUTORS`)
and the workers; one test per promise of :class:`rlds_cli.preprocess.executors.Executor`.

Each test runs a real job (``preprocess.run``) with its executor forced to this one and its
``on_done`` watched, on real chunks (:func:`~rlds_cli.preprocess.worker.run_chunk`).

Register your executor and subclass ``ExecutorContract``::

    from rlds_cli.testing.executor import ExecutorContract

    class TestMyExecutor(ExecutorContract):
        name = "mine"  # monkeypatch.setitem(executors.EXECUTORS, "mine", "pkg.mod:MyExecutor")
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli import preprocess
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import DatasetNotFoundError, UserFunctionError
from rlds_cli.preprocess import executors
from rlds_cli.preprocess.executors import Executor, OnDone, Task
from rlds_cli.testing.sources import make_dataset

FNS = "rlds_cli.testing.functions"
#: 120 steps in episodes of mixed lengths: 12 chunks of 10 steps.
LENGTHS = [7, 13, 1, 30, 9, 20, 40]
CHUNK = 10


class _Watched:
    """The executor under test, recording what it hands to ``on_done`` and whether it is closed."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.results: list[dict[str, Any]] = []
        self.tasks: list[Task] = []
        self.closed = False

    def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
        self.tasks = list(tasks)

        def watch(result: dict[str, Any]) -> None:
            self.results.append(result)
            on_done(result)

        self.inner.run(spec, tasks, watch)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class ExecutorContract:
    """Tests every executor passes; subclasses set :attr:`name` (and :attr:`workers`)."""

    #: The executor's name in :data:`~rlds_cli.preprocess.executors.EXECUTORS`.
    name: str
    #: The job's ``workers``.
    workers: int | None = 2

    @pytest.fixture(autouse=True)
    def _own_cache(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each test's datasets in a cache of their own (workers inherit the variable)."""
        monkeypatch.setenv("RLDS_HOME", str(tmp_path / "rlds-home"))

    @pytest.fixture
    def watched(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_Watched]]:
        """Every executor the jobs start: ``self.name``'s, watched."""
        made: list[_Watched] = []
        start = executors.start

        def forced(name: str, **kwargs: Any) -> Executor:
            made.append(_Watched(start(self.name, **kwargs)))
            return made[-1]

        monkeypatch.setattr(executors, "start", forced)
        yield made
        assert all(w.closed for w in made)
        assert multiprocessing.active_children() == []

    def run(self, fn: str, out: str = "out") -> preprocess.PreprocessResult:
        return preprocess.run("src", f"{FNS}:{fn}", out, workers=self.workers, chunk_steps=CHUNK)

    def test_is_an_executor(self, watched: list[_Watched]) -> None:
        make_dataset("src", LENGTHS)
        self.run("identity")
        assert isinstance(watched[0].inner, Executor)

    def test_every_result_is_delivered_exactly_once(self, watched: list[_Watched]) -> None:
        make_dataset("src", LENGTHS)
        result = self.run("normalize")
        (w,) = watched
        delivered = sorted(r["i"] for r in w.results)
        assert delivered == sorted(t[0] for t in w.tasks) == list(range(result.num_chunks))
        assert all(r["ok"] for r in w.results)
        src, out = open_dataset("src")[:], open_dataset("out")[:]
        np.testing.assert_array_equal(out["observation"], (src["observation"] - 1.5) / 2.0)
        np.testing.assert_array_equal(out["next/reward"], src["next/reward"])

    def test_a_failing_user_function_is_reported_with_its_traceback(self, watched: list[_Watched]) -> None:
        make_dataset("src", LENGTHS)
        with pytest.raises(UserFunctionError) as info:
            self.run("raises")
        assert "ValueError: boom in user code" in info.value.message
        assert 'raise ValueError("boom in user code")' in info.value.user_traceback
        assert "executors.py" not in info.value.user_traceback  # rlds's own frames left out
        failed = [r for r in watched[0].results if not r["ok"]]
        assert len(failed) == 1  # the job stopped at the first failure it was told of
        with pytest.raises(DatasetNotFoundError):
            open_dataset("out")  # nothing published

    def test_on_done_raising_stops_the_job(
        self, watched: list[_Watched], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        make_dataset("src", LENGTHS)
        calls: list[int] = []
        start = executors.start

        class Stop(Exception):
            pass

        def stopping(name: str, **kwargs: Any) -> Executor:
            inner = start(name, **kwargs)

            class Stopping:
                def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
                    def once(result: dict[str, Any]) -> None:
                        calls.append(result["i"])
                        raise Stop

                    inner.run(spec, tasks, once)

                def close(self) -> None:
                    inner.close()

            return Stopping()

        monkeypatch.setattr(executors, "start", stopping)
        with pytest.raises(Stop):
            self.run("identity")
        assert len(calls) == 1
