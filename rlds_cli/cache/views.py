"""Views: derived datasets that select a contiguous range of a parent's episodes and share its
arrays (nothing is copied).

A view's directory holds only ``manifest.json`` (``layout: "view"``, the parent's name, manifest
digest and the episode range) and its own ``episodes.npy``. Because the range is contiguous,
every stored column of the view is one slice of the parent's column, so the flat layout holds
unchanged and every reader (the loader included) works on a view as on any dataset. A view
refuses to open once its parent was replaced (the digest differs), and ``rlds rm`` refuses to
remove a parent while views of it exist.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np

from rlds_cli import settings
from rlds_cli._version import __version__
from rlds_cli.cache import digest
from rlds_cli.cache.builder import EPISODE_DTYPE, EPISODES_FILE
from rlds_cli.cache.manifest import Manifest, write_manifest
from rlds_cli.cache.root import CacheRoot, fsync_tree, validate_name
from rlds_cli.errors import DatasetExistsError, InvalidSelectionError, LockTimeoutError

VIEW_LAYOUT = "view"


class SlicedColumn:
    """Rows ``[start, stop)`` of a column, indexed like a numpy array along the first axis."""

    def __init__(self, column: Any, start: int, stop: int) -> None:
        self._column = column
        self._start = start
        self.shape = (stop - start, *tuple(column.shape[1:]))
        self.dtype = np.dtype(column.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            return self._column[self._start + start : self._start + stop : step]
        if isinstance(index, int | np.integer):
            if not -self.shape[0] <= index < self.shape[0]:
                raise IndexError(f"row {index} out of range for {self.shape[0]} rows")
            return self._column[self._start + int(index) % self.shape[0]]
        idx = np.asarray(index, dtype=np.int64)
        return self._column[np.where(idx < 0, idx + self.shape[0], idx) + self._start]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._column[self._start : self._start + self.shape[0]])
        return data.astype(dtype) if dtype is not None else data


def parse_range(spec: object, *, negative: bool) -> tuple[int | None, int | None]:
    """The one parser of episode ranges: ``"A:B"`` -> ``(A, B)`` (``None`` for an empty side), or
    ``[A, B]`` as a manifest stores it (``A`` an int, ``B`` an int or ``None``).

    ``negative=True`` allows any values, read as a Python slice (a view knows its parent's episode
    count); ``negative=False`` requires ``0 <= A < B`` (a conversion's stream does not know its
    count in advance).

    Raises:
        InvalidSelectionError: ``spec`` is not of that form, or breaks those rules.
    """
    parts: list[Any] = []
    if isinstance(spec, str):
        with contextlib.suppress(ValueError):  # a side that is no integer: not of the form
            parts = [int(p) if p.strip() else None for p in spec.split(":")]
    elif isinstance(spec, tuple | list) and spec and isinstance(spec[0], Integral):
        parts = list(spec)
    if len(parts) != 2 or not all(p is None or isinstance(p, Integral) for p in parts):
        raise InvalidSelectionError(f"episode range {spec!r} is not of the form A:B")
    start, stop = (None if p is None else int(p) for p in parts)
    if not negative and ((start or 0) < 0 or (stop is not None and stop <= (start or 0))):
        raise InvalidSelectionError(
            f"episode range {spec!r} must be A:B with 0 <= A < B (B empty: to the end)",
            hint="for a range counted from the end, convert everything and make a view ('rlds view')",
        )
    return start, stop


def parse_episode_range(spec: str, num_episodes: int) -> tuple[int, int]:
    """``"A:B"`` (either side may be empty or negative, as a Python slice) -> ``(a, b)``."""
    start, stop, _ = slice(*parse_range(spec, negative=True)).indices(num_episodes)
    if stop <= start:
        raise InvalidSelectionError(f"episode range {spec!r} selects no episode of {num_episodes}")
    return start, stop


@dataclass(frozen=True)
class ViewSpec:
    """Where a view's rows lie in its parent."""

    parent: str
    parent_digest: str
    first_episode: int
    stop_episode: int
    step_offset: int

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> ViewSpec:
        s = manifest.source
        return cls(
            s["parent"],
            s["parent_digest"],
            int(s["episodes"][0]),
            int(s["episodes"][1]),
            int(s["step_offset"]),
        )

    def rows(self, storage: str, num_steps: int) -> tuple[int, int]:
        """The parent rows of a column with this storage kind."""
        start = self.step_offset + (self.first_episode if storage == "flat" else 0)
        count = num_steps + (self.stop_episode - self.first_episode if storage == "flat" else 0)
        return start, start + count


def create_view(
    parent: str,
    name: str,
    episodes: tuple[int, int],
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    lock_timeout: float = 60.0,
) -> Manifest:
    """Publish a view of ``parent`` holding episodes ``[a, b)`` under ``name``.

    Raises:
        InvalidSelectionError: The range is empty or outside the parent.
        DatasetExistsError: ``name`` exists and ``replace`` is false.
    """
    from filelock import Timeout

    from rlds_cli.cache.dataset import open_dataset

    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    source = open_dataset(parent, cache)
    if source.manifest.layout == VIEW_LAYOUT:
        # a view of a view points straight at the stored arrays
        inner = ViewSpec.from_manifest(source.manifest)
        base = inner.first_episode
        return create_view(
            inner.parent,
            name,
            (base + episodes[0], base + episodes[1]),
            root=cache,
            replace=replace,
            lock_timeout=lock_timeout,
        )
    a, b = episodes
    if not 0 <= a < b <= source.num_episodes:
        raise InvalidSelectionError(
            f"episodes {a}:{b} are outside dataset {parent!r} with {source.num_episodes} episodes"
        )
    index = np.zeros(b - a, EPISODE_DTYPE)
    parent_index = source.episodes[a:b]
    offset = int(parent_index["start"][0])
    for field in EPISODE_DTYPE.names or ():
        index[field] = parent_index[field]
    index["start"] -= offset
    num_steps = int(index["length"].sum())
    manifest = Manifest(
        name=name,
        backend=source.manifest.backend,
        num_steps=num_steps,
        num_episodes=b - a,
        fields=dict(source.manifest.fields),
        source={
            "format": "view",
            "parent": parent,
            "parent_digest": source.manifest.digest(),
            # which version of the parent, in words a user can compare ('rlds inspect PARENT')
            "parent_created_at": source.manifest.created_at,
            "episodes": [a, b],
            "step_offset": offset,
        },
        lineage=[
            {
                "name": parent,
                "digest": source.manifest.digest(),
                "created_at": source.manifest.created_at,
                "op": "view",
                "episodes": [a, b],
                "rlds_version": __version__,
            }
        ],
        layout=VIEW_LAYOUT,
        # the view's own data is its episode index; its columns are the parent's, whose
        # digests the parent's manifest (pinned by parent_digest) holds
        content_digest={"algorithm": digest.ALGORITHM, "episodes": digest.array_digest(index)},
    )
    try:
        with cache.lock(name, timeout=lock_timeout):
            if cache.exists(name) and not replace:
                raise DatasetExistsError(f"dataset {name!r} already exists in {cache.path}")
            build = cache.new_build_dir(name)
            np.save(build / EPISODES_FILE, index, allow_pickle=False)
            fsync = settings.fsync_enabled()
            if fsync:
                fsync_tree(build)
            write_manifest(build, manifest, fsync=fsync)
            cache.publish(build, name, replace=replace, fsync=fsync)
    except Timeout:
        raise LockTimeoutError(f"dataset {name!r} is being written by another process") from None
    return manifest


def split_dataset(
    parent: str,
    val_fraction: float,
    *,
    train_name: str | None = None,
    val_name: str | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
) -> tuple[Manifest, Manifest]:
    """Split by episode into two views: the first episodes for training, the last
    ``val_fraction`` of them (at least one) for validation.

    Returns:
        The manifests of the train and validation views.
    """
    from rlds_cli.cache.dataset import open_dataset

    if not 0.0 < val_fraction < 1.0:
        raise InvalidSelectionError(
            f"--val must be between 0 and 1, got {val_fraction}",
            hint="--val is the fraction of episodes for validation, e.g. --val 0.1",
        )
    total = open_dataset(parent, root).num_episodes
    n_val = max(1, round(total * val_fraction))
    if n_val >= total:
        raise InvalidSelectionError(
            f"dataset {parent!r} has {total} episode(s): too few to split",
            hint="a split needs at least 2 episodes; pick a smaller --val",
        )
    train_name = f"{parent}-train" if train_name is None else validate_name(train_name)
    val_name = f"{parent}-val" if val_name is None else validate_name(val_name)
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    taken = [n for n in (train_name, val_name) if cache.exists(n)]
    if taken and not replace:  # checked before either view is made: never half a split
        raise DatasetExistsError(
            f"dataset {' and '.join(repr(n) for n in taken)} already exists in {cache.path}",
            hint="pass --force to replace, or --name BASE to split into BASE-train and BASE-val",
        )
    train = create_view(parent, train_name, (0, total - n_val), root=root, replace=replace)
    val = create_view(parent, val_name, (total - n_val, total), root=root, replace=replace)
    return train, val
