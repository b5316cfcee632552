"""V-D4RL (pixel DeepMind Control, Lu et al., 2022): Dreamer ``.npz`` episodes and drqbc ``.hdf5``
shards, streamed into TED with the dataset's one-step action/reward shift applied.

:mod:`~rlds_cli.formats.vd4rl.files`: the two layouts, ``sniff``, ``source_files``, the files
opened and checked;
:mod:`~rlds_cli.formats.vd4rl.reader`: :class:`VD4RLReader`, its options and the rules.
"""

from __future__ import annotations

from rlds_cli.formats.base import BLOCK_BYTES
from rlds_cli.formats.vd4rl.files import (
    HDF5_CONSUMED,
    HDF5_REQUIRED,
    NPZ_FLAGS,
    NPZ_REQUIRED,
    PIXEL_KEYS,
    sniff,
    source_files,
)
from rlds_cli.formats.vd4rl.reader import IMAGE_LAYOUTS, RULES, VD4RLOptions, VD4RLReader

__all__ = [
    "BLOCK_BYTES",
    "HDF5_CONSUMED",
    "HDF5_REQUIRED",
    "IMAGE_LAYOUTS",
    "NPZ_FLAGS",
    "NPZ_REQUIRED",
    "PIXEL_KEYS",
    "RULES",
    "VD4RLOptions",
    "VD4RLReader",
    "sniff",
    "source_files",
]
