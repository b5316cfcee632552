"""Derived datasets: views (a contiguous range of a parent's episodes, sharing its arrays) and
splits (two views), each written through a :class:`~rlds_cli.cache.transaction.CacheTransaction`.

A view's directory holds only ``manifest.json`` and its own ``episodes.npy``; how a view is read
is in :mod:`rlds_cli.cache.views`.
"""

from __future__ import annotations

import os

from rlds_cli._version import __version__
from rlds_cli.cache import digest
from rlds_cli.cache.episodes import slice_index, write_index
from rlds_cli.cache.layout import SEGMENTED_LAYOUT, VIEW_LAYOUT, validate_name
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.snapshot import fixed_copy_hint
from rlds_cli.cache.transaction import CacheTransaction
from rlds_cli.cache.views import ViewSpec
from rlds_cli.errors import DatasetExistsError, InvalidSelectionError

__all__ = ["create_view", "split_dataset"]


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
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    source = open_dataset(parent, cache)
    _refuse_growing(source.manifest.layout, parent)
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
    index, offset = slice_index(source.episodes, a, b)
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
    with CacheTransaction(name, root=cache, replace=replace, lock_timeout=lock_timeout) as txn:
        txn.check_free()
        write_index(txn.new_build_dir(), index, fsync=txn.fsync)
        txn.commit(manifest)
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
    if not 0.0 < val_fraction < 1.0:
        raise InvalidSelectionError(
            f"--val must be between 0 and 1, got {val_fraction}",
            hint="--val is the fraction of episodes for validation, e.g. --val 0.1",
        )
    opened = open_dataset(parent, root)
    _refuse_growing(opened.manifest.layout, parent)  # before either view is made
    total = opened.num_episodes
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
            f"dataset {taken[0]!r} already exists in {cache.path}"
            if len(taken) == 1
            else f"datasets {taken[0]!r} and {taken[1]!r} already exist in {cache.path}",
            hint="pass --force to replace, or --name BASE to split into BASE-train and BASE-val",
        )
    train = create_view(parent, train_name, (0, total - n_val), root=root, replace=replace)
    val = create_view(parent, val_name, (total - n_val, total), root=root, replace=replace)
    return train, val


def _refuse_growing(layout: str, parent: str) -> None:
    """A view reads its parent's arrays as one converted dataset stores them, and pins that
    version: a growing dataset has its arrays in segments and a new version at every commit."""
    if layout == SEGMENTED_LAYOUT:
        raise InvalidSelectionError(
            f"dataset {parent!r} is a growing dataset (written by DatasetWriter): a view cannot pin "
            "its episodes, which change at every commit",
            hint=fixed_copy_hint(parent),
        )
