"""The block index of the step -> episode lookup (rlds_cli/cache/episodes.py): its answers
are exactly the binary search's, for every integer step, every episode layout, every number of
corrections; it declines where a search serves better; ``Episodes`` uses it only without a table."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli.cache import episodes as episode_lookup
from rlds_cli.cache.episodes import BlockIndex
from rlds_cli.cache.reader import Episodes


def _lengths(kind: str, rng: np.random.Generator) -> np.ndarray:
    episodes = int(rng.integers(16, 600))
    if kind == "same":  # time-limited episodes, the last one cut short
        return np.append(np.full(episodes, int(rng.integers(1, 2000))), int(rng.integers(1, 50)))
    if kind == "short":
        return rng.integers(1, 6, episodes)
    if kind == "mixed":
        return rng.integers(1, 4000, episodes)
    # one long episode among short ones: blocks sized by the shortest
    lengths = rng.integers(40, 60, episodes)
    lengths[episodes // 2] = 100_000
    return lengths


def _steps(n: int, rng: np.random.Generator) -> np.ndarray:
    """Every step of the first 20,000, random ones, and the edges: before 0, the end, far past it."""
    edges = [-(2**40), -7, -1, n - 1, n, n + 1, 2**40]
    return np.concatenate([np.arange(min(n, 20_000)), rng.integers(0, n, 2000), edges]).astype(np.int64)


@pytest.mark.parametrize("kind", ["same", "short", "mixed", "one-long"])
def test_block_index_answers_as_the_binary_search(kind: str) -> None:
    rng = np.random.default_rng(len(kind))
    for _ in range(25):
        episodes = Episodes(_lengths(kind, rng))
        index = episodes.block_index()
        assert index is not None  # at least 16 episodes, blocks no longer than the shortest
        steps = _steps(episodes.num_steps, rng)
        want = np.searchsorted(episodes.ends, steps, side="right")
        got = index.episode_of(steps)
        assert got.dtype == np.int64 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(episodes.episode_of(steps), want)
        # any shape in front, int32 steps
        np.testing.assert_array_equal(
            index.episode_of(steps[:2000].reshape(40, 50)), want[:2000].reshape(40, 50)
        )
        small = steps[np.abs(steps) < 2**31].astype(np.int32)
        np.testing.assert_array_equal(
            episodes.episode_of(small), np.searchsorted(episodes.ends, small, "right")
        )


def test_blocks_longer_than_episodes_correct_several_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block budget too small for blocks of the shortest episode's length: bigger blocks, each
    holding several episode starts, and as many corrections a lookup."""
    monkeypatch.setattr(episode_lookup, "MAX_BLOCKS", 64)
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(40):
        ends = np.cumsum(rng.integers(90, 200, int(rng.integers(16, 200))))
        index = BlockIndex.build(ends)
        if index is None:  # more than MAX_PASSES starts in a block: declined, checked below
            continue
        seen.add(index.passes)
        assert len(index.first) <= 64
        steps = _steps(int(ends[-1]), rng)
        np.testing.assert_array_equal(index.episode_of(steps), np.searchsorted(ends, steps, side="right"))
    assert max(seen) > 1


def test_declines_where_a_search_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    assert BlockIndex.build(np.cumsum(np.full(15, 100))) is None  # a few episodes: the search
    monkeypatch.setattr(episode_lookup, "MAX_BLOCKS", 4)
    ends = np.cumsum(np.ones(1000, np.int64))  # 1000 one-step episodes over 4 blocks
    assert BlockIndex.build(ends) is None
    episodes = Episodes(np.ones(1000, np.int64))
    steps = np.arange(-2, 1003)
    np.testing.assert_array_equal(episodes.episode_of(steps), np.searchsorted(ends, steps, side="right"))
    assert episodes.block_index() is None


def test_index_is_small_and_built_once() -> None:
    episodes = Episodes(np.full(50_000, 1000))  # 50M steps
    index = episodes.block_index()
    assert index is not None and episodes.block_index() is index
    assert index.shift == 9 and index.passes == 1  # 512-step blocks inside 1000-step episodes
    assert len(index.first) == -(-50_000_000 // 512)  # 98k entries, not 50M


def test_a_table_is_used_as_it_was() -> None:
    episodes = Episodes([3, 1, 4] * 10, table=np.int32)
    steps = np.arange(episodes.num_steps)
    out = episodes.episode_of(steps)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.searchsorted(episodes.ends, steps, side="right"))
    assert episodes.block_index() is None  # the table serves: no index is built


def test_unsigned_and_non_array_steps_take_the_search() -> None:
    episodes = Episodes(np.full(40, 10))
    steps = np.array([0, 9, 10, 399, 400], np.uint64)
    np.testing.assert_array_equal(episodes.episode_of(steps), [0, 0, 1, 39, 40])
    assert int(episodes.episode_of(np.int64(25))) == 2
