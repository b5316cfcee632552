"""Datasets made from others' rows: merged, trimmed, and downsampled.

Composed datasets (read by :mod:`rlds_cli.cache.composed`): ``rlds merge`` (whole datasets end
to end), ``rlds trim`` (steps cut at both ends of each episode) and a selection of a composed
dataset's episodes. Each writes only a manifest and an episode index (O(episodes) bytes),
pinning each parent's version, through a :class:`~rlds_cli.cache.transaction.CacheTransaction`.

``rlds downsample`` keeps every k-th step and is materialized through a
:class:`~rlds_cli.cache.builder.DatasetBuilder` (``N / k`` rows; frames copied as stored). Step ``i``
covers the parent's steps ``[i*k, min(i*k + k, L))``: every key is the window's first step's,
except ``next/reward`` (summed), ``next/terminated`` and ``next/truncated`` (any step's), and
other ``next/...`` keys and the sources' own keys of what follows a step (LeRobot's
``info/next.success``, robomimic's ``info/dones``: :func:`after_step`) the last step's. Its next
observation is the next window's first or the episode's final one; an episode of ``L`` steps
keeps ``ceil(L / k)``.

A kill at any point leaves the parents intact and nothing published.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._version import __version__
from rlds_cli.cache import digest
from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.card import combine_cards, dataset_card, dataset_fps
from rlds_cli.cache.composed import ComposedDataset, Part, parts_of
from rlds_cli.cache.dataset import Dataset, Instructions
from rlds_cli.cache.episodes import write_index
from rlds_cli.cache.growing import fixed_copy_hint
from rlds_cli.cache.layout import (
    COMPOSED_LAYOUT,
    SEGMENTED_LAYOUT,
    VIEW_LAYOUT,
    text_blob_name,
    validate_name,
)
from rlds_cli.cache.manifest import FieldSpec, Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.ted import EPISODE_DTYPE, StepBlock
from rlds_cli.cache.transaction import CacheTransaction
from rlds_cli.errors import CorruptDatasetError, InvalidSelectionError, SchemaMismatchError

__all__ = [
    "composed_selection",
    "copied_metadata",
    "copied_source_arrays",
    "copied_step_column",
    "downsample_dataset",
    "merge_datasets",
    "publish_index",
    "schema_difference",
    "trim_dataset",
]


def merge_datasets(
    names: Sequence[str],
    name: str,
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    verify: bool = True,
    lock_timeout: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> Manifest:
    """Publish the datasets ``names`` end to end (their episodes in the order given) as ``name``,
    sharing their arrays (nothing is copied).

    Args:
        names: Two or more cached datasets with the same keys, shapes, dtypes and codecs: any but
            growing ones (views and merged datasets too).
        name: The new dataset's name.
        verify: Check every parent's files and content digests first (they are read once).
        progress: Called with each parent's name before it is verified.

    Raises:
        InvalidSelectionError: Fewer than two datasets, one named twice, or a growing one.
        SchemaMismatchError: The datasets' schemas differ (the message names the key).
        CorruptDatasetError: A parent's files or digests do not match its manifest.
        DatasetExistsError: ``name`` exists and ``replace`` is false.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    validate_name(name)
    if len(names) < 2:
        raise InvalidSelectionError(
            f"a merge needs two datasets or more, got {len(names)}", hint="rlds merge A B ... --name C"
        )
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise InvalidSelectionError(
            f"dataset {twice[0]!r} is named twice in the merge",
            hint="name each dataset once (a merge of a dataset with itself would double its episodes)",
        )
    parents = [open_dataset(n, cache) for n in names]
    for ds in parents:
        refuse_growing(ds.manifest.layout, ds.name, "a merge or trim")
    first = parents[0]
    for ds in parents[1:]:
        problem = schema_difference(first, ds)
        if problem is not None:
            raise SchemaMismatchError(
                f"cannot merge {first.name!r} and {ds.name!r}: {problem}",
                hint="merge datasets with the same keys, shapes, dtypes and codecs ('rlds inspect NAME')",
            )
    for ds in parents:
        if verify:
            if progress is not None:
                progress(ds.name)
            verify_parent(ds)
        else:
            check_readable(ds)
    parts = [Part(ds.name, ds.manifest.digest()) for ds in parents]
    index = _concat_index([np.asarray(ds.episode_index) for ds in parents])
    manifest = _composed_manifest(parents, parts, index, name, "merge", {})
    return publish_index(manifest, index, cache=cache, replace=replace, lock_timeout=lock_timeout)


def composed_selection(
    source: Dataset, name: str, ids: np.ndarray, how: str, *, cache: CacheRoot
) -> tuple[Manifest, np.ndarray]:
    """The manifest and episode index of the episodes ``ids`` (ascending positions) of a composed
    dataset ``source`` as ``name``: a composed dataset of the same parents (publish with
    :func:`publish_index`)."""
    parts, parents, index, first = [], [], [], 0
    ids = np.asarray(ids, np.int64)
    for part in parts_of(source.manifest):
        parent = open_dataset(part.parent, cache)
        chosen = part.chosen(parent.num_episodes)
        mine = ids[(ids >= first) & (ids < first + len(chosen))] - first
        first += len(chosen)
        if not len(mine):
            continue
        taken = Part(
            part.parent, part.parent_digest, tuple(chosen[mine].tolist()), part.trim_start, part.trim_end
        )
        parts.append(taken)
        parents.append(parent)
        index.append(taken.index(parent.episode_index))
    # in a view's source terms ('rlds view' and 'rlds split' report these)
    note: dict[str, Any] = {"parent": source.name, "episodes": [int(ids[0]), int(ids[-1]) + 1]}
    note.update({"selection": how} if how else {})
    # the lineage names what it was made of (the composed dataset), its card the parents it holds
    # episodes of (the source's card listed the licences of parents it holds none of)
    joined = _concat_index(index)
    return _composed_manifest(parents, parts, joined, name, "select", note, [source]), joined


def _count(value: Any, option: str) -> int:
    """``value`` as a Python int (a numpy integer too: the manifest records it as JSON).

    Raises:
        InvalidSelectionError: Not an integer (a bool, a float).
    """
    try:
        if isinstance(value, bool | np.bool_):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise InvalidSelectionError(f"--{option} must be a whole number of steps, got {value!r}") from None


def trim_dataset(
    parent: str,
    name: str,
    *,
    start: int = 0,
    end: int = 0,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    lock_timeout: float = 60.0,
) -> Manifest:
    """Publish ``parent`` with ``start`` and ``end`` steps cut from each episode as ``name``
    (nothing copied). An episode cut at its end reads ``next/truncated`` true at its new last
    step; episodes of ``start + end`` steps or fewer are left out (counted in
    ``source.dropped_short``).

    Raises:
        InvalidSelectionError: ``start`` or ``end`` negative, both zero, or no episode longer.
        CorruptDatasetError: A file of ``parent`` is missing or short, or it is a view whose parent
            was replaced.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    validate_name(name)
    start, end = _count(start, "start"), _count(end, "end")
    if start < 0 or end < 0 or start + end == 0:
        raise InvalidSelectionError(
            f"a trim cuts steps at the start and/or end of each episode, got --start {start} --end {end}",
            hint="pass --start K and/or --end K with K >= 1",
        )
    source = open_dataset(parent, cache)
    refuse_growing(source.manifest.layout, source.name, "a merge or trim")
    problems = source.check_files()  # sizes only (a view's: of its pinned parent's files)
    if problems:
        raise CorruptDatasetError(
            f"dataset {parent!r} cannot be trimmed: {problems[0]}", hint=f"rlds inspect {parent} --check"
        )
    lengths = source.episode_index["length"].astype(np.int64)
    keep = np.flatnonzero(lengths > start + end)
    if not len(keep):
        raise InvalidSelectionError(
            f"no episode of dataset {parent!r} is longer than {start + end} steps (its longest has "
            f"{int(lengths.max())}): the trim would leave none",
            hint="cut fewer steps",
        )
    ids = None if len(keep) == len(lengths) else tuple(keep.tolist())
    part = Part(parent, source.manifest.digest(), ids, start, end)
    index = _concat_index([part.index(source.episode_index)])
    note = {"trim": [start, end], "dropped_short": int(len(lengths) - len(keep))}
    manifest = _composed_manifest([source], [part], index, name, "trim", note)
    return publish_index(manifest, index, cache=cache, replace=replace, lock_timeout=lock_timeout)


def schema_difference(a: Dataset, b: Dataset) -> str | None:
    """The first difference of ``a``'s and ``b``'s stored schemas (keys, dtype, shape, storage,
    codec), in words naming the key; ``None`` if equal."""
    fa, fb = a.manifest.fields, b.manifest.fields
    for key in sorted(set(fa) ^ set(fb)):
        has, lacks = (a, b) if key in fa else (b, a)
        return f"key {key!r} is in {has.name!r} but not in {lacks.name!r}"
    for key in sorted(fa):
        sa, sb = fa[key], fb[key]
        for what in ("dtype", "shape", "storage", "codec", "channels_first"):
            va, vb = getattr(sa, what), getattr(sb, what)
            if va != vb:
                return f"key {key!r} has {what} {_show(va)} in {a.name!r} and {_show(vb)} in {b.name!r}"
    return None


def check_readable(ds: Dataset) -> None:
    """Check that what ``ds`` reads is there, reading no rows, so a dataset made of it can be
    read: every file at its full size (``--no-verify`` published a merge of a parent with a file
    missing), and through a view's or composed dataset's parents, each the version it pins (a
    broken chain, a grandparent replaced, was published, exit 0).

    Raises:
        CorruptDatasetError: A file is missing or short, a parent is gone or replaced, or a column
            does not open.
    """
    if isinstance(ds, ComposedDataset):  # it opens its parents' columns when read
        for part in ds.segment_datasets():
            check_readable(part)
        return
    if ds.manifest.layout == VIEW_LAYOUT:
        for key in ds.manifest.fields:
            ds.column(key)
    problems = ds.check_files()
    if problems:
        raise CorruptDatasetError(
            f"dataset {ds.name!r} cannot be read: {problems[0]}",
            hint=f"'rlds inspect {ds.name} --check' lists every problem",
        )


def verify_parent(ds: Dataset, shown_at: Path | None = None, keys: Collection[str] | None = None) -> None:
    """Check a parent's files and content digests before anything is made of it (the digests
    not where its reads check what they return: :attr:`Dataset.reads_checked`). ``shown_at``:
    the folder to name in messages instead of ``ds``'s own (a growing dataset checked through a
    snapshot of hard links, which is gone once the command ends); ``keys``: the columns read to
    make it (default: all; see :func:`~rlds_cli.cache.digest.check_digests`).

    Raises:
        CorruptDatasetError: A file is missing or short, or a digest differs (the first named).
    """

    def shown(text: str) -> str:
        return text if shown_at is None else text.replace(str(ds.directory), str(shown_at))

    problems = ds.check_files()
    if problems:
        raise CorruptDatasetError(
            shown(f"dataset {ds.name!r} is damaged: {problems[0]}"), hint="rlds inspect --check"
        )
    if ds.reads_checked:  # a second full read (of a store) would find nothing the first does not
        return
    report = digest.check_digests(ds, keys=keys)
    if report.problems:
        bad = report.problems[0]
        raise CorruptDatasetError(
            shown(f"dataset {ds.name!r} is damaged: {bad.key!r} ({bad.path}): {bad.message}"),
            hint=f"'rlds inspect {ds.name} --check' lists every damaged key",
        )


def _show(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, tuple) else str(value)


def refuse_growing(layout: str, parent: str, made: str) -> None:
    """Refuse a growing parent of dataset kind ``made`` (a view, a merge or trim): neither can pin a
    dataset whose episodes change at every commit."""
    if layout == SEGMENTED_LAYOUT:
        raise InvalidSelectionError(
            f"dataset {parent!r} is a growing dataset (written by DatasetWriter): {made} cannot pin "
            "its episodes, which change at every commit",
            hint=fixed_copy_hint(parent),
        )


def _concat_index(parts: list[np.ndarray]) -> np.ndarray:
    """The episode indexes ``parts`` end to end, starts counted anew from 0."""
    index = np.concatenate(parts) if parts else np.zeros(0, EPISODE_DTYPE)
    index["start"] = np.cumsum(index["length"]) - index["length"]
    return index


def _composed_manifest(
    parents: list[Dataset],
    parts: list[Part],
    index: np.ndarray,
    name: str,
    op: str,
    note: dict[str, Any],
    lineage_of: list[Dataset] | None = None,
) -> Manifest:
    """The manifest of a composed dataset of ``parts`` (of ``parents``) with episode ``index``;
    its lineage names ``lineage_of`` (default: the parents), its card is the parents' cards."""
    fields: dict[str, FieldSpec] = dict(parents[0].manifest.fields)
    held = _unique(parents)
    makers = lineage_of or held
    envs = [ds.manifest.env for ds in parents]
    manifest = Manifest(
        name=name,
        backend=parents[0].manifest.backend,
        num_steps=int(index["length"].sum()),
        num_episodes=len(index),
        fields=fields,
        source={"format": COMPOSED_LAYOUT, "op": op, **note, "parts": [p.to_dict() for p in parts]},
        lineage=[
            {
                "name": ds.name,
                "digest": ds.manifest.digest(),
                "created_at": ds.manifest.created_at,
                "op": op,
                "rlds_version": __version__,
            }
            for ds in makers
        ],
        layout=COMPOSED_LAYOUT,
        # its own data is its episode index; its columns are the parents', whose digests their
        # manifests (pinned by each part's parent_digest) hold
        content_digest={"algorithm": digest.ALGORITHM, "episodes": digest.array_digest(index)},
        # the same environment for every part, or none known
        env=envs[0] if all(e == envs[0] for e in envs) else {},
        card=combine_cards([dataset_card(ds) for ds in held], [ds.name for ds in held]),
    )
    return manifest


def publish_index(
    manifest: Manifest, index: np.ndarray, *, cache: CacheRoot, replace: bool, lock_timeout: float
) -> Manifest:
    """Publish a dataset whose own data is its episode ``index`` (a view, a composed dataset)."""
    with CacheTransaction(manifest.name, root=cache, replace=replace, lock_timeout=lock_timeout) as txn:
        txn.check_free()
        write_index(txn.new_build_dir(), index, fsync=txn.fsync)
        txn.commit(manifest)
    return manifest


def _unique(parents: list[Dataset]) -> list[Dataset]:
    seen: dict[str, Dataset] = {}
    for ds in parents:
        seen.setdefault(ds.name, ds)
    return list(seen.values())


#: The rows read per block, in bytes of every key together (at least one episode a block).
BLOCK_BYTES = 64 << 20
#: Step keys summed over a window, and keys true where any step of the window is.
SUMMED = ("next/reward",)
FLAGS = ("next/terminated", "next/truncated")
#: Sources' own keys of what follows a step (LeRobot's ``next.success``, ``next.done``;
#: robomimic's ``dones``): the window's last step's, as TED's ``next/...`` keys.
AFTER_STEP_NAMES = ("dones",)
AFTER_STEP_PREFIX = "next."


def after_step(key: str) -> bool:
    """Whether ``key`` holds what follows its step (``next/...``, :data:`AFTER_STEP_NAMES`,
    names from :data:`AFTER_STEP_PREFIX`), so a window takes its last step's."""
    leaf = key.rpartition("/")[2]
    return key.startswith("next/") or leaf in AFTER_STEP_NAMES or leaf.startswith(AFTER_STEP_PREFIX)


def downsample_dataset(
    parent: str,
    name: str,
    every: int,
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    replace: bool = False,
    lock_timeout: float = 60.0,
    progress: Callable[[int], None] | None = None,
) -> Manifest:
    """Publish every ``every``-th step of each episode of ``parent`` as ``name`` (windowing
    rules: see the module docstring).

    Args:
        progress: Called with the parent's steps read so far, after each block.

    Raises:
        InvalidSelectionError: ``every`` below 2, or ``parent`` is a growing dataset.
        DatasetExistsError: ``name`` exists and ``replace`` is false.
        CorruptDatasetError: ``parent``'s files or content digests do not match its manifest.
    """
    every = _count(every, "every")
    if every < 2:
        raise InvalidSelectionError(
            f"--every must be 2 or more (every k-th step is kept), got {every}", hint="e.g. --every 2"
        )
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    validate_name(name)
    source = open_dataset(parent, cache)
    if source.manifest.layout == SEGMENTED_LAYOUT:
        raise InvalidSelectionError(
            f"dataset {parent!r} is a growing dataset (written by DatasetWriter): downsample a fixed copy",
            hint=fixed_copy_hint(parent),
        )
    fields = source.manifest.fields
    row_bytes = sum(spec.row_bytes for spec in fields.values())
    budget = max(1, BLOCK_BYTES // max(1, row_bytes))
    verify_parent(source)  # a copy of damaged arrays would verify clean
    meta, instructions = copied_metadata(source)
    index = source.episode_index
    # capped: the same result, and a k past int64 would overflow numpy
    window = min(every, max(2, int(index["length"].max(initial=0))))
    with DatasetBuilder(
        name,
        root=cache,
        backend=source.manifest.backend,
        replace=replace,
        lock_timeout=lock_timeout,  # frames: kept as the parent stores them (never encoded again)
    ) as builder:
        for first, stop in _blocks(index["length"].astype(np.int64), budget):
            builder.append(_window_block(source, index, first, stop, window, instructions))
            if progress is not None:
                progress(int(index["start"][stop - 1] + index["length"][stop - 1]))
        return builder.commit(
            source={
                "format": "rlds-downsample",
                "parent": parent,
                "every": every,
                **({"metadata": meta} if meta else {}),
            },
            conversion={"downsample": {"every": every, "parent_steps": source.num_steps}},
            lineage=[
                {
                    "name": parent,
                    "digest": source.manifest.digest(),
                    "created_at": source.manifest.created_at,
                    "op": "downsample",
                    "every": every,
                    "rlds_version": __version__,
                }
            ],
            card=_downsampled_card(source, every),
            source_arrays=copied_source_arrays(source),  # every episode kept, in order
        )


def copied_metadata(source: Dataset) -> tuple[dict[str, Any], Instructions | None]:
    """The source metadata of a copy of ``source``'s rows (a downsample, a preprocess output),
    and the instructions whose step column the copy writes as :meth:`Instructions.of_rows` gives
    it: the metadata of a merge of parents whose metadata differ holds only what they say alike
    (:func:`~rlds_cli.cache.composed.agreed_metadata`: no task table), so the copy gets the
    merged table as a text table and each step's index in it; ``None`` where the metadata
    carries them as they are."""
    meta = source.source_metadata
    merged = isinstance(source, ComposedDataset) and not source.parents_agree
    found = source.instructions if merged else None
    if found is None or found.step_key is None:
        return meta, None
    rlds = dict(meta.get("rlds") or {})  # a section every parent has alike keeps its other tables
    rlds["text"] = {**dict(rlds.get("text") or {}), found.step_key: list(found.texts)}
    return {**meta, "rlds": rlds}, found


def copied_source_arrays(source: Dataset) -> dict[str, np.ndarray]:
    """The per-episode source arrays of a copy of ``source``'s episodes, in its episode order: its
    own (:meth:`~rlds_cli.cache.dataset.Dataset.episode_source_arrays`), and, for a merge whose
    per-episode instructions come from its parents' differing metadata (LIBERO's
    ``problem_info``, which a merge keeps only where every parent has the same: see
    :func:`copied_metadata`), those instructions as RoboCasa's are kept,
    ``robomimic/episode_lang`` (an episode of a parent without any: none)."""
    arrays = dict(source.episode_source_arrays())
    if not isinstance(source, ComposedDataset) or source.parents_agree or LANG_RANGES in arrays:
        return arrays
    found = source.instructions
    if found is None or found.step_key is not None or found.episode_task is None:
        return arrays
    encoded = [text.encode("utf-8") for text in found.texts]
    sizes = np.array([len(raw) for raw in encoded], np.int64)
    ends = np.cumsum(sizes)
    spans = np.stack([ends - sizes, ends], axis=1)
    spans[[not text for text in found.texts]] = -1  # "" stands for a parent without instructions
    arrays[LANG_RANGES] = spans[np.asarray(found.episode_task, np.int64)].reshape(-1, 2)
    arrays[text_blob_name(LANG_RANGES)] = np.frombuffer(b"".join(encoded), np.uint8)
    return arrays


#: RoboCasa's per-episode instruction (byte ranges into its text blob), read by
#: :attr:`~rlds_cli.cache.dataset.Dataset.instructions`.
LANG_RANGES = "robomimic/episode_lang"


def _downsampled_card(source: Dataset, every: int) -> dict[str, Any]:
    """The card of every ``every``-th step of ``source``: its card, with its rate
    (:func:`~rlds_cli.cache.card.dataset_fps`: the card's, else its source's) divided."""
    card, fps = dataset_card(source), dataset_fps(source)
    if fps is not None:
        rate = fps / every
        return {**card, "fps": int(rate) if float(rate).is_integer() else rate}
    return card


def copied_step_column(
    source: Dataset, instructions: Instructions, start: int, rows: np.ndarray
) -> np.ndarray:
    """``rows`` (the instructions' step column at ``source``'s steps from ``start``, read
    already) as indices of their ``texts``, in the column's dtype (see :func:`copied_metadata`).

    Raises:
        SchemaMismatchError: An index the column's dtype cannot hold.
    """
    mapped = instructions.of_column(source, start, rows)
    if len(mapped) and int(mapped.max()) > np.iinfo(rows.dtype).max:
        raise SchemaMismatchError(
            f"{source.name}: its {len(instructions.texts)} instructions do not fit "
            f"{instructions.step_key!r}'s dtype {rows.dtype}",
            hint="copy each parent, then merge the copies",
        )
    return mapped.astype(rows.dtype).reshape(rows.shape)


def _blocks(lengths: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Runs of whole episodes of about ``budget`` steps each (one episode at least)."""
    out, first, rows = [], 0, 0
    for e, length in enumerate(lengths.tolist()):
        rows += length
        if rows >= budget:
            out.append((first, e + 1))
            first, rows = e + 1, 0
    if first < len(lengths):
        out.append((first, len(lengths)))
    return out


def _window_sums(source: Dataset, key: str, rows: np.ndarray, starts: np.ndarray, every: int) -> np.ndarray:
    """``rows`` summed over each window from ``starts``, in their stored dtype (floats add in it;
    integers and bools add exactly first: int8 wrapped, bool took "any", int64 wrapped in int64).

    Raises:
        SchemaMismatchError: A sum the stored dtype cannot hold (an integer out of range, a bool
            above 1, a float that overflows).
    """
    if rows.dtype.kind == "f":
        with np.errstate(over="ignore"):  # an overflow is refused below
            wide = sums = np.add.reduceat(rows, starts, axis=0)
        exact = np.isfinite(sums)
        if not exact.all():  # infinite where the rows were, or an overflow of the stored dtype
            exact |= ~np.isfinite(np.add.reduceat(rows.astype(np.float64), starts, axis=0))
    else:
        # Python integers for 64-bit rows (no wider numpy integer exists); int64 holds the rest
        wide = np.add.reduceat(rows.astype(object if rows.dtype.itemsize == 8 else np.int64), starts, axis=0)
        info = np.iinfo(rows.dtype) if rows.dtype.kind != "b" else np.iinfo(np.uint8)
        high = 1 if rows.dtype.kind == "b" else info.max
        exact = (wide >= info.min) & (wide <= high)
        sums = np.where(exact, wide, 0).astype(rows.dtype)
    if not exact.all():
        bad = wide[~exact].reshape(-1)[0]
        raise SchemaMismatchError(
            f"{source.name}: the sum of {key!r} over {every} steps reaches {bad}, which its dtype "
            f"{rows.dtype} cannot hold",
            hint="downsampled rewards keep their dtype: store them as floats (rlds preprocess), "
            "or pick a smaller -k",
        )
    return sums


def _window_block(
    source: Dataset, index: np.ndarray, first: int, stop: int, every: int, instructions: Instructions | None
) -> StepBlock:
    """Episodes ``[first, stop)`` of ``source`` downsampled, as one block (``instructions``: whose
    step column is written as indices of its ``texts``, see :func:`copied_metadata`)."""
    lengths = index["length"][first:stop].astype(np.int64)
    step0 = int(index["start"][first])
    n = int(lengths.sum())
    kept = -(-lengths // every)  # windows per episode
    ep_starts = np.cumsum(lengths) - lengths  # in the block's steps
    win_ep = np.repeat(np.arange(len(lengths)), kept)
    win_pos = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
    win_first = ep_starts[win_ep] + win_pos * every  # each window's first step, in the block
    win_last = np.minimum(win_first + every, ep_starts[win_ep] + lengths[win_ep]) - 1
    steps: dict[str, np.ndarray] = {}
    observations: dict[str, np.ndarray] = {}
    for key, spec in source.manifest.fields.items():
        column = source.column(key)
        if spec.storage == "flat":  # step t of episode e: flat row t + e; its final row after
            flat_first = win_first + win_ep
            finals = ep_starts + lengths + np.arange(len(lengths))
            take = np.insert(flat_first, np.cumsum(kept), finals)
            if getattr(column, "stored_format", None) is not None:  # frames copied as stored
                observations[key] = column.encoded_rows(step0 + first + take)
                continue
            rows = np.asarray(column[step0 + first : step0 + first + n + len(lengths)])
            observations[key] = rows[take]
            continue
        rows = np.asarray(column[step0 : step0 + n])
        if instructions is not None and key == instructions.step_key:
            rows = copied_step_column(source, instructions, step0, rows)
        if key in SUMMED:
            steps[key] = _window_sums(source, key, rows, win_first, every)
        elif key in FLAGS:
            steps[key] = np.logical_or.reduceat(rows.astype(bool), win_first, axis=0)
        elif after_step(key):
            steps[key] = rows[win_last]
        else:
            steps[key] = rows[win_first]
    return StepBlock(
        steps=steps,
        observations=observations,
        ends=np.cumsum(kept) - 1,
        final_known=index["final_known"][first:stop],
        episode_ids=index["source_id"][first:stop],
    )
