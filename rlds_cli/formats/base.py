"""What every source reader produces: a stream of :class:`StepBlock` in the flat TED layout."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

import numpy as np

#: Keys every block must carry (per step, N rows).
REQUIRED_STEP_KEYS = ("action", "next/reward", "next/terminated", "next/truncated")


def column(values: np.ndarray) -> np.ndarray:
    """A per-step scalar as TED's ``[N, 1]`` column (``(N,)`` gains the trailing axis)."""
    values = np.asarray(values)
    return values[:, None] if values.ndim == 1 else values


@dataclass
class StepBlock:
    """A run of consecutive transitions, in the flat layout the cache stores.

    Attributes:
        steps: Per-step columns with ``n`` rows each (``action``, ``next/reward``,
            ``next/terminated``, ``next/truncated``, ``info/...``).
        observations: Observation-like columns in flat layout: the observation of each step,
            plus, right after the last step of every episode that ends in this block, that
            episode's final observation. So ``n + len(ends)`` rows each.
        ends: Sorted positions (in ``[0, n)``) of the last step of each episode that ends in
            this block. An episode may start in an earlier block.
        final_known: Per end, whether the final observation is the real one (``False`` where a
            format rule had to fill it in; see ``docs/formats.md``). ``None`` means all real.
        episode_ids: Per end, the source's own id of that episode (``None``: numbered in order).
    """

    steps: Mapping[str, np.ndarray]
    observations: Mapping[str, np.ndarray]
    ends: np.ndarray
    final_known: np.ndarray | None = None
    episode_ids: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(next(iter(self.steps.values())).shape[0]) if self.steps else 0


@dataclass
class ConversionReport:
    """What a reader decided while converting; stored in the manifest under ``conversion``."""

    rules: str = ""
    source_rows: int = 0
    dropped_rows: int = 0
    dropped_episodes: int = 0
    synthesized_final_observations: int = 0
    inferred_boundaries: int = 0
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Counts the source itself declares (e.g. Minari's ``total_steps``), checked by
    #: ``rlds inspect --check``: keys ``num_steps`` and ``num_episodes`` (episodes counted
    #: before any were dropped).
    expected: dict[str, int] = field(default_factory=dict)
    #: NaN values per stored key, counted while converting (``rlds inspect --check`` compares).
    nan_counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": self.rules,
            "source_rows": self.source_rows,
            "dropped_rows": self.dropped_rows,
            "dropped_episodes": self.dropped_episodes,
            "synthesized_final_observations": self.synthesized_final_observations,
            "inferred_boundaries": self.inferred_boundaries,
            "notes": list(self.notes),
        }

    def checks(self) -> dict[str, Any]:
        """What ``rlds inspect --check`` compares against (stored as the manifest's
        ``source.checks``): the source's declared counts and the NaN count per key."""
        return {"expected": dict(self.expected), "nan_counts": dict(self.nan_counts)}


class ReaderBase:
    """What every reader shares: use as a context manager; ``close`` releases its files."""

    def close(self) -> None:
        """Release open files (nothing to do for readers that open files per block)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SourceReader(Protocol):
    """A reader of one source format, streaming blocks with bounded memory."""

    format_name: str
    path: Path
    report: ConversionReport

    def total_rows(self) -> int:
        """Rows the source holds (for progress bars)."""
        ...

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the whole source as blocks; ``progress`` gets the source rows consumed."""
        ...

    def source_metadata(self) -> dict[str, Any]:
        """Small JSON-serialisable facts from the source (stored in the manifest)."""
        ...

    def source_arrays(self) -> dict[str, np.ndarray]:
        """Larger non-step arrays from the source (stored in ``source_metadata.npz``)."""
        ...
