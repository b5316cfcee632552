"""Frame columns (manifest ``codec`` not ``raw``): encoded image files, stored alike in both backends.

The frames' image files lie end to end in ``arrays/<key>@frames``; each frame's end offset is in
``arrays/<key>@ends.npy`` (int64, one per row). ``@`` is no key character, so these never clash
with a key's files. A :class:`FramesColumn` reads as the ``(rows, *shape)`` ``uint8`` array,
decoding only the rows asked for, each distinct row once, on every core
(:mod:`rlds_cli.frames.codecs`). Its content digest (:class:`FramesHasher`) covers the stored
bytes, the offsets, codec, frame shape and channel order, so an edited manifest fails the check.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli._util.io import DIGEST_ALGORITHM, new_hash
from rlds_cli.cache.backends.base import Backend, ColumnWriter, key_path
from rlds_cli.cache.backends.memmap import NpyColumnWriter, load_npy, release_pages
from rlds_cli.errors import ConversionError, CorruptDatasetError, FrameError
from rlds_cli.frames.codecs import (
    DAMAGED_FRAME_HINT,
    DEFAULT_JPEG_QUALITY,
    EncodedFrames,
    FrameFormat,
    FramesMode,
    damaged_frame,
    decode_many,
    encode_many,
)

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from rlds_cli.cache.manifest import FieldSpec

#: The two files of a frame column, after its key.
FRAMES_SUFFIX = "@frames"
ENDS_SUFFIX = "@ends.npy"
#: Bytes of stored frames read at a time by :meth:`FramesColumn.content_digest`.
_DIGEST_BLOCK = 16 << 20


def frame_files(dataset_dir: Path, key: str) -> tuple[Path, Path]:
    """``(frames, ends)``: the files of frame column ``key`` under ``dataset_dir``."""
    return key_path(dataset_dir, key, FRAMES_SUFFIX), key_path(dataset_dir, key, ENDS_SUFFIX)


class FramesHasher:
    """The content digest of a frame column, fed as it is written: the hash (``algorithm``, one
    of :data:`rlds_cli._util.io.DIGEST_ALGORITHMS`) of the stored bytes and that of the end offsets
    (int64, little-endian), joined with the column's format (codec, frame shape, channel order)."""

    def __init__(self, fmt: FrameFormat, algorithm: str = DIGEST_ALGORITHM) -> None:
        self.format = fmt
        self.algorithm = algorithm
        self._bytes = new_hash(algorithm)
        self._ends = new_hash(algorithm)

    def update(self, parts: Sequence[Any], ends: np.ndarray) -> None:
        """Add the next frames: their stored bytes, and their end offsets."""
        for part in parts:
            self._bytes.update(part)
        self._ends.update(np.ascontiguousarray(ends, dtype="<i8").data)

    def hexdigest(self) -> str:
        fmt = self.format
        layout = f"{fmt.codec}:{list(fmt.shape)}:{'chw' if fmt.channels_first else 'hwc'}"
        joined = f"frames:{layout}:{self._bytes.hexdigest()}:{self._ends.hexdigest()}"
        outer = new_hash(self.algorithm)
        outer.update(joined.encode())
        return str(outer.hexdigest())


class FramesColumnWriter(ColumnWriter):
    """Appends frames to a frame column: image files of the column's format are kept as they
    are; other rows are encoded with the column's codec, on every core, when ``encodes``.

    Args:
        dataset_dir: The build directory.
        key: The column's key.
        fmt: The column's codec and frame shape.
        quality: The JPEG quality of frames encoded here.
        encodes: Whether frames may be encoded here (``--frames jpeg|png|webp``); without it
            (``keep``), rows that are not the column's image files raise
            :class:`~rlds_cli.errors.ConversionError`.
        checks: Decode every kept frame before storing it, so a damaged source image is refused
            at conversion; off where the bytes are known good (compaction).
    """

    def __init__(
        self,
        dataset_dir: Path,
        key: str,
        fmt: FrameFormat,
        quality: int = DEFAULT_JPEG_QUALITY,
        *,
        encodes: bool = True,
        checks: bool = True,
    ) -> None:
        self.format = fmt
        self.quality = quality
        self.key = key
        self.encodes = encodes
        self.checks = checks
        frames_path, ends_path = frame_files(dataset_dir, key)
        frames_path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(frames_path, "wb")  # noqa: SIM115 - closed in close()
        self._ends = NpyColumnWriter(ends_path, np.dtype(np.int64), ())
        self._size = 0
        self._writer: ThreadPoolExecutor | None = None  # writes and hashes the encoded blocks
        self._written: Future[None] | None = None
        self.hasher = FramesHasher(fmt)
        #: Frames stored as they arrived, and frames encoded here.
        self.kept = 0
        self.encoded = 0

    @property
    def rows(self) -> int:
        return self._ends.rows

    def append(self, rows: Any) -> None:
        if len(rows) == 0:
            return
        if isinstance(rows, EncodedFrames) and rows.format == self.format:
            parts = rows.data
            if self.checks:
                self._decoded(rows)  # every kept frame decodes
            self.kept += len(parts)
        elif not self.encodes:
            arrived = f"{rows.format.codec} images" if isinstance(rows, EncodedFrames) else "arrays"
            raise ConversionError(
                f"frames of {self.key!r} arrive as {arrived} after {self.format.codec} images: a frame "
                "column holds one codec, and --frames keep never encodes",
                hint="convert with --frames raw (arrays), png or webp (lossless) or jpeg",
            )
        else:
            frames = self._decoded(rows) if isinstance(rows, EncodedFrames) else np.asarray(rows)
            if frames.shape[1:] != self.format.shape or frames.dtype != np.uint8:
                raise ValueError(
                    f"frames of shape {frames.shape[1:]} {frames.dtype}, expected {self.format.shape} uint8"
                )
            parts = encode_many(frames, self.format, self.quality)
            self.encoded += len(parts)
        ends = self._size + np.cumsum([len(p) for p in parts], dtype=np.int64)
        self._size = int(ends[-1])
        self._ends.append(ends)
        # written and hashed on a thread while the next block encodes: 0.73x -> 0.8x of the
        # encoder's rate (docs/benchmarks.md, "Compressed frames")
        self._wait_written()
        if self._writer is None:
            from concurrent.futures import ThreadPoolExecutor

            self._writer = ThreadPoolExecutor(1, thread_name_prefix="rlds-frames-write")
        self._written = self._writer.submit(self._write, parts, ends)

    def _decoded(self, rows: EncodedFrames) -> np.ndarray:
        """Every frame of ``rows`` decoded (on every core); a frame that does not decode is a
        :class:`ConversionError` naming its row and key."""
        scratch = np.empty((len(rows), *rows.format.shape), np.uint8)
        try:
            decode_many(rows.data.__getitem__, len(rows), rows.format, scratch)
            return scratch
        except FrameError as exc:
            row = self.rows + int(getattr(exc, "index", 0))
            raise ConversionError(
                f"frame {row} of {self.key!r} does not decode: {exc.message}",
                hint="the source's image file is damaged: download it again, or convert with --frames "
                "raw to see where it comes from",
            ) from None

    def _write(self, parts: list[bytes], ends: np.ndarray) -> None:
        self._fh.writelines(parts)
        self.hasher.update(parts, ends)

    def _wait_written(self) -> None:
        """Wait for the writing thread, re-raising its error (e.g. a full disk)."""
        written, self._written = self._written, None
        if written is not None:
            written.result()

    def write_behind(self) -> None:
        self._ends.write_behind()  # (the frames' own bytes are fsynced by the build's seal)

    def close(self, *, fsync: bool) -> int:
        try:
            self._wait_written()
            self._fh.flush()
            if fsync:
                os.fsync(self._fh.fileno())
        except BaseException:
            self.abort()
            raise
        self._stop_writer()
        self._fh.close()
        return self._ends.close(fsync=fsync)

    def abort(self) -> None:
        """End a column that will not be published: stop the writing thread and close both
        files, dropping the last write's error."""
        written, self._written = self._written, None
        if written is not None:
            written.exception()  # waits; what it raised belongs to the failed build
        self._stop_writer()
        with contextlib.suppress(OSError):  # its last flush may fail as the build did
            self._fh.close()
        self._ends.abort()

    def _stop_writer(self) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None


class FramesColumn:
    """A stored frame column, read as the ``(rows, *shape)`` uint8 array it stands for.

    ``column[i]``, ``column[a:b]`` and ``column[int_array]`` decode the rows asked for;
    :meth:`read_into` decodes into a caller's array, each distinct row once; :meth:`encoded`
    gives rows as stored. Stored bytes come through :meth:`fetch` (a memory map here; ranged
    requests in :mod:`rlds_cli.remote.reader`).

    Args:
        frames_path: The ``@frames`` file (or where it lies, for messages).
        ends: The end offset of each row (checked here against the file's size).
        fmt: The codec and frame shape.
        label: Names the column in errors (dataset and key).
        size: The file's size (``None``: read from the file, which is then mapped).
        data: The stored bytes, held in RAM (instead of the file).
    """

    #: Read ``key`` and ``next/key`` rows with one :meth:`read_into` (the TED reader's pairing).
    one_row_chunks = True
    #: What to do about a frame that does not decode (where the column's copy is mended).
    damage_hint = DAMAGED_FRAME_HINT
    #: Keeps reading the file it mapped (see :attr:`rlds_cli.cache.backends.base.Backend.stable_once_open`).
    stable_once_open = True
    dtype = np.dtype(np.uint8)

    def __init__(
        self,
        frames_path: Path | str,
        ends: np.ndarray,
        fmt: FrameFormat,
        label: str,
        size: int | None = None,
        data: np.ndarray | None = None,
    ) -> None:
        self.path = frames_path
        self.format = fmt
        self.label = label
        mapped = size is None and data is None
        size = len(data) if data is not None else os.stat(frames_path).st_size if size is None else size
        if ends.dtype != np.int64:
            raise CorruptDatasetError(
                f"frames of {label} ({frames_path}) are damaged: their offsets are {ends.dtype}, not int64"
            )
        if ends.ndim != 1:
            raise CorruptDatasetError(
                f"frames of {label} ({frames_path}) are damaged: their offsets are of shape {ends.shape}, "
                "not one per row"
            )
        if len(ends) and int(ends[0]) <= 0:
            raise CorruptDatasetError(
                f"frames of {label} ({frames_path}) are damaged: the first frame ends at byte {int(ends[0])}"
            )
        if (int(ends[-1]) if len(ends) else 0) != size:
            raise CorruptDatasetError(
                f"frames of {label} ({frames_path}) are damaged: the offsets say "
                f"{int(ends[-1]) if len(ends) else 0:,} bytes, the file holds {size:,}"
            )
        if len(ends) > 1 and not bool(np.all(ends[1:] > ends[:-1])):
            raise CorruptDatasetError(
                f"frames of {label} ({frames_path}) are damaged: the offsets go backwards"
            )
        self.ends = ends
        self.starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        self.size = size
        if data is not None:
            self._bytes = data
        else:
            self._bytes = (
                np.memmap(frames_path, np.uint8, mode="r") if mapped and size else np.empty(0, np.uint8)
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.ends), *self.format.shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.format.shape)

    def __len__(self) -> int:
        return len(self.ends)

    def fetch(self, first_byte: list[int], end_byte: list[int]) -> Any:
        """The stored bytes ``[first_byte[i], end_byte[i])`` of each ``i``, as a function of ``i``
        (views of the mapped file)."""
        data = self._bytes
        return lambda i: data[first_byte[i] : end_byte[i]]

    def repeats(self, rows: np.ndarray) -> np.ndarray:
        """Whether each stored frame ``rows[i]`` is byte for byte the frame before it (row 0:
        ``False``): sizes compared first, then the bytes of the equal-sized pairs, fetched in one
        :meth:`fetch` (a remote column merges them into few requests); nothing decoded."""
        rows = np.asarray(rows, np.int64)
        before = np.maximum(rows - 1, 0)
        same = (rows > 0) & (self.ends[rows] - self.starts[rows] == self.ends[before] - self.starts[before])
        pairs = np.flatnonzero(same)
        if len(pairs):
            both = np.concatenate([rows[pairs], before[pairs]])
            stored = self.fetch(self.starts[both].tolist(), self.ends[both].tolist())
            n = len(pairs)
            for j, i in enumerate(pairs.tolist()):
                same[i] = bytes(stored(j)) == bytes(stored(n + j))
        return same

    def release(self, start: int, stop: int) -> None:
        """Drop the mapped pages of rows ``[start, stop)`` from this process's resident set (they
        stay in the page cache); nothing where the bytes are not a read-only map of the file."""
        if stop > start and isinstance(self._bytes, np.ndarray):
            release_pages(self._bytes[int(self.starts[start]) : int(self.ends[stop - 1])])

    def frame_bytes(self, row: int) -> Any:
        """The stored image file of ``row`` (a buffer: a view of the mapped file)."""
        return self.fetch([int(self.starts[row])], [int(self.ends[row])])(0)

    def encoded(self, start: int, stop: int) -> EncodedFrames:
        """Rows ``[start, stop)`` as stored (their image files, copied out of the map)."""
        return self.encoded_rows(np.arange(start, stop, dtype=np.int64))

    @property
    def stored_format(self) -> FrameFormat:
        """The format :meth:`encoded_rows` gives rows in (a view's or merge's column of frames
        has the same attribute: ``None`` where its rows cannot be given as stored)."""
        return self.format

    def encoded_rows(self, rows: np.ndarray) -> EncodedFrames:
        """Rows ``rows`` as stored (their image files, copied out of the map)."""
        rows = np.asarray(rows, np.int64)
        stored = self.fetch(self.starts[rows].tolist(), self.ends[rows].tolist())
        return EncodedFrames([bytes(stored(i)) for i in range(len(rows))], self.format)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            row = int(index) + (len(self) if index < 0 else 0)
            if not 0 <= row < len(self):
                raise IndexError(f"row {index} out of range for {self.label} of {len(self)} rows")
            return self.read_into(np.array([row]), np.empty((1, *self.format.shape), np.uint8))[0]
        if isinstance(index, slice):
            rows = np.arange(*index.indices(len(self)), dtype=np.int64)
        elif isinstance(index, tuple) or index is Ellipsis:
            raise IndexError(f"{self.label}: frames are read by row (an int, a slice or an int array)")
        else:
            rows = np.asarray(index)
            if rows.dtype == np.bool_:
                if rows.shape != (len(self),):
                    raise IndexError(f"a mask of shape {rows.shape} for {self.label} of {len(self)} rows")
                rows = np.flatnonzero(rows)
            elif rows.dtype.kind not in "iu":
                raise IndexError(f"{self.label}: rows are read by integer indices, not {rows.dtype}")
            rows = rows.astype(np.int64, copy=False)
            if rows.size and (int(rows.min()) < -len(self) or int(rows.max()) >= len(self)):
                raise IndexError(f"row index out of range for {self.label} of {len(self)} rows")
            rows = np.where(rows < 0, rows + len(self), rows)
        return self.read_into(rows, np.empty(rows.shape + self.format.shape, np.uint8))

    def damaged(self, row: int, problem: str) -> CorruptDatasetError:
        """The error for stored frame ``row`` that does not decode (``problem``: why)."""
        return damaged_frame(row, self.label, self.path, problem, self.damage_hint)

    def read_into(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``rows`` (in range, any shape) into ``out`` (``rows.shape + shape`` uint8,
        C-contiguous), each distinct row once; returns ``out``.

        Raises:
            CorruptDatasetError: A frame that does not decode as the column's format.
        """
        flat = np.asarray(rows, np.int64).reshape(-1)
        frames = out.reshape(len(flat), *self.format.shape)
        if len(flat) > 1:
            distinct, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        else:
            distinct, first, inverse = flat, np.zeros(len(flat), np.int64), np.zeros(len(flat), np.int64)
        # each distinct row decoded in place at its first position, then copied to repeats
        stored = self.fetch(self.starts[distinct].tolist(), self.ends[distinct].tolist())
        try:
            decode_many(stored, len(distinct), self.format, frames, first.tolist())
        except FrameError as exc:
            raise self.damaged(int(distinct[getattr(exc, "index", 0)]), exc.message) from None
        if len(distinct) != len(flat):
            source = first[inverse.reshape(-1)]
            again = np.flatnonzero(source != np.arange(len(flat)))
            frames[again] = frames[source[again]]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        frames = self[:]
        return frames if dtype is None else frames.astype(dtype, copy=False)

    def loaded(self) -> FramesColumn:
        """This column with its stored (still encoded) bytes read into RAM."""
        data = np.frombuffer(bytes(self.fetch([0], [self.size])(0)), np.uint8)
        return FramesColumn(self.path, self.ends, self.format, self.label, data=data)

    def content_digest(self, algorithm: str = DIGEST_ALGORITHM) -> str:
        """The column's digest as :class:`FramesHasher` makes it, read in bounded blocks."""
        hasher = FramesHasher(self.format, algorithm)
        for start in range(0, self.size, _DIGEST_BLOCK):
            block = self.fetch([start], [min(self.size, start + _DIGEST_BLOCK)])(0)
            hasher.update([block], np.zeros(0, np.int64))
        hasher.update([], self.ends)
        return hasher.hexdigest()


def column_writer(
    backend: Backend,
    dataset_dir: Path,
    spec: FieldSpec,
    quality: int = DEFAULT_JPEG_QUALITY,
    *,
    encodes: bool = True,
    checks: bool = True,
    rows: int | None = None,
) -> ColumnWriter:
    """A writer of stored column ``spec`` under ``dataset_dir``: a :class:`FramesColumnWriter`
    for a frame column (``quality``, ``encodes``, ``checks``: see there), else the backend's
    (``rows``: as :meth:`~rlds_cli.cache.backends.base.Backend.create_column` takes it)."""
    fmt = spec.frame_format
    if fmt is None:
        return backend.create_column(dataset_dir, spec.key, np.dtype(spec.dtype), spec.shape, rows)
    return FramesColumnWriter(dataset_dir, spec.key, fmt, quality, encodes=encodes, checks=checks)


def with_frames(fields: dict[str, FieldSpec], mode: FramesMode) -> dict[str, FieldSpec]:
    """``fields`` as ``mode`` stores them: observation-like ``uint8`` frame keys get ``mode``'s
    codec (:mod:`rlds_cli.frames.codecs`); the rest are unchanged."""
    out = {}
    for key, spec in fields.items():
        fmt = mode.stored_format(spec.shape, spec.dtype) if spec.storage == "flat" else None
        out[key] = spec if fmt is None else replace(spec, codec=fmt.codec, channels_first=fmt.channels_first)
    return out


def open_frames(dataset_dir: Path, key: str, fmt: FrameFormat, label: str) -> FramesColumn:
    """Frame column ``key`` of the dataset at ``dataset_dir``.

    Raises:
        CorruptDatasetError: A file is missing or damaged.
    """
    frames_path, ends_path = frame_files(dataset_dir, key)
    try:
        ends = load_npy(ends_path, mmap=False, what="offsets file")
        return FramesColumn(frames_path, ends, fmt, label)
    except FileNotFoundError as exc:
        raise CorruptDatasetError(f"frames file {exc.filename} of {label} is missing") from None


def check_frames(dataset_dir: Path, key: str, fmt: FrameFormat, rows: int) -> str | None:
    """Check frame column ``key`` is complete (both files, ``rows`` offsets, the last at the
    file's size) without decoding; returns the problem, or ``None``."""
    try:
        column = open_frames(dataset_dir, key, fmt, repr(key))
    except CorruptDatasetError as exc:
        return exc.message
    if len(column) != rows:
        return f"frame column {key!r} has {len(column)} rows, expected {rows}"
    return None
