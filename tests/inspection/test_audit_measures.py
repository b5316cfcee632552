"""The audit scan's fast paths (:mod:`rlds_cli.inspection.audit`) against the plain
definitions they replace: the groups of episodes, the row-wise ``all``.
That every measure is unchanged end to end is :mod:`tests.inspection.test_audit`'s part."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli.inspection.audit import CONTEXT, _all_columns, _groups


def _groups_one_by_one(lengths: np.ndarray, max_rows: int) -> list[list[tuple[int, int, int, int]]]:
    """The grouping rule, one episode at a time: whole episodes while their steps fit, a longer
    one alone in pieces of ``max_rows`` (each with up to CONTEXT steps before it)."""
    out: list[list[tuple[int, int, int, int]]] = []
    rows: list[tuple[int, int, int, int]] = []
    total = 0
    for v, n in enumerate(lengths.tolist()):
        if n > max_rows:
            if rows:
                out.append(rows)
                rows, total = [], 0
            out.extend([[(v, a, min(n, a + max_rows), min(a, CONTEXT))] for a in range(0, n, max_rows)])
            continue
        if total + n > max_rows and rows:
            out.append(rows)
            rows, total = [], 0
        rows.append((v, 0, n, 0))
        total += n
    if rows:
        out.append(rows)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_groups_are_the_rule_one_episode_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 1, 3, 7, 20, 49, 50, 51, 130], size=300).astype(np.int64)
    positions = rng.permutation(300).astype(np.int64)
    lens_by_pos = np.zeros(300, np.int64)
    lens_by_pos[positions] = lengths
    got = [
        [(int(v), int(a), int(b), int(c)) for v, a, b, c in zip(g.view, g.a, g.b, g.ctx, strict=True)]
        for g in _groups(lengths, positions, lens_by_pos, 50)
    ]
    assert got == _groups_one_by_one(lengths, 50)
    for g in _groups(lengths, positions, lens_by_pos, 50):
        assert (g.pos == positions[g.view]).all()
        assert (g.ends == (g.b == lengths[g.view])).all()


def test_no_episodes_no_groups() -> None:
    empty = np.zeros(0, np.int64)
    assert list(_groups(empty, empty, empty, 50)) == []


@pytest.mark.parametrize("columns", [0, 1, 6, 17])
def test_all_columns_is_numpys_all_along_rows(columns: int) -> None:
    c = np.random.default_rng(columns).random((500, columns)) < 0.97
    c[::7] = True  # rows where every column holds
    assert (_all_columns(c) == c.all(axis=1)).all()
