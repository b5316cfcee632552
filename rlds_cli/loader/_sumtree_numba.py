"""Compiled kernels for :class:`~rlds_cli.loader.sumtree.SumTree` (the ``fast`` extra: numba).

They walk the same arrays as the tree's numpy code and add in the same order (sequential sums,
left to right, in float64), so both give bit-identical trees and draws: a run resumed on a
machine without numba continues the same stream. What they save is the numpy call overhead and
the temporaries: a descent of 256 draws over 10^6 leaves is ~20 numpy calls over (256, 33)
blocks, here one pass per draw that reads only the rows it needs.

Layout (see ``SumTree``): ``leaves`` (rows of ``f``); ``totals``, every level's row masses one
after another (level ``k`` at ``tot_off[k]:tot_off[k + 1]``); ``prefix``, the prefix rows of the
levels above the leaves (level ``k`` at ``pref_off[k]``, ``f + 1`` values a row, starting with 0;
level 0 has none); ``root``, 0 then the inclusive prefix sums of the top level's totals.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
from numba import njit


class _JitOptions(TypedDict):
    cache: bool
    nogil: bool
    boundscheck: bool


# cache=True: compiled once per machine (a few seconds), then loaded from numba's cache.
_JIT: _JitOptions = {"cache": True, "nogil": True, "boundscheck": False}


@njit(**_JIT)
def _last_with_mass(values: np.ndarray, start: int, count: int) -> int:
    """Offset of the last positive value of ``values[start:start + count]`` (``count - 1`` if none)."""
    for j in range(count - 1, -1, -1):
        if values[start + j] > 0:
            return j
    return count - 1


@njit(**_JIT)
def descend(
    u: np.ndarray,
    leaves: np.ndarray,
    totals: np.ndarray,
    tot_off: np.ndarray,
    prefix: np.ndarray,
    pref_off: np.ndarray,
    root: np.ndarray,
    depth: int,
    f: int,
    out_leaf: np.ndarray,
    out_priority: np.ndarray,
) -> float:
    """The leaf where each prefix mass ``u[i]`` falls, and its priority (``u`` is overwritten).

    Returns a sum of the values it touched ahead, only so the compiler keeps those loads."""
    n = len(u)
    top_rows = len(root) - 1
    top_start = tot_off[depth - 1]
    node = np.empty(n, np.int64)
    for i in range(n):
        x = u[i]
        # root: the number of inclusive sums <= x (searchsorted, side="right")
        lo, m = 0, top_rows
        while m > 0:
            half = m >> 1
            if root[lo + half + 1] <= x:
                lo += half + 1
                m -= half + 1
            else:
                m = half
        if lo >= top_rows:  # past the end (rounding): the last top row with mass
            lo = _last_with_mass(totals, top_start, top_rows)
        u[i] = x - root[lo]
        node[i] = lo
    # Level by level, for all draws: the rows one level reads are known before it starts, so a
    # first pass touches them all (independent loads, which the CPU overlaps) and the second
    # finds the children in rows that are then in cache. The inner loops count instead of
    # breaking at the child found (rows never decrease: the count of prefix sums <= x is the
    # child's column), which keeps them free of data-dependent branches.
    touched = 0.0
    for k in range(depth - 1, 0, -1):
        for i in range(n):
            row = pref_off[k] + node[i] * (f + 1)
            for c in range(0, f + 1, 8):
                touched += prefix[row + c]
        for i in range(n):
            x = u[i]
            row = pref_off[k] + node[i] * (f + 1)
            j = 0
            for c in range(1, f + 1):  # prefix[row] is the leading 0
                j += prefix[row + c] <= x
            if j == f:  # past the row's end: the last child with mass (a positive step)
                j = f - 1
                for jj in range(f - 1, -1, -1):
                    if prefix[row + jj + 1] - prefix[row + jj] > 0:
                        j = jj
                        break
            u[i] = x - prefix[row + j]
            node[i] = node[i] * f + j
    for i in range(n):
        base = node[i] * f
        for c in range(0, f, 8):
            touched += leaves[base + c]
    for i in range(n):
        # leaves: their prefix sums, on the fly; the count of those <= x is the leaf's column
        x = u[i]
        base = node[i] * f
        s = 0.0
        j = 0
        for c in range(f):
            s += leaves[base + c]
            j += s <= x
        if j == f:
            j = _last_with_mass(leaves, base, f)
        out_leaf[i] = base + j
        out_priority[i] = leaves[base + j]
    return touched


@njit(**_JIT)
def check(indices: np.ndarray, values: np.ndarray, size: int) -> int:
    """Where the smallest value is; -1 for an index outside ``[0, size)``, -2 for a value that is
    negative or not finite (NaN included). Nothing is written."""
    at = 0
    for i in range(len(indices)):
        if indices[i] < 0 or indices[i] >= size:
            return -1
    for i in range(len(values)):
        v = values[i]
        if not (v >= 0 and v < np.inf):
            return -2
        if v < values[at]:
            at = i
    return at


@njit(**_JIT)
def set_and_rebuild(
    indices: np.ndarray,
    values: np.ndarray,
    leaves: np.ndarray,
    totals: np.ndarray,
    tot_off: np.ndarray,
    prefix: np.ndarray,
    pref_off: np.ndarray,
    root: np.ndarray,
    depth: int,
    f: int,
) -> None:
    """``leaves[indices] = values`` (the last duplicate wins), then every row above them and the
    root recomputed from their children, level by level."""
    n = len(indices)
    for i in range(n):
        leaves[indices[i]] = values[i]
    nodes = indices // f
    for k in range(depth):
        if k:
            for i in range(n):
                nodes[i] //= f
        start = tot_off[k]
        below = tot_off[k - 1] if k else 0
        for i in range(n):
            node = nodes[i]
            s = 0.0
            if k == 0:
                base = node * f
                for c in range(f):
                    s += leaves[base + c]
            else:
                base = below + node * f
                row = pref_off[k] + node * (f + 1)
                for c in range(f):
                    s += totals[base + c]
                    prefix[row + c + 1] = s
            totals[start + node] = s
    top = tot_off[depth - 1]
    s = 0.0
    for r in range(len(root) - 1):
        s += totals[top + r]
        root[r + 1] = s
