"""The loader over frame columns: every batch equals the one the same loader draws from the same
frames stored raw (lossless codecs), through every read path: uniform and slice samplers,
frame stacks, windows, in RAM or not, views."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.derive import create_view
from rlds_cli.cache.opening import open_dataset
from rlds_cli.loader import Loader
from rlds_cli.loader.transforms import FrameStack
from tests.frames_fixtures import build_frames

LENGTHS = [6, 2, 9, 1, 5]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The same frames stored raw (``raw``) and as WebP (``enc``), in one cache root."""
    root = tmp_path_factory.mktemp("frames-loader")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        build_frames(root, "raw", LENGTHS, "raw")
        build_frames(root, "enc", LENGTHS, "webp")
    return root, "enc"


def same_batches(root: Path, enc: str, count: int, **kw: object) -> None:
    raw_loader = Loader(open_dataset("raw", root), **kw)
    enc_loader = Loader(open_dataset(enc, root), **kw)
    for a, b in itertools.islice(zip(raw_loader, enc_loader, strict=True), count):
        assert set(a.keys()) == set(b.keys())
        for key in a:
            np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(a[key]), err_msg=str(key))
    raw_loader.close()
    enc_loader.close()


@pytest.mark.parametrize("in_memory", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 8, "sampler": "uniform"},
        {"batch_size": 4, "sampler": "epoch"},
        {"batch_size": 3, "sampler": "slice", "slice_len": 3},
        {"batch_size": 5, "sampler": "uniform", "transform": FrameStack(3, keys=("pixels",))},
    ],
    ids=["uniform", "epoch", "slice", "framestack"],
)
def test_batches_equal_the_raw_datasets(pair: tuple[Path, str], options: dict, in_memory: bool) -> None:
    root, enc = pair
    same_batches(root, enc, 4, seed=3, in_memory=in_memory, **options)


def test_in_memory_holds_the_frames_encoded(pair: tuple[Path, str]) -> None:
    root, enc = pair
    loader = Loader(open_dataset(enc, root), batch_size=4, seed=0, in_memory=True)
    held = loader._host._columns["pixels"]
    assert held.format.codec == "webp" and not isinstance(held._bytes, np.memmap)
    assert held._bytes.nbytes == held.ends[-1]  # the stored bytes, not the decoded frames
    next(iter(loader))
    loader.close()


def test_in_memory_never_decodes_a_views_frames_whole(pair: tuple[Path, str]) -> None:
    """A view's (or a growing dataset's) frames have no one stored file to hold: with
    ``in_memory=True`` they stay read from their files, never decoded whole into RAM."""
    root, enc = pair
    create_view(enc, "mem-view", episodes=(0, 3), root=root)
    create_view("raw", "mem-raw", episodes=(0, 3), root=root)
    loader = Loader(open_dataset("mem-view", root), batch_size=4, seed=0, in_memory=True)
    assert not isinstance(loader._host._columns["pixels"], np.ndarray)
    raw_loader = Loader(open_dataset("mem-raw", root), batch_size=4, seed=0, in_memory=True)
    for a, b in itertools.islice(zip(raw_loader, loader, strict=True), 3):
        np.testing.assert_array_equal(np.asarray(b["pixels"]), np.asarray(a["pixels"]))
    loader.close()
    raw_loader.close()


def test_a_view_of_frames(pair: tuple[Path, str]) -> None:
    root, enc = pair
    create_view(enc, "enc-view", episodes=(1, 4), root=root)
    create_view("raw", "raw-view", episodes=(1, 4), root=root)
    view, raw = open_dataset("enc-view", root), open_dataset("raw-view", root)
    np.testing.assert_array_equal(view[:]["pixels"], raw[:]["pixels"])
    np.testing.assert_array_equal(view[:]["next/pixels"], raw[:]["next/pixels"])
    assert view.check_files() == []
