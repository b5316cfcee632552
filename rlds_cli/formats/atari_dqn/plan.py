"""Checkpoints planned: each checkpoint's six files opened and checked, its circular buffer as slots in
chronological order, and the ``checkpoints`` option parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceError, SourceFormatError
from rlds_cli.formats.atari_dqn.layout import _REDOWNLOAD, FILE_NAMES, STORE, STORE_PREFIX, file_name
from rlds_cli.formats.atari_dqn.stream import _GzipNpy
from rlds_cli.formats.untrusted import describe_dtype
from rlds_cli.numbers import NumberSelection, parse_numbers

#: Largest ``invalid_range`` read (Dopamine's holds ``stack_size + update_horizon`` values).
MAX_INVALID_RANGE = 1024


def _check_store(stream: _GzipNpy, name: str) -> None:
    """Dopamine's store signature: frames ``(C, H, W[, C])`` uint8, the rest ``(C,)`` numbers."""
    shape, dtype, where = stream.shape, stream.dtype, stream.path
    if name == "observation":
        if dtype != np.uint8 or len(shape) not in (3, 4):
            raise SourceFormatError(
                f"{where}: 'observation' is {_what(dtype)} of shape {shape}; Atari DQN frames are uint8 "
                "(rows, 84, 84)",
                hint="this reader reads Dopamine's Atari replay logs: uint8 frames, one per row",
            )
        return
    kinds, want = {
        "action": ("iu", "integers"),
        "reward": ("iuf", "numbers"),
        "terminal": ("biu", "0/1 flags"),
    }[name]
    if len(shape) != 1 or dtype.kind not in kinds:
        raise SourceFormatError(
            f"{where}: {name!r} is {_what(dtype)} of shape {shape}; Dopamine stores one value per row here "
            f"({want}, shape (rows,))",
            hint=_REDOWNLOAD,
        )


def _what(dtype: np.dtype) -> str:
    return f"{dtype}" if dtype.kind in "biufc" and dtype.fields is None else describe_dtype(dtype)


@dataclass
class _Checkpoint:
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
        """The slot ranges that hold chronological rows ``[skip, length)``, in reading order (each
        starts a new read of the files when it starts before the previous one's end)."""
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


def _listed(found: dict[int, Any]) -> str:
    numbers = sorted(found)
    return ", ".join(str(n) for n in numbers[:12]) + (
        f" and {len(numbers) - 12} more" if len(numbers) > 12 else ""
    )


def _run_length(sorted_positions: np.ndarray, start: int, step: int) -> int:
    """How many of ``start, start + step, ...`` are all in ``sorted_positions``."""
    wanted = set(sorted_positions.tolist())
    k = 0
    while start + k * step in wanted:
        k += 1
    return k


def _open_checkpoint(folder: Path, number: int, files: dict[str, Path]) -> _Checkpoint:
    """One checkpoint's six files checked: every file present, the store arrays alike in length
    and sound, ``add_count`` and ``invalid_range`` read."""
    missing = [file_name(name, number) for name in FILE_NAMES if name not in files]
    if missing:
        raise SourceFormatError(
            f"{folder}: checkpoint {number} lacks {', '.join(missing)}",
            hint="download every file of the checkpoint ($store$_observation, _action, _reward, "
            "_terminal, add_count and invalid_range), or leave it out with the checkpoints option",
        )
    ck = _Checkpoint(number, files)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for name in STORE:
        stream = _GzipNpy(files[STORE_PREFIX + name], name)
        try:
            _check_store(stream, name)
            shapes[name], dtypes[name] = stream.shape, stream.dtype
        finally:
            stream.close()
    ck.schema = (shapes["observation"][1:], dtypes["observation"], dtypes["action"].newbyteorder("="))
    rows = {name: shape[0] for name, shape in shapes.items()}
    if len(set(rows.values())) != 1:
        first = rows["observation"]
        other = next(n for n in STORE if rows[n] != first)
        raise SourceFormatError(
            f"{files[STORE_PREFIX + other]}: {other!r} has {rows[other]:,} rows but "
            f"{files[STORE_PREFIX + 'observation'].name} has {first:,} (arrays of different lengths)",
            hint=_REDOWNLOAD,
        )
    ck.capacity = rows["observation"]
    ck.add_count = _read_add_count(files["add_count"])
    ck.invalid_range = _read_invalid_range(files["invalid_range"], ck.capacity)
    if ck.capacity == 0:
        raise SourceFormatError(f"{files[STORE_PREFIX + 'observation']}: the buffer has no rows")
    return ck


def _small(path: Path, name: str, max_values: int) -> np.ndarray:
    stream = _GzipNpy(path, name)
    try:
        if int(np.prod(stream.shape, dtype=np.float64)) > max_values:
            raise SourceFormatError(
                f"{path}: {name!r} has shape {stream.shape}; Dopamine writes at most {max_values} "
                "value(s) here",
                hint=_REDOWNLOAD,
            )
        values = stream.read_all()
        stream.finish()
        return values
    finally:
        stream.close()


def _read_add_count(path: Path) -> int:
    value = _small(path, "add_count", 1)
    if value.dtype.kind not in "iu" or value.size != 1 or int(value.reshape(-1)[0]) < 0:
        raise SourceFormatError(
            f"{path}: add_count is {value!r}; Dopamine writes one integer >= 0 (rows ever added)",
            hint=_REDOWNLOAD,
        )
    return int(value.reshape(-1)[0])


def _read_invalid_range(path: Path, capacity: int) -> list[int]:
    value = _small(path, "invalid_range", MAX_INVALID_RANGE).reshape(-1)
    # before the first add Dopamine's invalid_range is np.zeros(stack_size): floats
    whole = value.dtype.kind in "iu" or (value.dtype.kind == "f" and bool(np.all(np.mod(value, 1) == 0)))
    if not whole or (value.size and (value.min() < 0 or value.max() >= capacity)):
        raise SourceFormatError(
            f"{path}: invalid_range {value.tolist()[:8]} is not a list of slots 0 .. {capacity - 1}",
            hint=_REDOWNLOAD,
        )
    return [int(v) for v in value]


def parse_checkpoints(spec: object) -> NumberSelection:
    """``checkpoints`` option -> a predicate on checkpoint numbers (``None``: all of them), and
    the numbers it names one by one (``None`` for a range), which must all exist.

    Accepts ``"A:B"`` (numbers ``A <= N < B``; either side may be empty), ``"3,5,9"``, one
    number, or a list of numbers (:func:`rlds_cli.numbers.parse_numbers`: the registry picks
    which files to download by the same rule)."""
    try:
        return parse_numbers(spec)
    except ValueError:
        raise SourceError(
            f"checkpoints={spec!r} is not a range 'A:B' or a list of checkpoint numbers",
            hint="e.g. checkpoints='0:10' (A <= N < B), checkpoints='49,50' or checkpoints=[49, 50]",
        ) from None
