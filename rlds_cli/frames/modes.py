"""What a conversion or a writer does with camera frames: the ``--frames`` / ``frames=`` modes, which
arrays are frames, and frames that arrive encoded.

Modes (:class:`FramesMode`):

* ``keep`` (the default): frames that arrive encoded keep the source's bytes exactly; frames
  that arrive as arrays stay arrays;
* ``raw``: every frame is decoded and stored as a plain ``uint8`` array;
* ``jpeg`` / ``jpeg:QUALITY``, ``png``, ``webp`` (lossless): frames that arrive as arrays are
  encoded; frames already in that codec keep their bytes (never re-encoded); frames in another
  codec are decoded and encoded.

A camera frame (:func:`frame_format`) is a ``uint8`` array of shape ``(H, W)``, ``(H, W, C)`` or
``(C, H, W)``, both sides at least :data:`MIN_SIDE` pixels (minari's rule: smaller grids, such as
MiniGrid's, are data), ``C`` a channel count the codec takes.

:class:`EncodedFrames` is what a reader hands a builder when the source stores each frame as an
image file (minari's JPEG observations, RLDS TFRecord JPEG/PNG features, LeRobot image features)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.errors import FramesModeError
from rlds_cli.frames.codecs import CODECS, DEFAULT_JPEG_QUALITY, FrameFormat, decode_many, frame_shape_problem


class EncodedFrames:
    """A column of frames, one image file per row, all of one :class:`FrameFormat`.

    Stands in for a block's ``(n, *shape)`` uint8 array: ``len``, ``shape``, ``dtype``, ``ndim``
    and row slicing behave as that array's; :meth:`decode` makes it.

    Args:
        data: One image file per row (``bytes`` or a ``uint8`` buffer each).
        fmt: The codec and frame shape of every file (checked when a frame is decoded).
    """

    dtype = np.dtype(np.uint8)

    def __init__(self, data: Sequence[Any], fmt: FrameFormat) -> None:
        self.data = [bytes(d) if not isinstance(d, bytes) else d for d in data]
        self.format = fmt

    def __len__(self) -> int:
        return len(self.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.data), *self.format.shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.format.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the frames decoded (what a block's budget counts: a block may be decoded whole)."""
        return len(self.data) * self.format.frame_bytes

    @property
    def stored_bytes(self) -> int:
        """Bytes of the image files."""
        return sum(len(d) for d in self.data)

    def __getitem__(self, index: Any) -> EncodedFrames:
        """Rows by a slice, an int array or a boolean mask (not decoded)."""
        if isinstance(index, slice):
            return EncodedFrames(self.data[index], self.format)
        rows = np.asarray(index)
        if rows.dtype == np.bool_:
            if rows.shape != (len(self.data),):
                raise IndexError(f"a mask of {rows.shape} for {len(self.data)} frames")
            rows = np.flatnonzero(rows)
        return EncodedFrames([self.data[int(r)] for r in rows.reshape(-1)], self.format)

    def decode(self) -> np.ndarray:
        """Every frame decoded: a ``(n, *shape)`` uint8 array.

        Raises:
            FrameError: A frame that is not an image of the format.
        """
        out = np.empty(self.shape, np.uint8)
        decode_many(self.data.__getitem__, len(self.data), self.format, out)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        frames = self.decode()
        return frames if dtype is None else frames.astype(dtype, copy=False)


def join_rows(parts: Sequence[Any]) -> Any:
    """The rows of a block's column pieces in order: one :class:`EncodedFrames` when every piece
    is one of the same format, else one array (frames decoded)."""
    if parts and all(isinstance(p, EncodedFrames) for p in parts) and len({p.format for p in parts}) == 1:
        return EncodedFrames([d for p in parts for d in p.data], parts[0].format)
    return np.concatenate([np.asarray(p) for p in parts])


def block_rows(rows: Any) -> np.ndarray | EncodedFrames:
    """A block's column as checked and written: :class:`EncodedFrames` stay encoded, anything else
    becomes an array."""
    return rows if isinstance(rows, EncodedFrames) else np.asarray(rows)


def take_rows(rows: Any, index: Any) -> Any:
    """``rows[index]`` of a block's column (see :func:`block_rows`)."""
    return block_rows(rows)[index]


#: The mode names, in the order the help lists them.
MODES = ("keep", "raw", *CODECS)
#: The smallest side of an array taken for a camera frame (minari's ``is_image_space``).
MIN_SIDE = 32


@dataclass(frozen=True)
class FramesMode:
    """One ``--frames`` setting: ``name`` one of :data:`MODES`, ``quality`` the JPEG quality."""

    name: str = "keep"
    quality: int = DEFAULT_JPEG_QUALITY

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise FramesModeError(f"frames mode {self.name!r} is not one of {', '.join(MODES)}")
        quality = self.quality
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise FramesModeError(f"JPEG quality {self.quality!r} is not an integer from 1 to 100")

    @classmethod
    def parse(cls, value: str | FramesMode | None) -> FramesMode:
        """``keep``, ``raw``, ``jpeg``, ``jpeg:QUALITY``, ``png`` or ``webp`` (``None``: keep).

        Raises:
            FramesModeError: Anything else, named.
        """
        if value is None:
            return cls()
        if isinstance(value, FramesMode):
            return value
        name, colon, quality = str(value).strip().lower().partition(":")
        if name not in MODES:
            raise FramesModeError(f"--frames {value!r} is not a frames mode")
        if not colon:
            return cls(name)
        digits = quality.isascii() and quality.isdigit()
        if name != "jpeg" or not digits or not 1 <= int(quality) <= 100:
            raise FramesModeError(f"--frames {value!r}: only jpeg takes a quality, from 1 to 100")
        return cls(name, int(quality))

    def __str__(self) -> str:
        if self.name == "jpeg" and self.quality != DEFAULT_JPEG_QUALITY:
            return f"jpeg:{self.quality}"
        return self.name

    @property
    def codec(self) -> str | None:
        """The codec frames that arrive as arrays are encoded with (``None``: kept as arrays)."""
        return self.name if self.name in CODECS else None

    def stored_format(
        self, shape: tuple[int, ...], dtype: np.dtype | str, arrived: FrameFormat | None = None
    ) -> FrameFormat | None:
        """How this mode stores an observation column of per-step ``shape`` and ``dtype`` (``None``:
        as a plain array; rules in the module docstring). ``arrived``: the format of frames that
        arrive as image files (``None``: as arrays)."""
        if arrived is not None:
            if self.name == "raw":
                return None
            if self.codec is None or self.codec == arrived.codec:
                return arrived
            return frame_format(arrived.shape, np.dtype(np.uint8), self.codec)
        return None if self.codec is None else frame_format(tuple(shape), dtype, self.codec)


def frame_format(shape: tuple[int, ...], dtype: np.dtype | str, codec: str) -> FrameFormat | None:
    """The :class:`FrameFormat` that stores arrays of per-step ``shape`` and ``dtype`` with
    ``codec``; ``None`` when they are not camera frames ``codec`` can hold (see the module)."""
    if np.dtype(dtype) != np.uint8 or len(shape) not in (2, 3):
        return None
    channels_first = len(shape) == 3 and shape[2] not in (1, 3, 4) and shape[0] in (1, 3, 4)
    height, width = (shape[1], shape[2]) if channels_first else (shape[0], shape[1])
    if min(height, width) < MIN_SIDE:
        return None
    if frame_shape_problem(tuple(shape), channels_first, codec) is not None:
        return None
    return FrameFormat(codec, tuple(shape), channels_first)
