"""Kill ``rlds merge``, ``drop``, ``trim`` and ``downsample`` before each of their steps (see
``tests/faults.py``): the parents stay byte for byte as they were, and the new dataset is either
absent or whole (it opens and passes ``--check``); what a kill leaves in tmp/ goes with ``rlds gc``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache import CacheRoot, DatasetBuilder, open_dataset
from rlds_cli.cache.compose import downsample_dataset, merge_datasets, trim_dataset
from rlds_cli.cache.derive import drop_episodes
from rlds_cli.cache.manage import collect_garbage, remove_dataset
from rlds_cli.cache.ted import StepBlock
from rlds_cli.inspection.validate import check_dataset
from tests.faults import count_steps, kill_at, snapshot

pytestmark = pytest.mark.xdist_group("disk-heavy")


@pytest.fixture(autouse=True)
def durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync on, so the fsync steps are part of what is killed."""
    monkeypatch.setenv("RLDS_FSYNC", "1")


def write(name: str, lengths: tuple[int, ...]) -> None:
    """A small dataset with episodes of ``lengths`` ending terminated."""
    n = sum(lengths)
    ends = np.cumsum(lengths) - 1
    term = np.zeros(n, bool)
    term[ends] = True
    block = StepBlock(
        steps={
            "action": np.arange(n, dtype=np.float32)[:, None],
            "next/reward": np.arange(n, dtype=np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(n, bool),
        },
        observations={"observation": np.arange((n + len(lengths)) * 2, dtype=np.float32).reshape(-1, 2)},
        ends=ends,
    )
    with DatasetBuilder(name) as builder:
        builder.append(block)
        builder.commit()


def parents_bytes(names: tuple[str, ...]) -> dict[str, dict[str, bytes]]:
    return {n: snapshot(CacheRoot().dataset_dir(n)) for n in names}


@pytest.mark.parametrize(
    ("op", "episodes"),
    [
        ("merge", 5),
        ("drop", 2),  # of the merged dataset: a composed selection
        ("trim", 3),
        ("downsample", 5),
    ],
)
def test_a_kill_at_any_step_leaves_the_parents_and_nothing_half_published(op: str, episodes: int) -> None:
    write("a", (3, 4, 2))
    write("b", (5, 1))
    parents: tuple[str, ...] = ("a", "b")
    if op != "merge":
        merge_datasets(["a", "b"], "m")
        parents = ("a", "b", "m")
    operations: dict[str, Callable[[], Any]] = {
        "merge": lambda: merge_datasets(["a", "b"], "new"),
        "drop": lambda: drop_episodes("m", [0, 2, 4], "new"),
        "trim": lambda: trim_dataset("m", "new", start=1, end=1),
        "downsample": lambda: downsample_dataset("m", "new", 2),
    }
    operation = operations[op]
    before = parents_bytes(parents)
    assert count_steps(operation) > 3
    cache = CacheRoot()
    if cache.exists("new"):
        remove_dataset(cache, "new", force=True)
    k, published = 1, 0
    while (where := kill_at(operation, k)) is not None:
        assert parents_bytes(parents) == before, where
        if cache.exists("new"):  # published whole before the kill
            published += 1
            ds = open_dataset("new")
            assert ds.num_episodes == episodes and check_dataset(ds).ok, where
            remove_dataset(cache, "new", force=True)
        collect_garbage(cache)
        tmp = cache.tmp_dir
        assert not (tmp.is_dir() and sorted(p.name for p in Path(tmp).iterdir())), where
        k += 1
    assert k > 3 and published < k - 1  # most kills came before the publish
