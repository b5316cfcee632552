"""Padded slice sampling (``sampler="slice", padded=...``) against AMAGO's rule, written out.

AMAGO (``amago/loading.py``, ``RLData.random_slice(length, padded_sampling)``) draws the start of
a ``length``-step window in a trajectory of ``L`` steps as::

    safe_randrange = lambda lo, hi: random.randrange(lo, max(hi, lo + 1))
    if L <= length:            start = 0
    elif mode == "none":       start = safe_randrange(0, L - length + 1)
    elif mode == "both":       start = safe_randrange(-length + 1, L - 1)
    elif mode == "left":       start = safe_randrange(-length + 1, L - length + 1)
    elif mode == "right":      start = safe_randrange(0, L - 1)

then keeps steps ``max(start, 0) .. min(start + length, L) - 1`` and pads the sequence at its end.
:func:`amago_starts` is that statement, one episode at a time; the sampler's start table
(``start_distribution()``) must equal it exactly, its draws must map one to one onto that table,
every start must come up, and every drawn window must hold exactly the statement's steps.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlds_cli.loader import Loader, SliceSampler
from tests.loader_fixtures import make_ted

MODES = ("none", "both", "left", "right")


def amago_starts(length_of_episode: int, length: int, mode: str) -> list[int]:
    """AMAGO's candidate starts for one trajectory (each equally likely), as its code reads."""

    def safe_range(lo: int, hi: int) -> range:
        return range(lo, max(hi, lo + 1))

    n = length_of_episode
    if n <= length:
        return [0]
    return list(
        {
            "none": safe_range(0, n - length + 1),
            "both": safe_range(-length + 1, n - 1),
            "left": safe_range(-length + 1, n - length + 1),
            "right": safe_range(0, n - 1),
        }[mode]
    )


def statement_table(
    lengths: list[int], length: int, mode: str, weight: str, short: str
) -> dict[tuple[int, int], Fraction]:
    """``{(episode, start): probability}``: ``weight="episodes"`` picks an episode uniformly (as
    AMAGO picks a trajectory file), then a start; ``"steps"`` makes every (episode, start) pair
    equally likely. ``short="skip"`` leaves out episodes shorter than ``length``."""
    eligible = [e for e, n in enumerate(lengths) if not (short == "skip" and n < length)]
    pairs = {e: amago_starts(lengths[e], length, mode) for e in eligible}
    total = sum(len(s) for s in pairs.values())
    table = {}
    for e, starts in pairs.items():
        for s in starts:
            p = Fraction(1, len(eligible) * len(starts)) if weight == "episodes" else Fraction(1, total)
            table[(e, s)] = p
    return table


def window_statement(ep_start: int, n: int, s: int, length: int) -> tuple[list[int], list[bool]]:
    """The window's global indices and mask: steps ``max(s,0) .. min(s+length, n)-1`` first, then
    the last of them repeated with mask False."""
    steps = list(range(max(s, 0), min(s + length, n)))
    pad = length - len(steps)
    return [ep_start + t for t in steps + [steps[-1]] * pad], [True] * len(steps) + [False] * pad


def recover_start(first: int, count: int, n: int, length: int) -> int:
    """A window's start from its first step (relative) and valid count (see window_statement)."""
    if n > length and first == 0 and count < length:
        return count - length  # cut at the episode's start
    return first


class _Counter:
    """A stand-in generator whose raw words are 0, 1, 2, ...: ``sample(total)`` then draws window
    ``k`` for every ``k`` exactly once."""

    class bit_generator:
        @staticmethod
        def random_raw(n: int) -> np.ndarray:
            return np.arange(n, dtype=np.uint64)


LENGTH_LISTS = st.lists(st.integers(1, 14), min_size=1, max_size=7)


@settings(max_examples=80, deadline=None)
@given(
    lengths=LENGTH_LISTS,
    length=st.integers(1, 8),
    mode=st.sampled_from(MODES),
    weight=st.sampled_from(("steps", "episodes")),
    short=st.sampled_from(("pad", "skip")),
)
def test_start_table_is_amagos_rule(
    lengths: list[int], length: int, mode: str, weight: str, short: str
) -> None:
    want = statement_table(lengths, length, mode, weight, short)
    if not want:
        with pytest.raises(ValueError, match="nothing to sample"):
            SliceSampler(np.array(lengths), 2, length, padded=mode, weight=weight, short=short, seed=0)
        return
    sampler = SliceSampler(np.array(lengths), 2, length, padded=mode, weight=weight, short=short, seed=0)
    e, s, p = sampler.start_distribution()
    got = {(int(a), int(b)): float(c) for a, b, c in zip(e, s, p, strict=True)}
    assert len(got) == len(e)  # no start listed twice
    assert set(got) == set(want)
    for key, prob in want.items():
        assert got[key] == pytest.approx(float(prob), rel=1e-12, abs=0), key
    assert sum(want.values()) == 1


@settings(max_examples=60, deadline=None)
@given(lengths=LENGTH_LISTS, length=st.integers(1, 8), mode=st.sampled_from(MODES))
def test_draws_map_one_to_one_onto_the_table_and_hold_the_statements_steps(
    lengths: list[int], length: int, mode: str
) -> None:
    """weight="steps": raw words 0..total-1 give every window exactly once (so each has
    probability 1/total, the table's), each window exactly as the statement says."""
    sampler = SliceSampler(np.array(lengths), 1, length, padded=mode, seed=0)
    table = statement_table(lengths, length, mode, "steps", "pad")
    sampler._rng = _Counter()  # type: ignore[assignment]
    draw = sampler.sample(len(table))
    ep_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    seen = []
    for idx, mask in zip(draw.indices.tolist(), draw.extras["mask"].tolist(), strict=True):
        e = int(np.searchsorted(np.cumsum(lengths), idx[0], side="right"))
        n, first = lengths[e], idx[0] - int(ep_starts[e])
        s = recover_start(first, sum(mask), n, length)
        assert (idx, mask) == window_statement(int(ep_starts[e]), n, s, length)
        seen.append((e, s))
    assert sorted(seen) == sorted(table)  # each start once: no duplicates, none missing


@pytest.mark.parametrize(("mode", "weight"), list(itertools.product(MODES, ("steps", "episodes"))))
def test_every_start_is_reachable_and_slices_stay_in_their_episode(mode: str, weight: str) -> None:
    lengths = [1, 3, 4, 9, 2, 6]
    length = 4
    sampler = SliceSampler(np.array(lengths), 64, length, padded=mode, weight=weight, seed=3)
    table = statement_table(lengths, length, mode, weight, "pad")
    cum = np.cumsum(lengths)
    ep_starts = cum - lengths
    seen: set[tuple[int, int]] = set()
    for _ in range(200):
        draw = sampler.sample()
        idx, mask = draw.indices, draw.extras["mask"]
        episode = np.searchsorted(cum, idx, side="right")
        assert (episode == episode[:, :1]).all()  # never crosses an episode's end
        assert mask[:, 0].all() and (np.diff(mask.astype(int), axis=1) <= 0).all()  # valid first
        for row, m, e in zip(idx.tolist(), mask.tolist(), episode[:, 0].tolist(), strict=True):
            s = recover_start(row[0] - int(ep_starts[e]), sum(m), lengths[e], length)
            assert (row, m) == window_statement(int(ep_starts[e]), lengths[e], s, length)
            seen.add((e, s))
    assert seen == set(table)


def test_loader_padded_slices_and_resume(tmp_path: Path) -> None:
    ds = make_ted(tmp_path, "pad", [2, 9, 5, 12])
    loader = Loader(ds, batch_size=12, sampler="slice", slice_len=4, padded="left", seed=1, prefetch=2)
    first = [loader.sample() for _ in range(3)]
    state = loader.state_dict()
    rest = [loader.sample() for _ in range(4)]
    again = Loader(ds, batch_size=12, sampler="slice", slice_len=4, padded="left", seed=1)
    again.load_state_dict(state)
    for a, b in zip(rest, [again.sample() for _ in range(4)], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert (a[key] == b[key]).all(), key
    batch = first[0]
    assert batch["index"].shape == batch["mask"].shape == (3, 4)
    # observation[0] is the step index in this fixture: padded rows repeat the last valid one
    obs = batch["observation"][..., 0].numpy()
    np.testing.assert_array_equal(obs, batch["index"].numpy().astype(np.float32))


def test_padded_option_errors() -> None:
    with pytest.raises(
        ValueError, match="padded must be one of 'none', 'both', 'left', 'right'; got 'middle'"
    ):
        SliceSampler(np.array([5]), 1, 2, padded="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start_aligned=True and padded='both' contradict"):
        SliceSampler(np.array([5]), 1, 2, padded="both", start_aligned=True)
    with pytest.raises(ValueError, match="slice_len=4 is longer than 1 episode"):
        SliceSampler(np.array([3, 9]), 1, 4, padded="right", short="error")
    skip = SliceSampler(np.array([3, 9]), 1, 4, padded="both", short="skip", seed=0)
    assert skip.skipped_episodes == 1 and set(skip.start_distribution()[0].tolist()) == {1}
    with pytest.raises(ValueError, match="sampler 'uniform' has no option"):
        from rlds_cli.loader import make_sampler
        from rlds_cli.loader.samplers import Episodes

        make_sampler("uniform", Episodes(np.array([4])), 2, 0, padded="left")
