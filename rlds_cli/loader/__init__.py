"""The loader library: batches of TED transitions from the cache, as torch tensors.

The front door is :class:`Loader`; samplers, transforms, mixtures and the ``torch.utils.data``
adapters are importable from here too. See ``docs/loader.md``.

Public names are imported lazily, so importing a numpy-only submodule (e.g.
``rlds_cli.loader.samplers``) does not import torch; a name that needs torch checks for it first
(:func:`require_torch`: one clear error naming what to install).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlds_cli._util.lazy import lazy_names
from rlds_cli.errors import MissingExtraError

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
    from rlds_cli.loader.prioritized import PrioritizedSampler, PrioritizedSliceSampler, SumTree
    from rlds_cli.loader.samplers import Draw, Episodes, SliceSampler, UniformSampler
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
    "SumTree": "prioritized",
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


#: What to do when torch is missing.
INSTALL_TORCH = "install PyTorch first: pip install torch (any 2.x from 2.3 on), then run the command again"


def require_torch() -> None:
    """Import torch, or raise :class:`~rlds_cli.errors.MissingExtraError` (an ``ImportError``)
    saying it is not installed, or installed but broken (e.g. a CUDA library it cannot load).
    torch is not a dependency of rlds-cli (its build depends on the machine)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "torch").split(".")[0] != "torch":  # torch found, one of its own imports not
            raise _broken(exc) from exc
        raise MissingExtraError(
            "the rlds loader needs torch, which is not installed", hint=INSTALL_TORCH
        ) from None
    except ImportError as exc:
        raise _broken(exc) from exc


def _broken(exc: ImportError) -> MissingExtraError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return MissingExtraError(
        f"torch is installed but cannot be imported: {first}",
        hint="reinstall PyTorch for this machine (pip install --force-reinstall torch); "
        "RLDS_DEBUG=1 shows the full traceback",
    )


def _torch_first(module: str) -> None:
    if module.rsplit(".", 1)[-1] not in _TORCH_FREE:
        require_torch()


__getattr__, __dir__ = lazy_names(
    __name__, {k: "." + v for k, v in _LAZY.items()}, globals(), __all__, before=_torch_first
)
