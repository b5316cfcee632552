"""Subsets at conversion time (``rlds download --episodes A:B --keys K,...``): a filter between
any reader and the builder, so the unselected data is never written."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from rlds_cli.errors import InvalidSelectionError
from rlds_cli.formats.base import REQUIRED_STEP_KEYS, StepBlock


def parse_episodes(spec: str | tuple[int, int | None] | list[int | None]) -> tuple[int, int | None]:
    """``"A:B"`` (``B`` may be empty: to the end) -> ``(A, B)``. Negative values are refused:
    a stream does not know its episode count in advance."""
    if isinstance(spec, tuple | list):
        start, stop = spec
    else:
        try:
            left, right = spec.split(":")
            start = int(left) if left.strip() else 0
            stop = int(right) if right.strip() else None
        except ValueError:
            raise InvalidSelectionError(f"episode range {spec!r} is not of the form A:B") from None
    if start < 0 or (stop is not None and stop <= start):
        raise InvalidSelectionError(
            f"episode range {spec!r} must be A:B with 0 <= A < B (B empty: to the end)",
            hint="for a range counted from the end, convert everything and make a view ('rlds view')",
        )
    return int(start), None if stop is None else int(stop)


def select_blocks(
    blocks: Iterable[StepBlock],
    *,
    episodes: tuple[int, int | None] | None = None,
    keys: list[str] | None = None,
) -> Iterator[StepBlock]:
    """Keep the episodes ``[A, B)`` and the named keys of a block stream.

    Episode numbers count the source's episodes in order; each kept episode keeps its source
    number as its ``source_id``. ``keys`` names TED keys to keep besides the required ones
    (``action``, ``next/reward``, ``next/terminated``, ``next/truncated``); ``next/K`` selects
    the observation-like key ``K``, and naming none of those keeps them all. Reading stops as
    soon as episode ``B`` has been seen.
    """
    first, stop = episodes if episodes is not None else (0, None)
    wanted = None if keys is None else {k.removeprefix("next/") for k in keys} | set(REQUIRED_STEP_KEYS)
    counter = 0  # number of the episode open at the start of the block
    for block in blocks:
        if wanted is not None:
            block = _select_keys(block, wanted)
        if episodes is None:
            yield block
            continue
        kept = _select_episodes(block, counter, first, stop)
        counter += len(block.ends)
        if kept is not None:
            yield kept
        if stop is not None and counter >= stop:
            return


def _select_keys(block: StepBlock, wanted: set[str]) -> StepBlock:
    available = {*block.steps, *block.observations}
    unknown = sorted(wanted - available)
    if unknown:
        raise InvalidSelectionError(
            f"--keys names {', '.join(unknown)}, which the source does not have",
            hint=f"available keys: {', '.join(sorted(available))}",
        )
    # naming no observation-like key keeps them all: a transition needs its observation
    observations = {k: v for k, v in block.observations.items() if k in wanted} or dict(block.observations)
    steps = {k: v for k, v in block.steps.items() if k in wanted}
    return StepBlock(steps, observations, block.ends, block.final_known, block.episode_ids)


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
        observations={key: np.asarray(v)[keep_flat] for key, v in block.observations.items()},
        ends=new_ends,
        final_known=None if block.final_known is None else np.asarray(block.final_known)[keep_end],
        episode_ids=np.asarray(ids)[keep_end],
    )
