"""Sampler properties, checked with hypothesis on arrays alone (no dataset needed)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlds_cli.loader import (
    Episodes,
    EpochSampler,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SliceSampler,
    SumTree,
    UniformSampler,
    make_sampler,
)
from rlds_cli.loader.prioritized import compiled_kernels
from rlds_cli.loader.samplers import split_draw

# Sum-tree tests run on both kernels: numpy, and the compiled (numba) one when installed.
KERNELS = [
    pytest.param(False, id="numpy"),
    pytest.param(
        True,
        id="numba",
        marks=pytest.mark.skipif(compiled_kernels() is None, reason="numba not installed (a broken install)"),
    ),
]

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
lengths_st = st.lists(st.integers(1, 40), min_size=1, max_size=25)


def _episode_of(lengths: list[int], idx: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(lengths), idx, side="right")


def _stream(sampler: object, n: int = 4) -> list[list[int]]:
    return [np.asarray(split_draw(sampler.sample())[0]).tolist() for _ in range(n)]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- slices


@FAST
@given(
    lengths=lengths_st,
    slice_len=st.integers(1, 12),
    weight=st.sampled_from(["steps", "episodes"]),
    aligned=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_slices_never_cross_episode_ends_and_pad_right(
    lengths: list[int], slice_len: int, weight: str, aligned: bool, seed: int
) -> None:
    sampler = SliceSampler(
        lengths, 16, slice_len, short="pad", weight=weight, start_aligned=aligned, seed=seed
    )  # type: ignore[arg-type]
    idx, extras = split_draw(sampler.sample())
    mask = extras["mask"]
    assert idx.shape == mask.shape == (16, slice_len)
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    ep = _episode_of(lengths, idx[:, 0])
    # every index of a slice is in the episode of its first step
    assert (_episode_of(lengths, idx) == ep[:, None]).all()
    # consecutive real steps, then padding (the last step repeated) only past the episode end
    real = mask.sum(axis=1)
    expect_real = np.minimum(slice_len, ends[ep] - idx[:, 0])
    np.testing.assert_array_equal(real, expect_real)
    assert (mask[:, :-1] >= mask[:, 1:]).all()  # True... then False
    steps = idx[:, :1] + np.arange(slice_len)
    np.testing.assert_array_equal(np.where(mask, idx, steps), steps)
    np.testing.assert_array_equal(np.where(mask, 0, idx), np.where(mask, 0, (ends[ep] - 1)[:, None]))
    # padding only where the episode is shorter than the slice
    short = np.asarray(lengths)[ep] < slice_len
    assert (mask.all(axis=1) | short).all()
    if aligned:
        np.testing.assert_array_equal(idx[:, 0], starts[ep])


@FAST
@given(lengths=lengths_st, slice_len=st.integers(1, 12), seed=st.integers(0, 1000))
def test_slice_skip_policy(lengths: list[int], slice_len: int, seed: int) -> None:
    long_enough = [n >= slice_len for n in lengths]
    if not any(long_enough):
        with pytest.raises(ValueError, match="slice_len"):
            SliceSampler(lengths, 4, slice_len, short="skip", seed=seed)
        return
    sampler = SliceSampler(lengths, 32, slice_len, short="skip", seed=seed)
    assert sampler.skipped_episodes == long_enough.count(False)
    idx, extras = split_draw(sampler.sample())
    assert extras["mask"].all()
    ep = _episode_of(lengths, idx[:, 0])
    assert all(long_enough[e] for e in ep)


def test_slice_error_policy_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"slice_len=5 .* 2 episode\(s\) .* shortest has 3 steps"):
        SliceSampler([10, 3, 4], 2, 5, short="error")
    SliceSampler([10, 5], 2, 5, short="error")  # long enough: fine


def test_slice_weighting_steps_vs_episodes() -> None:
    lengths = [100, 10]
    by_steps = SliceSampler(lengths, 20_000, 5, weight="steps", seed=0)
    ep = _episode_of(lengths, by_steps.sample().indices[:, 0])
    assert abs((ep == 1).mean() - 6 / 102) < 0.01  # 96 and 6 windows
    by_episodes = SliceSampler(lengths, 20_000, 5, weight="episodes", seed=0)
    ep = _episode_of(lengths, by_episodes.sample().indices[:, 0])
    assert abs((ep == 1).mean() - 0.5) < 0.02


def test_slice_windows_uniform_over_starts() -> None:
    sampler = SliceSampler([7], 70_000, 3, seed=1)
    counts = np.bincount(sampler.sample().indices[:, 0], minlength=7)
    assert counts[5:].sum() == 0  # a window never runs past the end
    assert (np.abs(counts[:5] / 70_000 - 0.2) < 0.01).all()


# --------------------------------------------------------------------------- epochs


@FAST
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 64),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_epoch_covers_every_index_once(n: int, batch: int, drop_last: bool, seed: int) -> None:
    if drop_last and batch > n:
        with pytest.raises(ValueError, match="batch_size"):
            EpochSampler(n, batch, seed, drop_last=drop_last)
        return
    sampler = EpochSampler(n, batch, seed, drop_last=drop_last)
    for epoch in range(2):
        seen = [sampler.sample() for _ in range(sampler.batches_per_epoch)]
        assert sampler.epoch == epoch and sampler.epoch_done()
        flat = np.concatenate(seen)
        assert all(len(b) == batch for b in seen[:-1])
        if drop_last:
            assert len(flat) == (n // batch) * batch and len(set(flat.tolist())) == len(flat)
        else:
            assert sorted(flat.tolist()) == list(range(n))
    assert sampler.sample() is not None and sampler.epoch == 2


@FAST
@given(n=st.integers(1, 200), world=st.integers(1, 5), seed=st.integers(0, 1000))
def test_epoch_shards_partition_the_epoch(n: int, world: int, seed: int) -> None:
    shards = [EpochSampler(n, 1000, seed, rank=r, world_size=world) for r in range(world)]
    parts = [s.sample() for s in shards]
    per = -(-n // world)
    assert all(len(p) == per for p in parts)  # equal work per rank
    flat = np.concatenate(parts)
    assert set(flat.tolist()) == set(range(n))
    assert len(flat) - n == per * world - n  # only the padding repeats


def test_epoch_reshuffles_and_no_shuffle_is_in_order() -> None:
    s = EpochSampler(50, 50, seed=3)
    assert s.sample().tolist() != s.sample().tolist()
    assert EpochSampler(10, 4, shuffle=False).sample().tolist() == [0, 1, 2, 3]


# --------------------------------------------------------------------------- prioritized


@pytest.mark.parametrize("compiled", KERNELS)
def test_sum_tree_matches_priorities(compiled: bool) -> None:
    rng = np.random.default_rng(0)
    for size, fanout in [(1, 2), (7, 2), (100, 4), (1000, 32), (5000, 16)]:
        tree = SumTree(size, fanout, compiled=compiled)
        p = rng.random(size) * (rng.random(size) > 0.3)
        p[rng.integers(size)] = 0.5  # at least one positive
        tree.set_all(p)
        assert tree.total == pytest.approx(p.sum())
        assert tree.min == pytest.approx(p[p > 0].min())
        # the leaf found for a prefix mass is the one a cumulative search gives
        u = rng.random(500) * p.sum() * (1 - 1e-12)
        want = np.searchsorted(np.cumsum(p), u, side="right")
        np.testing.assert_array_equal(tree.find(u), want)
        # updates (with duplicates) keep every level right
        idx = rng.integers(0, size, 50)
        val = rng.random(50)
        tree.set(idx, val)
        p[idx] = val  # numpy assignment: the last duplicate wins, as in the tree
        assert tree.total == pytest.approx(p.sum())
        assert tree.min == pytest.approx(p[p > 0].min())
        draws = tree.sample(rng, 2000)
        assert (p[draws] > 0).all()


@settings(max_examples=15, deadline=None)
@given(
    priorities=st.lists(st.just(0.0) | st.floats(1e-3, 10.0), min_size=2, max_size=40).filter(
        lambda p: sum(p) > 0.5
    ),
    alpha=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_prioritized_frequencies_converge(priorities: list[float], alpha: float) -> None:
    n = len(priorities)
    sampler = PrioritizedSampler(n, 4000, alpha=alpha, beta=1.0, eps=0.0, seed=0)
    sampler.update_priority(np.arange(n), np.asarray(priorities))
    draws = np.concatenate([sampler.sample().indices for _ in range(10)])
    p = np.asarray(priorities) ** alpha if alpha else (np.asarray(priorities) > 0).astype(float)
    if alpha == 0.0:
        p = np.ones(n)  # 0 ** 0 == 1: alpha 0 is uniform
    expected = p / p.sum()
    observed = np.bincount(draws, minlength=n) / len(draws)
    assert np.abs(observed - expected).max() < 0.03
    # weights: (P(i) / min P)^-beta, at most 1
    draw = sampler.sample()
    pi = p[draw.indices]
    np.testing.assert_allclose(draw.extras["weight"], (pi / p[p > 0].min()) ** -1.0, rtol=1e-5)
    assert draw.extras["weight"].max() <= 1.0 + 1e-6


@pytest.mark.parametrize("compiled", KERNELS)
def test_prioritized_update_and_new_items_at_max(compiled: bool) -> None:
    s = PrioritizedSampler(6, 10, alpha=1.0, eps=0.0, compiled=compiled)
    np.testing.assert_array_equal(s.priorities, np.ones(6))
    s.update_priority([0, 1], [5.0, 0.0])
    assert s.max_priority == 5.0
    assert 1 not in s.sample(5000).indices  # priority 0: never drawn
    with pytest.raises(ValueError, match="finite"):
        s.update_priority([0], [float("nan")])
    with pytest.raises(IndexError):
        s.update_priority([6], [1.0])


def test_prioritized_slices() -> None:
    lengths = [10, 3, 20]
    s = PrioritizedSliceSampler(lengths, 64, 5, short="skip", alpha=1.0, seed=0)
    assert s.skipped_episodes == 1
    draw = s.sample()
    assert draw.indices.shape == draw.extras["mask"].shape == draw.extras["weight"].shape == (64, 5)
    ep = _episode_of(lengths, draw.indices)
    assert (ep == ep[:, :1]).all() and (ep != 1).all()
    # priorities pull slices toward the hot step (step 25 of episode 2)
    s.update_priority(np.arange(33), np.where(np.arange(33) == 25, 1000.0, 0.001))
    draw = s.sample()
    assert ((draw.indices == 25).any(axis=1)).mean() > 0.9
    s.update_priority(np.arange(10, 13), 1e6)  # the skipped episode stays impossible
    assert (_episode_of(lengths, s.sample().indices) != 1).all()


def test_a_padded_slices_priorities_keep_the_real_steps() -> None:
    """A padded position repeats a real step's index: a masked loss's 0 there, passed as is, was
    written last and replaced the real step's priority (never drawn as an anchor again)."""
    s = PrioritizedSliceSampler([2, 40], 64, 4, short="pad", alpha=1.0, eps=0.0, seed=0)
    draw = s.sample()
    mask = draw.extras["mask"]
    assert not mask.all()  # some windows padded
    td = np.where(mask, -7.0, 0.0)  # signed TD errors, 0 where the loss is masked
    s.update_priority(draw.indices, td)
    real = np.unique(draw.indices[mask])
    np.testing.assert_array_equal(s.priorities[real], 7.0)
    with pytest.raises(ValueError, match="priorities for indices of shape"):
        s.update_priority(draw.indices, np.ones(3))


@pytest.mark.parametrize("compiled", KERNELS)
def test_a_step_drawn_twice_keeps_its_largest_priority_in_any_order(compiled: bool) -> None:
    """A batch drawn with replacement holds some steps twice: the plain sampler kept the last
    value given (the slice sampler the largest in magnitude, as the docs say of both)."""
    s = PrioritizedSampler(8, 4, alpha=1.0, eps=0.0, compiled=compiled)
    s.update_priority([5, 5, 5, 2], [0.1, -3.0, 2.0, 0.5])
    np.testing.assert_array_equal(s.priorities[[2, 5]], [0.5, 3.0])
    s.update_priority(np.array([[1, 1]]), np.array([[4.0, 0.0]]))
    assert s.priorities[1] == 4.0 and s.max_priority == 4.0


# --------------------------------------------------------------------------- streams and state


def _all_samplers(seed: int) -> list[object]:
    lengths = [30, 5, 50, 12]
    return [
        UniformSampler(97, 8, seed),
        EpochSampler(97, 8, seed),
        SliceSampler(lengths, 4, 6, seed=seed),
        SliceSampler(lengths, 4, 6, weight="episodes", seed=seed),
        PrioritizedSampler(97, 8, seed=seed),
        PrioritizedSliceSampler(lengths, 4, 6, seed=seed),
    ]


@FAST
@given(seed=st.integers(0, 2**32 - 1), warmup=st.integers(0, 30))
def test_same_seed_same_stream_and_restore_continues(seed: int, warmup: int) -> None:
    others = _all_samplers(seed + 1)  # restored into samplers seeded differently
    for a, b, fresh in zip(_all_samplers(seed), _all_samplers(seed), others, strict=True):
        assert _stream(a) == _stream(b)
        for _ in range(warmup):
            a.sample()  # type: ignore[attr-defined]
        if hasattr(a, "update_priority"):
            a.update_priority(np.arange(5), np.arange(5) + 1.0)
        state = pickle.loads(pickle.dumps(a.state_dict()))  # type: ignore[attr-defined]
        want = _stream(a, 5)
        fresh.load_state_dict(state)  # type: ignore[attr-defined]
        assert _stream(fresh, 5) == want


def test_different_seeds_differ() -> None:
    for a, b in zip(_all_samplers(1), _all_samplers(2), strict=True):
        assert _stream(a, 3) != _stream(b, 3)


def test_state_from_another_dataset_is_refused() -> None:
    for a, b in [
        (EpochSampler(10, 2), EpochSampler(11, 2)),
        (SliceSampler([5, 5], 2, 2), SliceSampler([5, 6], 2, 2)),
        (PrioritizedSampler(10, 2), PrioritizedSampler(11, 2)),
    ]:
        with pytest.raises(ValueError, match="steps"):
            b.load_state_dict(a.state_dict())


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("bogus", {}, "unknown sampler 'bogus'"),
        ("uniform", {"slice_len": 4}, "no option.*slice_len"),
        ("slice", {}, "slice_len"),
        ("slice", {"slice_len": 0}, "slice_len must be a positive integer"),
        ("slice", {"slice_len": 3}, "batch_size=8 is not a multiple of slice_len=3"),
        ("slice", {"slice_len": 4, "short": "truncate"}, "short must be one of"),
        ("slice", {"slice_len": 4, "weight": "time"}, "weight must be one of"),
        ("slice", {"slice_len": 4, "num_slices": -1}, "num_slices"),
        ("epoch", {"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size=2\)"),
        ("epoch", {"world_size": 0}, "world_size"),
        ("prioritized", {"alpha": -1.0}, "alpha must be"),
        ("prioritized", {"beta": float("nan")}, "beta must be"),
        ("prioritized", {"short": "pad"}, "pass slice_len"),
    ],
)
def test_bad_sampler_arguments_name_the_argument(name: str, options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_sampler(name, Episodes([10, 20]), 8, 0, **options)


def test_bad_batch_sizes() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            make_sampler("uniform", Episodes([10]), bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive lengths"):
        Episodes([3, 0])


@pytest.mark.parametrize("compiled", KERNELS)
@pytest.mark.parametrize(("size", "fanout"), [(200_000, 32), (10_000, 2), (70_001, 8)])
def test_sum_tree_with_levels_below_the_root(size: int, fanout: int, compiled: bool) -> None:
    """Sizes past ROOT_MAX rows: the descent goes through intermediate levels."""
    from rlds_cli.loader.prioritized import ROOT_MAX

    assert -(-size // fanout) > ROOT_MAX
    rng = np.random.default_rng(size)
    tree = SumTree(size, fanout, compiled=compiled)
    p = rng.random(size) * (rng.random(size) > 0.2)
    tree.set_all(p)
    for _ in range(3):
        cumulative = np.cumsum(p)
        u = rng.random(2000) * cumulative[-1] * (1 - 1e-9)
        u[:2] = [0.0, cumulative[-1] * (1 - 1e-15)]  # the edges: first and last leaf with mass
        leaf, priority = tree.draw(u)
        np.testing.assert_array_equal(leaf, np.searchsorted(cumulative, u, side="right"))
        # exactly on a boundary the tree's sums (another order than cumsum's) may round either
        # way: either neighbour is right, as long as it has mass
        k = size // 2
        (at,), _ = tree.draw(np.array([cumulative[k]]))
        assert at in (k, *np.flatnonzero(p[k + 1 :] > 0)[:1] + k + 1) and p[at] > 0
        np.testing.assert_array_equal(priority, p[leaf])
        assert (priority > 0).all()
        # updates with duplicates, including zeroing the smallest positive priority
        idx = np.concatenate([rng.integers(0, size, 300), [int(np.argmin(np.where(p > 0, p, np.inf)))]])
        val = np.concatenate([rng.random(300) * (rng.random(300) > 0.3), [0.0]])
        tree.set(idx, val)
        p[idx] = val
        assert tree.total == pytest.approx(p.sum(), rel=1e-12)
        assert tree.min == p[p > 0].min()
        np.testing.assert_array_equal(tree.leaves, p)


@pytest.mark.parametrize("compiled", KERNELS)
def test_sum_tree_draw_of_nothing_and_sampling_with_priorities(compiled: bool) -> None:
    tree = SumTree(100, 4, compiled=compiled)
    p = np.linspace(0, 1, 100)
    tree.set_all(p)
    leaf, priority = tree.draw(np.zeros(0))
    assert leaf.shape == priority.shape == (0,)
    leaves, priorities = tree.sample_with_priority(np.random.default_rng(0), 5000)
    np.testing.assert_array_equal(priorities, p[leaves])
    assert 0 not in leaves  # priority 0 is never drawn
    tree.set_all(np.zeros(100))
    with pytest.raises(ValueError, match="every priority is 0"):
        tree.sample(np.random.default_rng(0), 1)


@FAST
@given(lengths=st.lists(st.integers(8, 40), min_size=1, max_size=25), seed=st.integers(0, 2**16))
def test_slice_fast_path_draws_what_the_general_one_does(lengths: list[int], seed: int) -> None:
    """When every episode holds a whole slice, the sampler skips the mask and clipping work; its
    draws (indices, mask, stream) are exactly those of the general path."""
    fast = SliceSampler(np.array(lengths), 5, 8, seed=seed)
    general = SliceSampler(np.array(lengths), 5, 8, seed=seed)
    assert fast._all_fit
    general._all_fit = False  # the general path: mask and clipping computed
    for _ in range(3):
        a, b = fast.sample(), general.sample()
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.extras["mask"], b.extras["mask"])
        assert a.indices.dtype == b.indices.dtype == np.int64
