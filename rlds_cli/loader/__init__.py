"""The loader library: batches of TED transitions from the cache, as torch tensors.

The front door is :class:`Loader`; samplers, transforms, mixtures and the ``torch.utils.data``
adapters are importable from here too. See ``docs/loader.md``.

Public names are imported lazily, so importing a numpy-only submodule (e.g.
``rlds_cli.loader.samplers``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlds_cli._util.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from rlds_cli.loader.block_shuffle import BlockSampler
    from rlds_cli.loader.data_loader import TedDataLoader
    from rlds_cli.loader.epoch import EpochSampler, merge_states
    from rlds_cli.loader.factory import make_sampler
    from rlds_cli.loader.image_transforms import CenterCrop, ColorJitter, RandomCrop, RandomShift, Resize
    from rlds_cli.loader.loader import Loader
    from rlds_cli.loader.mixture import MixtureLoader, MixtureSource
    from rlds_cli.loader.mixture_sampler import MixtureSampler, by_size
    from rlds_cli.loader.normalization_table import NormalizationTable
    from rlds_cli.loader.prioritized import PrioritizedSampler, PrioritizedSliceSampler
    from rlds_cli.loader.samplers import Draw, Episodes, SliceSampler, UniformSampler
    from rlds_cli.loader.sumtree import SumTree
    from rlds_cli.loader.tensors import to_tensordict, to_torch
    from rlds_cli.loader.torch_data import (
        EpochBatchSampler,
        TedIterableDataset,
        TedMapDataset,
        collate_ted,
    )
    from rlds_cli.loader.transforms import FrameStack, Normalize, NStepReturn, compute_stats
    from rlds_cli.loader.windows import Windows

#: Public name -> the submodule that defines it.
_LAZY = {
    "Draw": "samplers",
    "Episodes": "samplers",
    "SliceSampler": "samplers",
    "UniformSampler": "samplers",
    "EpochSampler": "epoch",
    "BlockSampler": "block_shuffle",
    "merge_states": "epoch",
    "FrameStack": "transforms",
    "NStepReturn": "transforms",
    "Normalize": "transforms",
    "compute_stats": "transforms",
    "Resize": "image_transforms",
    "CenterCrop": "image_transforms",
    "RandomCrop": "image_transforms",
    "RandomShift": "image_transforms",
    "ColorJitter": "image_transforms",
    "Windows": "windows",
    "make_sampler": "factory",
    "Loader": "loader",
    "to_tensordict": "tensors",
    "to_torch": "tensors",
    "MixtureLoader": "mixture",
    "MixtureSampler": "mixture_sampler",
    "MixtureSource": "mixture",
    "NormalizationTable": "normalization_table",
    "by_size": "mixture_sampler",
    "PrioritizedSampler": "prioritized",
    "PrioritizedSliceSampler": "prioritized",
    "SumTree": "sumtree",
    "EpochBatchSampler": "torch_data",
    "TedDataLoader": "data_loader",
    "TedIterableDataset": "torch_data",
    "TedMapDataset": "torch_data",
    "collate_ted": "torch_data",
}

#: Submodules that import without torch; every other one imports it, so torch is checked first
#: and a missing or broken install is one error saying what to install.
_TORCH_FREE = frozenset(
    {
        "samplers",
        "epoch",
        "block_shuffle",
        "transforms",
        "windows",
        "normalization_table",
        "mixture_sampler",
    }
)

__all__ = [
    "BlockSampler",
    "CenterCrop",
    "ColorJitter",
    "Draw",
    "Episodes",
    "EpochBatchSampler",
    "EpochSampler",
    "FrameStack",
    "Loader",
    "MixtureLoader",
    "MixtureSampler",
    "MixtureSource",
    "NStepReturn",
    "NormalizationTable",
    "Normalize",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomCrop",
    "RandomShift",
    "Resize",
    "SliceSampler",
    "SumTree",
    "TedDataLoader",
    "TedIterableDataset",
    "TedMapDataset",
    "UniformSampler",
    "Windows",
    "by_size",
    "collate_ted",
    "compute_stats",
    "make_sampler",
    "merge_states",
    "to_tensordict",
    "to_torch",
]


def _torch_first(module: str) -> None:
    if module.rsplit(".", 1)[-1] not in _TORCH_FREE:
        from rlds_cli.loader.requires import require_torch

        require_torch()


__getattr__, __dir__ = lazy_names(
    __name__, {k: "." + v for k, v in _LAZY.items()}, globals(), __all__, before=_torch_first
)
