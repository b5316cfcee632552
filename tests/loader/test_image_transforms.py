"""Image transforms in the loader: what each does to a batch's frames (checked against a plain
per-frame loop and torchvision's definitions), one draw per sample, seeded and resumable, on
frame stacks and both layouts."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from rlds_cli.cache.opening import open_dataset
from rlds_cli.loader import CenterCrop, ColorJitter, FrameStack, Loader, RandomCrop, RandomShift, Resize
from tests.frames_fixtures import build_frames

LENGTHS = [7, 3, 9]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("image-transforms")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        build_frames(folder, "hwc", LENGTHS, "png")
        build_frames(folder, "chw", LENGTHS, "raw", shape=(3, 48, 64))
    return folder


def batches(root: Path, name: str, transform: object, count: int = 2, **kw: object) -> list[dict]:
    loader = Loader(open_dataset(name, root), batch_size=6, seed=1, transform=transform, **kw)
    out = [{k: np.asarray(v) for k, v in b.items()} for b in itertools.islice(loader, count)]
    loader.close()
    return out


def plain(root: Path, name: str, count: int = 2) -> list[dict]:
    return batches(root, name, None, count)


def test_center_crop_and_resize(root: Path) -> None:
    (raw,) = plain(root, "hwc", 1)
    (crop,) = batches(root, "hwc", CenterCrop((32, 40)), 1)
    np.testing.assert_array_equal(crop["pixels"], raw["pixels"][:, 8:40, 12:52])
    np.testing.assert_array_equal(crop["next/pixels"], raw["next/pixels"][:, 8:40, 12:52])
    np.testing.assert_array_equal(crop["state"], raw["state"])  # not a frame: untouched
    (small,) = batches(root, "hwc", Resize(24), 1)
    assert small["pixels"].shape == (6, 24, 24, 3) and small["pixels"].dtype == np.uint8
    want = torch.nn.functional.interpolate(
        torch.from_numpy(raw["pixels"]).permute(0, 3, 1, 2).float(),
        size=(24, 24),
        mode="bilinear",
        antialias=True,
    )
    np.testing.assert_array_equal(
        small["pixels"], want.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    )


def test_random_crop_is_a_crop_per_sample_and_channels_first_too(root: Path) -> None:
    for name, frame_axes in (("hwc", (1, 2)), ("chw", (2, 3))):
        (raw,) = plain(root, name, 1)
        (crop,) = batches(root, name, RandomCrop(20), 1)
        for i in range(6):
            image, got = raw["pixels"][i], crop["pixels"][i]
            if name == "chw":
                image, got = image.transpose(1, 2, 0), got.transpose(1, 2, 0)
            hits = [
                (y, x)
                for y in range(48 - 19)
                for x in range(64 - 19)
                if np.array_equal(image[y : y + 20, x : x + 20], got)
            ]
            assert hits, f"sample {i} of {name} is no crop of its frame"
        assert crop["pixels"].shape[frame_axes[0]] == 20


def test_random_shift_moves_each_stack_as_one(root: Path) -> None:
    """DrQ's shift: the frames of one sample's stack move together, by at most pad pixels."""
    (raw,) = batches(root, "hwc", FrameStack(3, keys=("pixels",)), 1)
    (shifted,) = batches(root, "hwc", [FrameStack(3, keys=("pixels",)), RandomShift(4)], 1)
    assert shifted["pixels"].shape == raw["pixels"].shape == (6, 3, 48, 64, 3)
    padded = np.pad(raw["pixels"], ((0, 0), (0, 0), (4, 4), (4, 4), (0, 0)), mode="edge")
    for i in range(6):
        offsets = [
            (y, x)
            for y in range(9)
            for x in range(9)
            if np.array_equal(padded[i, :, y : y + 48, x : x + 64], shifted["pixels"][i])
        ]
        assert offsets, f"sample {i}: its 3 frames were not shifted together"


def test_color_jitter_is_torchvisions_blend_per_sample(root: Path) -> None:
    (raw,) = plain(root, "hwc", 1)
    (jit,) = batches(root, "hwc", ColorJitter(brightness=0.4), 1)
    for i in range(6):
        ratio = jit["pixels"][i].astype(float) / np.maximum(raw["pixels"][i], 1)
        factor = np.median(ratio[(raw["pixels"][i] > 20) & (jit["pixels"][i] < 250)])
        assert 0.6 - 0.02 <= factor <= 1.4 + 0.02
        np.testing.assert_allclose(
            jit["pixels"][i], np.clip(np.round(raw["pixels"][i] * factor), 0, 255), atol=1.01
        )

    def gray(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64) @ np.array([0.299, 0.587, 0.114])

    (sat,) = batches(root, "hwc", ColorJitter(saturation=0.3), 1)
    assert sat["pixels"].dtype == np.uint8 and not np.array_equal(sat["pixels"], raw["pixels"])
    # saturation blends each pixel with its own gray level: the gray image stays (rounding aside)
    unclipped = (sat["pixels"] > 0).all(-1) & (sat["pixels"] < 255).all(-1)
    assert np.abs(gray(sat["pixels"]) - gray(raw["pixels"]))[unclipped].max() < 1.0
    (con,) = batches(root, "hwc", ColorJitter(contrast=0.3), 1)
    # contrast blends with the frame's mean gray level: that mean stays (rounding, clipping aside)
    np.testing.assert_allclose(gray(con["pixels"]).mean((1, 2)), gray(raw["pixels"]).mean((1, 2)), atol=1.5)


def test_seeded_and_resumable(root: Path) -> None:
    shift = [RandomShift(4, seed=3), ColorJitter(0.3, 0.3, 0.3, seed=3)]
    first = batches(root, "hwc", shift, 3)
    again = batches(root, "hwc", [RandomShift(4, seed=3), ColorJitter(0.3, 0.3, 0.3, seed=3)], 3)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a["pixels"], b["pixels"])
    other = batches(root, "hwc", [RandomShift(4, seed=4), ColorJitter(0.3, 0.3, 0.3, seed=4)], 1)
    assert not np.array_equal(other[0]["pixels"], first[0]["pixels"])
    # a loader restored from its state after one batch applies the same draws to the next ones
    loader = Loader(
        open_dataset("hwc", root),
        batch_size=6,
        seed=1,
        transform=[RandomShift(4, seed=3), ColorJitter(0.3, 0.3, 0.3, seed=3)],
    )
    stream = iter(loader)
    next(stream)
    state = loader.state_dict()
    restored = Loader(
        open_dataset("hwc", root),
        batch_size=6,
        seed=1,
        transform=[RandomShift(4, seed=3), ColorJitter(0.3, 0.3, 0.3, seed=3)],
    )
    restored.load_state_dict(state)
    np.testing.assert_array_equal(np.asarray(next(iter(restored))["pixels"]), first[1]["pixels"])
    loader.close()
    restored.close()


def test_bad_arguments_and_keys(root: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        Resize(0)
    with pytest.raises(ValueError, match="fraction"):
        ColorJitter(brightness=2)
    with pytest.raises(ValueError, match=r"\['state'\] are no camera frames of dataset 'hwc'"):
        Loader(open_dataset("hwc", root), batch_size=4, transform=CenterCrop(8, keys=["state"]))
    with pytest.raises(ValueError, match="CenterCrop of 64x64 is larger than the frames"):
        batches(root, "hwc", CenterCrop(64), 1)


def test_gray_frames_and_their_stacks(tmp_path: Path) -> None:
    """(H, W) frames, alone or stacked: transformed as one-channel images, the stack's frames
    moved together."""
    build_frames(tmp_path, "gray", LENGTHS, "raw", shape=(48, 64))
    (raw,) = batches(tmp_path, "gray", None, 1)
    (small,) = batches(tmp_path, "gray", Resize(24), 1)
    assert small["pixels"].shape == (6, 24, 24)
    (stack,) = batches(tmp_path, "gray", [FrameStack(3, keys=("pixels",)), Resize(32)], 1)
    assert stack["pixels"].shape == (6, 3, 32, 32)
    (plain_stack,) = batches(tmp_path, "gray", FrameStack(3, keys=("pixels",)), 1)
    (shifted,) = batches(tmp_path, "gray", [FrameStack(3, keys=("pixels",)), RandomShift(4)], 1)
    padded = np.pad(plain_stack["pixels"], ((0, 0), (0, 0), (4, 4), (4, 4)), mode="edge")
    for i in range(6):
        assert any(
            np.array_equal(padded[i, :, y : y + 48, x : x + 64], shifted["pixels"][i])
            for y in range(9)
            for x in range(9)
        )
    np.testing.assert_array_equal(raw["state"], small["state"])


def test_a_dataset_without_frames_is_told(tmp_path: Path) -> None:
    from tests.loader_fixtures import make_ted

    make_ted(tmp_path, "lowdim", [4, 3])
    with pytest.raises(ValueError, match="dataset 'lowdim' has no camera frames"):
        Loader(open_dataset("lowdim", tmp_path), batch_size=4, transform=Resize(8))
