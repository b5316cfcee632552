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
* a file that does not end with JPEG's end-of-image marker (cut short, its scan zeroed) is
  decoded on the host first, strictly: nvJPEG fills what it cannot read without an error (seen on
  an H200 with torchvision 0.26), where libjpeg-turbo refuses it. Damage inside a complete file
  may still decode differently on the two; the digests of ``rlds verify`` / ``inspect --check``
  find any changed byte;
* a decode that fails on the device is done again on the host: a damaged frame is then the
  same error as the host path gives, naming the row; where every frame decodes on the host
  (the device failed: out of memory, a driver error), the device's own error is raised as it is;
* each distinct row of a batch is decoded once (its repeats are copies);
* the decode waits for the work already queued on the device's current stream (nvJPEG's batched
  decode writes its outputs outside that stream's order: memory a queued kernel still reads
  could otherwise be overwritten).

Only a plain stored frame column (:class:`~rlds_cli.cache.backends.frames.FramesColumn`, local or
remote) is read for the device; the frames of views, merges and growing datasets of several
segments decode on the host.

The pixels are nvJPEG's: its inverse DCT and chroma upsampling may differ from libjpeg-turbo's
(the host decoder) by a few levels; the shape, dtype and layout are the same. torch and
torchvision are imported only when a batch is decoded.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rlds_cli.errors import CorruptDatasetError, FrameError
from rlds_cli.frames.codecs import FrameFormat, check_jpeg_header, damaged_frame, decode_into

__all__ = ["DeviceFrames", "EncodedRows", "device_decode_problem"]

#: The first torchvision whose ``decode_jpeg`` takes a list of files and a CUDA device.
MIN_TORCHVISION = (0, 19)


def device_decode_problem(device: Any, fmt: FrameFormat) -> str | None:
    """Why frames of ``fmt`` cannot be decoded on ``device`` (``None``: they can): the device is
    no CUDA device, the codec is not JPEG, or torchvision (with its image decoders) is missing."""
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return f"decoding on the device needs a CUDA device, not {str(device)!r}"
    if fmt.codec != "jpeg":
        return f"only JPEG frames decode on the device (nvJPEG), these are {fmt.codec}"
    try:
        import torchvision
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        return f"decoding on the device needs torchvision (pip install torchvision): {exc}"
    version = tuple(int(p) for p in re.findall(r"\d+", torchvision.__version__)[:2])
    if version < MIN_TORCHVISION:
        return (
            f"decoding on the device needs torchvision >= {'.'.join(map(str, MIN_TORCHVISION))} "
            f"(batched nvJPEG), not {torchvision.__version__}"
        )
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
        if torch.device(device).type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # see the module docstring
        try:
            images = decode_jpeg(files, mode=mode, device=device)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            self._decode_on_the_host()  # raises the host's error for a damaged frame
            raise  # every frame decodes on the host: the device's own failure
        decoded = torch.stack(images)  # (n, C, H, W)
        if tuple(decoded.shape[1:]) != (channels, height, width):  # headers were checked: never
            self._decode_on_the_host()
            raise CorruptDatasetError(
                f"frames {self.rows[:4].tolist()} ... of {self.column.label} decoded on the device "
                f"(nvJPEG) to {tuple(decoded.shape[1:])} (C, H, W), not {(channels, height, width)}",
                hint="decode on the host: Loader(..., decode='host')",
            )
        if len(fmt.shape) == 2:
            decoded = decoded[:, 0]
        elif not fmt.channels_first:
            decoded = decoded.permute(0, 2, 3, 1)
        index = torch.from_numpy(self.inverse.reshape(-1)).to(device, non_blocking=True)
        return decoded.index_select(0, index).reshape(*self.shape, *fmt.shape)

    def _decode_on_the_host(self) -> None:
        """Decode the distinct rows on the host: raises the host path's
        :class:`~rlds_cli.errors.CorruptDatasetError` for the first frame that is damaged."""
        out = np.empty((len(self.rows), *self.format.shape), np.uint8)
        self.column.read_into(self.rows, out)


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
            raw = np.frombuffer(frame, np.uint8)  # a view, bytes or a map
            try:
                check_jpeg_header(frame, fmt)
                if len(raw) < 2 or raw[-2] != 0xFF or raw[-1] != 0xD9:
                    # no end-of-image marker last: nvJPEG fills a cut or zeroed scan without a
                    # word where libjpeg-turbo refuses it, so such a file is decoded on the host
                    # (strict) once; one the host reads (trailing bytes) goes to the device
                    decode_into(frame, fmt, np.empty(fmt.shape, np.uint8))
            except FrameError as exc:
                raise damaged_frame(int(distinct[i]), self.label, column.path, exc.message) from None
            data[offsets[i] : offsets[i + 1]] = raw
        return EncodedRows(data, offsets, distinct, inverse.reshape(rows.shape), rows.shape, column)
