"""The contract every sampler keeps: a base class of tests to subclass.

Subclass and implement :meth:`SamplerContract.make`; one test per promise of
:mod:`rlds_cli.loader.protocols`.

Subclass ``SamplerContract`` in a ``test_*.py`` file::

    class TestMySampler(SamplerContract):
        def make(self, episodes, seed, rank=0, world_size=1):
            return MySampler(episodes.num_steps, 8, seed, rank=rank, world_size=world_size)
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.protocols import Checkpointable, Epochal, Prioritized, Sampler
from rlds_cli.loader.samplers import Draw, Episodes

#: Episodes of mixed lengths, one of a single step: 62 steps.
LENGTHS = (9, 1, 17, 4, 23, 8)


def indices(draw: Any) -> np.ndarray:
    """The step indices of a draw (masked-out padding left out)."""
    if isinstance(draw, Draw):
        idx = np.asarray(draw.indices)
        mask = draw.extras.get("mask")
        return idx[np.asarray(mask, bool)] if mask is not None else idx.ravel()
    return np.asarray(draw).ravel()


def as_arrays(draw: Any) -> dict[str, np.ndarray]:
    """Everything a draw holds, as arrays (to compare two draws exactly)."""
    if isinstance(draw, Draw):
        return {"index": np.asarray(draw.indices), **{k: np.asarray(v) for k, v in draw.extras.items()}}
    return {"index": np.asarray(draw)}


def assert_same_draws(a: list[Any], b: list[Any]) -> None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        ax, ay = as_arrays(x), as_arrays(y)
        assert ax.keys() == ay.keys(), f"draw {i}"
        for key in ax:
            np.testing.assert_array_equal(ax[key], ay[key], err_msg=f"draw {i}, {key}")


class SamplerContract:
    """Tests every sampler passes; subclasses implement :meth:`make`."""

    #: Draws taken by the stream tests.
    DRAWS = 12

    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        raise NotImplementedError

    @pytest.fixture
    def episodes(self) -> Episodes:
        return Episodes(np.array(LENGTHS))

    def draws(self, sampler: Sampler, n: int | None = None) -> list[Any]:
        return [sampler.sample() for _ in range(n or self.DRAWS)]

    def test_is_a_checkpointable_sampler(self, episodes: Episodes) -> None:
        sampler = self.make(episodes, 0)
        assert isinstance(sampler, Sampler) and isinstance(sampler, Checkpointable)

    def test_draws_int64_steps_of_the_dataset(self, episodes: Episodes) -> None:
        for draw in self.draws(self.make(episodes, 1)):
            idx = indices(draw)
            assert idx.dtype == np.int64 and idx.size > 0
            assert idx.min() >= 0 and idx.max() < episodes.num_steps

    def test_the_seed_fixes_the_stream(self, episodes: Episodes) -> None:
        assert_same_draws(self.draws(self.make(episodes, 5)), self.draws(self.make(episodes, 5)))
        a = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 5))])
        b = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 6))])
        assert not np.array_equal(a, b), "another seed, the same stream"

    @pytest.mark.parametrize("after", [0, 1, 5])
    def test_a_restored_state_continues_the_exact_stream(self, episodes: Episodes, after: int) -> None:
        sampler = self.make(episodes, 11)
        if after:
            self.draws(sampler, after)
        assert isinstance(sampler, Checkpointable)
        state = pickle.loads(pickle.dumps(sampler.state_dict()))  # a checkpoint goes through a file
        expected = self.draws(sampler)
        fresh = self.make(episodes, 999)  # another seed: everything must come from the state
        assert isinstance(fresh, Checkpointable)
        fresh.load_state_dict(state)
        assert_same_draws(self.draws(fresh), expected)

    def test_a_state_from_another_rank_or_world_size_is_refused(self, episodes: Episodes) -> None:
        saved = self.make(episodes, 3, rank=1, world_size=2)
        assert isinstance(saved, Checkpointable)
        state = saved.state_dict()
        for rank, world in ((0, 2), (1, 3), (0, 1)):
            other = self.make(episodes, 3, rank=rank, world_size=world)
            assert isinstance(other, Checkpointable)
            with pytest.raises(LoaderStateError):
                other.load_state_dict(state)

    def test_ranks_draw_different_streams(self, episodes: Episodes) -> None:
        a = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 4, rank=0, world_size=2))])
        b = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 4, rank=1, world_size=2))])
        assert not np.array_equal(a, b), "two ranks of one run drew the same stream"


class EpochalContract(SamplerContract):
    """For samplers without replacement: an epoch covers the rank's shard once; the ranks' shards
    are disjoint and cover the dataset."""

    def test_is_epochal(self, episodes: Episodes) -> None:
        assert isinstance(self.make(episodes, 0), Epochal)

    def test_ranks_cover_every_step_once_per_epoch(self, episodes: Episodes) -> None:
        seen: list[np.ndarray] = []
        for rank in range(2):
            sampler = self.make(episodes, 8, rank=rank, world_size=2)
            assert isinstance(sampler, Epochal)
            mine = [indices(sampler.sample()) for _ in range(sampler.batches_per_epoch)]
            assert sampler.epoch_done()
            seen.append(np.concatenate(mine))
        assert not set(seen[0].tolist()) & set(seen[1].tolist()), "two ranks drew the same step"
        assert sorted(np.concatenate(seen).tolist()) == list(range(episodes.num_steps))


class PrioritizedContract(SamplerContract):
    """For prioritized samplers: a step whose priority is set to zero is never drawn again."""

    def test_zero_priority_is_never_drawn(self, episodes: Episodes) -> None:
        sampler = self.make(episodes, 2)
        assert isinstance(sampler, Prioritized)
        muted = np.arange(0, episodes.num_steps, 2)
        sampler.update_priority(muted, np.zeros(len(muted)))
        drawn = np.concatenate([indices(d) for d in self.draws(sampler)])
        assert not set(drawn.tolist()) & set(muted.tolist())
