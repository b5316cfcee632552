"""Frame columns in the cache: encoded at conversion (jpeg, png, webp) in both stores, read as
the arrays they stand for, checked by digest, and every damage reported, never served."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.backends.frames import frame_files
from rlds_cli.cache.digest import check_digests
from rlds_cli.cache.manifest import read_manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import CorruptDatasetError
from tests.dataset_fixtures import rewrite_manifest
from tests.frames_fixtures import build_frames, psnr

LENGTHS = [3, 5, 4]


def flat_to_steps(pixels: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's frame and its next frame, from the flat rows (steps, then the final one)."""
    here, after, row = [], [], 0
    for n in lengths:
        here.append(pixels[row : row + n])
        after.append(pixels[row + 1 : row + n + 1])
        row += n + 1
    return np.concatenate(here), np.concatenate(after)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
@pytest.mark.parametrize("codec", ["jpeg", "png", "webp"])
def test_frames_read_back_as_the_arrays_they_stand_for(tmp_path: Path, backend: str, codec: str) -> None:
    pixels = build_frames(tmp_path, "f", LENGTHS, codec, backend=backend)
    ds = open_dataset("f", tmp_path)
    assert ds.manifest.format_version == 2
    spec = ds.stored_fields["pixels"]
    assert (spec.codec, spec.shape, spec.dtype) == (codec, (48, 64, 3), "uint8")
    assert ds.stored_fields["state"].codec == "raw"  # not a picture
    assert ds.manifest.conversion["frames"] == {
        "mode": codec,
        "columns": {"pixels": {"codec": codec, "kept": 0, "encoded": len(pixels)}},
    }
    here, after = flat_to_steps(pixels, LENGTHS)
    batch = ds.gather(np.array([0, 7, 3, 7, 11]))
    for key, want in (("pixels", here), ("next/pixels", after)):
        got = batch[key]
        assert got.shape == (5, 48, 64, 3) and got.dtype == np.uint8
        if codec == "jpeg":
            assert psnr(got, want[[0, 7, 3, 7, 11]]) > 38
        else:
            np.testing.assert_array_equal(got, want[[0, 7, 3, 7, 11]])
    episode = ds.episode(1)["pixels"]
    assert episode.shape == (5, 48, 64, 3)
    assert check_digests(ds).ok and ds.check_files() == []
    # files: the two of the frame column, and nothing of a plain array
    frames, ends = frame_files(ds.directory, "pixels")
    assert frames.is_file() and ends.is_file() and not (ds.directory / "arrays" / "pixels.npy").exists()
    assert frames.stat().st_size * (3 if codec == "jpeg" else 1) < pixels.nbytes


def test_a_raw_dataset_stays_version_1(tmp_path: Path) -> None:
    build_frames(tmp_path, "r", LENGTHS, "keep")
    m = read_manifest(open_dataset("r", tmp_path).directory)
    assert m.format_version == 1 and m.fields["pixels"].codec == "raw" and "frames" not in m.conversion
    assert "codec" not in m.fields["pixels"].to_dict()


def test_channels_first_and_gray_frames(tmp_path: Path) -> None:
    pixels = build_frames(tmp_path, "c", LENGTHS, "png", shape=(3, 48, 64))
    ds = open_dataset("c", tmp_path)
    assert ds.stored_fields["pixels"].channels_first
    np.testing.assert_array_equal(ds.column("pixels")[:], pixels)
    gray = build_frames(tmp_path, "g", LENGTHS, "webp", shape=(48, 64))
    np.testing.assert_array_equal(open_dataset("g", tmp_path).column("pixels")[:], gray)


def test_column_indexing(tmp_path: Path) -> None:
    pixels = build_frames(tmp_path, "i", LENGTHS, "png")
    col = open_dataset("i", tmp_path).column("pixels")
    assert col.shape == pixels.shape and len(col) == len(pixels)
    np.testing.assert_array_equal(col[4], pixels[4])
    np.testing.assert_array_equal(col[-1], pixels[-1])
    np.testing.assert_array_equal(col[2:9:3], pixels[2:9:3])
    rows = np.array([[1, 1], [0, 14]])
    np.testing.assert_array_equal(col[rows], pixels[rows])
    out = np.empty((2, 2, 48, 64, 3), np.uint8)
    assert col.read_into(rows, out) is out
    np.testing.assert_array_equal(out, pixels[rows])
    with pytest.raises(IndexError):
        col[len(pixels)]
    with pytest.raises(IndexError):
        col[np.array([0, 99])]


# ----------------------------------------------------------------------------- damage


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("suffix", ["frames", "ends"])
def test_every_flipped_byte_is_detected_or_harmless(tmp_path: Path, suffix: str) -> None:
    """A flipped byte anywhere in a frame column's files fails the check (its digest, its
    offsets, its header) or changes nothing that is read (a byte of the offsets' .npy header
    padding): it is never served as other pixels with a check that passes."""
    original = build_frames(tmp_path, "d", [2, 1], "png", shape=(32, 32))
    ds = open_dataset("d", tmp_path)
    path = frame_files(ds.directory, "pixels")[0 if suffix == "frames" else 1]
    clean = path.read_bytes()
    missed, harmless = [], 0
    for at in range(len(clean)):
        _flip(path, at)
        try:
            flipped = open_dataset("d", tmp_path)
            report = check_digests(flipped)
            if report.ok:
                if np.array_equal(flipped.column("pixels")[:], original):
                    harmless += 1
                else:
                    missed.append(at)
            else:
                assert [p.key for p in report.problems] == ["pixels"]
        except CorruptDatasetError:
            pass  # refused at open: the offsets or their header
        path.write_bytes(clean)
    assert missed == []
    assert harmless <= (0 if suffix == "frames" else 64)  # the bytes of the frames all count


def test_a_damaged_frame_is_a_corrupt_dataset_error_naming_it(tmp_path: Path) -> None:
    build_frames(tmp_path, "b", LENGTHS, "jpeg")
    ds = open_dataset("b", tmp_path)
    frames, _ = frame_files(ds.directory, "pixels")
    col = ds.column("pixels")
    start = int(col.starts[6])
    _flip(frames, start)  # frame 6's first byte: no JPEG any more
    ds = open_dataset("b", tmp_path)
    with pytest.raises(
        CorruptDatasetError, match=r"frame 6 of 'pixels' of dataset 'b' .* is damaged: not a JPEG"
    ):
        ds.column("pixels")[[5, 6]]
    np.testing.assert_array_equal(ds.column("pixels")[5].shape, (48, 64, 3))  # the others read


def test_offsets_that_disagree_with_the_file_are_refused_at_open(tmp_path: Path) -> None:
    build_frames(tmp_path, "o", LENGTHS, "png")
    ds = open_dataset("o", tmp_path)
    frames, _ends = frame_files(ds.directory, "pixels")
    with open(frames, "ab") as fh:
        fh.write(b"x")
    with pytest.raises(CorruptDatasetError, match=r"frames of 'pixels' of dataset 'o'.*the file holds"):
        open_dataset("o", tmp_path).column("pixels")
    assert any("the file holds" in p for p in open_dataset("o", tmp_path).check_files())
    frames.unlink()
    with pytest.raises(CorruptDatasetError, match="is missing"):
        open_dataset("o", tmp_path).column("pixels")


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"codec": "gif"}, "'codec' must be raw or one of jpeg, png, webp, got 'gif'"),
        ({"dtype": "float32"}, "'codec' 'png' needs dtype uint8"),
        ({"shape": [48, 64, 5]}, "cannot be png frames"),
        ({"channels_first": "yes"}, "'channels_first' must be true or false"),
    ],
)
def test_a_tampered_frame_spec_is_a_malformed_manifest(tmp_path: Path, edit: dict, words: str) -> None:
    build_frames(tmp_path, "m", LENGTHS, "png")
    path = open_dataset("m", tmp_path).directory / "manifest.json"
    data = json.loads(path.read_text())
    data["fields"]["pixels"].update(edit)
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match=words):
        open_dataset("m", tmp_path)


@pytest.mark.parametrize(
    ("edit", "codec"),
    [
        ({"shape": [3, 48, 64], "channels_first": True}, "png"),  # read transposed
        ({"shape": [48, 64]}, "webp"),  # read as one channel of the RGB frames
        ({"codec": "png"}, "webp"),
    ],
)
def test_a_format_edit_fails_the_digest(tmp_path: Path, edit: dict, codec: str) -> None:
    """The digest covers how the frames are read (codec, shape, channel order), not only their
    bytes: an edited manifest fails the check, whatever a read then does."""
    build_frames(tmp_path, "e", LENGTHS, codec)
    path = open_dataset("e", tmp_path).directory / "manifest.json"
    data = json.loads(path.read_text())
    data["fields"]["pixels"].update(edit)
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    report = check_digests(open_dataset("e", tmp_path))
    assert not report.ok and [p.key for p in report.problems] == ["pixels"]


def test_offsets_of_another_shape_are_refused(tmp_path: Path) -> None:
    build_frames(tmp_path, "s", LENGTHS, "png")
    _, ends = frame_files(open_dataset("s", tmp_path).directory, "pixels")
    values = np.load(ends)
    np.save(ends, values.reshape(-1, 1))
    with pytest.raises(CorruptDatasetError, match=r"offsets are of shape \(15, 1\), not one per row"):
        open_dataset("s", tmp_path).column("pixels")


def test_frame_columns_refuse_float_and_misshapen_indices(tmp_path: Path) -> None:
    build_frames(tmp_path, "x", LENGTHS, "png")
    col = open_dataset("x", tmp_path).column("pixels")
    with pytest.raises(IndexError, match="integer indices"):
        col[np.array([1.7])]
    with pytest.raises(IndexError, match="a mask of shape"):
        col[np.ones(3, bool)]


def test_a_codec_on_a_step_field_or_in_a_version_1_manifest_is_malformed(tmp_path: Path) -> None:
    build_frames(tmp_path, "v", LENGTHS, "png")
    path = open_dataset("v", tmp_path).directory / "manifest.json"
    clean = path.read_text()
    data = json.loads(clean)
    data["format_version"] = 1
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match="format_version 1 cannot hold frame columns"):
        open_dataset("v", tmp_path)
    data = json.loads(clean)
    data["fields"]["action"].update(codec="png", dtype="uint8", shape=[48, 64, 3])
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match="on a per-step field"):
        open_dataset("v", tmp_path)


# ----------------------------------------------------------------------------- keep never encodes


def test_keep_refuses_frames_that_arrive_otherwise_and_damaged_ones(tmp_path: Path) -> None:
    """``--frames keep`` stores what arrives as image files bit for bit: frames of another codec
    later on (or as arrays) are refused, not encoded lossily; a source image file whose data is
    damaged is refused at conversion, never published."""
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.errors import ConversionError
    from rlds_cli.frames.codecs import EncodedFrames, FrameFormat, encode
    from tests.frames_fixtures import frames_block

    def encoded(block, codec: str):  # the block with its frames as image files of ``codec``
        fmt = FrameFormat(codec, (48, 64, 3))
        frames = block.observations["pixels"]
        return replace(
            block,
            observations={
                **block.observations,
                "pixels": EncodedFrames([encode(f, fmt) for f in frames], fmt),
            },
        )

    first, _ = frames_block([3])
    later, _ = frames_block([2], first=10)
    with (
        pytest.raises(ConversionError, match="arrive as png images after jpeg images"),
        DatasetBuilder("k", root=tmp_path) as builder,
    ):
        builder.append(encoded(first, "jpeg"))
        builder.append(encoded(later, "png"))
    with (
        pytest.raises(ConversionError, match="arrive as arrays after jpeg images"),
        DatasetBuilder("k", root=tmp_path) as builder,
    ):
        builder.append(encoded(first, "jpeg"))
        builder.append(later)
    cut = encoded(first, "jpeg")
    files = cut.observations["pixels"].data
    files[2] = files[2][: len(files[2]) // 2]  # the header is fine, the data ends early
    for frames in ("keep", "png"):  # kept as they are, or decoded to be encoded again (a bare line)
        with (
            pytest.raises(ConversionError, match="frame 2 of 'pixels' does not decode") as info,
            DatasetBuilder("k", root=tmp_path, frames=frames) as builder,
        ):
            builder.append(cut)
        assert "damaged" in info.value.hint
        assert not (tmp_path / "datasets" / "k").exists()


def test_a_failed_build_releases_its_frame_writers(tmp_path: Path) -> None:
    """An aborted build (an error after frames were appended) leaves no writing thread and no
    open file behind."""
    import threading

    from rlds_cli.cache.builder import DatasetBuilder
    from tests.frames_fixtures import frames_block

    block, _ = frames_block([3, 2])
    failing = pytest.raises(RuntimeError, match="stop")
    with failing, DatasetBuilder("a", root=tmp_path, frames="png") as builder:
        builder.append(block)
        raise RuntimeError("stop")
    assert not [t for t in threading.enumerate() if t.name.startswith("rlds-frames-write")]
    assert not (tmp_path / "datasets" / "a").exists()
    with DatasetBuilder("a", root=tmp_path, frames="png") as builder:  # the cause gone: it builds
        builder.append(block)
        builder.commit()
    assert check_digests(open_dataset("a", tmp_path)).ok


def test_offsets_of_another_dtype_are_refused(tmp_path: Path) -> None:
    build_frames(tmp_path, "f", LENGTHS, "png")
    _, ends = frame_files(open_dataset("f", tmp_path).directory, "pixels")
    np.save(ends, np.load(ends).astype(np.float64))
    with pytest.raises(CorruptDatasetError, match="their offsets are float64, not int64"):
        open_dataset("f", tmp_path).column("pixels")
