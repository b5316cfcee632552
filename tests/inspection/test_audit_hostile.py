"""The audit on degenerate data: constant episodes, one-step episodes, NaN, inf and float32-max
actions. Right flags, no numpy warning (inf - inf, overflowing squares) under the report."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.ted import StepBlock
from rlds_cli.inspection.audit import audit


def _build(root: Path, name: str, actions: list[np.ndarray]) -> None:
    with DatasetBuilder(name, root=root, frames=None) as builder:
        for a in actions:
            n = len(a)
            truncated = np.zeros((n, 1), bool)
            truncated[-1] = True
            builder.append(
                StepBlock(
                    steps={
                        "action": a.astype(np.float32),
                        "next/reward": np.zeros((n, 1), np.float32),
                        "next/terminated": np.zeros((n, 1), bool),
                        "next/truncated": truncated,
                    },
                    observations={"state": np.arange((n + 1) * 3, dtype=np.float32).reshape(n + 1, 3)},
                    ends=np.array([n - 1]),
                )
            )
        builder.commit(source={"generator": "hostile-audit"})


def _flagged(root: Path, name: str) -> dict[str, list[int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would print under the CLI's report
        report = audit(name, root=root)
    return {k: v.tolist() for k, v in report.flags.items() if len(v)}


def test_constant_episodes(isolated_cache: Path) -> None:
    # states move, actions do not: duplicates only of the whole episode, no IQR division by zero
    _build(isolated_cache, "c", [np.zeros((10, 2))] * 5)
    assert _flagged(isolated_cache, "c") == {"duplicate": [1, 2, 3, 4]}


def test_one_step_episodes(isolated_cache: Path) -> None:
    _build(isolated_cache, "one", [np.full((1, 2), i, np.float32) for i in range(4)])
    assert _flagged(isolated_cache, "one") == {}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_actions(isolated_cache: Path, bad: float) -> None:
    rng = np.random.default_rng(0)
    clean = [rng.uniform(-1, 1, (20, 2)) for _ in range(5)]
    _build(isolated_cache, "n", [np.full((20, 2), bad), *clean])
    assert _flagged(isolated_cache, "n") == {"nonfinite": [0]}


def test_float32_extremes_do_not_warn(isolated_cache: Path) -> None:
    rng = np.random.default_rng(1)
    _build(isolated_cache, "x", [rng.uniform(-3e38, 3e38, (20, 2)) for _ in range(3)])
    assert "nonfinite" not in _flagged(isolated_cache, "x")


def test_a_sparse_reward_tasks_successes_are_no_return_outliers() -> None:
    """80% of episodes return 0 and 20% return 1: the IQR is 0, and a fifth of the episodes is a
    mode of the returns, not a fault; one success in 20 is still rare enough to be flagged."""
    from rlds_cli.inspection.audit import iqr_outliers

    sparse = np.array([0.0] * 16 + [1.0] * 4)
    assert iqr_outliers(sparse, 3.0).tolist() == []
    one_apart = np.array([0.0] * 19 + [1.0])
    assert iqr_outliers(one_apart, 3.0).tolist() == [19]
    lengths = np.array([50.0] * 19 + [500.0])
    assert iqr_outliers(lengths, 3.0).tolist() == [19]
    spread = np.array([10.0, 11, 12, 13, 14, 15, 16, 17, 100])
    assert iqr_outliers(spread, 3.0).tolist() == [8]
