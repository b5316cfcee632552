"""A checkpoint's rotation (its slots in add order), the rows read from it, and the checkpoint
selection (``--option checkpoints=A:B``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.numbers import NumberSelection, parse_numbers
from rlds_cli.errors import SourceError


@dataclass
class Checkpoint:
    """One checkpoint: its files, its header facts, and how the conversion reads it."""

    number: int
    files: dict[str, Path]
    capacity: int = 0
    add_count: int = 0
    invalid_range: list[int] = field(default_factory=list)
    #: whether the previous converted checkpoint continues into this one (and this into the next)
    head_continued: bool = False
    tail_continued: bool = False
    #: chronological positions not read at the head: repeated from the previous checkpoint, or
    #: invalid_range rows that cannot matter (see :meth:`AtariDQNReader._plan_edges`)
    skip_duplicate: int = 0
    skip_invalid: int = 0
    #: chronological positions of invalid_range rows that are dropped (sorted)
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stats: dict[str, int] = field(default_factory=dict)
    first_step: int = -1
    #: frame shape, frame dtype and action dtype, which every converted checkpoint shares
    schema: tuple[Any, ...] = ()

    @property
    def length(self) -> int:
        """Rows holding data: the whole buffer once full, else ``add_count``."""
        return min(self.add_count, self.capacity)

    @property
    def first_add(self) -> int:
        """The add index of the oldest row."""
        return self.add_count - self.length

    @property
    def start_slot(self) -> int:
        """The slot of the oldest row (the write cursor once the buffer is full)."""
        return self.add_count % self.capacity if self.capacity and self.add_count >= self.capacity else 0

    @property
    def skip(self) -> int:
        return self.skip_duplicate + self.skip_invalid

    def passes(self) -> list[tuple[int, int]]:
        """The slot ranges holding chronological rows ``[skip, length)``, in reading order (one starting
        before the previous one's end starts a new read of the files)."""
        c, s, first = self.capacity, self.start_slot, self.skip
        if self.add_count < c:
            return [(first, self.length)] if first < self.length else []
        out = []
        if s + first < c:
            out.append((s + first, c))
        lo = max(first - (c - s), 0)
        if lo < s:
            out.append((lo, s))
        return out

    def positions(self, slots: np.ndarray) -> np.ndarray:
        """Chronological positions of ``slots`` (slots holding no data are left out)."""
        if self.add_count >= self.capacity:
            return np.unique((slots - self.start_slot) % self.capacity)
        return np.unique(slots[slots < self.length])


def listed(found: dict[int, Any]) -> str:
    numbers = sorted(found)
    return ", ".join(str(n) for n in numbers[:12]) + (
        f" and {len(numbers) - 12} more" if len(numbers) > 12 else ""
    )


def run_length(sorted_positions: np.ndarray, start: int, step: int) -> int:
    """How many of ``start, start + step, ...`` are all in ``sorted_positions``."""
    wanted = set(sorted_positions.tolist())
    k = 0
    while start + k * step in wanted:
        k += 1
    return k


def parse_checkpoints(spec: object) -> NumberSelection:
    """``checkpoints`` option -> a predicate on checkpoint numbers (``None``: all), and the numbers it
    names one by one (``None`` for a range), which must all exist.

    Accepts ``"A:B"`` (``A <= N < B``; either side may be empty), ``"3,5,9"``, one number, or a list
    (:func:`rlds_cli._util.numbers.parse_numbers`, the rule the registry downloads by)."""
    try:
        return parse_numbers(spec)
    except ValueError:
        raise SourceError(
            f"checkpoints={spec!r} is not a range 'A:B' or a list of checkpoint numbers",
            hint="e.g. checkpoints='0:10' (A <= N < B), checkpoints='49,50' or checkpoints=[49, 50]",
        ) from None


@dataclass
class Rows:
    """Consecutive rows of the chronological stream, with what each row needs decided."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    term: np.ndarray
    #: the row is in invalid_range (and dropped), or padding (and dropped)
    invalid: np.ndarray
    pad: np.ndarray
    #: the next row of the stream is this row's successor in the data
    link: np.ndarray
    #: index into the reader's checkpoint list
    ckpt: np.ndarray

    def __len__(self) -> int:
        return len(self.term)

    def cut(self, lo: int, hi: int | None = None) -> Rows:
        return Rows(**{k: v[lo:hi] for k, v in self.__dict__.items()})

    @staticmethod
    def join(a: Rows, b: Rows) -> Rows:
        if not len(a):
            return b
        return Rows(**{k: np.concatenate([v, getattr(b, k)]) for k, v in a.__dict__.items()})
