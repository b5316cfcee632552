"""Whole episodes checked against the first one: the schema rule of every episode-structured reader.

Minari, Roboset, AMAGO and Gen-DGRL sources are read episode by episode (or trajectory by
trajectory). Each reader turns one into an :class:`Episode` (a whole-episode
:class:`~rlds_cli.formats.packing.Piece`: observation-like columns with ``T + 1`` rows, per-step
columns with ``T`` rows, how it ended) and hands it to the
:class:`~rlds_cli.formats.packing.BlockPacker` with an :class:`EpisodeSchema` as its ``admit``
check, which makes every episode have the schema of the first one (so a file with mixed shapes
fails with a message naming the episode, not deep in the builder).
"""

from __future__ import annotations

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.packing import Piece

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
