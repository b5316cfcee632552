"""Pieces of episodes -> :class:`StepBlock` s: the block packer of every reader, the block-size
rule, and the schema rule of episode-structured readers.

A reader hands the :class:`BlockPacker`, in order, :class:`Piece` s (consecutive steps of one
episode: a whole episode or a segment) or blocks it built itself (:meth:`BlockPacker.add_block`).
The packer gathers them into blocks of about :data:`BLOCK_BYTES` (or ``block_rows`` steps), marks
each episode's end (``next/terminated``, ``next/truncated``, final observation known or filled
in, source id), and never copies a piece that fills a block on its own.
:func:`rows_per_block` is the same budget for readers that read a fixed number of rows at a time.

Episode-structured readers (Minari, Roboset, AMAGO, Gen-DGRL) hand over whole :class:`Episode` s
(observation-like columns ``T + 1`` rows, per-step columns ``T``) with an :class:`EpisodeSchema`
as ``admit``, so every episode must have the first one's schema (mixed shapes fail naming the
episode, not deep in the builder).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport, StepBlock
from rlds_cli.frames.codecs import join_rows

#: Source bytes gathered before a block is emitted (every reader's budget).
BLOCK_BYTES = 8 * 1024 * 1024


def rows_per_block(row_bytes: int, lo: int = 1, hi: int = 1 << 18) -> int:
    """Rows of ``row_bytes`` bytes in about :data:`BLOCK_BYTES`, clipped to ``[lo, hi]``."""
    return int(np.clip(BLOCK_BYTES // max(row_bytes, 1), lo, hi))


@dataclass
class Piece:
    """A run of consecutive steps of one episode, as a reader read it.

    Attributes:
        label: Where it came from, for error messages (``file.h5:episode_3``).
        observations: Observation-like columns, one row a step, plus the final observation when
            ``last`` (``T + 1`` rows for a whole episode).
        steps: Per-step columns, ``T`` rows each; ``action`` and ``next/reward`` at least
            (``next/terminated``/``next/truncated`` are the packer's).
        terminated: Whether the episode's last step terminated it (otherwise it was truncated);
            read only when ``last``.
        source_id: The source's own number for the episode.
        final_known: Whether the final observation is the real one.
        truncated: Truncation flag of the last step (default: ``not terminated``); a step may
            carry both flags when the source says so.
        last: Whether the episode ends with this piece (a whole episode does).
    """

    label: str
    observations: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    terminated: bool
    source_id: int = -1
    final_known: bool = True
    truncated: bool | None = None
    last: bool = True

    @property
    def length(self) -> int:
        """The number of steps."""
        return int(next(iter(self.steps.values())).shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of its columns."""
        return sum(v.nbytes for v in self.steps.values()) + sum(v.nbytes for v in self.observations.values())


def piece_block(piece: Piece) -> StepBlock:
    """One piece as a block of its own (its end marked when it is the episode's last piece)."""
    n = piece.length
    term = np.zeros((n, 1), bool)
    trunc = np.zeros((n, 1), bool)
    if piece.last:
        term[-1, 0] = piece.terminated
        trunc[-1, 0] = (not piece.terminated) if piece.truncated is None else piece.truncated
    ends = 1 if piece.last else 0
    return StepBlock(
        steps={**piece.steps, "next/terminated": term, "next/truncated": trunc},
        observations=piece.observations,
        ends=np.array([n - 1] * ends, np.int64),
        final_known=np.array([piece.final_known] * ends, bool),
        episode_ids=np.array([piece.source_id] * ends, np.int64),
    )


def _block_bytes(block: StepBlock) -> int:
    return sum(v.nbytes for v in (*block.steps.values(), *block.observations.values()))


class BlockPacker:
    """Gathers pieces of episodes (or blocks) into blocks of about ``block_bytes`` bytes, or
    ``block_rows`` steps when given; a piece that would overflow the pending ones sends them out
    first, so a piece that fills a block alone passes without a copy.

    Args:
        block_rows: Steps per block at most (``None``: bytes only).
        admit: Asked for each piece before it is queued; ``False`` leaves it out (an episode without
            a transition), raising stops the conversion (a schema that differs).
        block_bytes: Target bytes per block.
    """

    def __init__(
        self,
        block_rows: int | None = None,
        *,
        admit: Callable[[Piece], bool] | None = None,
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        self.block_rows = block_rows
        self.block_bytes = block_bytes
        self._admit = admit
        self._pending: list[StepBlock] = []
        self._bytes = 0
        self._steps = 0

    def _full(self, nbytes: int, steps: int, *, over: bool = False) -> bool:
        """Whether ``nbytes``/``steps`` reach the budget (``over``: go past it)."""
        rows = self.block_rows if self.block_rows is not None else steps + 1
        if over:
            return nbytes > self.block_bytes or steps > rows
        return nbytes >= self.block_bytes or steps >= rows

    def add(self, piece: Piece) -> Iterator[StepBlock]:
        """Queue one piece of an episode; yields the blocks that fill up."""
        if self._admit is not None and not self._admit(piece):
            return
        if piece.length == 0:
            if piece.last:
                raise ValueError(f"{piece.label}: an episode's last piece has no step (readers drop those)")
            return
        yield from self.add_block(piece_block(piece))

    def add_block(self, block: StepBlock) -> Iterator[StepBlock]:
        """Queue a block the reader built (consecutive steps, episode ends marked)."""
        nbytes = _block_bytes(block)
        if self._pending and self._full(self._bytes + nbytes, self._steps + block.num_steps, over=True):
            yield self._flush()
        self._pending.append(block)
        self._bytes += nbytes
        self._steps += block.num_steps
        if self._full(self._bytes, self._steps):
            yield self._flush()

    def finish(self) -> Iterator[StepBlock]:
        """Emit what is left."""
        if self._pending:
            yield self._flush()

    def _flush(self) -> StepBlock:
        blocks, self._pending, self._bytes, self._steps = self._pending, [], 0, 0
        if len(blocks) == 1:
            return blocks[0]
        offsets = np.cumsum([0, *(b.num_steps for b in blocks[:-1])])
        first = blocks[0]
        return StepBlock(
            steps={k: np.concatenate([b.steps[k] for b in blocks]) for k in first.steps},
            observations={k: join_rows([b.observations[k] for b in blocks]) for k in first.observations},
            ends=np.concatenate([b.ends + o for b, o in zip(blocks, offsets, strict=True)]).astype(np.int64),
            final_known=_per_end([b.final_known for b in blocks], blocks, True),
            episode_ids=_per_end([b.episode_ids for b in blocks], blocks, -1),
        )


def _per_end(values: list[Any], blocks: list[StepBlock], default: bool | int) -> np.ndarray | None:
    """One per-end array for several blocks (``None`` when no block has one; a block without one gets
    ``default`` per end)."""
    if all(v is None for v in values):
        return None
    filled = [np.full(len(b.ends), default) if v is None else v for v, b in zip(values, blocks, strict=True)]
    return np.concatenate(filled)


#: A whole episode: a piece that is its episode's last (``T + 1`` observation rows).
Episode = Piece


def _schema(columns: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (tuple(v.shape[1:]), v.dtype.str) for k, v in columns.items()}


class EpisodeSchema:
    """Admits whole episodes that have the first one's keys, shapes and dtypes.

    Args:
        report: The reader's report (episodes without a transition are counted as dropped).
    """

    def __init__(self, report: ConversionReport) -> None:
        self.report = report
        self._obs_schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self._step_schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self._first_label = ""

    def __call__(self, ep: Episode) -> bool:
        """Whether to pack ``ep`` (an episode without a transition is dropped and counted).

        Raises:
            SourceFormatError: Ragged columns, or keys, shapes or dtypes unlike the first episode's.
        """
        if ep.length == 0:
            self.report.dropped_episodes += 1
            return False
        self._check(ep)
        return True

    def _check(self, ep: Episode) -> None:
        t = ep.length
        for key, rows in ep.steps.items():
            if rows.shape[0] != t:
                raise SourceFormatError(
                    f"{ep.label}: {key!r} has {rows.shape[0]} rows, expected {t} (ragged episode)"
                )
        for key, rows in ep.observations.items():
            if rows.shape[0] != t + 1:
                raise SourceFormatError(
                    f"{ep.label}: {key!r} has {rows.shape[0]} rows, expected {t + 1} "
                    f"({t} steps + the final observation; ragged episode)"
                )
        obs, steps = _schema(ep.observations), _schema(ep.steps)
        if self._obs_schema is None:
            self._obs_schema, self._step_schema, self._first_label = obs, steps, ep.label
            return
        for mine, first, kind in ((obs, self._obs_schema, "observation"), (steps, self._step_schema, "step")):
            assert first is not None
            if set(mine) != set(first):
                extra = sorted(set(mine) - set(first))
                missing = sorted(set(first) - set(mine))
                raise SourceFormatError(
                    f"{ep.label}: {kind} keys differ from {self._first_label}"
                    + (f"; unknown keys {extra}" if extra else "")
                    + (f"; missing keys {missing}" if missing else "")
                )
            for key, spec in mine.items():
                if spec != first[key]:
                    raise SourceFormatError(
                        f"{ep.label}: {key!r} has shape {spec[0]} dtype {np.dtype(spec[1])} per step, "
                        f"but {first[key][0]} {np.dtype(first[key][1])} in {self._first_label} "
                        "(mixed shapes across episodes)"
                    )
