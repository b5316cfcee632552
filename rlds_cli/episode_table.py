"""Each episode of a dataset as one row of a table: :meth:`Dataset.episode_table`.

One table for every kind of dataset (converted, a view, growing, read at a URL), built from what
the dataset already holds: the starts and lengths from its episode index (``Dataset.episodes``,
never a pass over the steps), the returns from one pass over ``next/reward`` in bounded blocks
(:func:`rlds_cli.summary.episode_returns`), the reset seeds where they were recorded (by rlds,
on every step: read at each episode's first step; by Minari, kept per episode in the source
arrays at conversion, a view's taken from its parent), and the environment the dataset records.
Every column is of one view: a growing dataset's as of the commit-log position it holds (taken
again after ``refresh()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.integrity import damage_hint
from rlds_cli.cache.layout import VIEW_LAYOUT, entry_name
from rlds_cli.cache.views import ViewSpec
from rlds_cli.errors import CorruptDatasetError
from rlds_cli.recording.episode import episode_seed_columns
from rlds_cli.summary import episode_returns

if TYPE_CHECKING:
    from rlds_cli.envspec import RecordedEnvSpec

#: Per-episode source arrays holding a reset seed, as readers name them (``<format>/episode_seed``
#: with ``<format>/episode_seed_present``; see :mod:`rlds_cli.formats.select`).
SEED_ARRAY_SUFFIX = "/episode_seed"


@dataclass(frozen=True)
class EpisodeTable:
    """One row per episode of a dataset, in its order (row ``i`` is ``ds.episode(i)``): numpy
    arrays of one length, plus the environment, which is one for the whole dataset.

    Attributes:
        starts: Each episode's first step (int64): its transitions are ``ds[starts[i] :
            starts[i] + lengths[i]]``.
        lengths: Its steps (int64).
        returns: The sum of its ``next/reward`` (float64).
        source_ids: The source's own id of the episode (int64; its position where the source
            has none).
        seeds: Its reset seed (uint64; 0 where it had none), or ``None`` where the dataset
            records no seeds.
        seed_present: Whether it had a reset seed (bool), or ``None`` with ``seeds``.
        env_spec: The environment every episode was recorded in (``Dataset.env_spec``), or
            ``None`` where the dataset records none.
    """

    starts: np.ndarray
    lengths: np.ndarray
    returns: np.ndarray
    source_ids: np.ndarray
    seeds: np.ndarray | None
    seed_present: np.ndarray | None
    env_spec: RecordedEnvSpec | None

    def __len__(self) -> int:
        return len(self.starts)

    def columns(self) -> dict[str, np.ndarray]:
        """The per-episode arrays by name (the seeds only where recorded), e.g. for
        ``pandas.DataFrame(table.columns())``."""
        names = ("starts", "lengths", "returns", "source_ids", "seeds", "seed_present")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def episode_table(ds: Dataset) -> EpisodeTable:
    """The :class:`EpisodeTable` of ``ds`` (see the module docstring). Cost: one pass over
    ``next/reward``, plus one read of the seed keys at the episodes' first steps where rlds
    recorded them."""
    index = ds.episodes
    seeds = episode_seed_columns(ds)
    if seeds is None:
        seeds = _source_seeds(ds)
    return EpisodeTable(
        starts=np.array(index["start"], np.int64),
        lengths=np.array(index["length"], np.int64),
        returns=episode_returns(ds),
        source_ids=np.array(index["source_id"], np.int64),
        seeds=None if seeds is None else np.asarray(seeds[0], np.uint64),
        seed_present=None if seeds is None else np.asarray(seeds[1], bool),
        env_spec=ds.env_spec,
    )


def _source_seeds(ds: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-episode seeds a conversion kept in the source arrays (a view: its rows of its
    parent's), or ``None``."""
    rows, owner = np.arange(ds.num_episodes), ds
    if ds.manifest.layout == VIEW_LAYOUT:
        ds.column("next/reward")  # checks that the parent is there, the version the view pins
        view = ViewSpec.from_manifest(ds.manifest)
        rows = view.parent_episodes()  # a range, or a selection's episodes (rlds split)
        owner = Dataset(ds.directory.parent / entry_name(view.parent))
    arrays = owner.source_arrays
    for key, seeds in arrays.items():
        present = arrays.get(key + "_present")
        if not key.endswith(SEED_ARRAY_SUFFIX) or present is None:
            continue
        if not len(seeds) == len(present) == owner.num_episodes:
            raise CorruptDatasetError(
                f"dataset {owner.name!r}: source arrays {key!r} and {key + '_present'!r} hold "
                f"{len(seeds)} and {len(present)} rows for {owner.num_episodes} episodes",
                hint=damage_hint(owner.name),
            )
        return np.asarray(seeds)[rows], np.asarray(present)[rows]
    return None
