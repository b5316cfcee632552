"""Dropping episodes: a dataset without some of its parent's episodes, made as a selection view.

The view is :func:`rlds_cli.cache.derive.create_selection`'s (of a merged or trimmed dataset, a
composed selection): nothing is copied and the parent stays as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from rlds_cli.cache.derive import create_selection
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import InvalidSelectionError

__all__ = ["drop_episodes"]


def drop_episodes(
    parent: str,
    episodes: Sequence[int] | np.ndarray,
    name: str,
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    lock_timeout: float = 60.0,
) -> Manifest:
    """Publish ``parent`` without the episodes at positions ``episodes`` as ``name``.

    Raises:
        InvalidSelectionError: A position outside the parent, none given, or every episode.
        DatasetExistsError: ``name`` exists and ``replace`` is false.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    total = open_dataset(parent, cache).num_episodes
    dropped = np.unique(np.asarray(episodes, np.int64).reshape(-1))
    if not len(dropped):
        raise InvalidSelectionError("no episode to drop was given", hint="--episodes 0,5,9-20")
    if dropped[0] < 0 or dropped[-1] >= total:
        bad = int(dropped[0] if dropped[0] < 0 else dropped[-1])
        raise InvalidSelectionError(
            f"episode {bad} is outside dataset {parent!r} ({total} episodes: 0..{total - 1})"
        )
    keep = np.setdiff1d(np.arange(total, dtype=np.int64), dropped, assume_unique=True)
    if not len(keep):
        raise InvalidSelectionError(
            f"dropping {len(dropped)} episodes would leave dataset {parent!r} with none",
            hint="'rlds rm NAME' removes a whole dataset",
        )
    how = f"without {len(dropped)} of {total} episodes ({_spans(dropped)})"
    return create_selection(
        parent, name, keep, how=how, root=cache, replace=replace, lock_timeout=lock_timeout
    )


def _spans(ids: np.ndarray, most: int = 8) -> str:
    """``[0, 5, 9, 10, 11]`` -> ``"0,5,9-11"`` (the first ``most`` runs, then ``...``)."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(ids, breaks)]
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (",..." if len(runs) > most else "")
