"""What every source reader produces: a stream of :class:`StepBlock` in the flat TED layout.

:class:`StepBlock`, :data:`REQUIRED_STEP_KEYS` and :func:`column` belong to the TED vocabulary
(:mod:`rlds_cli.cache.ted`), shared by the readers and the cache; they are importable from here
too, where a reader looks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

import numpy as np

# re-exported: the reader's side of the TED vocabulary
from rlds_cli.cache.ted import REQUIRED_STEP_KEYS as REQUIRED_STEP_KEYS
from rlds_cli.cache.ted import StepBlock as StepBlock
from rlds_cli.cache.ted import column as column


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
