"""Subsets at conversion time (``rlds download --episodes A:B --keys K,...``): a filter between any
reader and the builder, so unselected data is never written.

Per-episode source arrays (``source_metadata.npz``, named ``<format>/episode_<what>``, e.g.
``minari/episode_seed``) have one row per episode of the reader's stream; after ``--episodes A:B``
they keep the kept episodes' rows only (:func:`subset_episode_arrays`), so row ``i`` describes
the dataset's episode ``i``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from rlds_cli.cache.layout import is_episode_array
from rlds_cli.cache.views import parse_range
from rlds_cli.errors import ConversionError, InvalidSelectionError, SourceFormatError
from rlds_cli.formats.base import REQUIRED_STEP_KEYS, StepBlock, key_problem
from rlds_cli.formats.untrusted import require_numeric, require_rows
from rlds_cli.frames.codecs import block_rows, take_rows


@dataclass
class SelectionRecord:
    """What :func:`select_blocks` saw: the number of source episodes read, to cut the per-episode source
    arrays to the kept ones."""

    episodes_seen: int = 0


def kept_episodes(episodes: tuple[int, int | None], seen: int) -> np.ndarray:
    """Positions (in the source's episode stream) of the episodes ``A:B`` kept, of ``seen`` read."""
    first, stop = episodes
    last = seen if stop is None else min(stop, seen)
    return np.arange(first, max(first, last), dtype=np.int64)


def subset_episode_arrays(arrays: Mapping[str, np.ndarray], kept: np.ndarray) -> dict[str, np.ndarray]:
    """``arrays`` with every per-episode array cut to the ``kept`` episodes, row for row."""
    out: dict[str, np.ndarray] = {}
    need = int(kept[-1]) + 1 if len(kept) else 0
    for name, value in arrays.items():
        if not is_episode_array(name):
            out[name] = value
            continue
        value = np.asarray(value)
        if value.ndim == 0 or len(value) < need:
            # a reader bug, not bad input: its array must cover every episode it streamed
            raise ConversionError(
                f"source array {name!r} has {len(value) if value.ndim else 0} rows, but episode "
                f"{need - 1} was kept: it cannot be cut to the kept episodes"
            )
        out[name] = value[kept]
    return out


def parse_episodes(spec: str | tuple[int, int | None] | list[int | None]) -> tuple[int, int | None]:
    """``"A:B"`` (empty ``B``: to the end) or a manifest's ``[A, B]`` -> ``(A, B)``; anything else, and
    negative values, raise :class:`InvalidSelectionError`."""
    start, stop = parse_range(spec, negative=False)
    return start or 0, stop


def select_blocks(
    blocks: Iterable[StepBlock],
    *,
    episodes: tuple[int, int | None] | None = None,
    keys: list[str] | None = None,
    record: SelectionRecord | None = None,
    source: object = None,
    start: int = 0,
) -> Iterator[StepBlock]:
    """Keep the episodes ``[A, B)`` and the named keys of a block stream.

    Episode numbers count the source's episodes in order; a kept episode keeps its source number as
    its ``source_id``. ``keys`` names TED keys to keep besides the required ones (``action``,
    ``next/reward``, ``next/terminated``, ``next/truncated``); ``next/K`` selects the observation-like
    key ``K``, and naming none of those keeps them all. Reading stops once episode ``B`` is seen.
    ``record`` gets the number of source episodes read (for :func:`kept_episodes`). ``start`` is the
    source position of the stream's first episode (after
    :meth:`~rlds_cli.formats.base.Reader.select_episodes`).

    Every block is checked by :func:`check_block`, naming ``source`` in the error.
    """
    first, stop = episodes if episodes is not None else (0, None)
    wanted = None if keys is None else {k.removeprefix("next/") for k in keys} | set(REQUIRED_STEP_KEYS)
    counter = start  # number of the episode open at the start of the block
    for block in blocks:
        check_block(block, source)
        if wanted is not None:
            block = _select_keys(block, wanted)
        if episodes is None:
            yield block
            continue
        kept = _select_episodes(block, counter, first, stop)
        counter += len(block.ends)
        if record is not None:
            record.episodes_seen = counter
        if kept is not None:
            yield kept
        if stop is not None and counter >= stop:
            return


def check_block(block: StepBlock, source: object = None) -> None:
    """Check every reader's output before anything is written: valid TED keys (never a path out of the
    dataset), numeric or bool columns with one row per step; :class:`SourceFormatError` naming
    ``source`` and the key.
    """
    where = source if source is not None else "the source"
    for columns in (block.steps, block.observations):
        for key, rows in columns.items():
            problem = key_problem(key)
            if problem is not None:
                raise SourceFormatError(
                    f"{where}: key {key!r} cannot be stored: {problem}",
                    hint="rename the array in the source (keys are '/'-separated parts of A-Z a-z 0-9 _ . -)",
                )
            values = block_rows(rows)
            require_numeric(where, key, values.dtype)
            require_rows(where, key, values.shape)


def _select_keys(block: StepBlock, wanted: set[str]) -> StepBlock:
    available = {*block.steps, *block.observations}
    # a name keeps the keys under it too: 'action' keeps action/0, action/1 of a Tuple action
    unknown = sorted(k for k in wanted if not any(a == k or a.startswith(f"{k}/") for a in available))
    if unknown:
        raise InvalidSelectionError(
            f"--keys names {', '.join(unknown)}, which the source does not have",
            hint=f"available keys: {', '.join(sorted(available))}",
        )
    # naming no observation-like key keeps them all: a transition needs its observation
    observations = {k: v for k, v in block.observations.items() if _named(k, wanted)}
    observations = observations or dict(block.observations)
    steps = {k: v for k, v in block.steps.items() if _named(k, wanted)}
    return StepBlock(steps, observations, block.ends, block.final_known, block.episode_ids)


def _named(key: str, wanted: set[str]) -> bool:
    """Whether ``key`` or a group holding it (``action`` for ``action/0``) is in ``wanted``."""
    parts = key.split("/")
    return any("/".join(parts[:i]) in wanted for i in range(1, len(parts) + 1))


def _select_episodes(block: StepBlock, counter: int, first: int, stop: int | None) -> StepBlock | None:
    n, ends = block.num_steps, np.asarray(block.ends, np.int64)
    k = len(ends)
    ends_before = np.searchsorted(ends, np.arange(n), side="left")  # episode ends before each step
    step_episode = counter + ends_before
    end_episode = counter + np.arange(k)
    keep_step = (step_episode >= first) & (step_episode < (stop if stop is not None else np.inf))
    keep_end = (end_episode >= first) & (end_episode < (stop if stop is not None else np.inf))
    if not keep_step.any():
        return None
    keep_flat = np.zeros(n + k, bool)
    keep_flat[np.arange(n) + ends_before] = keep_step
    keep_flat[ends + np.arange(k) + 1] = keep_end
    new_ends = np.cumsum(keep_step)[ends[keep_end]] - 1
    ids = block.episode_ids if block.episode_ids is not None else end_episode
    return StepBlock(
        steps={key: np.asarray(v)[keep_step] for key, v in block.steps.items()},
        observations={key: take_rows(v, keep_flat) for key, v in block.observations.items()},
        ends=new_ends,
        final_known=None if block.final_known is None else np.asarray(block.final_known)[keep_end],
        episode_ids=np.asarray(ids)[keep_end],
    )
