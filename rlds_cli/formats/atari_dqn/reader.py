"""The Atari DQN replay logs reader, and each gzip'd ``.npy`` log streamed in bounded memory.

The Atari DQN replay logs reader: checkpoints located, selected and opened, their edges planned,
read in order and decided into blocks (rules: :mod:`rlds_cli.formats.atari_dqn`).

A gzip'd ``.npy`` file of Dopamine's, inflated front to back in bounded memory (zlib, CRC and
sizes checked), never held whole.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import RldsError, SourceError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats.atari_dqn import plan
from rlds_cli.formats.atari_dqn.plan import (
    DEFAULT_STACK_SIZE,
    FILE_NAMES,
    MAX_INVALID_RANGE,
    READ_BYTES,
    REDOWNLOAD_HINT,
    RULES,
    SKIP_BYTES,
    STORE,
    STORE_PREFIX,
    Checkpoint,
    Decider,
    Rows,
    close_positioned,
    file_name,
    listed,
    logs_folder,
    parse_checkpoints,
    parse_name,
    run_length,
    scan_folder,
)
from rlds_cli.formats.base import (
    ConversionReport,
    Reader,
    ReaderOptions,
    StepBlock,
    from_layout,
    rows_per_block,
)
from rlds_cli.formats.untrusted import check_declared, declared_bytes, describe_dtype, require_shape

#: One .npy header parsed at a time: numpy uses ``ast.literal_eval``, and CPython 3.11 keeps the AST
#: recursion depth per interpreter (python/cpython gh-95185, gh-106905), so two threads parsing at
#: once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in CI, 3.11.7).
_HEADER_LOCK = threading.Lock()


class GzipStream:
    """The bytes of a gzip file, inflated on demand by zlib (which checks each member's CRC and length);
    multi-member files (``cat a.gz b.gz``) are read through, zero bytes between or after members
    skipped (as Python's gzip does)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._inflate = zlib.decompressobj(31)
        self._tail = b""
        self.pos = 0

    def chunk(self, want: int) -> bytes:
        """Up to ``want`` inflated bytes; ``b""`` only at the end of the stream."""
        while True:
            if self._inflate.eof:
                rest = self._inflate.unused_data or self._file.read(READ_BYTES)
                while rest and not rest.strip(b"\0"):  # zeros padding the file (gzip reads past)
                    rest = self._file.read(READ_BYTES)
                if not rest:
                    return b""
                self._inflate = zlib.decompressobj(31)  # a next member
                self._tail = rest.lstrip(b"\0")
            data = self._tail or self._file.read(READ_BYTES)
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
            part = self.chunk(min(left, SKIP_BYTES))
            if not part:
                break
            left -= len(part)
        return size - left

    def close(self) -> None:
        self._file.close()


class GzipNpy:
    """The rows of one gzip'd ``.npy`` file, read front to back.

    Attributes:
        shape: The array's shape as its header declares it.
        dtype: Its dtype.
        rows: ``shape[0]`` (1 for a 0-d array).
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        try:
            self._stream = GzipStream(path)
        except FileNotFoundError:
            raise SourceNotFoundError(f"{path} does not exist", hint=REDOWNLOAD_HINT) from None
        except OSError as exc:
            raise SourceFormatError(f"cannot open {path}: {exc}") from None
        try:
            with self._guard("not a gzip'd .npy file"), _HEADER_LOCK:
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
                    hint=REDOWNLOAD_HINT,
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
            hint = REDOWNLOAD_HINT
            if what.startswith("not a gzip'd") and "magic string" in str(exc):
                hint = "Dopamine writes each array with np.save (never a pickle); " + REDOWNLOAD_HINT
            raise SourceFormatError(f"{self.path}: {what}: {exc}", hint=hint) from None

    def _check_sizes(self) -> None:
        """Before any row is read: the gzip trailer's length (mod 2**32) must match the header's (a
        truncated download mostly fails here; the stream's own checks catch the rest), and the
        declared bytes must be backed by the compressed bytes (no decompression bomb). The trailer
        of a multi-member file holds its last member's length only: one below the header's may be
        that, and is left to the stream (zlib checks every member's CRC and length)."""
        data = declared_bytes(self.shape, self.dtype)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            f.seek(max(size - 4, 0))
            isize = int.from_bytes(f.read(4), "little")
        whole = self._stream.pos + data
        if isize != whole % (1 << 32) and isize > whole:
            raise SourceFormatError(
                f"{self.path}: the gzip trailer says it holds {isize:,} bytes (mod 2**32) but its .npy "
                f"header declares {whole:,} (shape {self.shape}, {self.dtype}): "
                "truncated or damaged",
                hint=REDOWNLOAD_HINT,
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


def check_store(stream: GzipNpy, name: str) -> None:
    """Dopamine's store signature: frames ``(C, H, W[, C])`` uint8, the rest ``(C,)`` numbers."""
    shape, dtype, where = stream.shape, stream.dtype, stream.path
    if name == "observation":
        if dtype != np.uint8 or len(shape) not in (3, 4):
            raise SourceFormatError(
                f"{where}: 'observation' is {kind_of(dtype)} of shape {shape}; Atari DQN frames are uint8 "
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
            f"{where}: {name!r} is {kind_of(dtype)} of shape {shape}; Dopamine stores one value per row here "
            f"({want}, shape (rows,))",
            hint=REDOWNLOAD_HINT,
        )


def kind_of(dtype: np.dtype) -> str:
    return f"{dtype}" if dtype.kind in "biufc" and dtype.fields is None else describe_dtype(dtype)


@dataclass(frozen=True)
class AtariDQNOptions(ReaderOptions):
    """Options of :class:`AtariDQNReader` (its keyword arguments)."""

    checkpoints: str | int | Sequence[Any] | None = None  # the reader checks the numbers
    stack_size: int = DEFAULT_STACK_SIZE
    block_rows: int | None = None


@from_layout(plan)  # sniff, source_files and EXPECTED_FILES: formats/atari_dqn/plan.py
class AtariDQNReader(Reader):
    """Streams Dopamine replay logs (a ``replay_logs`` folder, its run folder, or files of it)."""

    format_name = "atari_dqn"
    Options = AtariDQNOptions

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
            block_rows: Rows per block (default: about ``packing.BLOCK_BYTES`` of frames).
        """
        for option, value in (("stack_size", stack_size), ("block_rows", block_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SourceError(f"{option}={value!r} is not an integer >= 1")
        self.stack_size = stack_size
        self.path, only = self._locate(path)
        self.report = ConversionReport(rules=RULES)
        found = scan_folder(self.folder)
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
        self.block_rows = block_rows or rows_per_block(frame, 64, 1 << 16)

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
                parsed = parse_name(p.name)
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
                f"{self.folder}: no checkpoint {sorted(named - set(found))} (found {listed(found)})",
                hint="the checkpoints option names the N of the *_ckpt.N.gz files",
            )
        numbers = sorted(
            n for n in found if (only is None or n in only) and (selected is None or selected(n))
        )
        if not numbers:
            raise SourceFormatError(
                f"{self.folder}: no checkpoint to convert"
                + (f" among {listed(found)}" if found else " (no *_ckpt.N.gz files)"),
                hint="check the checkpoints option; files are named like $store$_observation_ckpt.0.gz",
            )
        return numbers

    def _open_checkpoint(self, number: int, files: dict[str, Path]) -> Checkpoint:
        missing = [file_name(name, number) for name in FILE_NAMES if name not in files]
        if missing:
            raise SourceFormatError(
                f"{self.folder}: checkpoint {number} lacks {', '.join(missing)}",
                hint="download every file of the checkpoint ($store$_observation, _action, _reward, "
                "_terminal, add_count and invalid_range), or leave it out with the checkpoints option",
            )
        ck = Checkpoint(number, files)
        shapes: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, np.dtype] = {}
        for name in STORE:
            stream = GzipNpy(files[STORE_PREFIX + name], name)
            try:
                check_store(stream, name)
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
                hint=REDOWNLOAD_HINT,
            )
        ck.capacity = rows["observation"]
        ck.add_count = self._read_add_count(files["add_count"])
        ck.invalid_range = self._read_invalid_range(files["invalid_range"], ck.capacity)
        if ck.capacity == 0:
            raise SourceFormatError(f"{files[STORE_PREFIX + 'observation']}: the buffer has no rows")
        return ck

    def _small(self, path: Path, name: str, max_values: int) -> np.ndarray:
        stream = GzipNpy(path, name)
        try:
            if int(np.prod(stream.shape, dtype=np.float64)) > max_values:
                raise SourceFormatError(
                    f"{path}: {name!r} has shape {stream.shape}; Dopamine writes at most {max_values} "
                    "value(s) here",
                    hint=REDOWNLOAD_HINT,
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
                hint=REDOWNLOAD_HINT,
            )
        return int(value.reshape(-1)[0])

    def _read_invalid_range(self, path: Path, capacity: int) -> list[int]:
        value = self._small(path, "invalid_range", MAX_INVALID_RANGE).reshape(-1)
        # before the first add Dopamine's invalid_range is np.zeros(stack_size): floats
        whole = value.dtype.kind in "iu" or (value.dtype.kind == "f" and bool(np.all(np.mod(value, 1) == 0)))
        if not whole or (value.size and (value.min() < 0 or value.max() >= capacity)):
            raise SourceFormatError(
                f"{path}: invalid_range {value.tolist()[:8]} is not a list of slots 0 .. {capacity - 1}",
                hint=REDOWNLOAD_HINT,
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
            head = run_length(positions, 0, 1)
            tail = run_length(positions, ck.length - 1, -1)
            keep = np.ones(len(positions), bool)
            if ck.head_continued:  # the cursor is bridged by the previous checkpoint
                keep &= positions >= head
            if ck.tail_continued:
                keep &= positions < ck.length - tail
            ck.dropped = positions[keep]
            if not ck.head_continued:
                # unread invalid rows at the head: dropped, and too far from the first row read
                # for a terminal among them to make it padding
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
        """Yield every converted checkpoint's transitions in order, in blocks of about
        ``packing.BLOCK_BYTES`` of frames.

        One background thread inflates the next checkpoint's files up to its write cursor meanwhile, so
        the rotation's extra pass overlaps this one's work (zlib releases the GIL)."""
        from concurrent.futures import Future, ThreadPoolExecutor

        stream = Decider(self)
        pool = ThreadPoolExecutor(1, thread_name_prefix="rlds-atari-dqn")
        ahead: dict[int, Future[list[GzipNpy]]] = {}
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
                future.add_done_callback(close_positioned)
            pool.shutdown(wait=False, cancel_futures=True)
        self._write_notes()

    def _positioned(self, ck: Checkpoint) -> list[GzipNpy]:
        """The checkpoint's four store files, opened and inflated up to where its first pass starts."""
        passes = ck.passes()
        return self._positioned_at(ck, passes[0][0] if passes else 0)

    def _read(self, index: int, ck: Checkpoint, first: list[GzipNpy] | None) -> Iterator[Rows]:
        """The checkpoint's rows ``[skip, length)`` in chronological order, a block at a time (``first``: its
        files already positioned for the first pass)."""
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
                    yield Rows(
                        obs=obs,
                        action=action.astype(self.action_dtype, copy=False),
                        reward=reward.astype(np.float32, copy=False),
                        term=terminal != 0,
                        invalid=np.isin(positions, ck.dropped),
                        pad=(ck.first_add + positions) < self.stack_size - 1,  # refined by Decider
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

    def _positioned_at(self, ck: Checkpoint, row: int) -> list[GzipNpy]:
        streams: list[GzipNpy] = []
        try:
            for name in STORE:
                streams.append(GzipNpy(ck.files[STORE_PREFIX + name], name))
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
