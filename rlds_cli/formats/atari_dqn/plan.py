"""Where a run's replay logs lie, and which rows of its checkpoints are read and what they become.

Where a run's replay logs lie: Dopamine's checkpoint file names, the ``replay_logs/`` folder,
sniffing, a conversion's source files, and the rules' constants (:mod:`rlds_cli.formats.atari_dqn`).

Which rows of the checkpoints are read and what they become: a checkpoint's rotation (its slots
in add order), the rows read from it, the checkpoint selection (``--option checkpoints=A:B``).

**Rows -> transitions** (:class:`Decider`): zero padding dropped, episodes ended (terminated, or
truncated at the write cursor and the cuts), blocks packed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli._util.numbers import NumberSelection, parse_numbers
from rlds_cli.errors import SourceError
from rlds_cli.formats.base import StepBlock

if TYPE_CHECKING:
    from rlds_cli.formats.atari_dqn.reader import AtariDQNReader


RULES = "atari-dqn-v1"


#: Dopamine's prefix of the files of its store arrays (``STORE_FILENAME_PREFIX``).
STORE_PREFIX = "$store$_"


STORE = ("observation", "action", "reward", "terminal")


SIDE = ("add_count", "invalid_range")


#: The six files of a checkpoint, by their name before ``_ckpt.N.gz``.
FILE_NAMES = (*(STORE_PREFIX + n for n in STORE), *SIDE)


LOGS_DIR = "replay_logs"


#: Dopamine's Atari frame stack (``stack_size``): ``stack_size - 1`` zero rows precede an episode.
DEFAULT_STACK_SIZE = 4


#: Largest ``invalid_range`` read (Dopamine's holds ``stack_size + update_horizon`` values).
MAX_INVALID_RANGE = 1024


#: Compressed bytes read from a file at a time.
READ_BYTES = 1 << 20


#: Most bytes inflated at once when skipping rows.
SKIP_BYTES = 4 << 20


FILE_RE = re.compile(r"^(?P<name>.+)_ckpt\.(?P<n>[0-9]{1,9})\.gz$")


REDOWNLOAD_HINT = "re-download the checkpoint's files; Dopamine writes each with np.save into a gzip file"


def file_name(name: str, checkpoint: int) -> str:
    """Dopamine's file name of array ``name`` in checkpoint ``checkpoint``."""
    return f"{name}_ckpt.{checkpoint}.gz"


def parse_name(name: str) -> tuple[str, int] | None:
    m = FILE_RE.match(name)
    if m is None or m["name"] not in FILE_NAMES:
        return None
    return m["name"], int(m["n"])


def scan_folder(folder: Path) -> dict[int, dict[str, Path]]:
    """The checkpoint files in ``folder``: number -> {name: path}."""
    found: dict[int, dict[str, Path]] = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            parsed = parse_name(entry.name)
            if parsed is not None and entry.is_file():
                found.setdefault(parsed[1], {})[parsed[0]] = Path(entry.path)
    return found


def has_logs(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(
                entry.name.startswith(STORE_PREFIX + "observation_ckpt.") and parse_name(entry.name)
                for entry in entries
            )
    except OSError:
        return False


def logs_folder(path: Path) -> Path | None:
    """The ``replay_logs`` folder ``path`` names: itself, its ``replay_logs/`` (a run folder), or
    the folder of one of its files; ``None`` when ``path`` is none of these."""
    if path.is_file():
        return path.parent if parse_name(path.name) is not None else None
    if path.is_dir():
        if has_logs(path):
            return path
        if has_logs(path / LOGS_DIR):
            return path / LOGS_DIR
    return None


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "a Dopamine replay_logs folder of gzip'd .npy files ($store$_observation_ckpt.N.gz, "
    "$store$_action_ckpt.N.gz, ..., add_count_ckpt.N.gz, invalid_range_ckpt.N.gz)"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Dopamine ``replay_logs`` folder, a run folder holding one, or one of
    its ``*_ckpt.N.gz`` files."""
    try:
        return logs_folder(path) is not None
    except OSError:
        return False


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The checkpoint files a conversion reads (all checkpoints of the folder, or those of the
    files named), by checkpoint then in :data:`FILE_NAMES` order."""
    out: list[Path] = []
    for p in paths:
        folder = logs_folder(p)
        if folder is None:  # not ours: the reader says what is wrong
            out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            continue
        only = parse_name(p.name) if p.is_file() else None
        for number, files in sorted(scan_folder(folder).items()):
            if only is None or number == only[1]:
                out += [files[name] for name in FILE_NAMES if name in files]
    return list(dict.fromkeys(out))


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


def close_positioned(future: Any) -> None:
    """Close the files a background positioning opened, once it is done (whatever its outcome)."""
    if not future.cancelled() and future.exception() is None:
        for s in future.result():
            s.close()


class Decider:
    """Turns the chronological row stream into blocks, two rows behind what it has read (a row's fate
    depends on the next row, whose fate depends on the row after)."""

    def __init__(self, reader: AtariDQNReader) -> None:
        self.reader = reader
        self.pad_rows = reader.stack_size - 1
        self.carry: Rows | None = None
        self.index = 0  # stream index of the next row fed
        self.last_terminal = -1  # stream index of the last terminal row (-1: none since a cut)
        self.linked = False  # whether the last row fed links to the next
        self.steps = 0

    def feed(self, rows: Rows) -> StepBlock | None:
        self._mark_padding(rows)
        window = rows if self.carry is None else Rows.join(self.carry, rows)
        block, decided = self._decide(window, final=False)
        self.carry = window.cut(decided)
        return block

    def finish(self) -> StepBlock | None:
        if self.carry is None or not len(self.carry):
            return None
        block, _ = self._decide(self.carry, final=True)
        self.carry = None
        return block

    def _mark_padding(self, rows: Rows) -> None:
        """Padding rows: the ``stack_size - 1`` rows after a terminal, or with add index below
        ``stack_size - 1`` (``rows.pad`` holds the latter on entry), when all zero."""
        n = len(rows)
        index = self.index + np.arange(n)
        prior = self.last_terminal if self.linked else -1
        last = np.maximum.accumulate(np.concatenate([[prior], np.where(rows.term, index, -1)]))
        before = last[:-1]
        at_start = rows.pad
        expected = at_start | ((before >= 0) & (index - before <= self.pad_rows))
        rows.pad = np.zeros(n, bool)
        at = np.flatnonzero(expected)
        if len(at):
            zero = (
                ~rows.obs[at].reshape(len(at), -1).any(axis=1)
                & (rows.action[at] == 0)
                & (rows.reward[at] == 0)
                & ~rows.term[at]
            )
            rows.pad[at[zero]] = True
            data = at[~zero & ~rows.invalid[at]]
            self.reader.padding_with_data += int(np.count_nonzero(~at_start[data]))
            for i in np.unique(rows.ckpt[data[at_start[data]]]).tolist():
                self.reader.start_with_data.add(self.reader.checkpoints[i].number)
        self.last_terminal = int(last[-1])
        self.index += n
        self.linked = bool(rows.link[-1]) if n else self.linked

    def _decide(self, w: Rows, *, final: bool) -> tuple[StepBlock | None, int]:
        """Decide rows ``[0, d)`` of window ``w`` (all when ``final``, else all but the last two); returns
        their transitions' block and ``d``."""
        m = len(w)
        d = m if final else max(m - 2, 0)
        if d == 0:
            return None, 0
        real = ~w.pad
        has_next = np.zeros(m, bool)
        has_next[:-1] = w.link[:-1] & real[1:]
        step = real & ~w.invalid & (w.term | has_next)
        next_step = np.zeros(m, bool)
        next_step[:-1] = step[1:]
        end = step & (w.term | ~next_step)
        self._count(w, step, d)
        rows = np.flatnonzero(step[:d])
        if not len(rows):
            return None, d
        ends = rows[end[rows]]
        at = np.searchsorted(rows, ends)
        finals = np.where(w.term[ends], ends, ends + 1)
        flat = np.insert(rows, at + 1, finals)
        term = w.term[rows]
        for i in np.unique(w.ckpt[rows]).tolist():
            ck = self.reader.checkpoints[i]
            if ck.first_step < 0:
                ck.first_step = self.steps + int(np.argmax(w.ckpt[rows] == i))
        self.steps += len(rows)
        self.reader.report.synthesized_final_observations += int(np.count_nonzero(w.term[ends]))
        block = StepBlock(
            steps={
                "action": w.action[rows],
                "next/reward": w.reward[rows][:, None],
                "next/terminated": term[:, None],
                "next/truncated": (end[rows] & ~term)[:, None],
            },
            observations={"observation": w.obs[flat]},
            ends=at.astype(np.int64),
            final_known=~w.term[ends],
        )
        return block, d

    def _count(self, w: Rows, step: np.ndarray, d: int) -> None:
        """Add the fate of rows ``[0, d)`` to the reader's and each checkpoint's counters."""
        invalid = w.invalid[:d]
        fates = {
            "steps": step[:d],
            "invalid_range": invalid,
            "padding": w.pad[:d] & ~invalid,
            "no_next_frame": ~w.pad[:d] & ~invalid & ~step[:d],
        }
        ckpt = w.ckpt[:d]
        for fate, mask in fates.items():
            per = np.bincount(ckpt[mask], minlength=len(self.reader.checkpoints))
            for i in np.flatnonzero(per).tolist():
                self.reader.checkpoints[i].stats[fate] += int(per[i])
            if fate != "steps":
                self.reader.dropped[fate] += int(mask.sum())
                self.reader.report.dropped_rows += int(mask.sum())
