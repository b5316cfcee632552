"""A vectorized wide sum tree in numpy, for prioritized sampling.

A binary tree over 10^6 leaves is 20 levels deep, and a numpy call costs about a microsecond
whatever its size, so descending it one level per call is slow. This tree has a fan-out of
``fanout`` (default 32): 10^6 leaves need 4 levels. Each internal node stores the *inclusive
prefix sums* of its children's masses, so a descent step is one ``(batch, fanout)`` gather and one
compare-and-count, and an update recomputes one ``cumsum`` row per touched node and level. Cost
is O(batch * fanout * log_fanout(size)) in a few numpy calls per level, flat in the size.

Every row is recomputed from its children (never updated by differences), so sums never drift
however many updates happen. A draw that rounding pushes past a node's end falls back to that
node's last child with mass, so a leaf with priority 0 is never drawn.

The smallest priority (for importance weights) is kept without a min tree: an update can only
lower it, except when it changes the leaf that holds it; only then is it recomputed, lazily, with
one pass over the leaves. In prioritized replay that leaf is the least likely to be drawn (and
so updated), which makes the pass rare, while a min tree would cost every update a second
rebuild.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Priorities of ``size`` items; draws items with probability proportional to them.

    Args:
        size: Number of leaves.
        fanout: Children per internal node.
    """

    def __init__(self, size: int, fanout: int = 32) -> None:
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        if fanout < 2:
            raise ValueError(f"fanout must be at least 2, got {fanout}")
        self.size = int(size)
        self.fanout = f = int(fanout)
        # Rows of prefix sums per level, bottom-up; each level but the top is padded to whole
        # groups of ``f`` rows (zero mass), so the level above always gathers full groups.
        rows = [-(-self.size // f)]
        while rows[-1] > 1:
            rows[-1] = -(-rows[-1] // f) * f
            rows.append(rows[-1] // f)
        self.depth = len(rows)
        self._leaves = np.zeros(rows[0] * f, np.float64)
        # _prefix[k][r]: 0, then the inclusive prefix sums of the masses of row r's ``f`` children
        # (level 0: the leaves); _prefix[-1] is the root's single row. The leading 0 makes "mass
        # before child j" a plain gather at column j (no masking for j == 0).
        self._prefix = [np.zeros((r, f + 1), np.float64) for r in rows]
        # flat offsets, inside a parent's group of rows, of each child row's total (last column)
        self._child_totals = np.arange(f) * (f + 1) + f
        self._min = np.inf  # smallest positive leaf, valid unless _min_stale
        self._min_at = -1
        self._min_stale = False

    @property
    def leaves(self) -> np.ndarray:
        """The priorities (a read-only view of the first ``size`` leaves)."""
        view = self._leaves[: self.size]
        view.flags.writeable = False
        return view

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._prefix[-1][0, -1])  # the root row's last prefix

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

    def _check(self, val: np.ndarray) -> None:
        if not np.isfinite(val).all() or (val < 0).any():
            raise ValueError("priorities must be finite and >= 0")

    def set(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set the priorities of ``indices`` (for duplicates the last one wins) and fix the tree.

        Items with priority 0 are never drawn and do not count toward :attr:`min`.
        """
        idx = np.asarray(indices, np.int64).ravel()
        val = np.broadcast_to(np.asarray(values, np.float64), np.shape(indices)).ravel()
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.size:
            raise IndexError(f"priority index out of range [0, {self.size})")
        self._check(val)
        self._leaves[idx] = val
        self._rebuild(idx // self.fanout)
        if not self._min_stale:
            if (idx == self._min_at).any():  # the minimum's own leaf changed: recompute lazily
                self._min_stale = True
            else:
                now = self._leaves.take(idx)  # with duplicates, the value that was kept
                positive = np.where(now > 0, now, np.inf)
                at = int(np.argmin(positive))
                if positive[at] < self._min:
                    self._min, self._min_at = float(positive[at]), int(idx[at])

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
        """Recompute the rows of ``nodes`` (level-0 row numbers; ``None``: all) and their
        ancestors from their children."""
        f = self.fanout
        if nodes is None:
            mass = self._leaves.reshape(-1, f)
            for k in range(self.depth):
                self._prefix[k][: len(mass), 1:] = np.add.accumulate(mass, axis=1)  # rows under padding
                if k + 1 == self.depth:
                    break
                mass = np.ascontiguousarray(self._prefix[k][:, -1]).reshape(-1, f)
            return
        nodes = np.sort(nodes)  # each touched row once (np.unique is slower than sort + compare)
        if len(nodes) > 1:
            nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
        group = f * (f + 1)  # flat size of a parent's f child rows
        mass = self._leaves.reshape(-1, f).take(nodes, axis=0)
        for k in range(self.depth):
            # np.add.accumulate, not np.cumsum: the wrapper costs more than the work on small rows
            self._prefix[k][nodes, 1:] = np.add.accumulate(mass, axis=1)
            if k + 1 == self.depth:
                break
            parents = nodes // f  # sorted, so duplicates are neighbours
            if len(parents) > 1:
                parents = parents[np.concatenate(([True], parents[1:] != parents[:-1]))]
            nodes = parents
            # Only the touched parents' children: a (rows, fanout) gather, never a whole level.
            mass = self._prefix[k].reshape(-1).take(nodes[:, None] * group + self._child_totals)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The leaf where each prefix ``mass`` (values in ``[0, total)``) falls."""
        u = np.array(mass, np.float64, copy=True).reshape(-1, 1)
        f = self.fanout
        node = np.zeros(len(u), np.int64)
        base = np.arange(len(u)) * (f + 1) - 1
        for k in range(self.depth - 1, -1, -1):
            rows = self._prefix[k].take(node, axis=0)  # (n, f + 1), column 0 is 0 <= u
            # j children lie fully before u (prefix[j] <= u < prefix[j + 1]); that child has
            # positive mass. Rounding can push u past the row's end (j == f): then take the last
            # child with mass.
            j = (rows <= u).sum(axis=1) - 1
            if j.max() >= f:
                over = np.flatnonzero(j >= f)
                has_mass = np.diff(rows[over], axis=1) > 0
                j[over] = f - 1 - np.argmax(has_mass[:, ::-1], axis=1)
            u -= rows.reshape(-1).take(base + j + 1)[:, None]
            node = node * f + j
        return node

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` leaves with probability proportional to their priority."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample: every priority is 0")
        return self.find(rng.random(n) * total)
