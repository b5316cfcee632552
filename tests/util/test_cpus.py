"""usable_cpus: the affinity mask where there is one, else the machine's count."""

from __future__ import annotations

import os

import pytest

from rlds_cli._util import cpus


def test_the_affinity_mask_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert cpus.usable_cpus() == 3


def test_without_an_affinity_mask_the_machine_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cpus.usable_cpus() == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert cpus.usable_cpus() == 6


def test_every_pool_sized_to_the_machine_counts_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process pinned to 3 of 16 CPUs (taskset, a container's cpuset, a scheduler's slot) sizes
    its pools to 3: the preprocess pool, the parallel format readers."""
    from rlds_cli.formats.folders import MIN_PARALLEL_BYTES, default_workers
    from rlds_cli.preprocess.executors import InlineExecutor
    from rlds_cli.preprocess.pool import LocalPool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_workers(10, MIN_PARALLEL_BYTES) == 3
    made: list[int] = []
    monkeypatch.setattr(LocalPool, "__init__", lambda self, procs, preload=None: made.append(procs))
    LocalPool.for_job(workers=None, num_chunks=10)
    assert made == [2]  # the coordinator is the third
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4}, raising=False)
    assert isinstance(LocalPool.for_job(workers=None, num_chunks=10), InlineExecutor)
