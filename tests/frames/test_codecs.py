"""The image codecs, the --frames modes and the rule of which arrays are camera frames."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from rlds_cli.errors import FrameError, FramesModeError
from rlds_cli.frames.codecs import (
    EncodedFrames,
    FrameFormat,
    FramesMode,
    decode,
    decode_into,
    decode_many,
    encode,
    encode_many,
    frame_format,
    image_format,
    join_rows,
    sniff,
    take_rows,
)
from tests.frames_fixtures import psnr, scene


@pytest.mark.parametrize(
    ("shape", "channels_first"),
    [((48, 64, 3), False), ((48, 64), False), ((48, 64, 1), False), ((3, 48, 64), True), ((1, 48, 64), True)],
)
@pytest.mark.parametrize("codec", ["jpeg", "png", "webp"])
def test_round_trip_every_layout(codec: str, shape: tuple[int, ...], channels_first: bool) -> None:
    fmt = FrameFormat(codec, shape, channels_first)
    h, w, c = fmt.image_shape
    image = scene(h, w, c)
    frame = image.transpose(2, 0, 1) if channels_first else image.reshape(shape)
    data = encode(frame, fmt)
    assert sniff(data) == codec
    back = decode(data, fmt)
    assert back.shape == shape and back.dtype == np.uint8
    if codec == "jpeg":
        assert psnr(back, frame) > 38
    else:
        np.testing.assert_array_equal(back, frame)  # lossless


def test_rgba_frames_need_a_lossless_codec() -> None:
    frame = np.dstack([scene(), np.full((48, 64), 200, np.uint8)])
    for codec in ("png", "webp"):
        fmt = FrameFormat(codec, (48, 64, 4))
        np.testing.assert_array_equal(decode(encode(frame, fmt), fmt), frame)
    with pytest.raises(FrameError, match="jpeg images have 1 or 3 channels, not 4"):
        FrameFormat("jpeg", (48, 64, 4))


@pytest.mark.parametrize("subsampling", ["444", "420"])
def test_jpeg_decodes_exactly_as_pillow_does(subsampling: str) -> None:
    """What minari's loader and the TFDS readers decode with: the same pixels, bit for bit."""
    frame = scene(64, 96)
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=75, subsampling=0 if subsampling == "444" else 2)
    data = buf.getvalue()
    np.testing.assert_array_equal(
        decode(data, FrameFormat("jpeg", (64, 96, 3))), np.asarray(Image.open(io.BytesIO(data)))
    )


def test_default_jpeg_keeps_40_db_at_several_times_smaller() -> None:
    frame = scene(96, 96)
    data = encode(frame, FrameFormat("jpeg", frame.shape))
    assert psnr(decode(data, FrameFormat("jpeg", frame.shape)), frame) > 40
    assert len(data) * 3 < frame.nbytes


def test_decode_refuses_what_the_column_does_not_hold() -> None:
    fmt = FrameFormat("jpeg", (48, 64, 3))
    data = encode(scene(), fmt)
    out = np.empty(fmt.shape, np.uint8)
    with pytest.raises(FrameError, match="a 48x64 JPEG image where the column holds 32x64 frames"):
        decode_into(data, FrameFormat("jpeg", (32, 64, 3)), np.empty((32, 64, 3), np.uint8))
    with pytest.raises(FrameError, match="where the column holds 1-channel frames"):
        decode_into(data, FrameFormat("jpeg", (48, 64)), np.empty((48, 64), np.uint8))
    with pytest.raises(FrameError, match="not a PNG image"):
        decode_into(data, FrameFormat("png", (48, 64, 3)), out)
    with pytest.raises(FrameError, match="not a JPEG image"):
        decode_into(b"garbage" * 10, fmt, out)
    with pytest.raises(FrameError, match="damaged jpeg frame"):
        decode_into(data[: len(data) // 2], fmt, out)  # cut: the decoder stops early
    png = encode(scene(), FrameFormat("png", (48, 64, 3)))
    with pytest.raises(FrameError, match="damaged png frame"):
        decode_into(png[: len(png) // 2], FrameFormat("png", (48, 64, 3)), out)


@pytest.mark.parametrize(("side", "words"), [(5000, "5000x5000 PNG image"), (60000, "decompression bomb")])
def test_a_forged_size_is_refused_before_anything_is_allocated(side: int, words: str) -> None:
    """A header that promises another size (a decompression bomb: Pillow's own guard says so
    first) is refused before the pixels are decoded."""
    fmt = FrameFormat("png", (48, 64, 3))
    data = bytearray(encode(scene(), fmt))
    data[16:24] = side.to_bytes(4, "big") * 2  # IHDR width and height, with the chunk's crc
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    with pytest.raises(FrameError, match=words):
        decode_into(bytes(data), fmt, np.empty(fmt.shape, np.uint8))


def test_image_format_reads_headers() -> None:
    assert image_format(encode(scene(), FrameFormat("jpeg", (48, 64, 3)))) == FrameFormat("jpeg", (48, 64, 3))
    assert image_format(encode(scene(c=None), FrameFormat("png", (48, 64)))) == FrameFormat("png", (48, 64))
    assert image_format(
        encode(scene(), FrameFormat("webp", (48, 64, 3))), channels_first=True
    ) == FrameFormat("webp", (3, 48, 64), True)
    with pytest.raises(FrameError, match="not a JPEG, PNG or WebP image"):
        image_format(b"GIF89a....")


def test_threads_keep_order_and_report_the_bad_frame() -> None:
    fmt = FrameFormat("png", (48, 64, 3))
    frames = np.stack([scene(seed=i) for i in range(24)])
    data = encode_many(frames, fmt)
    out = np.empty_like(frames)
    decode_many(data.__getitem__, len(data), fmt, out)
    np.testing.assert_array_equal(out, frames)
    data[17] = b"\x89PNG\r\n\x1a\n" + bytes(40)
    with pytest.raises(FrameError) as info:
        decode_many(data.__getitem__, len(data), fmt, out)
    assert info.value.index == 17  # type: ignore[attr-defined]


def test_encoded_frames_stand_for_their_array() -> None:
    fmt = FrameFormat("webp", (48, 64, 3))
    frames = np.stack([scene(seed=i) for i in range(5)])
    enc = EncodedFrames(encode_many(frames, fmt), fmt)
    assert enc.shape == (5, 48, 64, 3) and len(enc) == 5 and enc.ndim == 4 and enc.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(enc), frames)
    np.testing.assert_array_equal(enc[1:3].decode(), frames[1:3])
    mask = np.array([True, False, True, False, True])
    np.testing.assert_array_equal(take_rows(enc, mask).decode(), frames[mask])
    joined = join_rows([enc[:2], enc[2:]])
    assert isinstance(joined, EncodedFrames) and joined.data == enc.data
    mixed = join_rows([enc[:2], frames[2:]])  # one piece arrived as an array: all arrays
    np.testing.assert_array_equal(mixed, frames)


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        (None, FramesMode("keep")),
        ("keep", FramesMode("keep")),
        ("RAW", FramesMode("raw")),
        ("jpeg", FramesMode("jpeg", 93)),
        ("jpeg:75", FramesMode("jpeg", 75)),
        ("png", FramesMode("png")),
        (" webp ", FramesMode("webp")),
    ],
)
def test_modes_parse(text: str | None, mode: FramesMode) -> None:
    assert FramesMode.parse(text) == mode
    assert FramesMode.parse(str(mode)) == mode


@pytest.mark.parametrize("text", ["gif", "jpeg:0", "jpeg:101", "jpeg:high", "png:9", ""])
def test_bad_modes_are_one_named_error(text: str) -> None:
    with pytest.raises(FramesModeError, match=repr(text)) as info:
        FramesMode.parse(text)
    assert "keep (the default), raw, jpeg" in info.value.hint


def test_which_arrays_are_camera_frames() -> None:
    assert frame_format((84, 84), np.uint8, "jpeg") == FrameFormat("jpeg", (84, 84))
    assert frame_format((224, 224, 3), np.uint8, "jpeg") == FrameFormat("jpeg", (224, 224, 3))
    assert frame_format((3, 84, 84), np.uint8, "png") == FrameFormat("png", (3, 84, 84), True)
    assert frame_format((4, 84, 84), np.uint8, "jpeg") is None  # 4 stacked gray frames: no JPEG
    assert frame_format((4, 84, 84), np.uint8, "webp") == FrameFormat("webp", (4, 84, 84), True)
    assert frame_format((7, 7, 3), np.uint8, "jpeg") is None  # a MiniGrid grid: data, not a picture
    assert frame_format((84, 84, 3), np.float32, "jpeg") is None
    assert frame_format((17,), np.uint8, "jpeg") is None


def test_cmyk_jpegs_are_no_frames() -> None:
    """A CMYK JPEG has no one RGB reading (Pillow keeps it CMYK, libjpeg-turbo converts it its
    own way): refused, never kept and served as some RGB."""
    buf = io.BytesIO()
    Image.fromarray(scene()).convert("CMYK").save(buf, format="JPEG")
    with pytest.raises(FrameError, match=r"a jpeg image in CMYK \(frames are gray or RGB images\)"):
        image_format(buf.getvalue())
    with pytest.raises(FrameError, match="a CMYK JPEG image"):
        decode(buf.getvalue(), FrameFormat("jpeg", (48, 64, 3)))


def test_webp_keeps_an_opaque_alpha_and_checks_gray() -> None:
    """libwebp drops an alpha channel opaque everywhere: the frame still reads as RGBA, exactly.
    A WebP RGB image of unequal channels is no gray frame."""
    rgba = np.dstack([scene(), np.full((48, 64), 255, np.uint8)])
    fmt = FrameFormat("webp", (48, 64, 4))
    np.testing.assert_array_equal(decode(encode(rgba, fmt), fmt), rgba)
    colour = encode(scene(), FrameFormat("webp", (48, 64, 3)))
    with pytest.raises(FrameError, match="unequal channels where the column holds gray frames"):
        decode(colour, FrameFormat("webp", (48, 64)))


def test_frames_over_pillows_bomb_limit_are_refused() -> None:
    with pytest.raises(FrameError, match="over 89,478,485 pixels a frame"):
        FrameFormat("jpeg", (20_000, 20_000, 3))
    assert frame_format((20_000, 20_000, 3), np.uint8, "png") is None  # stays an array


@pytest.mark.parametrize("text", ["jpeg:", "png:", "keep:", "jpeg:\u00b2", "jpeg:\u0663"])
def test_an_empty_or_non_ascii_quality_is_refused(text: str) -> None:
    with pytest.raises(FramesModeError):
        FramesMode.parse(text)


def test_a_mode_made_by_hand_is_checked() -> None:
    with pytest.raises(FramesModeError, match="quality 500"):
        FramesMode("jpeg", 500)
    with pytest.raises(FramesModeError, match="'gif' is not one of"):
        FramesMode("gif")


def test_frames_decode_in_a_forked_child_after_the_parent_did() -> None:
    """A DataLoader worker forked while the parent's frame threads exist makes its own pool
    (the inherited one has no threads, its lock may be held)."""
    import multiprocessing

    fmt = FrameFormat("png", (48, 64, 3))
    frames = np.stack([scene(seed=i) for i in range(16)])
    data = encode_many(frames, fmt)
    out = np.empty_like(frames)
    decode_many(data.__getitem__, len(data), fmt, out)  # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        back = pool.apply(_decode_all, (data, fmt))
    np.testing.assert_array_equal(back, frames)


def _decode_all(data: list[bytes], fmt: FrameFormat) -> np.ndarray:
    out = np.empty((len(data), *fmt.shape), np.uint8)
    decode_many(data.__getitem__, len(data), fmt, out)
    return out


def test_what_each_mode_stores() -> None:
    """The one rule: arrays are encoded only by a codec mode; image files are kept unless raw is
    asked, never re-encoded in their own codec, decoded and encoded for another codec."""
    png = FrameFormat("png", (48, 64, 3))
    assert FramesMode("keep").stored_format((48, 64, 3), np.uint8) is None
    assert FramesMode("keep").stored_format((48, 64, 3), np.uint8, png) == png
    assert FramesMode("raw").stored_format((48, 64, 3), np.uint8, png) is None
    assert FramesMode("png").stored_format((48, 64, 3), np.uint8, png) == png
    assert FramesMode("jpeg").stored_format((48, 64, 3), np.uint8, png) == FrameFormat("jpeg", (48, 64, 3))
    assert FramesMode("jpeg").stored_format((48, 64, 4), np.uint8, FrameFormat("png", (48, 64, 4))) is None
    assert FramesMode("webp").stored_format((3, 48, 64), np.uint8) == FrameFormat("webp", (3, 48, 64), True)
    assert FramesMode("webp").stored_format((17,), np.float32) is None


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_every_flipped_bit_of_a_png_frame_is_refused(channels: int) -> None:
    """Pillow checks neither a PNG's chunk CRCs nor zlib's Adler-32: about 1% of one-bit flips of
    a frame decoded to other pixels, so a damaged frame was served, and a damaged source frame
    passed a conversion's 'decodes' check and was published with fresh digests."""
    fmt = FrameFormat("png", (48, 64, channels) if channels > 1 else (48, 64))
    image = scene(48, 64, channels, 3)
    frame = image if channels > 1 else image.reshape(48, 64)
    data = encode(frame, fmt)
    for offset in range(len(data)):
        for bit in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[offset] ^= bit
            with pytest.raises(FrameError):
                decode(bytes(damaged), fmt)
    with pytest.raises(FrameError, match="cut short"):
        decode(data[:-12], fmt)  # without its IEND chunk
    np.testing.assert_array_equal(decode(data, fmt), frame)
