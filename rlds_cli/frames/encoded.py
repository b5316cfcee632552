"""Frames that arrive encoded: what a reader hands a builder when the source stores each frame
as an image file (minari's JPEG observations, RLDS TFRecord JPEG/PNG features, LeRobot image
features), so that ``--frames keep`` stores the source's bytes exactly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlds_cli.frames.codecs import FrameFormat
from rlds_cli.frames.threads import decode_many


class EncodedFrames:
    """A column of frames, one image file per row, all of one :class:`FrameFormat`.

    It stands where a block's ``(n, *shape)`` uint8 array would: ``len``, ``shape``, ``dtype``,
    ``ndim`` and slicing along rows answer as that array's would, and :meth:`decode` makes it.

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
        """Bytes of the frames decoded, as the array's: what a block's budget counts (a reader's
        block of encoded frames is decoded whole where they are stored raw)."""
        return len(self.data) * self.format.frame_bytes

    @property
    def stored_bytes(self) -> int:
        """Bytes of the image files."""
        return sum(len(d) for d in self.data)

    def __getitem__(self, index: Any) -> EncodedFrames:
        """Rows by a slice, an int array or a boolean mask (the frames as they are)."""
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
    """A block's column as checked and written: frames that arrived encoded stay so (never
    decoded to be looked at: their ``shape`` and ``dtype`` answer), anything else is an array."""
    return rows if isinstance(rows, EncodedFrames) else np.asarray(rows)


def take_rows(rows: Any, index: Any) -> Any:
    """``rows[index]`` of a block's column (see :func:`block_rows`)."""
    return block_rows(rows)[index]
