"""Camera frames: image codecs (``uint8`` frame <-> image bytes) and the threads that run them, and
the ``--frames`` / ``frames=`` modes of a conversion or a writer.

A stored frame column is described by a :class:`FrameFormat`: its codec (:data:`CODECS`) and the
frame's shape as read (``(H, W)`` gray, ``(H, W, C)``, or ``(C, H, W)`` with ``channels_first``),
always ``uint8``. A frame's bytes are one complete image file of that codec (JPEG, PNG, WebP):
a source's bytes kept bit for bit, or :func:`encode`'s output.

Decoders (measured on 224x224 MuJoCo renders): JPEG through simplejpeg (libjpeg-turbo, into the
caller's buffer, GIL released: 4,100 frames/s on one thread, 8,300 on two; Pillow 3,400 on one;
output bit for bit Pillow's, as minari's loader and the TFRecord reader decode: tested); PNG and WebP
through Pillow (GIL released). Every decode checks the header against the column's format first:
a frame of another size (damaged or forged header, decompression bomb) is a
:class:`~rlds_cli.errors.FrameError`, never an allocation. A PNG's chunks are checked against
their CRCs before it decodes (Pillow checks neither them nor zlib's Adler-32: ~1% of one-bit flips
decoded to other pixels); JPEG and WebP carry no checksum of their pixels (``rlds verify`` checks
the column's content digest).

Threads: one pool per process, one thread per usable CPU; threads take runs of a few frames from
one queue (a future per frame costs more than a small frame's decode).

What a conversion or a writer does with camera frames: the ``--frames`` / ``frames=`` modes, which
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
image file (minari's JPEG observations, RLDS TFRecord JPEG/PNG features, LeRobot image features).
"""

from __future__ import annotations

import io
import math
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli._util.cpus import usable_cpus
from rlds_cli.errors import CorruptDatasetError, FrameError, FramesModeError

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


#: The codecs a frame column may be stored in. ``raw`` (not here) is a plain array column.
CODECS = ("jpeg", "png", "webp")


#: Which of :data:`CODECS` lose nothing.
LOSSLESS = frozenset({"png", "webp"})


#: JPEG quality of ``--frames jpeg`` without ``:QUALITY``: on 1,200 224x224 MuJoCo renders (4:4:4
#: chroma) 6.9x smaller than raw at 41.8 dB PSNR, every frame above 40 dB (a sweep of every 4th
#: frame: quality 90 gave 7.9x at 40.4 dB, some frames at 39; 4:2:0 chroma gave 2-2.5 dB less
#: for 10-20% fewer bytes).
DEFAULT_JPEG_QUALITY = 93


#: Most pixels of one frame: Pillow's own decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``),
#: so a tiny source cannot make every read allocate gigabytes.
MAX_FRAME_PIXELS = 89_478_485


#: Leading bytes of each codec's files (WebP: ``RIFF????WEBP``, checked at bytes 0 and 8).
_MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}


def sniff(data: bytes | memoryview | np.ndarray) -> str | None:
    """The codec whose file ``data`` starts like (``None``: none of :data:`CODECS`)."""
    head = bytes(data[:12])
    for codec, magic in _MAGIC.items():
        if head.startswith(magic):
            return codec
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


@dataclass(frozen=True)
class FrameFormat:
    """How every frame of one column is stored and read.

    Attributes:
        codec: One of :data:`CODECS`.
        shape: The frame's shape as read: ``(H, W)``, ``(H, W, C)`` or, with
            ``channels_first``, ``(C, H, W)``; ``C`` is 1 or 3 (4 for PNG and WebP).
        channels_first: Frames are read as ``(C, H, W)`` (stored as images, channels last).
    """

    codec: str
    shape: tuple[int, ...]
    channels_first: bool = False

    def __post_init__(self) -> None:
        problem = frame_shape_problem(self.shape, self.channels_first, self.codec)
        if problem is not None:
            raise FrameError(
                f"a {self.codec} frame column cannot hold frames of shape {self.shape}: {problem}"
            )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of the stored image."""
        if len(self.shape) == 2:
            return (self.shape[0], self.shape[1], 1)
        if self.channels_first:
            return (self.shape[1], self.shape[2], self.shape[0])
        return (self.shape[0], self.shape[1], self.shape[2])

    @property
    def frame_bytes(self) -> int:
        """Bytes of one decoded frame."""
        return math.prod(self.shape)


def frame_shape_problem(shape: tuple[int, ...], channels_first: bool, codec: str) -> str | None:
    """Why frames of ``shape`` cannot be stored with ``codec`` (``None``: they can)."""
    if codec not in CODECS:
        return f"{codec!r} is not one of {', '.join(CODECS)}"
    if len(shape) not in (2, 3) or (len(shape) == 2 and channels_first):
        return "a frame is (H, W), (H, W, C) or (C, H, W)"
    channels = 1 if len(shape) == 2 else shape[0] if channels_first else shape[2]
    height, width = (shape[1], shape[2]) if channels_first else (shape[0], shape[1])
    allowed = (1, 3) if codec == "jpeg" else (1, 3, 4)
    if channels not in allowed:
        return f"{codec} images have {' or '.join(map(str, allowed))} channels, not {channels}"
    if not (1 <= height <= 65_500 and 1 <= width <= 65_500):  # JPEG's and WebP's limits (16383)
        return f"{height}x{width} is no image size"
    if codec == "webp" and max(height, width) > 16_383:
        return "WebP images are at most 16383 pixels on a side"
    if height * width > MAX_FRAME_PIXELS:
        return f"{height}x{width} is over {MAX_FRAME_PIXELS:,} pixels a frame (a decompression bomb?)"
    return None


def encode(frame: np.ndarray, fmt: FrameFormat, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """One frame (of ``fmt.shape``, ``uint8``) as an image file of ``fmt.codec``: JPEG at
    ``quality`` with 4:4:4 chroma (thin gripper edges keep their colour), PNG at zlib level 6,
    WebP lossless at least effort (224x224 render: 1.1 ms, 5.9x smaller than raw; effort 2:
    6.5 ms for 7.5x, effort 4: 29 ms for 7.6x)."""
    image = _image_view(frame, fmt)
    try:
        if fmt.codec == "jpeg":
            import simplejpeg

            gray = image.shape[2] == 1
            return bytes(
                simplejpeg.encode_jpeg(
                    image,
                    quality=int(quality),
                    colorspace="GRAY" if gray else "RGB",
                    colorsubsampling="Gray" if gray else "444",
                )
            )
        from PIL import Image

        pil = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
        out = io.BytesIO()
        if fmt.codec == "png":
            pil.save(out, format="PNG", compress_level=6)
        else:
            pil.save(out, format="WEBP", lossless=True, quality=0, method=0, exact=True)
        return out.getvalue()
    except (ValueError, OSError) as exc:  # the encoders' own words for what they refuse
        raise FrameError(f"a frame of {fmt.shape} cannot be encoded as {fmt.codec}: {exc}") from None


def _image_view(frame: np.ndarray, fmt: FrameFormat) -> np.ndarray:
    """``frame`` as a C-contiguous ``(H, W, C)`` uint8 image."""
    frame = np.asarray(frame)
    if frame.shape != fmt.shape or frame.dtype != np.uint8:
        raise FrameError(f"a frame of shape {frame.shape} {frame.dtype}, expected {fmt.shape} uint8")
    if fmt.channels_first:
        frame = frame.transpose(1, 2, 0)
    return np.ascontiguousarray(frame.reshape(fmt.image_shape))


def decode_into(data: Any, fmt: FrameFormat, out: np.ndarray) -> None:
    """Decode one image file (``bytes`` or a ``uint8`` buffer) into ``out``, a writable
    ``uint8`` array of ``fmt.shape`` (decoded in place where ``out`` is C-contiguous and
    channels last). Releases the GIL while it decodes.

    Raises:
        FrameError: ``data`` is not a complete image of ``fmt`` (another codec, another size
            or channel count, damaged).
    """
    height, width, channels = fmt.image_shape
    in_place = not fmt.channels_first and out.flags.c_contiguous
    target = out if in_place else np.empty((height, width, channels), np.uint8)
    try:
        if fmt.codec == "jpeg":
            _decode_jpeg(data, height, width, channels, target)
        else:
            _decode_pillow(data, fmt.codec, height, width, channels, target)
    except FrameError:
        raise
    except Exception as exc:  # each decoder's own errors: damaged data is all they mean here
        raise FrameError(
            f"a damaged {fmt.codec} frame: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    if not in_place:
        out[...] = target.transpose(2, 0, 1) if fmt.channels_first else target.reshape(out.shape)


def _decode_jpeg(data: Any, height: int, width: int, channels: int, out: np.ndarray) -> None:
    import simplejpeg

    _check_jpeg_header(data, height, width, channels)
    simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == 1 else "RGB", buffer=out.reshape(-1))


def check_frame(data: Any, fmt: FrameFormat) -> None:
    """Check, without decoding its pixels, that an image file is a frame of ``fmt``: its header
    (codec, size, gray or colour) and, for PNG, every chunk's CRC.

    Raises:
        FrameError: Another codec, a damaged header or chunk, or another size or channel count.
    """
    height, width, channels = fmt.image_shape
    try:
        if fmt.codec == "jpeg":
            _check_jpeg_header(data, height, width, channels)
        else:
            _open_pillow(data, fmt.codec, height, width, channels)[0].close()
    except FrameError:
        raise
    except Exception as exc:  # the decoders' own errors on a damaged header
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FrameError(f"a damaged {fmt.codec} frame: {reason}") from exc


def _check_jpeg_header(data: Any, height: int, width: int, channels: int) -> None:
    import simplejpeg

    if sniff(data) != "jpeg":
        raise FrameError("not a JPEG image (its first bytes are not a JPEG's)")
    got_h, got_w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    if (got_h, got_w) != (height, width):
        raise FrameError(f"a {got_h}x{got_w} JPEG image where the column holds {height}x{width} frames")
    if colorspace not in _JPEG_COLORSPACES:
        raise FrameError(f"a {colorspace} JPEG image (frames are gray or RGB)")
    if (colorspace == "Gray") != (channels == 1):
        raise FrameError(f"a {colorspace} JPEG image where the column holds {channels}-channel frames")


#: The JPEG colour spaces of frames (a CMYK or YCCK JPEG has no one RGB reading: Pillow keeps
#: it CMYK, libjpeg-turbo converts it its own way).
_JPEG_COLORSPACES = ("Gray", "YCbCr", "RGB")


#: Pillow's modes for each channel count.
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _open_pillow(data: Any, codec: str, height: int, width: int, channels: int) -> tuple[Any, bool]:
    """The PNG or WebP image ``data`` opened by Pillow (its header read, no pixel decoded) once
    checked against the column's frames, and whether it is an RGB image standing for gray or RGBA
    frames (WebP has no gray images; libwebp drops an alpha channel opaque everywhere)."""
    from PIL import Image

    if sniff(data) != codec:
        raise FrameError(f"not a {codec.upper()} image (its first bytes are not a {codec.upper()}'s)")
    if codec == "png":
        _check_png_chunks(memoryview(data).cast("B"))
    image = Image.open(io.BytesIO(memoryview(data)))
    as_rgb = codec == "webp" and channels in (1, 4) and image.mode == "RGB"
    name = codec.upper()
    if image.size != (width, height):
        got = f"{image.size[1]}x{image.size[0]}"
        problem = f"a {got} {name} image where the column holds {height}x{width} frames"
    elif image.mode != _MODES[channels] and not as_rgb:
        problem = f"a {image.mode} {name} image where the column holds {channels}-channel frames"
    else:
        return image, as_rgb
    image.close()
    raise FrameError(problem)


def _decode_pillow(data: Any, codec: str, height: int, width: int, channels: int, out: np.ndarray) -> None:
    image, as_rgb = _open_pillow(data, codec, height, width, channels)
    with image:
        image.load()
        pixels = np.asarray(image)
        target = out.reshape(height, width, channels)
        if not as_rgb:
            target[...] = pixels.reshape(height, width, channels)
        elif channels == 1:
            if not (
                np.array_equal(pixels[:, :, 0], pixels[:, :, 1])
                and np.array_equal(pixels[:, :, 0], pixels[:, :, 2])
            ):
                raise FrameError("an RGB WEBP image of unequal channels where the column holds gray frames")
            target[:, :, 0] = pixels[:, :, 0]
        else:
            target[:, :, :3] = pixels
            target[:, :, 3] = 255


def _check_png_chunks(data: memoryview) -> None:
    """Check every chunk of a PNG file up to ``IEND`` against its CRC-32 (PNG spec, 5.3).

    Raises:
        FrameError: A chunk's CRC differs, a chunk runs past the end, or there is no ``IEND``.
    """
    pos, end = 8, len(data)
    while pos + 12 <= end:
        length = int.from_bytes(data[pos : pos + 4], "big")
        stop = pos + 8 + length
        if stop + 4 > end:
            break
        kind = bytes(data[pos + 4 : pos + 8])
        if zlib.crc32(data[pos + 4 : stop]) != int.from_bytes(data[stop : stop + 4], "big"):
            raise FrameError(f"a damaged png frame: its {kind.decode('latin-1')!r} chunk fails its CRC")
        if kind == b"IEND":
            return
        pos = stop + 4
    raise FrameError("a damaged png frame: it is cut short (no IEND chunk)")


#: What to do about a damaged frame of a dataset in the cache.
DAMAGED_FRAME_HINT = "'rlds verify NAME' checks every file of the dataset; download or convert it again"


def damaged_frame(
    row: int, label: str, path: Any, problem: str, hint: str = DAMAGED_FRAME_HINT
) -> CorruptDatasetError:
    """The error for stored frame ``row`` of column ``label`` (file ``path``) that does not
    decode as its column says (``problem``: the codec's or the header check's words)."""
    return CorruptDatasetError(f"frame {row} of {label} ({path}) is damaged: {problem}", hint=hint)


def decode(data: Any, fmt: FrameFormat) -> np.ndarray:
    """One image file decoded into a new array of ``fmt.shape`` (see :func:`decode_into`)."""
    out = np.empty(fmt.shape, np.uint8)
    decode_into(data, fmt, out)
    return out


def image_format(data: Any, channels_first: bool = False) -> FrameFormat:
    """The :class:`FrameFormat` of one image file as it arrived (its codec from its bytes, its
    size and channels from its header): gray images read as ``(H, W)``.

    Raises:
        FrameError: ``data`` is no image of :data:`CODECS`, or its header is damaged.
    """
    codec = sniff(data)
    if codec is None:
        raise FrameError("not a JPEG, PNG or WebP image")
    try:
        if codec == "jpeg":
            import simplejpeg

            height, width, mode, _ = simplejpeg.decode_jpeg_header(data)
            channels = 0 if mode not in _JPEG_COLORSPACES else 1 if mode == "Gray" else 3
            kinds = "gray or RGB"
        else:
            from PIL import Image

            with Image.open(io.BytesIO(memoryview(data))) as image:
                width, height = image.size
                mode = image.mode
                channels = {v: k for k, v in _MODES.items()}.get(mode, 0)
            kinds = "gray, RGB or RGBA"
    except Exception as exc:
        raise FrameError(f"a {codec} image whose header is damaged: {exc}") from exc
    if channels == 0:  # not damage: a kind of image no frame is (convert the images first)
        raise FrameError(f"a {codec} image in {mode} (frames are {kinds} images)")
    if channels == 1:
        return FrameFormat(codec, (height, width))
    shape = (channels, height, width) if channels_first else (height, width, channels)
    return FrameFormat(codec, shape, channels_first)


#: Fewer frames than this are decoded on the calling thread: handing them over costs more.
INLINE_FRAMES = 4


_pool: ThreadPoolExecutor | None = None


_workers = 0


_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """Reset the pool and its lock in a forked child (which inherits neither the threads nor a
    usable lock)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _threads() -> tuple[ThreadPoolExecutor, int]:
    """The process's frame pool and its size."""
    global _pool, _workers
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor  # here: a reader of no frame needs none

            _workers = usable_cpus()
            _pool = ThreadPoolExecutor(_workers, thread_name_prefix="rlds-frames")
        return _pool, _workers


def run_split(count: int, work: Callable[[int, int], None]) -> None:
    """Call ``work(start, stop)`` over ``[0, count)`` in runs of a few items taken from one queue
    by every thread, the caller's included (frames differ in cost: fixed halves left a core idle).
    Returns when every run is done; raises the first error of any run."""
    pool, workers = _threads()
    helpers = min(workers, count // INLINE_FRAMES) - 1 if count >= 2 * INLINE_FRAMES else 0
    if helpers <= 0:
        work(0, count)
        return
    step = max(INLINE_FRAMES, count // (8 * (helpers + 1)))
    runs = iter(range(0, count, step))  # next() on it is atomic: each run is taken once

    def take() -> None:
        for start in runs:
            work(start, min(start + step, count))

    futures = [pool.submit(take) for _ in range(helpers)]
    try:
        take()
    finally:
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def decode_many(
    frame_bytes: Callable[[int], Any], count: int, fmt: FrameFormat, out: np.ndarray, places: Any = None
) -> None:
    """Decode frames ``frame_bytes(0) .. frame_bytes(count - 1)`` into ``out[0] .. out[count - 1]``
    (``out``: ``(rows, *fmt.shape)`` uint8), or into ``out[places[i]]`` when ``places`` is given,
    on every thread.

    Raises:
        FrameError: A frame that does not decode to ``fmt`` (the first met; its position is
            the ``index`` attribute of the error).
    """

    def share(start: int, stop: int) -> None:
        for i in range(start, stop):
            try:
                decode_into(frame_bytes(i), fmt, out[i if places is None else places[i]])
            except Exception as exc:
                exc.index = i  # type: ignore[attr-defined]
                raise

    run_split(count, share)


def encode_many(frames: np.ndarray, fmt: FrameFormat, quality: int = DEFAULT_JPEG_QUALITY) -> list[bytes]:
    """Each frame of ``frames`` (``(n, *fmt.shape)`` uint8) encoded with ``fmt.codec``, in order,
    on every thread."""
    encoded: list[bytes] = [b""] * len(frames)

    def share(start: int, stop: int) -> None:
        for i in range(start, stop):
            encoded[i] = encode(frames[i], fmt, quality)

    run_split(len(frames), share)
    return encoded


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


def _channels_first(shape: tuple[int, ...]) -> bool | None:
    """Whether per-step ``shape`` looks like an image with its channels first (``(C, H, W)``),
    ``False`` with them last or none (``(H, W, C)``, ``(H, W)``); ``None`` when it does not look like
    an image: not 2 or 3 axes, no axis of 1, 3 or 4 channels at either end, a side under
    :data:`MIN_SIDE` (the rule :func:`frame_format` and :func:`unencodable` share)."""
    if len(shape) not in (2, 3):
        return None
    if len(shape) == 3 and shape[2] not in (1, 3, 4) and shape[0] not in (1, 3, 4):
        return None
    channels_first = len(shape) == 3 and shape[2] not in (1, 3, 4)
    height, width = (shape[1], shape[2]) if channels_first else (shape[0], shape[1])
    return None if min(height, width) < MIN_SIDE else channels_first


def unencodable(shape: tuple[int, ...], dtype: np.dtype | str, codec: str) -> str | None:
    """Why arrays of per-step ``shape`` and ``dtype`` that look like images (2 or 3 axes, both
    sides at least :data:`MIN_SIDE`, 1, 3 or 4 channels) stay arrays under ``codec`` (``None``:
    they are frames it stores, or they do not look like images)."""
    channels_first = _channels_first(tuple(shape))
    if channels_first is None:
        return None
    if np.dtype(dtype) != np.uint8:
        return f"{np.dtype(dtype)}, and frames are uint8"
    return frame_shape_problem(tuple(shape), channels_first, codec)


def frame_format(shape: tuple[int, ...], dtype: np.dtype | str, codec: str) -> FrameFormat | None:
    """The :class:`FrameFormat` that stores arrays of per-step ``shape`` and ``dtype`` with
    ``codec``; ``None`` when they are not camera frames ``codec`` can hold (see the module)."""
    channels_first = _channels_first(tuple(shape))
    if np.dtype(dtype) != np.uint8 or channels_first is None:
        return None
    if frame_shape_problem(tuple(shape), channels_first, codec) is not None:
        return None
    return FrameFormat(codec, tuple(shape), channels_first)
