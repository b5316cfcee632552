"""The compiled sum-tree kernels (numba) against the numpy ones.

Both must build the same tree and draw the same leaves, bit for bit: a prioritized run resumed on
a machine without numba continues the same stream.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlds_cli.loader import PrioritizedSampler, PrioritizedSliceSampler, SumTree
from rlds_cli.loader.prioritized import compiled_kernels

needs_numba = pytest.mark.skipif(compiled_kernels() is None, reason="numba not installed (a broken install)")


def _arrays(tree: SumTree) -> list[np.ndarray]:
    return [tree._leaves, tree._totals_flat, tree._prefix_flat, tree._root]


def _assert_same_tree(a: SumTree, b: SumTree) -> None:
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.min == b.min and a.total == b.total


@needs_numba
@pytest.mark.parametrize(
    ("size", "fanout"),
    # roots of 1, 3, 9, 32 (one whole block of 32 sums), 1,250, 1,094 and 196 rows
    [(1, 2), (5, 2), (33, 4), (1024, 32), (10_000, 2), (70_001, 8), (200_000, 32)],
)
def test_compiled_and_numpy_trees_are_bit_identical(size: int, fanout: int) -> None:
    rng = np.random.default_rng(size + fanout)
    fast, slow = SumTree(size, fanout, compiled=True), SumTree(size, fanout, compiled=False)
    assert fast.compiled and not slow.compiled
    p = rng.random(size) * (rng.random(size) > 0.3)
    p[0] = 0.25
    fast.set_all(p)
    slow.set_all(p)
    _assert_same_tree(fast, slow)
    for step in range(12):
        # duplicates, zeros, and (every third step) the current minimum zeroed; batch sizes of
        # every remainder mod 4 (the kernels work on four rows or draws at a time)
        n = 61 + step % 4
        idx = rng.integers(0, size, n)
        val = rng.random(n) * (rng.random(n) > 0.25)
        if step % 3 == 0:
            idx[0], val[0] = int(np.argmin(np.where(slow.leaves > 0, slow.leaves, np.inf))), 0.0
        if not (val > 0).any() and slow.total == 0:
            val[-1] = 1.0
        fast.set(idx, val)
        slow.set(idx, val)
        _assert_same_tree(fast, slow)
        if slow.total == 0:
            continue
        u = rng.random(497 + step % 4) * slow.total
        # the edges: 0, exactly the total, and past it (rounding): the last leaf with mass
        u[:3] = [0.0, slow.total, slow.total * (1 + 1e-12)]
        leaf_fast, pri_fast = fast.draw(u)
        leaf_slow, pri_slow = slow.draw(u)
        np.testing.assert_array_equal(leaf_fast, leaf_slow)
        np.testing.assert_array_equal(pri_fast, pri_slow)
        assert (pri_fast > 0).all()


@needs_numba
def test_compiled_boundaries_match_the_cumulative_search() -> None:
    """Draws exactly on prefix sums land where numpy's cumulative search puts them."""
    p = np.array([0.0, 1.0, 0.0, 0.0, 2.0, 3.0, 0.0, 4.0, 0.0])
    tree = SumTree(len(p), 2, compiled=True)
    tree.set_all(p)
    cumulative = np.cumsum(p)
    u = np.concatenate([[0.0], cumulative, cumulative - 1e-9])
    u = u[u < tree.total]  # at the total itself a draw goes to the last leaf with mass (tested above)
    np.testing.assert_array_equal(tree.find(u), np.searchsorted(cumulative, u, side="right"))


@needs_numba
def test_compiled_bad_updates_change_nothing() -> None:
    tree = SumTree(50, 4, compiled=True)
    tree.set_all(np.linspace(1, 2, 50))
    before = [a.copy() for a in _arrays(tree)]
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        tree.set(np.array([3, 50]), np.array([1.0, 1.0]))
    with pytest.raises(IndexError):
        tree.set(np.array([-1]), np.array([1.0]))
    for bad in (np.nan, -0.5, np.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            tree.set(np.array([1, 2]), np.array([0.5, bad]))
    for x, y in zip(_arrays(tree), before, strict=True):
        np.testing.assert_array_equal(x, y)


@needs_numba
@pytest.mark.parametrize("slices", [False, True])
def test_prioritized_stream_is_the_same_with_either_kernel(slices: bool) -> None:
    """A state saved with the compiled kernels continues the same stream without them."""

    def make(compiled: bool) -> PrioritizedSampler:
        if slices:
            return PrioritizedSliceSampler([40, 3, 70, 25], 6, 5, short="skip", seed=4, compiled=compiled)
        return PrioritizedSampler(300, 16, seed=4, compiled=compiled)

    fast, slow = make(True), make(False)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = fast.sample(), slow.sample()
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.extras["weight"], b.extras["weight"])
        new = rng.random(a.indices.shape) * 3
        fast.update_priority(a.indices, new)
        slow.update_priority(b.indices, new)
    resumed = make(False)
    resumed.load_state_dict(fast.state_dict())
    for _ in range(5):
        np.testing.assert_array_equal(resumed.sample().indices, fast.sample().indices)


@needs_numba
def test_priority_updates_of_every_input_kind_are_the_same_with_either_kernel() -> None:
    """The compiled update turns ``|priority| + eps`` into one pass: the same priorities and the
    same largest priority as numpy's three calls, for every input the sampler takes."""
    fast = PrioritizedSampler(50, 4, seed=1, eps=1e-3, compiled=True)
    slow = PrioritizedSampler(50, 4, seed=1, eps=1e-3, compiled=False)
    idx = np.array([[3, 7], [7, 49]])
    inputs: list[object] = [
        torch.tensor([[-0.5, 2.0], [0.25, -3.0]], dtype=torch.float32),  # negative TD errors, 2-D
        np.array([[1e-9, 0.0], [7.5, -0.0]]),
        [[1, -2], [3, 4]],  # integers
        np.array([[True, False], [False, True]]),
        0.75,  # one value for every index
        np.array([1.0 + 2.0j, 0.5, 3.0j, 1.0]).reshape(2, 2),  # complex: the modulus, as np.abs
        np.array([[2.0, 1.0]], np.float16),  # broadcast along the first axis
    ]
    for value in inputs:
        fast.update_priority(idx, value)
        slow.update_priority(idx, value)
        np.testing.assert_array_equal(fast.priorities, slow.priorities)
        assert fast.max_priority == slow.max_priority
    for bad in (np.nan, np.inf, -np.inf):
        for sampler in (fast, slow):
            before = sampler.priorities.copy()
            with pytest.raises(ValueError, match="finite"):
                sampler.update_priority(idx, np.full(idx.shape, bad))
            np.testing.assert_array_equal(sampler.priorities, before)
    assert fast.max_priority == slow.max_priority == 7.5


def test_compiled_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLDS_NUMBA", "0")
    assert compiled_kernels() is None
    assert not SumTree(10).compiled
    with pytest.raises(ImportError, match=r"needs numba \(pip install numba\)"):
        SumTree(10, compiled=True)


@needs_numba
def test_sampler_by_name_passes_compiled_through() -> None:
    from rlds_cli.loader import Episodes, make_sampler

    episodes = Episodes(np.array([5, 7]))
    assert make_sampler("prioritized", episodes, 4, compiled=True)._tree.compiled
    assert not make_sampler("prioritized", episodes, 4, compiled=False)._tree.compiled
    assert not make_sampler("prioritized", episodes, 4, slice_len=2, compiled=False)._tree.compiled


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_a_pickled_sampler_continues_the_stream(compiled: bool) -> None:
    """Pickling keeps the priorities; the tree's shared views are rebuilt, not copied apart."""
    import pickle

    sampler = PrioritizedSampler(5000, 32, seed=1, compiled=compiled)
    rng = np.random.default_rng(2)
    for _ in range(5):
        draw = sampler.sample()
        sampler.update_priority(draw.indices, rng.random(32) * 4)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._tree.compiled == compiled
    for _ in range(5):
        a, b = sampler.sample(), copy.sample()
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.extras["weight"], b.extras["weight"])
        new = rng.random(32) * 4
        sampler.update_priority(a.indices, new)
        copy.update_priority(b.indices, new)  # updates reach every level of the copy
    _assert_same_tree(sampler._tree, copy._tree)
