"""The executors of ``rlds preprocess`` against the shared contract (:mod:`rlds_cli.testing.contracts`).

Ray is left out: starting a local Ray instance takes longer than the whole suite here allows;
``tests/preprocess/test_preprocess_ray.py`` checks it (byte-identical to the local executor)."""

from __future__ import annotations

import pytest

from rlds_cli.errors import PreprocessError
from rlds_cli.preprocess import executors
from rlds_cli.preprocess.executors import InlineExecutor
from rlds_cli.preprocess.pool import LocalPool
from rlds_cli.testing.contracts import ExecutorContract


class TestInlineExecutor(ExecutorContract):
    name = "inline"


class TestLocalExecutor(ExecutorContract):
    name = "local"
    workers = 2


def test_local_with_one_process_is_inline_and_spawns_no_worker() -> None:
    assert isinstance(executors.start("local", workers=1, num_chunks=8), InlineExecutor)
    assert isinstance(executors.start("local", workers=4, num_chunks=1), InlineExecutor)
    pool = executors.start("local", workers=2, num_chunks=8)
    try:
        assert isinstance(pool, LocalPool)
    finally:
        pool.close()


def test_an_unknown_executor_names_the_known_ones() -> None:
    with pytest.raises(PreprocessError, match="unknown executor 'dask'") as info:
        executors.start("dask", workers=None, num_chunks=1)
    assert info.value.hint is not None and "inline, local, ray" in info.value.hint
