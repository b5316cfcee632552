"""Whole episodes -> :class:`StepBlock` s: the common tail of every episode-structured reader.

Minari, Roboset, OGBench and AMAGO sources are read episode by episode (or trajectory by
trajectory). Each reader turns one into an :class:`Episode` (observation-like columns with
``T + 1`` rows, per-step columns with ``T`` rows, how it ended) and hands it to an
:class:`EpisodePacker`, which checks that every episode has the schema of the first one (so a
file with mixed shapes fails with a message naming the episode, not deep in the builder) and
packs consecutive episodes into blocks of about :data:`BLOCK_BYTES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport, StepBlock

#: Source bytes gathered before a block is emitted (the same budget as the D4RL reader).
BLOCK_BYTES = 8 * 1024 * 1024


@dataclass
class Episode:
    """One episode as a reader found it.

    Attributes:
        label: Where it came from, for error messages (``file.h5:episode_3``).
        observations: Observation-like columns, ``T + 1`` rows each (the last is the final
            observation).
        steps: Per-step columns, ``T`` rows each; ``action`` and ``next/reward`` at least.
        terminated: Whether the last step terminated the episode (otherwise it was truncated).
        source_id: The source's own number for the episode.
        final_known: Whether the final observation is the real one.
        truncated: Truncation flag of the last step (default: ``not terminated``); a step may
            carry both flags when the source says so.
    """

    label: str
    observations: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    terminated: bool
    source_id: int = -1
    final_known: bool = True
    truncated: bool | None = None

    @property
    def length(self) -> int:
        return int(next(iter(self.steps.values())).shape[0])


def _schema(columns: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (tuple(v.shape[1:]), v.dtype.str) for k, v in columns.items()}


class EpisodePacker:
    """Checks episodes against the first one's schema and packs them into blocks.

    Args:
        report: The reader's report (episodes without a transition are counted as dropped).
        block_bytes: Target bytes per block.
    """

    def __init__(self, report: ConversionReport, block_bytes: int = BLOCK_BYTES) -> None:
        self.report = report
        self.block_bytes = block_bytes
        self._obs_schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self._step_schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self._first_label = ""
        self._pending: list[Episode] = []
        self._bytes = 0

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

    def add(self, ep: Episode) -> Iterator[StepBlock]:
        """Queue one episode; yields a block when enough data has gathered."""
        if ep.length == 0:
            self.report.dropped_episodes += 1
            return
        self._check(ep)
        self._pending.append(ep)
        self._bytes += sum(v.nbytes for v in ep.observations.values()) + sum(
            v.nbytes for v in ep.steps.values()
        )
        if self._bytes >= self.block_bytes:
            yield self._flush()

    def finish(self) -> Iterator[StepBlock]:
        """Emit what is left."""
        if self._pending:
            yield self._flush()

    def _flush(self) -> StepBlock:
        eps, self._pending, self._bytes = self._pending, [], 0
        lengths = np.array([e.length for e in eps], np.int64)
        ends = np.cumsum(lengths) - 1
        n = int(lengths.sum())
        steps = {k: _concat([e.steps[k] for e in eps]) for k in eps[0].steps}
        term = np.zeros((n, 1), bool)
        trunc = np.zeros((n, 1), bool)
        term[ends, 0] = [e.terminated for e in eps]
        trunc[ends, 0] = [(not e.terminated) if e.truncated is None else e.truncated for e in eps]
        steps["next/terminated"] = term
        steps["next/truncated"] = trunc
        observations = {k: _concat([e.observations[k] for e in eps]) for k in eps[0].observations}
        return StepBlock(
            steps=steps,
            observations=observations,
            ends=ends,
            final_known=np.array([e.final_known for e in eps], bool),
            episode_ids=np.array([e.source_id for e in eps], np.int64),
        )


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """Rows of several parts in one array (one part is passed on as it is, without a copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
