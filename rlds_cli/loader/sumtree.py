"""A vectorized wide sum tree in numpy, for prioritized sampling.

Leaves are grouped in rows of ``fanout`` (default 32), those rows in rows of ``fanout``, and so
on until at most :data:`ROOT_MAX` rows remain under a *wide root* of prefix sums (10^6 leaves: rows
of 31,250 and 977 under a root of 977), since a numpy call costs ~1 us whatever its size and a
binary tree over 10^6 leaves is 20 levels deep.

A descent, for all draws at once: one ``searchsorted`` in the root (on sorted draws), then per
level one ``(batch, fanout + 1)`` gather of inclusive prefix rows (after a leading 0), a compare
and an ``argmin``. Leaf prefix rows are not stored (the drawn rows' leaves are summed on the fly),
so an update writes none. Row prefix sums use ``torch.cumsum`` (several times faster than numpy's
37 us for 256 rows of 32; both add left to right in float64: same sums). Cost is
O(batch * fanout * levels + ROOT_MAX), flat in the size.

Guarantees: every row is recomputed from its children (never by differences), so sums never
drift; prefix rows never decrease, so a child of mass 0 is never drawn; a draw pushed past a
node's end by rounding falls back to its last child with mass. With numba,
:mod:`rlds_cli.loader._sumtree_numba` gives the same tree and draws, bit for bit, in about half
the time.

The smallest priority (for importance weights) is kept without a min tree: it is recomputed
lazily, in one pass over the leaves, only when an update changes the leaf holding it and sets no
value at or below it (rare in prioritized replay: that leaf is the least likely drawn).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, cast

import numpy as np
import torch

from rlds_cli import settings

#: Widest root: levels of rows are added until at most this many rows remain. The root's prefix
#: array is recomputed at every update (``np.cumsum``, ~3 ns a value); one more level would cost
#: every update and descent several calls.
ROOT_MAX = 2048


def compiled_kernels() -> ModuleType | None:
    """The compiled kernels (numba), or None when numba is not installed or
    ``RLDS_NUMBA=0`` turns them off. Imported on first use: numba takes ~0.3 s to import."""
    if not settings.numba_enabled():
        return None
    try:
        import rlds_cli.loader._sumtree_numba as kernels
    except ImportError:
        return None
    return kernels


def _cumsum_rows(mass: np.ndarray) -> np.ndarray:
    """Inclusive prefix sums along the rows of a 2-D float64 array (sequential, as numpy's)."""
    return torch.cumsum(torch.from_numpy(mass), 1).numpy()


class SumTree:
    """Priorities of ``size`` items; draws items with probability proportional to them.

    Args:
        size: Number of leaves.
        fanout: Children per node below the root (the root has up to :data:`ROOT_MAX`).
        compiled: Use the compiled kernels (numba): True requires them, False never uses them,
            None (default) uses them when available. Both give bit-identical trees and draws;
            the compiled one takes about half the time.

    A tree pickles as its priorities; the levels are rebuilt on load.
    """

    def __init__(self, size: int, fanout: int = 32, *, compiled: bool | None = None) -> None:
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        if fanout < 2:
            raise ValueError(f"fanout must be at least 2, got {fanout}")
        self.size = int(size)
        self.fanout = f = int(fanout)
        # Row counts per level, bottom-up (level 0: rows of leaves). A level below another is
        # padded with zero-mass rows to whole groups of ``f``.
        rows = [-(-self.size // f)]
        while rows[-1] > ROOT_MAX:
            rows[-1] = -(-rows[-1] // f) * f
            rows.append(rows[-1] // f)
        self.depth = len(rows)  # levels of rows below the root
        self._leaves = np.zeros(rows[0] * f, np.float64)
        # _totals[k]: the mass of each row of level k; contiguous because they are gathered as the
        # children of level k + 1 (a strided take costs 30 us, a contiguous one 2). Levels and
        # prefix rows are views of flat arrays, which the compiled kernels take with offsets.
        self._tot_off = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._totals_flat = np.zeros(int(self._tot_off[-1]), np.float64)
        bounds = zip(self._tot_off[:-1], self._tot_off[1:], strict=True)
        self._totals = [self._totals_flat[a:b] for a, b in bounds]
        # _children[k]: the masses of the children of level k's rows, as a (rows, f) view
        self._children = [a.reshape(-1, f) for a in [self._leaves, *self._totals[:-1]]]
        # _prefix[k][r] (k >= 1; None for level 0): 0, then the inclusive prefix sums of
        # _children[k][r]. The leading 0 makes "mass before child j" a plain gather at column j.
        prefix_sizes = [0] + [r * (f + 1) for r in rows[1:]]
        self._pref_off = np.concatenate([[0], np.cumsum(prefix_sizes)]).astype(np.int64)
        self._prefix_flat = np.zeros(int(self._pref_off[-1]), np.float64)
        self._prefix: list[np.ndarray | None] = [None]
        self._prefix += [
            self._prefix_flat[self._pref_off[k] : self._pref_off[k + 1]].reshape(rows[k], f + 1)
            for k in range(1, self.depth)
        ]
        self._top = self._totals[-1]  # the root's children
        # the root: 0, then the inclusive prefix sums of _top
        self._root = np.zeros(rows[-1] + 1, np.float64)
        self._root_ends = self._root[1:]  # view: the inclusive sums alone, for searchsorted
        # (n, arange(n) * (f + 1)): each draw's row start in a gathered block, cached per size
        self._starts = (0, np.zeros(0, np.int64))
        self._min = np.inf  # smallest positive leaf, valid unless _min_stale
        self._min_at = -1
        self._min_stale = False
        self._kernels = compiled_kernels() if compiled is not False else None
        # the tree as the compiled kernels take it (every array is updated in place)
        self._kernel_tree = (
            self._leaves, self._totals_flat, self._tot_off, self._prefix_flat, self._pref_off,
            self._root, self.depth, self.fanout,
        )  # fmt: skip
        if compiled and self._kernels is None:
            raise ImportError("SumTree(compiled=True) needs numba (pip install numba) and RLDS_NUMBA unset")

    def __getstate__(self) -> dict[str, object]:
        leaves = self.leaves.copy()
        return {"size": self.size, "fanout": self.fanout, "compiled": self.compiled, "leaves": leaves}

    def __setstate__(self, state: dict[str, Any]) -> None:
        compiled = None if state["compiled"] else False
        type(self).__init__(self, state["size"], state["fanout"], compiled=compiled)
        self.set_all(state["leaves"])

    @property
    def compiled(self) -> bool:
        """Whether this tree runs the compiled kernels."""
        return self._kernels is not None

    @property
    def kernels(self) -> ModuleType | None:
        """The compiled kernels this tree runs (:func:`compiled_kernels`), or None."""
        return self._kernels

    @property
    def leaves(self) -> np.ndarray:
        """The priorities (a read-only view of the first ``size`` leaves)."""
        view = self._leaves[: self.size]
        view.flags.writeable = False
        return view

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._root[-1])

    @property
    def min(self) -> float:
        """Smallest positive priority (``inf`` when every priority is 0)."""
        if self._min_stale:
            leaves = self._leaves[: self.size]
            positive = np.where(leaves > 0, leaves, np.inf)
            self._min_at = int(np.argmin(positive))
            self._min = float(positive[self._min_at])
            self._min_stale = False
        return self._min

    @staticmethod
    def _check(val: np.ndarray) -> int:
        """Raise unless every value is finite and >= 0; return where the smallest is."""
        at = int(val.argmin())  # argmin stops at a NaN, which then fails the comparison
        if not (val[at] >= 0 and val.max() < np.inf):
            raise ValueError("priorities must be finite and >= 0")
        return at

    def set(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set the priorities of ``indices`` (for duplicates the last one wins) and fix the tree.

        Items with priority 0 are never drawn and do not count toward :attr:`min`.
        """
        idx = np.asarray(indices, np.int64)
        val = np.asarray(values, np.float64)
        # np.broadcast_to is a Python function costing as much as a small update's checks
        val = (val if val.shape == idx.shape else np.broadcast_to(val, idx.shape)).ravel()
        idx = idx.ravel()
        if idx.size == 0:
            return
        if self._kernels is not None:
            self._set_compiled(idx, val)
            return
        if idx.view(np.uint64).max() >= self.size:  # one pass: negative indices wrap to >= 2^63
            raise IndexError(f"priority index out of range [0, {self.size})")
        at = self._check(val)
        self._leaves[idx] = val
        self._rebuild(idx // self.fanout)
        if not self._min_stale:
            self._update_min(idx, val, at)

    def _set_compiled(self, idx: np.ndarray, val: np.ndarray) -> None:
        """:meth:`set` with the compiled kernels (the same checks, tree and minimum)."""
        kernels = self._kernels
        assert kernels is not None
        # (``ravel`` made both C-contiguous; the checks run before anything is written)
        at = kernels.check_and_set(idx, val, self.size, *self._kernel_tree)
        if at == -1:
            raise IndexError(f"priority index out of range [0, {self.size})")
        if at == -2:
            raise ValueError("priorities must be finite and >= 0")
        if not self._min_stale:
            self._update_min(idx, val, at)

    def _update_min(self, idx: np.ndarray, val: np.ndarray, at: int) -> None:
        """Keep :attr:`min` exact after ``leaves[idx] = val`` (``val[at]`` is the smallest value),
        or mark it stale when only a pass over every leaf can tell."""
        if val[at] > 0 and self._leaves[idx[at]] == val[at]:
            # usual case: the batch's smallest value is positive and not overwritten by a duplicate
            low, low_at = float(val[at]), int(idx[at])
        else:  # zeros, or duplicates: look at the values that were kept
            now = self._leaves.take(idx)
            positive = np.where(now > 0, now, np.inf)
            i = int(np.argmin(positive))
            low, low_at = float(positive[i]), int(idx[i])
        if self._min_at >= 0 and self._leaves[self._min_at] != self._min:
            # The leaf that held the minimum changed: every other leaf is >= the old minimum, so
            # a batch value at or below it is the new minimum; otherwise recompute lazily.
            if low <= self._min:
                self._min, self._min_at = low, low_at
            else:
                self._min_stale = True
        elif low < self._min:
            self._min, self._min_at = low, low_at

    def set_all(self, values: np.ndarray) -> None:
        """Set every priority at once (``size`` values), rebuilding the whole tree."""
        val = np.asarray(values, np.float64)
        if val.shape != (self.size,):
            raise ValueError(f"expected {self.size} priorities, got shape {val.shape}")
        self._check(val)
        self._leaves[: self.size] = val
        self._leaves[self.size :] = 0
        self._rebuild(None)
        self._min_stale = True

    def _rebuild(self, nodes: np.ndarray | None) -> None:
        """Recompute the totals (and prefix rows) of ``nodes`` (level-0 row numbers, duplicates
        allowed; ``None``: all) and of their ancestors from their children, then the root."""
        for k in range(self.depth):
            if nodes is None:
                mass = self._children[k]  # fewer rows than level k has when it is padded
                at: slice | np.ndarray = slice(0, len(mass))
            else:
                if k:
                    nodes = nodes // self.fanout
                # duplicates recompute to the same result: cheaper than deduplicating per level
                mass = self._children[k].take(nodes, axis=0)
                at = nodes
            prefix = _cumsum_rows(mass)
            row_prefix = self._prefix[k]
            if row_prefix is not None:
                row_prefix[at, 1:] = prefix
            self._totals[k][at] = prefix[:, -1]
        self._top.cumsum(out=self._root_ends)

    def _last_with_mass(self, mass: np.ndarray) -> np.ndarray:
        """Column of the last positive value of each row of ``mass`` (``f - 1`` if none)."""
        return mass.shape[1] - 1 - np.argmax(mass[:, ::-1] > 0, axis=1)

    def draw(self, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The leaf where each prefix ``mass`` (values in ``[0, total)``) falls, and its priority."""
        return self._descend(np.array(mass, np.float64, copy=True).ravel())

    def _descend(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`draw` for a 1-D float64 ``u``, which it overwrites."""
        f, n = self.fanout, len(u)
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if self._kernels is not None:
            leaf, priority = np.empty(n, np.int64), np.empty(n, np.float64)
            self._kernels.descend(u, *self._kernel_tree, leaf, priority)
            return leaf, priority
        if self._starts[0] != n:
            self._starts = (n, np.arange(n, dtype=np.int64) * (f + 1))
        prefix_starts = self._starts[1]
        # root: child j holds u when root[j] <= u < root[j + 1]; u >= total (rounding): last child
        # with mass. Sorted keys make the search's branches predictable: 12 us instead of 18 for
        # 256 draws over 1,000 rows, argsort included.
        order = u.argsort()
        sorted_u = u.take(order)
        node = np.empty(n, np.int64)
        node[order] = self._root_ends.searchsorted(sorted_u, side="right")  # (method: no wrapper)
        if sorted_u[-1] >= self._root[-1]:  # the largest draw is the last one once sorted
            with_mass = np.flatnonzero(self._top > 0)
            node[node >= len(self._top)] = with_mass[-1] if with_mass.size else len(self._top) - 1
        u -= self._root.take(node)
        for k in range(self.depth - 1, 0, -1):
            rows = cast(np.ndarray, self._prefix[k]).take(node, axis=0)  # (n, f + 1); None only at k = 0
            # rows never decrease: argmin finds the first prefix above u (j + 1 for child j), or 0
            # when rounding pushed u past the row's end: then the last child with mass
            j = (rows <= u[:, None]).argmin(axis=1)
            if j.min() == 0:
                over = j == 0
                j[over] = 1 + self._last_with_mass(np.diff(rows[over], axis=1))
            j -= 1
            u -= rows.reshape(-1).take(prefix_starts + j)
            node = node * f + j
        # leaves: no stored prefix rows; sum the gathered priorities here
        rows = self._children[0].take(node, axis=0)  # (n, f)
        prefix = _cumsum_rows(rows)
        j = (prefix <= u[:, None]).argmin(axis=1)
        over = prefix[:, -1] <= u
        if over.any():
            j[over] = self._last_with_mass(rows[over])
        leaf = node * f + j
        return leaf, self._leaves.take(leaf)  # rows just gathered: in cache

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The leaf where each prefix ``mass`` (values in ``[0, total)``) falls."""
        return self.draw(mass)[0]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` leaves with probability proportional to their priority."""
        return self.sample_with_priority(rng, n)[0]

    def sample_with_priority(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` leaves as :meth:`sample` does, with their priorities."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample: every priority is 0")
        u = rng.random(n)
        u *= total
        return self._descend(u)
