"""JPEG frames decoded on a CUDA device by nvJPEG (``torchvision.io.decode_jpeg``).

What ``decode=`` of a :class:`~rlds_cli.loader.Loader` on ``device="cuda"`` uses.

Indexing a :class:`DeviceFrames` with a batch's rows decodes nothing and returns
:class:`EncodedRows` (the distinct rows' stored files in one buffer, and each batch row's
frame); :meth:`EncodedRows.to_device` makes the batch's ``uint8`` tensor, of the host path's shape
and layout (``rows.shape + format.shape``).

Guarantees, as on the host:

* every header is checked on the host first: a frame of another size than the column's (damaged or
  forged header, decompression bomb) is a :class:`~rlds_cli.errors.CorruptDatasetError` naming the
  row, before any device allocation;
* a file without JPEG's end-of-image marker last (cut short, scan zeroed) is decoded strictly on
  the host first: nvJPEG fills what it cannot read without an error (H200, torchvision 0.26).
  Damage inside a complete file may still decode differently; ``rlds verify`` / ``inspect --check``
  digests find any changed byte;
* a decode that fails on the device is redone on the host: a damaged frame raises the host path's
  error naming the row; if every frame decodes on the host (out of memory, driver error), the
  device's error is raised;
* each distinct row of a batch is decoded once;
* the decode waits for the work queued on the device's current stream (nvJPEG's batched decode
  writes outside that stream's order, and could overwrite memory a queued kernel still reads).

Only a plain stored frame column (:class:`~rlds_cli.cache.backends.frames.FramesColumn`, local or
remote) is read for the device; views, merges and multi-segment growing datasets decode on the host.

Pixels may differ from libjpeg-turbo's (the host decoder) by a few levels (inverse DCT, chroma
upsampling); shape, dtype and layout are the same. torch and torchvision are imported only when a
batch is decoded.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rlds_cli.errors import CorruptDatasetError, FrameError
from rlds_cli.frames.codecs import FrameFormat, check_frame, decode_into

__all__ = ["DeviceFrames", "EncodedRows", "device_decode_problem"]

#: The first torchvision whose ``decode_jpeg`` takes a list of files and a CUDA device.
MIN_TORCHVISION = (0, 19)


def device_decode_problem(device: Any, fmt: FrameFormat) -> str | None:
    """Why frames of ``fmt`` cannot be decoded on ``device`` (``None``: they can): not a CUDA
    device, not JPEG, or no usable torchvision."""
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
    """A frame column read for decoding on a device: ``column[rows]`` is an :class:`EncodedRows`
    (stored bytes, headers checked); ``read_into`` still decodes on the host (FrameStack's gather)."""

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
                check_frame(frame, fmt)
                if len(raw) < 2 or raw[-2] != 0xFF or raw[-1] != 0xD9:
                    # no end-of-image marker last: nvJPEG silently fills a cut or zeroed scan, so
                    # check it strictly on the host; one the host reads (trailing bytes) goes on
                    decode_into(frame, fmt, np.empty(fmt.shape, np.uint8))
            except FrameError as exc:
                raise column.damaged(int(distinct[i]), exc.message) from None
            data[offsets[i] : offsets[i + 1]] = raw
        return EncodedRows(data, offsets, distinct, inverse.reshape(rows.shape), rows.shape, column)
