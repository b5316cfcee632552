"""Every sampler of the package against the shared contract (:mod:`rlds_cli.testing.contracts`)."""

from __future__ import annotations

from rlds_cli.loader import EpochSampler, PrioritizedSampler, PrioritizedSliceSampler, SliceSampler
from rlds_cli.loader.factory import make_sampler
from rlds_cli.loader.protocols import Prioritized, Sampler
from rlds_cli.loader.samplers import Episodes, UniformSampler
from rlds_cli.testing.contracts import EpochalContract, PrioritizedContract, SamplerContract


class TestUniformSampler(SamplerContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return UniformSampler(episodes.num_steps, 8, seed, rank=rank, world_size=world_size)


class TestSliceSampler(SamplerContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return SliceSampler(episodes.lengths, 3, 5, seed=seed, rank=rank, world_size=world_size)


class TestSliceSamplerSkippingShortEpisodes(SamplerContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return SliceSampler(episodes.lengths, 2, 6, short="skip", seed=seed, rank=rank, world_size=world_size)


class TestEpochSampler(EpochalContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return EpochSampler(episodes.num_steps, 7, seed, rank=rank, world_size=world_size)


class TestPrioritizedSampler(PrioritizedContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return PrioritizedSampler(episodes.num_steps, 8, seed=seed, rank=rank, world_size=world_size)


class TestPrioritizedSamplerNumpyKernels(PrioritizedContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return PrioritizedSampler(
            episodes.num_steps, 8, seed=seed, rank=rank, world_size=world_size, compiled=False, fanout=2
        )


class TestPrioritizedSliceSampler(SamplerContract):
    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return PrioritizedSliceSampler(episodes.lengths, 2, 4, seed=seed, rank=rank, world_size=world_size)

    def test_is_prioritized(self, episodes: Episodes) -> None:
        assert isinstance(self.make(episodes, 0), Prioritized)


class TestSamplersMadeByName(SamplerContract):
    """``make_sampler`` (what ``Loader(name, sampler="slice", ...)`` calls) gives the same kind."""

    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        return make_sampler("slice", episodes, 12, seed, rank=rank, world_size=world_size, slice_len=4)
