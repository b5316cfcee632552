"""JPEG frames decoded on a CUDA device (nvJPEG through ``torchvision.io.decode_jpeg``) instead
of on the host's threads: what a ``Loader(..., device="cuda")`` does with a JPEG frame column
(``decode=`` of :class:`~rlds_cli.loader.Loader`).

A column read for the device is a :class:`DeviceFrames`: indexing it with a batch's rows decodes
nothing and returns :class:`EncodedRows` (the stored image files of the distinct rows, one
buffer, and where each row of the batch finds its frame); :meth:`EncodedRows.to_device` makes the
batch's ``uint8`` tensor on the device, of the shape and layout the host path gives (``rows.shape +
format.shape``: ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``).

Guarantees, as on the host:

* every frame's header is read on the host first (a few microseconds): a frame that would decode
  to another size than the column's (a damaged or forged header, a decompression bomb) is a
  :class:`~rlds_cli.errors.CorruptDatasetError` naming the row, before anything is allocated on
  the device;
* a frame that fails to decode on the device is decoded again on the host to name it: the
  same error as the host path gives;
* each distinct row is decoded once (a batch's repeats and a FrameStack's overlaps are copies).

The pixels are nvJPEG's: its inverse DCT and chroma upsampling may differ from libjpeg-turbo's
(the host decoder) by a few levels; the shape, dtype and layout are the same. torch and
torchvision are imported only when a batch is decoded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.errors import CorruptDatasetError, FrameError
from rlds_cli.frames.codecs import FrameFormat, check_jpeg_header

__all__ = ["DeviceFrames", "EncodedRows", "device_decode_problem"]


def device_decode_problem(device: Any, fmt: FrameFormat) -> str | None:
    """Why frames of ``fmt`` cannot be decoded on ``device`` (``None``: they can): the device is
    no CUDA device, the codec is not JPEG, or torchvision (with its image decoders) is missing."""
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return f"decoding on the device needs a CUDA device, not {str(device)!r}"
    if fmt.codec != "jpeg":
        return f"only JPEG frames decode on the device (nvJPEG), these are {fmt.codec}"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        return f"decoding on the device needs torchvision (pip install torchvision): {exc}"
    return None


class EncodedRows:
    """A batch's rows of a frame column, not decoded: the stored files of the distinct rows in
    one ``uint8`` buffer (``data[offsets[i]:offsets[i + 1]]`` is distinct row ``rows[i]``'s) and,
    for each row of the batch (``shape``), which distinct row it is (``inverse``)."""

    def __init__(
        self, data: np.ndarray, offsets: np.ndarray, rows: np.ndarray, inverse: np.ndarray,
        shape: tuple[int, ...], column: Any,
    ) -> None:  # fmt: skip
        self.data = data
        self.offsets = offsets
        self.rows = rows
        self.inverse = inverse
        self.shape = shape
        self.column = column

    @property
    def format(self) -> FrameFormat:
        fmt: FrameFormat = self.column.format
        return fmt

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def to_device(self, device: Any) -> Any:
        """The batch's frames as a ``uint8`` tensor on ``device`` (``shape + format.shape``),
        decoded there with nvJPEG.

        Raises:
            CorruptDatasetError: A frame that does not decode as the column's format (named by
                its row).
        """
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        fmt = self.format
        height, width, channels = fmt.image_shape
        if len(self.rows) == 0:
            return torch.empty((*self.shape, *fmt.shape), dtype=torch.uint8, device=device)
        files = list(torch.from_numpy(self.data).split(np.diff(self.offsets).tolist()))  # views
        mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
        try:
            images = decode_jpeg(files, mode=mode, device=device)
        except RuntimeError:
            self._name_the_bad_frame()
            raise
        decoded = torch.stack(images)  # (n, C, H, W)
        if tuple(decoded.shape[1:]) != (channels, height, width):  # headers were checked: never
            self._name_the_bad_frame()
        if len(fmt.shape) == 2:
            decoded = decoded[:, 0]
        elif not fmt.channels_first:
            decoded = decoded.permute(0, 2, 3, 1)
        index = torch.from_numpy(self.inverse.reshape(-1)).to(device, non_blocking=True)
        return decoded.index_select(0, index).reshape(*self.shape, *fmt.shape)

    def _name_the_bad_frame(self) -> None:
        """Decode the distinct rows on the host to raise the host path's error for the first
        frame that fails; raise a plain one if they all decode there."""
        out = np.empty((len(self.rows), *self.format.shape), np.uint8)
        self.column.read_into(self.rows, out)
        raise CorruptDatasetError(
            f"frames {self.rows[:4].tolist()}... of {self.column.label} decode on the host but not "
            "on the device (nvJPEG)",
            hint="decode on the host: Loader(..., decode='host')",
        )


class DeviceFrames:
    """A frame column whose rows are read for decoding on a device: ``column[rows]`` is an
    :class:`EncodedRows` (stored bytes, headers checked), everything else the column's own
    (``read_into`` still decodes on the host: what a FrameStack's host gather uses)."""

    def __init__(self, column: Any) -> None:
        self.column = column
        self.format: FrameFormat = column.format
        self.dtype = column.dtype
        self.label = column.label

    @property
    def shape(self) -> tuple[int, ...]:
        shape: tuple[int, ...] = self.column.shape
        return shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self.column)

    def read_into(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode on the host (see :meth:`FramesColumn.read_into`)."""
        result: np.ndarray = self.column.read_into(rows, out)
        return result

    def __getitem__(self, index: Any) -> EncodedRows:
        rows = np.asarray(index, np.int64)
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= len(self.column)):
            raise IndexError(f"row index out of range for {self.label} of {len(self.column)} rows")
        flat = rows.reshape(-1)
        distinct, inverse = np.unique(flat, return_inverse=True)
        column = self.column
        starts, ends = column.starts[distinct], column.ends[distinct]
        sizes = ends - starts
        offsets = np.zeros(len(distinct) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = np.empty(int(offsets[-1]), np.uint8)
        stored = column.fetch(starts.tolist(), ends.tolist())
        fmt = self.format
        for i in range(len(distinct)):
            frame = stored(i)
            try:
                check_jpeg_header(frame, fmt)
            except FrameError as exc:
                raise CorruptDatasetError(
                    f"frame {int(distinct[i])} of {self.label} ({column.path}) is damaged: {exc.message}",
                    hint="'rlds verify NAME' checks every file of the dataset; download or convert it again",
                ) from None
            data[offsets[i] : offsets[i + 1]] = np.frombuffer(frame, np.uint8)  # a view, bytes or a map
        return EncodedRows(data, offsets, distinct, inverse.reshape(rows.shape), rows.shape, column)
