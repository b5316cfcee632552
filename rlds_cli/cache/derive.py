"""Derived datasets: views, splits and drops, sharing their parent's arrays, published or held
in memory.

A view is a range or a selection of a parent's episodes; a split is two views; a drop is a
selection of the episodes kept. Each is published through a
:class:`~rlds_cli.cache.transaction.CacheTransaction`, copies no data and leaves the parent
unchanged. A view's directory holds only ``manifest.json`` and its own ``episodes.npy``; reading
it is :mod:`rlds_cli.cache.views`.

**In memory, never published**: :func:`select_episodes` (``Loader(NAME, episodes=[...])``) builds
the manifest and index ``rlds view`` would publish (:func:`view_manifest`, O(episodes)) and opens them
as a :class:`SelectedDataset`, which reads its parent's columns as a published view does.
Nothing is written to the cache.

Filter keys are named episode subsets kept from the source (robomimic's ``mask/<key>``): names
in the manifest's ``source.metadata.filter_keys`` and, in ``source_metadata.npz``, the bool array
:data:`MEMBER_ARRAY` (one row per episode, one column per name). A view reads its parent's rows.
:func:`filtered_dataset` (``Loader(NAME, filter_key="train")``) is the in-memory view of one
key; ``rlds view NAME --filter-key KEY --name N`` publishes it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np

from rlds_cli._util import signals
from rlds_cli._version import __version__
from rlds_cli.cache import digest
from rlds_cli.cache.compose import check_readable, composed_selection, publish_index, refuse_growing
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.episode_table import parse_episode_list
from rlds_cli.cache.episodes import select_index, slice_index, write_index
from rlds_cli.cache.integrity import check_episode_index
from rlds_cli.cache.layout import (
    COMPOSED_LAYOUT,
    FILTER_KEYS,
    MANIFEST_FILE,
    MEMBER_ARRAY,
    VIEW_LAYOUT,
    validate_name,
)
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.transaction import CacheTransaction
from rlds_cli.cache.views import ViewSpec
from rlds_cli.errors import DatasetExistsError, InvalidSelectionError

__all__ = [
    "MEMBER_ARRAY",
    "SelectedDataset",
    "create_selection",
    "create_view",
    "drop_episodes",
    "filter_key_episodes",
    "filter_key_names",
    "filtered_dataset",
    "select_episodes",
    "split_dataset",
    "view_manifest",
]


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
    a, b = episodes
    if not 0 <= a < b <= source.num_episodes:
        raise InvalidSelectionError(
            f"episodes {a}:{b} are outside dataset {parent!r} with {source.num_episodes} episodes"
        )
    ids = np.arange(a, b, dtype=np.int64)
    return _publish_view(
        source, parent, name, ids, "", cache=cache, replace=replace, lock_timeout=lock_timeout
    )


def create_selection(
    parent: str,
    name: str,
    episode_ids: Sequence[int] | np.ndarray,
    *,
    how: str = "",
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    lock_timeout: float = 60.0,
) -> Manifest:
    """Publish a view of ``parent`` holding the episodes at positions ``episode_ids`` (any
    order, each once; kept in the parent's order) under ``name``. ``how`` describes the choice
    in words (kept in the manifest, shown by ``rlds list``).

    Raises:
        InvalidSelectionError: No episode, one outside the parent, or one given twice.
        DatasetExistsError: ``name`` exists and ``replace`` is false.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    source = open_dataset(parent, cache)
    ids = np.sort(episode_positions(episode_ids, source.num_episodes, parent))
    if len(ids) == 0 or ids[0] < 0 or ids[-1] >= source.num_episodes or (np.diff(ids) == 0).any():
        raise InvalidSelectionError(
            f"a selection of dataset {parent!r} ({source.num_episodes} episodes) needs distinct episode "
            f"positions from 0 to {source.num_episodes - 1}, got "
            + (f"{len(ids)} from {ids[0]} to {ids[-1]}" if len(ids) else "none")
        )
    return _publish_view(
        source, parent, name, ids, how, cache=cache, replace=replace, lock_timeout=lock_timeout
    )


def episode_positions(episodes: Any, total: int, parent: str) -> np.ndarray:
    """Episode positions (int64, 1-d) from integers, or from a boolean mask of one value per
    episode of ``parent`` (``ds.episodes["length"] < 3``: the episodes where it is true).

    Raises:
        InvalidSelectionError: Not integers (a float 1.7 was cut to episode 1), or a mask of another
            length than the dataset's episodes (a mask was read as positions 0 and 1).
    """
    try:
        given = np.asarray(episodes)
    except (TypeError, ValueError) as exc:
        raise InvalidSelectionError(f"episode positions of {parent!r} must be integers: {exc}") from None
    if given.dtype == np.bool_:
        if given.ndim != 1 or len(given) != total:
            raise InvalidSelectionError(
                f"a boolean mask of episodes of {parent!r} holds one value per episode ({total}), "
                f"got shape {given.shape}"
            )
        return np.flatnonzero(given).astype(np.int64)
    if given.size and given.dtype.kind not in "iu":
        raise InvalidSelectionError(
            f"episode positions of {parent!r} must be integers, got {given.dtype} "
            f"({str(given.reshape(-1)[:3].tolist())[:60]})",
            hint="give positions (ints) or a boolean mask of one value per episode",
        )
    return given.astype(np.int64).reshape(-1)


def _publish_view(
    source: Dataset,
    parent: str,
    name: str,
    ids: np.ndarray,
    how: str,
    *,
    cache: CacheRoot,
    replace: bool,
    lock_timeout: float,
) -> Manifest:
    """Publish the view of episodes ``ids`` (ascending) of ``source`` (:func:`_selection`)."""
    manifest, index = _selection(source, parent, name, ids, how, cache=cache)
    return publish_index(manifest, index, cache=cache, replace=replace, lock_timeout=lock_timeout)


def _selection(
    source: Dataset, parent: str, name: str, ids: np.ndarray, how: str, *, cache: CacheRoot
) -> tuple[Manifest, np.ndarray]:
    """The manifest and index of dataset ``name`` of episodes ``ids`` (ascending) of ``source``:
    a view (:func:`view_manifest`), or a composed selection when ``source`` is composed (its
    columns are its parents')."""
    check_readable(source)
    if source.manifest.layout == COMPOSED_LAYOUT:
        return composed_selection(source, name, ids, how, cache=cache)
    return view_manifest(source, parent, name, ids, how, cache=cache)


def _publish_together(
    made: list[tuple[Manifest, np.ndarray]], *, cache: CacheRoot, replace: bool, lock_timeout: float
) -> None:
    """Publish datasets whose own data is their index (a split's two views) as one step as far as
    a reader can tell: every name locked (in name order) and checked, every build written, the
    datasets they replace deleted, then each published (renames only). A kill leaves the old ones,
    or some of the new ones with the others missing, never old and new side by side (an
    interruption waits for the last rename: all new ones); an error leaves the old ones."""
    with ExitStack() as stack:
        txns = {
            m.name: stack.enter_context(
                CacheTransaction(m.name, root=cache, replace=replace, lock_timeout=lock_timeout)
            )
            for m, _ in sorted(made, key=lambda pair: pair[0].name)
        }
        for manifest, index in made:  # everything that can fail (seal checks the name), before any removal
            txn = txns[manifest.name]
            write_index(txn.new_build_dir(), index, fsync=txn.fsync)
            txn.seal(manifest)
        with signals.held():  # an interruption waits: never some of the new ones published
            for txn in txns.values():
                txn.withdraw()
            for manifest, _ in made:
                txns[manifest.name].publish()


def view_manifest(
    source: Dataset, parent: str, name: str, ids: np.ndarray, how: str, *, cache: CacheRoot | None = None
) -> tuple[Manifest, np.ndarray]:
    """The manifest and episode index of view ``name`` of episodes ``ids`` (ascending, distinct,
    caller-checked) of ``source``: a range when consecutive, else a selection. A view of a view
    points at the stored arrays. O(episodes); no data is read.

    Raises:
        InvalidSelectionError: ``source`` is growing, or composed (use :func:`create_selection`,
            which publishes a composed selection).
        CorruptDatasetError: ``source`` is a view whose parent is gone or was replaced.
    """
    refuse_growing(source.manifest.layout, parent, "a view")
    if source.manifest.layout == COMPOSED_LAYOUT:
        raise InvalidSelectionError(
            f"dataset {parent!r} is composed (merged or trimmed): its episodes are selected by "
            "publishing a dataset of them",
            hint=f"publish the selection first ('rlds view {parent} --episodes ... --name N'), then use N",
        )
    if source.manifest.layout == VIEW_LAYOUT:
        inner = ViewSpec.from_manifest(source.manifest)
        pinned = source.view_parent()  # raises when that parent was replaced: the positions would
        assert pinned is not None  # name other episodes
        outer = pinned[0]
        # the words count in this view: say so, beside the ids it names in the stored arrays
        said = f"{how} of view {parent!r}" if how else ""
        return view_manifest(outer, inner.parent, name, inner.parent_episodes()[ids], said, cache=cache)
    a, b = int(ids[0]), int(ids[-1]) + 1
    if b - a == len(ids):  # a drawn selection may come out consecutive: a range reads fastest
        index, offset = slice_index(source.episode_index, a, b)
        chosen: dict[str, Any] = {"episodes": [a, b], **({"selection": how} if how else {})}
        seen: dict[str, Any] = {"episodes": [a, b], **({"selection": how} if how else {})}
    else:
        index, offset = select_index(source.episode_index, ids), 0
        chosen = {"episodes": [a, b], "episode_ids": ids.tolist(), "selection": how}
        seen = {"selection": how or f"{len(ids)} of episodes {a}:{b}"}
    num_steps = int(index["length"].sum())
    manifest = Manifest(
        name=name,
        backend=source.manifest.backend,
        num_steps=num_steps,
        num_episodes=len(ids),
        fields=dict(source.manifest.fields),
        source={
            "format": "view",
            "parent": parent,
            "parent_digest": source.manifest.digest(),
            # which version of the parent, in words a user can compare ('rlds inspect PARENT')
            "parent_created_at": source.manifest.created_at,
            **chosen,
            "step_offset": offset,
        },
        lineage=[
            {
                "name": parent,
                "digest": source.manifest.digest(),
                "created_at": source.manifest.created_at,
                "op": "view",
                **seen,
                "rlds_version": __version__,
            }
        ],
        layout=VIEW_LAYOUT,
        # the view's own data is its episode index; its columns are the parent's, whose
        # digests the parent's manifest (pinned by parent_digest) holds
        content_digest={"algorithm": digest.ALGORITHM, "episodes": digest.array_digest(index)},
    )
    return manifest, index


def split_dataset(
    parent: str,
    val_fraction: float | None = None,
    *,
    val_episodes: Sequence[int] | str | None = None,
    train_name: str | None = None,
    val_name: str | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    seed: int = 0,
    last: bool = False,
) -> tuple[Manifest, Manifest]:
    """Split by episode into a train and a validation view, each in the parent's order.

    ``val_fraction`` of the episodes (rounded, at least one) go to validation, drawn without
    replacement by ``numpy.random.default_rng(seed)`` (deterministic; recorded in the manifests),
    or the last ones with ``last=True``. ``val_episodes`` (positions or ``"0,5,9-20"``) names the
    validation episodes instead of ``val_fraction``.

    Returns:
        The manifests of the train and validation views.
    """
    if (val_fraction is None) == (val_episodes is None):
        raise InvalidSelectionError(
            "a split takes either a validation fraction or the validation episodes",
            hint="pass --val 0.1 (a fraction, drawn at random or --last) or --val-episodes 0,5,9-20",
        )
    if val_episodes is not None:
        return _split_by_list(parent, val_episodes, train_name, val_name, root=root, replace=replace)
    assert val_fraction is not None
    if not 0.0 < val_fraction < 1.0:
        raise InvalidSelectionError(
            f"--val must be between 0 and 1, got {val_fraction}",
            hint="--val is the fraction of episodes for validation, e.g. --val 0.1",
        )
    opened = open_dataset(parent, root)
    refuse_growing(opened.manifest.layout, parent, "a view")  # before either view is made
    total = opened.num_episodes
    n_val = max(1, round(total * val_fraction))
    if total < 2:
        raise InvalidSelectionError(
            f"dataset {parent!r} has {total} episode{'' if total == 1 else 's'}: too few to split",
            hint="a split needs at least 2 episodes",
        )
    if n_val >= total:
        raise InvalidSelectionError(
            f"--val {val_fraction} of the {total} episodes of {parent!r} rounds to all of them: none is "
            "left for training",
            hint="pick a smaller --val",
        )
    train_name, val_name = _free_names(parent, train_name, val_name, root, replace)
    if last:
        in_val = np.arange(total) >= total - n_val
        how, rest = "", ""
    else:
        in_val = np.zeros(total, bool)
        in_val[np.random.default_rng(seed).choice(total, n_val, replace=False)] = True
        how = f"{n_val} of {total} episodes, drawn at random (seed {seed})"
        rest = f"the {total - n_val} of {total} episodes not drawn for validation (seed {seed})"
    return _publish_split(opened, parent, (train_name, rest), (val_name, how), in_val, root, replace)


def _publish_split(
    source: Dataset,
    parent: str,
    train: tuple[str, str],
    val: tuple[str, str],
    in_val: np.ndarray,
    root: str | os.PathLike[str] | CacheRoot | None,
    replace: bool,
) -> tuple[Manifest, Manifest]:
    """Publish the views ``train`` and ``val`` (name, how chosen) of the episodes of ``source``
    outside and inside ``in_val``, both made from this one opening of it and published together
    (a split whose outputs replace its input, or a kill between them, never mixes two splits)."""
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    made = [
        _selection(source, parent, name, np.flatnonzero(chosen), how, cache=cache)
        for (name, how), chosen in ((train, ~in_val), (val, in_val))
    ]
    _publish_together(made, cache=cache, replace=replace, lock_timeout=60.0)
    return made[0][0], made[1][0]


def _free_names(
    parent: str,
    train_name: str | None,
    val_name: str | None,
    root: str | os.PathLike[str] | CacheRoot | None,
    replace: bool,
) -> tuple[str, str]:
    """The split's two names, checked free before either view is made (never half a split)."""
    train_name = f"{parent}-train" if train_name is None else validate_name(train_name)
    val_name = f"{parent}-val" if val_name is None else validate_name(val_name)
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    if train_name == val_name:
        raise InvalidSelectionError(f"a split needs two names, got {train_name!r} for both views")
    taken = [n for n in (train_name, val_name) if cache.exists(n)]
    if taken and not replace:
        raise DatasetExistsError(
            f"dataset {taken[0]!r} already exists in {cache.path}"
            if len(taken) == 1
            else f"datasets {taken[0]!r} and {taken[1]!r} already exist in {cache.path}",
            hint="pass --force to replace, or --name BASE to split into BASE-train and BASE-val",
        )
    return train_name, val_name


def _split_by_list(
    parent: str,
    val_episodes: Sequence[int] | str,
    train_name: str | None,
    val_name: str | None,
    *,
    root: str | os.PathLike[str] | CacheRoot | None,
    replace: bool,
) -> tuple[Manifest, Manifest]:
    """The split whose validation episodes are named (positions or a list ``"0,5,9-20"``)."""
    opened = open_dataset(parent, root)
    refuse_growing(opened.manifest.layout, parent, "a view")
    total = opened.num_episodes
    spec = val_episodes if isinstance(val_episodes, str) else [int(i) for i in val_episodes]
    chosen = parse_episode_list(spec, total, option="--val-episodes")
    if len(chosen) >= total:
        raise InvalidSelectionError(
            f"--val-episodes names all {total} episodes of {parent!r}: nothing is left for training",
            hint="name fewer validation episodes",
        )
    train_name, val_name = _free_names(parent, train_name, val_name, root, replace)
    in_val = np.zeros(total, bool)
    in_val[chosen] = True
    label = val_episodes if isinstance(val_episodes, str) else f"{len(chosen)} named episodes"
    train, val = (train_name, f"all but episodes {label}"), (val_name, f"episodes {label}")
    return _publish_split(opened, parent, train, val, in_val, root, replace)


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
    dropped = np.unique(episode_positions(episodes, total, parent))
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


class SelectedDataset(Dataset):
    """A view of some episodes of a stored dataset, held in memory.

    :attr:`directory` is the parent's folder, so reads fail once the parent is replaced;
    :meth:`size_bytes` is 0. Pickles as its manifest and index (workers reopen the same selection).
    """

    def __init__(self, parent_dir: str | os.PathLike[str], manifest: Manifest, index: np.ndarray) -> None:
        self._given_index = index
        super().__init__(parent_dir, manifest)

    def _load_episode_index(self) -> np.ndarray:
        index = self._given_index
        check_episode_index(index, self.num_steps, self.num_episodes, self.directory, name=self.name)
        return index

    def size_bytes(self) -> int:
        return 0

    def __getstate__(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "manifest": self.manifest.to_dict(),
            "index": self.episode_index,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        SelectedDataset.__init__(
            self, state["directory"], Manifest.from_dict(state["manifest"]), state["index"]
        )


def select_episodes(
    dataset: Dataset,
    episodes: Sequence[int] | np.ndarray | str,
    *,
    name: str | None = None,
) -> SelectedDataset:
    """The episodes ``episodes`` of ``dataset`` (positions, any order, each once; or a list
    such as ``"0,5,9-20"``) as an unpublished view, in the dataset's order.

    Raises:
        InvalidSelectionError: A position outside the dataset, or ``dataset`` is not stored in
            the cache (a growing dataset, one read at a URL).
    """
    if isinstance(episodes, str):
        ids = parse_episode_list(episodes, dataset.num_episodes)
    else:
        raw = np.asarray(episodes).reshape(-1)
        spec: list[int] = raw.tolist() if raw.dtype.kind in "iu" or raw.size == 0 else []
        if raw.size and raw.dtype.kind not in "iu":
            raise InvalidSelectionError(f"episode positions must be integers, got {raw.dtype}")
        ids = parse_episode_list(spec, dataset.num_episodes)
        if len(ids) != len(raw):
            raise InvalidSelectionError(f"episodes: {len(raw) - len(ids)} position(s) given twice")
    parent = dataset.view_parent()
    if parent is not None:  # a selection of a view reads the stored arrays of its parent
        dataset, ids = parent[0], parent[1][ids]
    if not (dataset.directory / MANIFEST_FILE).is_file():
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} is not stored in the local cache: a selection reads a stored dataset",
            hint="pull it first ('rlds pull URL')",
        )
    label = name if name is not None else f"{dataset.name}[{len(ids)} episodes]"
    manifest, index = view_manifest(dataset, dataset.name, label, ids, "")
    return SelectedDataset(dataset.directory, manifest, index)


def filter_key_names(dataset: Dataset) -> list[str]:
    """The filter keys of ``dataset`` (a view: its parent's), in :data:`MEMBER_ARRAY` column
    order; empty when none."""
    names = dataset.source_metadata.get(FILTER_KEYS)
    return [str(n) for n in names] if isinstance(names, list) else []


def filter_key_episodes(dataset: Dataset, key: str) -> np.ndarray:
    """The positions (ascending, int64) of ``dataset``'s episodes that filter key ``key`` holds.

    Raises:
        InvalidSelectionError: ``dataset`` has no such key (the message lists those it has), or
            the key holds none of its episodes.
    """
    names = filter_key_names(dataset)
    if key not in names:
        known = ", ".join(names) if names else "none (its source had no mask/ filter keys)"
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} has no filter key {key!r}; its filter keys: {known}",
            hint="pick one of its filter keys, or select episodes with --episodes A:B",
        )
    view = dataset.view_parent()
    owner, rows = (dataset, None) if view is None else view
    member = owner.source_arrays.get(MEMBER_ARRAY)
    if member is None or member.ndim != 2 or member.shape[1] != len(names):
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} names filter keys but keeps no {MEMBER_ARRAY!r} array of "
            f"{len(names)} columns",
            hint=f"convert the source again ('rlds download SOURCE --name {dataset.name} --force')",
        )
    column = member[:, names.index(key)] if rows is None else member[rows, names.index(key)]
    ids = np.flatnonzero(column).astype(np.int64)
    if len(ids) == 0:
        raise InvalidSelectionError(
            f"filter key {key!r} holds none of the episodes of dataset {dataset.name!r}",
            hint=f"its demos were left out of the conversion (empty, or outside --episodes): 'rlds inspect "
            f"{dataset.name}' lists the filter keys and the conversion's notes",
        )
    return ids


def filtered_dataset(dataset: Dataset, key: str) -> SelectedDataset:
    """``dataset``'s episodes of filter key ``key`` as an in-memory view named ``NAME[key]``.

    Raises:
        InvalidSelectionError: As :func:`filter_key_episodes`.
    """
    ids = filter_key_episodes(dataset, key)
    if dataset.manifest.layout == COMPOSED_LAYOUT:  # selected by publishing (view_manifest)
        raise InvalidSelectionError(
            f"dataset {dataset.name!r} is composed (merged or trimmed): its filter key {key!r} is "
            "selected by publishing a view of it",
            hint=f"rlds view {dataset.name} --filter-key {key} --name N, then use N",
        )
    return select_episodes(dataset, ids, name=f"{dataset.name}[{key}]")


def selection(
    dataset: Dataset, *, episodes: Sequence[int] | np.ndarray | str | None, filter_key: str | None
) -> SelectedDataset:
    """``dataset``'s episodes ``episodes`` (:func:`select_episodes`) or those of filter key
    ``filter_key`` (:func:`filtered_dataset`): exactly one of the two.

    Raises:
        ValueError: Both or neither given.
        InvalidSelectionError: As :func:`select_episodes` and :func:`filter_key_episodes`.
    """
    if (episodes is None) == (filter_key is None):
        raise ValueError(
            "give episodes= or filter_key=, not both (make a view of one, then select)"
            if episodes is not None
            else "give episodes= or filter_key="
        )
    if filter_key is not None:
        return filtered_dataset(dataset, filter_key)
    assert episodes is not None
    return select_episodes(dataset, episodes)
