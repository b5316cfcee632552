"""Gen-DGRL (Procgen) trajectories: a ``.tar.xz`` of one ``.npy`` or ``.npz`` file per trajectory,
streamed member by member, never unpacked to disk.

:mod:`~rlds_cli.formats.gen_dgrl.files`: the layout, ``sniff``, ``source_files``, the level seed,
archive members streamed within the archive limits, one trajectory file read;
:mod:`~rlds_cli.formats.gen_dgrl.reader`: :class:`GenDGRLReader`, its options and the rules.
"""

from __future__ import annotations

from rlds_cli.formats.gen_dgrl.files import (
    MAX_MEMBER_BYTES,
    REQUIRED_KEYS,
    TAR_SUFFIXES,
    TRAJECTORY_SUFFIXES,
    sniff,
    source_files,
)
from rlds_cli.formats.gen_dgrl.reader import (
    RULES,
    GenDGRLOptions,
    GenDGRLReader,
    Trajectory,
    trajectory_episodes,
)

__all__ = [
    "MAX_MEMBER_BYTES",
    "REQUIRED_KEYS",
    "RULES",
    "TAR_SUFFIXES",
    "TRAJECTORY_SUFFIXES",
    "GenDGRLOptions",
    "GenDGRLReader",
    "Trajectory",
    "sniff",
    "source_files",
    "trajectory_episodes",
]
