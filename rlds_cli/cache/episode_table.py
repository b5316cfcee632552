"""Each episode of a dataset as one row of a table: :attr:`Dataset.episodes`.

Columns, for every kind of dataset (converted, view, growing, remote):

* ``start``, ``length``, ``source_id``, ``final_known``: the episode index (no read);
* ``return``: sum of ``next/reward``, one bounded pass (:func:`episode_returns`);
* ``seed``, ``seed_present``: recorded by rlds per step (``reset_seed``,
  :func:`recorded_seeds`) or kept by a conversion per episode (``<format>/episode_seed``,
  :func:`source_seeds`);
* plus the dataset's ``env_spec``.

Computed columns are made on first use and kept. A table belongs to one view: after a growing
dataset's ``refresh()`` changes the view, a column not yet made raises
:class:`~rlds_cli.errors.DatasetReplacedError`, never one of the new view.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rlds_cli.cache.blocks import Budget, blocks
from rlds_cli.cache.integrity import damage_hint
from rlds_cli.errors import CorruptDatasetError, DatasetReplacedError

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset
    from rlds_cli.cache.env_spec import RecordedEnvSpec

#: Per-step columns of a recording: the episode's reset seed (uint64) and whether it had one
#: (bool), on every step.
SEED_KEY = "reset_seed"
SEED_PRESENT_KEY = "reset_seed_present"
#: Per-episode source arrays holding a reset seed, as readers name them (``<format>/episode_seed``
#: with ``<format>/episode_seed_present``; see :mod:`rlds_cli.formats.select`).
SEED_ARRAY_SUFFIX = "/episode_seed"

T = TypeVar("T")

#: The columns a table makes from the data (on first use), after the index's fields.
RETURN = "return"
SEED = "seed"
SEED_PRESENT = "seed_present"


def episode_returns(ds: Dataset, budget: Budget | None = None) -> np.ndarray:
    """Sum of ``next/reward`` per episode (float64), read in bounded blocks."""
    budget = budget if budget is not None else Budget()
    returns = np.zeros(ds.num_episodes, np.float64)
    bounds = ds.episode_bounds
    for start, chunk in blocks(ds.column("next/reward"), budget, itemsize=8):
        rewards = budget.pool.empty((len(chunk), chunk[0].size), np.float64)
        np.copyto(rewards, chunk.reshape(rewards.shape), casting="unsafe")
        per_step = rewards.sum(axis=1, out=budget.pool.empty((len(chunk),), np.float64))
        e0, e1 = (int(e) for e in bounds.episode_of(np.array([start, start + len(chunk) - 1])))
        # each episode's first step in the block (the first one may have begun before it)
        firsts = np.maximum(bounds.starts[e0 : e1 + 1], start) - start
        returns[e0 : e1 + 1] += np.add.reduceat(per_step, firsts)
    return returns


def recorded_seeds(ds: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """Per episode: the reset seed (uint64; 0 where none) and whether it had one (bool), read
    at its first step; ``None`` without a ``reset_seed`` key."""
    if SEED_KEY not in ds.fields:
        return None
    rows = ds.gather(ds.episode_index["start"], [SEED_KEY, SEED_PRESENT_KEY])
    return np.asarray(rows[SEED_KEY]).reshape(-1), np.asarray(rows[SEED_PRESENT_KEY]).reshape(-1)


def source_seeds(ds: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-episode reset seeds and presence flags from the source arrays (a view: its parent's
    rows), or ``None`` where there are none.

    Raises:
        CorruptDatasetError: The seed arrays do not hold one row per episode.
    """
    rows, owner = np.arange(ds.num_episodes), ds
    parent = ds.view_parent()
    if parent is not None:
        owner, rows = parent
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


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False  # kept and shared by every caller: none may change it
    return values


class EpisodeTable:
    """One row per episode of a dataset, in its order (row ``i`` is ``ds.episode(i)``).

    ``table["length"]``: a column; ``table[["start", "length"]]``: a structured array;
    ``table[i]``: episode ``i`` as a dict; ``"seed" in table``: whether the column exists;
    ``np.asarray(table)``: all columns as one structured array. Columns are read-only.

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
        env_spec: The environment every episode was recorded in, or ``None`` where the
            dataset records none.
    """

    def __init__(self, dataset: Dataset) -> None:
        self._ds = dataset
        self._index = dataset.episode_index  # the view this table is of (see _check_view)
        self._columns: dict[str, np.ndarray] = {}
        self._seeds_found: bool | None = None
        self._env_spec: RecordedEnvSpec | None = None
        self._env_spec_read = False

    # ------------------------------------------------------------------ columns

    @property
    def names(self) -> tuple[str, ...]:
        """The column names: the index's fields, ``return``, and ``seed``/``seed_present``
        where seeds are recorded (finding out reads them)."""
        index_fields = tuple(self._index.dtype.names or ())
        return (*index_fields, RETURN, *((SEED, SEED_PRESENT) if self.seeds is not None else ()))

    def column(self, name: str) -> np.ndarray:
        """The column ``name`` (read-only; made on first use and kept).

        Raises:
            KeyError: The table has no such column.
            DatasetReplacedError: A column not yet made, after a growing dataset's
                ``refresh()`` changed its view.
        """
        values = self._columns.get(name)
        if values is not None:
            return values
        if name in (self._index.dtype.names or ()):
            values = np.array(self._index[name])  # a copy: the index itself is never handed out
        elif name == RETURN:
            values = self._made(episode_returns)
        elif name in (SEED, SEED_PRESENT) and self.seeds is not None:
            return self._columns[name]
        else:
            raise KeyError(
                f"the episodes of dataset {self._ds.name!r} have no column {name!r} "
                f"(they have {', '.join(self.names)})"
            )
        self._columns[name] = _read_only(values)
        return values

    def _made(self, make: Callable[[Dataset], T]) -> T:
        """``make(dataset)``, checked to be of this table's view."""
        self._check_view()
        out = make(self._ds)
        self._check_view()  # a refresh on another thread while it read
        return out

    def _check_view(self) -> None:
        if self._ds.episode_index is not self._index:
            raise DatasetReplacedError(
                f"growing dataset {self._ds.name!r} was refreshed to a new view after this "
                "episode table was taken: its columns would be of another set of episodes",
                hint="take ds.episodes again after refresh()",
            )

    @property
    def starts(self) -> np.ndarray:
        return self.column("start")

    @property
    def lengths(self) -> np.ndarray:
        return self.column("length")

    @property
    def source_ids(self) -> np.ndarray:
        return self.column("source_id")

    @property
    def returns(self) -> np.ndarray:
        return self.column(RETURN)

    @property
    def seeds(self) -> np.ndarray | None:
        if self._seeds_found is None:
            found = self._made(recorded_seeds)
            if found is None:
                found = self._made(source_seeds)
            if found is not None:
                self._columns[SEED] = _read_only(np.asarray(found[0], np.uint64))
                self._columns[SEED_PRESENT] = _read_only(np.asarray(found[1], bool))
            self._seeds_found = found is not None
        return self._columns[SEED] if self._seeds_found else None

    @property
    def seed_present(self) -> np.ndarray | None:
        return self._columns[SEED_PRESENT] if self.seeds is not None else None

    @property
    def env_spec(self) -> RecordedEnvSpec | None:
        if not self._env_spec_read:
            self._env_spec, self._env_spec_read = self._ds.env_spec, True
        return self._env_spec

    def columns(self) -> dict[str, np.ndarray]:
        """Every column by name (:attr:`names`), e.g. for ``pandas.DataFrame(table.columns())``."""
        return {name: self.column(name) for name in self.names}

    # ------------------------------------------------------------------ container

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names

    def __getitem__(self, key: Any) -> Any:
        """A column by name, a structured array of a list of names, or one episode (an int,
        negative from the end) as a dict of its values by column name."""
        if isinstance(key, str):
            return self.column(key)
        if isinstance(key, list) and all(isinstance(k, str) for k in key):
            return self._structured(key)
        try:
            i = operator.index(key)
        except TypeError:
            raise TypeError(
                f"an episode table is indexed by a column name ('length'), a list of names or an "
                f"episode number, not {type(key).__name__}; select rows of a column instead "
                f"(table['length'][a:b])"
            ) from None
        if not -len(self) <= i < len(self):
            raise IndexError(
                f"episode {i} out of range for dataset {self._ds.name!r} with {len(self)} episodes"
            )
        return {name: self.column(name)[i] for name in self.names}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Each episode as a dict (see :meth:`__getitem__`)."""
        columns = self.columns()
        for i in range(len(self)):
            yield {name: values[i] for name, values in columns.items()}

    def _structured(self, names: list[str]) -> np.ndarray:
        columns = [self.column(name) for name in names]
        out = np.empty(len(self), [(name, values.dtype) for name, values in zip(names, columns, strict=True)])
        for name, values in zip(names, columns, strict=True):
            out[name] = values
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:  # numpy's contract: refuse where a copy cannot be avoided
            raise ValueError("an episode table becomes an array only as a copy (np.array(table))")
        out = self._structured(list(self.names))
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"EpisodeTable(dataset={self._ds.name!r}, episodes={len(self)})"
