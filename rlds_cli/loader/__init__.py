"""The loader library: batches of TED transitions from the cache, as torch tensors.

This is the first version: a uniform sampler with reproducible state and a
:class:`Loader` front door. Further samplers plug in through the same ``sample()`` interface.
"""

from rlds_cli.loader.loader import Loader
from rlds_cli.loader.samplers import UniformSampler

__all__ = ["Loader", "UniformSampler"]
