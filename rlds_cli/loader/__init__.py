"""The loader library: batches of TED transitions from the cache, as torch tensors.

The front door is :class:`Loader`; samplers, transforms, mixtures and the ``torch.utils.data``
adapters are importable from here too. See ``docs/loader.md``.
"""

# first: without torch, this says what to install (every module below imports torch)
from rlds_cli.loader import _requires  # noqa: F401
from rlds_cli.loader.epoch import EpochSampler
from rlds_cli.loader.factory import make_sampler
from rlds_cli.loader.loader import Loader, to_tensordict, to_torch
from rlds_cli.loader.mixture import MixtureLoader
from rlds_cli.loader.prioritized import PrioritizedSampler, PrioritizedSliceSampler
from rlds_cli.loader.samplers import Draw, Episodes, SliceSampler, UniformSampler
from rlds_cli.loader.sumtree import SumTree
from rlds_cli.loader.torch_data import (
    EpochBatchSampler,
    TedDataLoader,
    TedIterableDataset,
    TedMapDataset,
    collate_ted,
)
from rlds_cli.loader.transforms import FrameStack, Normalize, NStepReturn, compute_stats

__all__ = [
    "Draw",
    "Episodes",
    "EpochBatchSampler",
    "EpochSampler",
    "FrameStack",
    "Loader",
    "MixtureLoader",
    "NStepReturn",
    "Normalize",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "SliceSampler",
    "SumTree",
    "TedDataLoader",
    "TedIterableDataset",
    "TedMapDataset",
    "UniformSampler",
    "collate_ted",
    "compute_stats",
    "make_sampler",
    "to_tensordict",
    "to_torch",
]
