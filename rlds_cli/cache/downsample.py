"""Downsampling: every k-th step of each episode as a dataset of its own (``rlds downsample``).

Step ``i`` of a downsampled episode covers the parent's steps ``[i*k, min(i*k + k, L))`` (a
window; the last one may be shorter): its observation and every other key are the window's
first step's, except ``next/reward``, the sum of the window's rewards, ``next/terminated`` and
``next/truncated``, true where any step of the window has them (so only the last window of an
episode is done, as TED requires), and other ``next/...`` keys, the window's last step's. Its
next observation is the observation after the window: the next window's first, or the
episode's final observation. An episode of ``L`` steps keeps ``ceil(L / k)``.

Why materialized and not a view: the summed rewards and moved flags are new values, and a
view of the kept rows would still need a stored reward column per version; the copy costs
``N / k`` rows, written once through a :class:`~rlds_cli.cache.builder.DatasetBuilder`
(content digests, atomic publish: a kill leaves the parent intact and nothing published).
Frame columns are decoded and encoded again with their codec.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from rlds_cli._version import __version__
from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.card import dataset_card
from rlds_cli.cache.compose import verify_parent
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import SEGMENTED_LAYOUT, validate_name
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.snapshot import fixed_copy_hint
from rlds_cli.cache.ted import StepBlock
from rlds_cli.errors import InvalidSelectionError

__all__ = ["downsample_dataset"]

#: The rows read per block, in bytes of every key together (at least one episode a block).
BLOCK_BYTES = 64 << 20
#: Step keys summed over a window, and keys true where any step of the window is.
SUMMED = ("next/reward",)
FLAGS = ("next/terminated", "next/truncated")


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
    """Publish every ``every``-th step of each episode of ``parent`` as ``name`` (see the
    module's text for what each key holds).

    Args:
        progress: Called with the parent's steps read so far, after each block.

    Raises:
        InvalidSelectionError: ``every`` below 2, or ``parent`` is a growing dataset.
        DatasetExistsError: ``name`` exists and ``replace`` is false.
        CorruptDatasetError: ``parent``'s files or content digests do not match its manifest.
    """
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
    framed = [spec.codec for spec in fields.values() if spec.codec != "raw"]
    frames = framed[0].partition(":")[0] if framed else None
    row_bytes = sum(spec.row_bytes for spec in fields.values())
    budget = max(1, BLOCK_BYTES // max(1, row_bytes))
    verify_parent(source)  # a copy of damaged arrays would verify clean: the damage would be lost
    index = source.episode_index
    # a k past the longest episode keeps each episode's first step, as the longest does (and a
    # k past int64 would overflow numpy)
    window = min(every, max(2, int(index["length"].max(initial=0))))
    with DatasetBuilder(
        name,
        root=cache,
        backend=source.manifest.backend,
        replace=replace,
        lock_timeout=lock_timeout,
        frames=frames,
    ) as builder:
        for first, stop in _blocks(index["length"].astype(np.int64), budget):
            builder.append(_window_block(source, index, first, stop, window))
            if progress is not None:
                progress(int(index["start"][stop - 1] + index["length"][stop - 1]))
        return builder.commit(
            source={"format": "rlds-downsample", "parent": parent, "every": every},
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
            card=dataset_card(source),
        )


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


def _window_block(source: Dataset, index: np.ndarray, first: int, stop: int, every: int) -> StepBlock:
    """Episodes ``[first, stop)`` of ``source`` downsampled, as one block."""
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
            rows = np.asarray(column[step0 + first : step0 + first + n + len(lengths)])
            flat_first = win_first + win_ep
            finals = ep_starts + lengths + np.arange(len(lengths))
            take = np.insert(flat_first, np.cumsum(kept), finals)
            observations[key] = rows[take]
            continue
        rows = np.asarray(column[step0 : step0 + n])
        if key in SUMMED:
            steps[key] = np.add.reduceat(rows, win_first, axis=0).astype(rows.dtype, copy=False)
        elif key in FLAGS:
            steps[key] = np.logical_or.reduceat(rows.astype(bool), win_first, axis=0)
        elif key.startswith("next/"):
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
