"""Atari DQN replay logs (the DQN Replay Dataset): Dopamine's circular replay buffer, logged as
gzip'd ``.npy`` files, streamed in bounded memory.

A run folder (``<Game>/<run>/``) holds ``replay_logs/`` with six files per checkpoint ``N``, each
written by ``np.save(allow_pickle=False)`` into a ``gzip.GzipFile``:
``$store$_observation_ckpt.N.gz`` (``(C, 84, 84)`` uint8 grey frames), ``$store$_action_ckpt.N.gz``
(``(C,)`` int32), ``$store$_reward_ckpt.N.gz`` (``(C,)`` float32), ``$store$_terminal_ckpt.N.gz``
(``(C,)`` uint8), ``add_count_ckpt.N.gz`` (a 0-d integer: rows ever added) and
``invalid_range_ckpt.N.gz`` (the slots around the write cursor). The rules below (``atari-dqn-v1``)
are written out in ``docs/formats.md`` ("Atari DQN replay logs"):

* **Rotation.** Each checkpoint is a circular buffer of capacity ``C`` (the rows of its files):
  once full (``add_count >= C``) its oldest row is at slot ``add_count % C``, so it is read as
  slots ``[cursor, C)`` then ``[0, cursor)``; before that, rows ``[0, add_count)``. Row ``p`` of
  that order was the ``add_count - min(add_count, C) + p``-th row ever added (its *add index*).
* **Transitions.** Row ``i`` is ``(frame_i, action_i, reward_i, terminal_i)``: the frame the
  action was chosen on, and what the step returned. Its next frame is row ``i + 1``'s, unless
  ``terminal_i``: Dopamine never stores the frame after a terminal step, so that episode's final
  observation repeats its last frame, marked ``final_known = false``.
* **Padding.** Before each episode's first row Dopamine adds ``stack_size - 1`` rows of zeros
  (frame, action, reward, terminal): the ``stack_size - 1`` rows after a terminal row, and the
  rows with add index below ``stack_size - 1``, are dropped when they are all zero (a row there
  that holds data is kept, and counted in a note).
* **invalid_range.** The rows it names straddle the write cursor (no next frame, or a frame stack
  mixing the newest and the oldest data): they are dropped, and the episode before them ends
  **truncated**, its final observation the dropped row's frame (which is real). Where the next
  converted checkpoint continues this one (below), the cursor is bridged and the rows named at
  that edge are kept. A row whose next frame is not in the conversion at all (the end of the
  data, a checkpoint not continued) is dropped the same way.
* **Across checkpoints.** Checkpoints are converted in order of ``N``; checkpoint ``B`` continues
  checkpoint ``A`` when ``B``'s first add index is at most ``A``'s ``add_count`` and ``B``'s
  ``add_count`` is larger (the logs of one run tile the adds exactly: batch_rl logs every ``C``
  adds). Rows of ``B`` already converted from ``A`` are skipped. Otherwise episodes are cut
  (truncated) at the junction.
* **Keys.** ``observation`` (flat, stored once, dtype and frame shape kept: frame stacking is the
  loader's ``FrameStack``), ``action`` (integer dtype kept), ``next/reward`` (float32),
  ``next/terminated`` (``terminal``), ``next/truncated`` (the cuts above). ``add_count`` and
  ``invalid_range`` of every checkpoint are kept in the manifest's source metadata.
* **Streaming.** A file is inflated front to back (zlib, CRC checked) and never held whole; the
  rotation reads a checkpoint's files twice when its cursor is inside the data (the first pass
  inflates and discards the rows before the cursor).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import RldsError, SourceError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock
from rlds_cli.formats.untrusted import check_declared, declared_bytes, describe_dtype, require_shape
from rlds_cli.numbers import NumberSelection, parse_numbers

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
#: Target decoded frame bytes per block, as the other readers.
BLOCK_BYTES = 8 << 20
#: Largest ``invalid_range`` read (Dopamine's holds ``stack_size + update_horizon`` values).
MAX_INVALID_RANGE = 1024
#: Compressed bytes read from a file at a time.
_READ_BYTES = 1 << 20
#: Most bytes inflated at once when skipping rows.
_SKIP_BYTES = 4 << 20
_FILE_RE = re.compile(r"^(?P<name>.+)_ckpt\.(?P<n>[0-9]{1,9})\.gz$")
_REDOWNLOAD = "re-download the checkpoint's files; Dopamine writes each with np.save into a gzip file"


def file_name(name: str, checkpoint: int) -> str:
    """Dopamine's file name of array ``name`` in checkpoint ``checkpoint``."""
    return f"{name}_ckpt.{checkpoint}.gz"


def _parse_name(name: str) -> tuple[str, int] | None:
    m = _FILE_RE.match(name)
    if m is None or m["name"] not in FILE_NAMES:
        return None
    return m["name"], int(m["n"])


def _scan(folder: Path) -> dict[int, dict[str, Path]]:
    """The checkpoint files in ``folder``: number -> {name: path}."""
    found: dict[int, dict[str, Path]] = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            parsed = _parse_name(entry.name)
            if parsed is not None and entry.is_file():
                found.setdefault(parsed[1], {})[parsed[0]] = Path(entry.path)
    return found


def _has_logs(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(
                entry.name.startswith(STORE_PREFIX + "observation_ckpt.") and _parse_name(entry.name)
                for entry in entries
            )
    except OSError:
        return False


def logs_folder(path: Path) -> Path | None:
    """The ``replay_logs`` folder ``path`` names: itself, its ``replay_logs/`` (a run folder), or
    the folder of one of its files; ``None`` when ``path`` is none of these."""
    if path.is_file():
        return path.parent if _parse_name(path.name) is not None else None
    if path.is_dir():
        if _has_logs(path):
            return path
        if _has_logs(path / LOGS_DIR):
            return path / LOGS_DIR
    return None


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
        only = _parse_name(p.name) if p.is_file() else None
        for number, files in sorted(_scan(folder).items()):
            if only is None or number == only[1]:
                out += [files[name] for name in FILE_NAMES if name in files]
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------- gzip'd .npy streams


class _GzipStream:
    """The bytes of a gzip file, inflated on demand with zlib, which checks each member's CRC and
    length (a file of several members, as ``cat a.gz b.gz`` makes, is read through)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._inflate = zlib.decompressobj(31)
        self._tail = b""
        self.pos = 0

    def chunk(self, want: int) -> bytes:
        """Up to ``want`` inflated bytes; ``b""`` only at the end of the stream."""
        while True:
            if self._inflate.eof:
                rest = self._inflate.unused_data or self._file.read(_READ_BYTES)
                if not rest:
                    return b""
                self._inflate = zlib.decompressobj(31)  # a next member
                self._tail = rest
            data = self._tail or self._file.read(_READ_BYTES)
            out = self._inflate.decompress(data, want)
            self._tail = self._inflate.unconsumed_tail
            if out:
                self.pos += len(out)
                return out
            if not data and not self._inflate.eof:
                raise EOFError("the gzip stream ends early (the file is truncated)")

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes, all that is left when negative (``np.lib.format`` reads a header
        with this)."""
        if size < 0:
            size = 1 << 62
        parts = []
        while size > 0:
            part = self.chunk(size)
            if not part:
                break
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def readinto(self, view: memoryview) -> int:
        """Fill ``view``; the bytes written (fewer only at the end of the stream)."""
        got = 0
        while got < len(view):
            part = self.chunk(len(view) - got)
            if not part:
                break
            view[got : got + len(part)] = part
            got += len(part)
        return got

    def discard(self, size: int) -> int:
        """Inflate and drop ``size`` bytes; the bytes dropped."""
        left = size
        while left > 0:
            part = self.chunk(min(left, _SKIP_BYTES))
            if not part:
                break
            left -= len(part)
        return size - left

    def close(self) -> None:
        self._file.close()


class _GzipNpy:
    """The rows of one gzip'd ``.npy`` file, read front to back.

    Attributes:
        shape: The array's shape as its header declares it.
        dtype: Its dtype.
        rows: ``shape[0]`` (1 for a 0-d array).
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        try:
            self._stream = _GzipStream(path)
        except FileNotFoundError:
            raise SourceNotFoundError(f"{path} does not exist", hint=_REDOWNLOAD) from None
        except OSError as exc:
            raise SourceFormatError(f"cannot open {path}: {exc}") from None
        try:
            with self._guard("not a gzip'd .npy file"):
                version = np.lib.format.read_magic(self._stream)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(self._stream)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(self._stream)
                else:
                    raise ValueError(f".npy format version {version[0]}.{version[1]}, not 1.0 or 2.0")
            self.shape = require_shape(path, name, shape)
            self.dtype = np.dtype(dtype)
            if fortran and len(self.shape) > 1:
                raise SourceFormatError(
                    f"{path}: {name!r} is stored in Fortran (column) order; its rows cannot be streamed",
                    hint=_REDOWNLOAD,
                )
            self.rows = self.shape[0] if self.shape else 1
            self._row_shape = self.shape[1:]
            self.row_bytes = declared_bytes(self._row_shape, self.dtype)
            self._check_sizes()
        except BaseException:
            self.close()
            raise
        self.pos = 0

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Errors of the gzip or .npy layer as one line naming the file."""
        try:
            yield
        except RldsError:
            raise
        except (OSError, EOFError, zlib.error, ValueError, SyntaxError) as exc:
            hint = _REDOWNLOAD
            if what.startswith("not a gzip'd") and "magic string" in str(exc):
                hint = "Dopamine writes each array with np.save (never a pickle); " + _REDOWNLOAD
            raise SourceFormatError(f"{self.path}: {what}: {exc}", hint=hint) from None

    def _check_sizes(self) -> None:
        """Before any row is read: the gzip trailer's length (mod 2**32) must match what the header
        declares (a truncated download fails here, not after hours), and the declared bytes must
        be backed by the file's compressed bytes (a decompression bomb is refused)."""
        data = declared_bytes(self.shape, self.dtype)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            f.seek(max(size - 4, 0))
            isize = int.from_bytes(f.read(4), "little")
        if isize != (self._stream.pos + data) % (1 << 32):
            raise SourceFormatError(
                f"{self.path}: the gzip trailer says it holds {isize:,} bytes (mod 2**32) but its .npy "
                f"header declares {self._stream.pos + data:,} (shape {self.shape}, {self.dtype}): "
                "truncated or damaged",
                hint=_REDOWNLOAD,
            )
        check_declared(self.path, self.name, data, size, how="compresses into")

    def read(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows (fewer at the end), in native byte order."""
        rows = max(0, min(rows, self.rows - self.pos))
        out = np.empty((rows, *self._row_shape), self.dtype)
        view = out.reshape(-1).view(np.uint8).data
        with self._guard(f"reading rows {self.pos:,} to {self.pos + rows:,} of {self.name!r}"):
            got = self._stream.readinto(view)
            if got < len(view):
                raise EOFError(
                    f"the data ends after {self.pos + got // max(self.row_bytes, 1):,} of {self.rows:,} rows"
                )
        self.pos += rows
        return out if self.dtype.isnative else out.astype(self.dtype.newbyteorder("="))

    def read_all(self) -> np.ndarray:
        """The whole array (for the small ``add_count`` and ``invalid_range`` files)."""
        if not self.shape:
            return self.read(1).reshape(())
        return self.read(self.rows)

    def skip(self, rows: int) -> None:
        """Inflate and drop the next ``rows`` rows."""
        rows = max(0, min(rows, self.rows - self.pos))
        with self._guard(f"skipping to row {self.pos + rows:,} of {self.name!r}"):
            got = self._stream.discard(rows * self.row_bytes)
            if got < rows * self.row_bytes:
                raise EOFError(f"the data ends after {self.pos + got // max(self.row_bytes, 1):,} rows")
        self.pos += rows

    def finish(self) -> None:
        """Read to the end of the file, so that zlib checks its CRC and length."""
        self.skip(self.rows - self.pos)
        with self._guard(f"checking the end of {self.name!r}"):
            if self._stream.chunk(1):
                raise ValueError(f"it holds data after the {self.rows:,} rows its header declares")

    def close(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.close()


# --------------------------------------------------------------------------- checkpoints


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


# --------------------------------------------------------------------------- the reader


@dataclass
class _Rows:
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

    def cut(self, lo: int, hi: int | None = None) -> _Rows:
        return _Rows(**{k: v[lo:hi] for k, v in self.__dict__.items()})

    @staticmethod
    def join(a: _Rows, b: _Rows) -> _Rows:
        if not len(a):
            return b
        return _Rows(**{k: np.concatenate([v, getattr(b, k)]) for k, v in a.__dict__.items()})


@dataclass(frozen=True)
class AtariDQNOptions(ReaderOptions):
    """Options of :class:`AtariDQNReader` (its keyword arguments)."""

    checkpoints: str | int | Sequence[Any] | None = None  # the reader checks the numbers
    stack_size: int = DEFAULT_STACK_SIZE
    block_rows: int | None = None


class AtariDQNReader(Reader):
    """Streams Dopamine replay logs (a ``replay_logs`` folder, its run folder, or files of it)."""

    format_name = "atari_dqn"
    expected_files = (
        "a Dopamine replay_logs folder of gzip'd .npy files ($store$_observation_ckpt.N.gz, "
        "$store$_action_ckpt.N.gz, ..., add_count_ckpt.N.gz, invalid_range_ckpt.N.gz)"
    )
    Options = AtariDQNOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        checkpoints: str | int | Sequence[int] | None = None,
        stack_size: int = DEFAULT_STACK_SIZE,
        block_rows: int | None = None,
    ) -> None:
        """Plan a conversion of the replay logs at ``path``.

        Args:
            path: A ``replay_logs`` folder, the run folder holding it, or checkpoint files (only
                their checkpoints are converted).
            checkpoints: Convert only these checkpoint numbers: ``"A:B"`` (``A <= N < B``),
                ``"3,5"`` or a list. Episodes are never continued into a checkpoint left out.
            stack_size: Dopamine's frame stack: ``stack_size - 1`` zero rows precede each episode
                in the buffer (4 for the DQN Replay Dataset; 1 for a buffer without padding).
            block_rows: Rows per block (default: about :data:`BLOCK_BYTES` of frames).
        """
        for option, value in (("stack_size", stack_size), ("block_rows", block_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SourceError(f"{option}={value!r} is not an integer >= 1")
        self.stack_size = stack_size
        self.path, only = self._locate(path)
        self.report = ConversionReport(rules=RULES)
        found = _scan(self.folder)
        self.checkpoints = [
            self._open_checkpoint(n, found[n]) for n in self._select(found, only, checkpoints)
        ]
        self._check_alike()
        self._plan_edges()
        self.report.source_rows = sum(ck.length for ck in self.checkpoints)
        self.dropped = {
            "padding": 0,
            "invalid_range": sum(ck.skip_invalid for ck in self.checkpoints),
            "no_next_frame": 0,
            "duplicate": sum(ck.skip_duplicate for ck in self.checkpoints),
        }
        self.report.dropped_rows = self.dropped["invalid_range"] + self.dropped["duplicate"]
        #: rows after a terminal that hold data where Dopamine writes padding
        self.padding_with_data = 0
        #: checkpoints whose add_count puts their first rows at the run's start, where those rows
        #: hold data instead of Dopamine's padding
        self.start_with_data: set[int] = set()
        frame = declared_bytes(self.obs_shape, self.obs_dtype)
        self.block_rows = block_rows or int(np.clip(BLOCK_BYTES // max(frame, 1), 64, 1 << 16))

    # ------------------------------------------------------------------ planning

    def _locate(self, path: str | Path | Sequence[str | Path]) -> tuple[Path, set[int] | None]:
        """The ``replay_logs`` folder, and the checkpoints named when files were given."""
        paths = [Path(path)] if isinstance(path, str | Path) else [Path(p) for p in path]
        if not paths:
            raise SourceFormatError("no replay_logs folder or checkpoint file given")
        folders: set[Path] = set()
        only: set[int] | None = None
        for p in paths:
            if not p.exists():
                raise SourceNotFoundError(f"source {p} does not exist")
            folder = logs_folder(p)
            if folder is None:
                raise SourceFormatError(
                    f"{p} is not a Dopamine replay_logs folder (no $store$_observation_ckpt.N.gz files), "
                    "nor a run folder holding one",
                    hint="pass the replay_logs folder, or its run folder (<Game>/<run>/)",
                )
            folders.add(folder)
            if p.is_file():
                parsed = _parse_name(p.name)
                assert parsed is not None
                only = (only or set()) | {parsed[1]}
            elif len(paths) > 1:
                raise SourceFormatError("give one replay_logs folder, or files of one folder, not both")
        if len(folders) > 1:
            raise SourceFormatError(
                f"the files given lie in {len(folders)} folders; give files of one replay_logs folder"
            )
        self.folder = folders.pop()
        shown = paths[0] if len(paths) == 1 else self.folder
        return shown, only

    def _select(self, found: dict[int, Any], only: set[int] | None, checkpoints: object) -> list[int]:
        """The checkpoint numbers to convert, in order."""
        selected, named = parse_checkpoints(checkpoints)
        if named is not None and named - set(found):
            raise SourceFormatError(
                f"{self.folder}: no checkpoint {sorted(named - set(found))} (found {_listed(found)})",
                hint="the checkpoints option names the N of the *_ckpt.N.gz files",
            )
        numbers = sorted(
            n for n in found if (only is None or n in only) and (selected is None or selected(n))
        )
        if not numbers:
            raise SourceFormatError(
                f"{self.folder}: no checkpoint to convert"
                + (f" among {_listed(found)}" if found else " (no *_ckpt.N.gz files)"),
                hint="check the checkpoints option; files are named like $store$_observation_ckpt.0.gz",
            )
        return numbers

    def _open_checkpoint(self, number: int, files: dict[str, Path]) -> _Checkpoint:
        missing = [file_name(name, number) for name in FILE_NAMES if name not in files]
        if missing:
            raise SourceFormatError(
                f"{self.folder}: checkpoint {number} lacks {', '.join(missing)}",
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
        ck.add_count = self._read_add_count(files["add_count"])
        ck.invalid_range = self._read_invalid_range(files["invalid_range"], ck.capacity)
        if ck.capacity == 0:
            raise SourceFormatError(f"{files[STORE_PREFIX + 'observation']}: the buffer has no rows")
        return ck

    def _small(self, path: Path, name: str, max_values: int) -> np.ndarray:
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

    def _read_add_count(self, path: Path) -> int:
        value = self._small(path, "add_count", 1)
        if value.dtype.kind not in "iu" or value.size != 1 or int(value.reshape(-1)[0]) < 0:
            raise SourceFormatError(
                f"{path}: add_count is {value!r}; Dopamine writes one integer >= 0 (rows ever added)",
                hint=_REDOWNLOAD,
            )
        return int(value.reshape(-1)[0])

    def _read_invalid_range(self, path: Path, capacity: int) -> list[int]:
        value = self._small(path, "invalid_range", MAX_INVALID_RANGE).reshape(-1)
        # before the first add Dopamine's invalid_range is np.zeros(stack_size): floats
        whole = value.dtype.kind in "iu" or (value.dtype.kind == "f" and bool(np.all(np.mod(value, 1) == 0)))
        if not whole or (value.size and (value.min() < 0 or value.max() >= capacity)):
            raise SourceFormatError(
                f"{path}: invalid_range {value.tolist()[:8]} is not a list of slots 0 .. {capacity - 1}",
                hint=_REDOWNLOAD,
            )
        return [int(v) for v in value]

    def _check_alike(self) -> None:
        """Every checkpoint's frames (and actions) have the first one's shape and dtype."""
        first = self.checkpoints[0]
        for ck in self.checkpoints:
            if ck.schema != first.schema:
                raise SourceFormatError(
                    f"{self.folder}: checkpoint {ck.number} holds frames {ck.schema[0]} {ck.schema[1]} and "
                    f"{ck.schema[2]} actions, checkpoint {first.number} frames {first.schema[0]} "
                    f"{first.schema[1]} and {first.schema[2]} actions",
                    hint="convert the checkpoints of one run (one game, one agent) together",
                )
        self.obs_shape, self.obs_dtype, self.action_dtype = first.schema

    def _plan_edges(self) -> None:
        """Which checkpoint continues which, and which invalid_range rows are dropped."""
        pad = self.stack_size - 1
        for prev, ck in zip(self.checkpoints, self.checkpoints[1:], strict=False):
            if prev.length and ck.first_add <= prev.add_count < ck.add_count:
                prev.tail_continued = ck.head_continued = True
                ck.skip_duplicate = prev.add_count - ck.first_add
        for ck in self.checkpoints:
            positions = ck.positions(np.asarray(ck.invalid_range, np.int64))
            head = _run_length(positions, 0, 1)
            tail = _run_length(positions, ck.length - 1, -1)
            keep = np.ones(len(positions), bool)
            if ck.head_continued:  # the cursor is bridged by the previous checkpoint
                keep &= positions >= head
            if ck.tail_continued:
                keep &= positions < ck.length - tail
            ck.dropped = positions[keep]
            if not ck.head_continued:
                # invalid rows at the head that are not read at all: dropped whatever they hold,
                # and too far from the first row read for a terminal among them to make it padding
                ck.skip_invalid = min(max(head - pad, 0), ck.length)
            ck.stats = {
                "steps": 0,
                **dict.fromkeys(("padding", "invalid_range", "no_next_frame", "duplicate"), 0),
            }
            ck.stats["invalid_range"] += ck.skip_invalid
            ck.stats["duplicate"] += ck.skip_duplicate

    # ------------------------------------------------------------------ reading

    def total_rows(self) -> int:
        return self.report.source_rows

    def source_metadata(self) -> dict[str, Any]:
        return {
            "atari_dqn": {
                "stack_size": self.stack_size,
                "dropped": dict(self.dropped),
                "checkpoints": [
                    {
                        "checkpoint": ck.number,
                        "add_count": ck.add_count,
                        "invalid_range": ck.invalid_range,
                        "capacity": ck.capacity,
                        "rows": ck.length,
                        "continues_previous": ck.head_continued,
                        "first_step": ck.first_step,
                        "steps": ck.stats["steps"],
                        "dropped": {k: v for k, v in ck.stats.items() if k != "steps"},
                    }
                    for ck in self.checkpoints
                ],
            }
        }

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield every converted checkpoint's transitions, in order, as blocks of about
        :data:`BLOCK_BYTES` of frames.

        While a checkpoint is read, one background thread inflates the next checkpoint's files up
        to where its reading starts (the write cursor), so that the rotation's extra pass overlaps
        this one's work (zlib releases the GIL)."""
        from concurrent.futures import Future, ThreadPoolExecutor

        stream = _Decider(self)
        pool = ThreadPoolExecutor(1, thread_name_prefix="rlds-atari-dqn")
        ahead: dict[int, Future[list[_GzipNpy]]] = {}
        try:
            for index, ck in enumerate(self.checkpoints):
                if index + 1 < len(self.checkpoints):
                    ahead[index + 1] = pool.submit(self._positioned, self.checkpoints[index + 1])
                if progress is not None and ck.skip:
                    progress(ck.skip)
                first = ahead.pop(index).result() if index in ahead else None
                for rows in self._read(index, ck, first):
                    block = stream.feed(rows)
                    if block is not None:
                        yield block
                    if progress is not None:
                        progress(len(rows))
            block = stream.finish()
            if block is not None:
                yield block
        finally:
            for future in ahead.values():  # stopped early (an error, or --episodes): release the files
                future.add_done_callback(_close_positioned)
            pool.shutdown(wait=False, cancel_futures=True)
        self._write_notes()

    def _positioned(self, ck: _Checkpoint) -> list[_GzipNpy]:
        """The checkpoint's four store files, opened and inflated up to where its first pass
        starts."""
        passes = ck.passes()
        return self._positioned_at(ck, passes[0][0] if passes else 0)

    def _read(self, index: int, ck: _Checkpoint, first: list[_GzipNpy] | None) -> Iterator[_Rows]:
        """The checkpoint's rows ``[skip, length)`` in chronological order, a block at a time
        (``first``: its files already positioned for the first pass)."""
        passes = ck.passes()
        reaches_end = any(hi == ck.capacity for _, hi in passes)
        position = ck.skip
        for k, (lo, hi) in enumerate(passes):
            streams = first if (k == 0 and first is not None) else []
            first = None
            try:
                if not streams:
                    streams = self._positioned_at(ck, lo)
                while lo < hi:
                    n = min(self.block_rows, hi - lo)
                    obs, action, reward, terminal = (s.read(n) for s in streams)
                    positions = np.arange(position, position + n)
                    link = np.ones(n, bool)
                    if position + n == ck.length:
                        link[-1] = ck.tail_continued
                    yield _Rows(
                        obs=obs,
                        action=action.astype(self.action_dtype, copy=False),
                        reward=reward.astype(np.float32, copy=False),
                        term=terminal != 0,
                        invalid=np.isin(positions, ck.dropped),
                        pad=(ck.first_add + positions) < self.stack_size - 1,  # refined by _Decider
                        link=link,
                        ckpt=np.full(n, index, np.int32),
                    )
                    lo += n
                    position += n
                if hi == ck.capacity or (not reaches_end and k == len(passes) - 1):
                    for s in streams:  # zlib checks the CRC and length at the end of the file
                        s.finish()
            finally:
                for s in streams:
                    s.close()
        if first is not None:  # a checkpoint with nothing to read
            for s in first:
                s.close()

    def _positioned_at(self, ck: _Checkpoint, row: int) -> list[_GzipNpy]:
        streams: list[_GzipNpy] = []
        try:
            for name in STORE:
                streams.append(_GzipNpy(ck.files[STORE_PREFIX + name], name))
                streams[-1].skip(row)
        except BaseException:
            for s in streams:
                s.close()
            raise
        return streams

    def _write_notes(self) -> None:
        d = self.dropped
        parts = [
            f"{d['padding']:,} zero padding rows (Dopamine's frame-stack padding before each episode)",
            f"{d['invalid_range']:,} invalid_range rows at a write cursor",
            f"{d['no_next_frame']:,} rows whose next frame is not in the conversion",
            f"{d['duplicate']:,} rows repeated from the previous checkpoint",
        ]
        shown = [p for p, n in zip(parts, d.values(), strict=True) if n]
        if shown:
            self.report.notes.append("dropped " + "; ".join(shown))
        cuts = [
            f"{a.number}->{b.number}"
            for a, b in zip(self.checkpoints, self.checkpoints[1:], strict=False)
            if not b.head_continued
        ]
        if cuts:
            listed = ", ".join(cuts[:6]) + (f" and {len(cuts) - 6} more" if len(cuts) > 6 else "")
            self.report.notes.append(
                f"episodes are cut (truncated) between checkpoints {listed}: add_count says the later one "
                "does not continue the earlier"
            )
        if self.padding_with_data:
            self.report.notes.append(
                f"{self.padding_with_data:,} rows where Dopamine's zero padding was expected (the "
                f"{self.stack_size - 1} rows after a terminal) hold data and were kept; pass stack_size if "
                "the buffer used another frame stack"
            )
        if self.start_with_data:
            self.report.notes.append(
                f"checkpoint(s) {sorted(self.start_with_data)}: add_count puts the first rows at the run's "
                "start, where Dopamine writes zero padding, but they hold data and were kept (batch_rl's "
                "last log, log_final_buffer, writes the write cursor as add_count)"
            )


def _close_positioned(future: Any) -> None:
    """Close the files a background positioning opened, once it is done (whatever its outcome)."""
    if not future.cancelled() and future.exception() is None:
        for s in future.result():
            s.close()


class _Decider:
    """Turns the chronological row stream into blocks, two rows behind what it has read (a row's
    fate depends on whether the next row is a transition, which depends on the row after)."""

    def __init__(self, reader: AtariDQNReader) -> None:
        self.reader = reader
        self.pad_rows = reader.stack_size - 1
        self.carry: _Rows | None = None
        self.index = 0  # stream index of the next row fed
        self.last_terminal = -1  # stream index of the last terminal row (-1: none since a cut)
        self.linked = False  # whether the last row fed links to the next
        self.steps = 0

    def feed(self, rows: _Rows) -> StepBlock | None:
        self._mark_padding(rows)
        window = rows if self.carry is None else _Rows.join(self.carry, rows)
        block, decided = self._decide(window, final=False)
        self.carry = window.cut(decided)
        return block

    def finish(self) -> StepBlock | None:
        if self.carry is None or not len(self.carry):
            return None
        block, _ = self._decide(self.carry, final=True)
        self.carry = None
        return block

    def _mark_padding(self, rows: _Rows) -> None:
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

    def _decide(self, w: _Rows, *, final: bool) -> tuple[StepBlock | None, int]:
        """Decide rows ``[0, d)`` of window ``w`` (all of them when ``final``, else all but the last
        two); the block of their transitions and ``d``."""
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

    def _count(self, w: _Rows, step: np.ndarray, d: int) -> None:
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
