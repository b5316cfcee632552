"""JPEG frames decoded on the device (``Loader(..., decode=...)``, rlds_cli.frames.device_decode).

Everywhere: a device batch's rows carry the stored files of their distinct rows (bytes for bytes),
a forged header is a CorruptDatasetError naming the row before anything is decoded, ``decode``'s
refusals say why, and ``"auto"`` stays on the host off CUDA. The layout logic of the device path
(gray, RGB, channels first, repeated rows, ``next/`` keys, views and growing datasets, whose
frames stay on the host) runs on the CPU with torchvision's
``decode_jpeg`` stood in by the host decoder, so batches must equal the host path's exactly.
Where CUDA and torchvision exist (the GPU machine), the real nvJPEG path is checked against the
host decoder: same shapes and dtypes, pixels within a few levels.
"""

from __future__ import annotations

import itertools
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.backends.frames import FramesColumn
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import CorruptDatasetError
from rlds_cli.frames.device_decode import DeviceFrames, EncodedRows
from rlds_cli.loader import Loader
from rlds_cli.loader.image_transforms import RandomShift
from rlds_cli.loader.samplers import Episodes
from rlds_cli.loader.sources import HostSource
from rlds_cli.loader.transforms import FrameStack
from tests.frames_fixtures import build_frames

LENGTHS = [6, 2, 9, 1, 5]
SHAPES = {"rgb": (48, 64, 3), "gray": (48, 64), "chw": (3, 48, 64)}


def _cuda_decode() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception:
        return False
    return True


CUDA = _cuda_decode()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("device-decode")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        for name, shape in SHAPES.items():
            build_frames(root, name, LENGTHS, "jpeg", shape=shape)
        build_frames(root, "webp", LENGTHS, "webp")
    return root


@pytest.fixture
def host_decoder_as_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's decode_jpeg stood in by the host decoder (CHW tensors, as torchvision gives),
    and every device allowed: the device path's layout logic, run on the CPU."""
    io = types.ModuleType("torchvision.io")

    class ImageReadMode:
        GRAY, RGB = "GRAY", "RGB"

    def decode_jpeg(files: list[torch.Tensor], mode: str, device: Any) -> list[torch.Tensor]:
        import simplejpeg

        out = []
        for f in files:
            image = simplejpeg.decode_jpeg(f.numpy().tobytes(), colorspace=mode)
            out.append(torch.from_numpy(image).permute(2, 0, 1).to(device))
        return out

    io.ImageReadMode, io.decode_jpeg = ImageReadMode, decode_jpeg  # type: ignore[attr-defined]
    package = types.ModuleType("torchvision")
    package.io = io  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", io)
    monkeypatch.setattr("rlds_cli.loader.loader.device_decode_problem", lambda device, fmt: None)


def test_rows_carry_their_stored_files(root: Path) -> None:
    column = open_dataset("rgb", root).column("pixels")
    rows = np.array([[3, 3, 0], [7, 3, 12]])
    encoded = DeviceFrames(column)[rows]
    assert isinstance(encoded, EncodedRows) and encoded.shape == (2, 3)
    assert encoded.rows.tolist() == [0, 3, 7, 12]  # each distinct row once
    for i, row in enumerate(rows.reshape(-1).tolist()):
        j = int(encoded.inverse.reshape(-1)[i])
        stored = encoded.data[encoded.offsets[j] : encoded.offsets[j + 1]].tobytes()
        assert stored == bytes(column.frame_bytes(row))


class _FetchesBytes(FramesColumn):
    """A frame column whose fetch hands out ``bytes`` (as a remote column's ranged reads do)."""

    def fetch(self, first_byte: list[int], end_byte: list[int]) -> Any:
        views = super().fetch(first_byte, end_byte)
        return lambda i: bytes(views(i))


def test_rows_fetched_as_bytes_carry_their_files_too(root: Path) -> None:
    column = open_dataset("rgb", root).column("pixels")
    remote_like = _FetchesBytes(column.path, column.ends, column.format, "rgb/pixels")
    rows = np.array([4, 1, 4])
    encoded = DeviceFrames(remote_like)[rows]
    for i, row in enumerate(rows.tolist()):
        j = int(encoded.inverse[i])
        assert encoded.data[encoded.offsets[j] : encoded.offsets[j + 1]].tobytes() == bytes(
            column.frame_bytes(row)
        )


def test_a_forged_header_is_refused_before_decoding(root: Path, tmp_path: Path) -> None:
    column = open_dataset("rgb", root).column("pixels")
    first = bytes(column.frame_bytes(5))
    sof = first.index(b"\xff\xc0")  # the frame header: height at +5, width at +7
    forged = bytearray(first)
    forged[sof + 5 : sof + 7] = (40000).to_bytes(2, "big")  # a 40000-row frame: a decompression bomb
    data = np.frombuffer(bytes(forged), np.uint8)
    ends = np.array([len(data)], np.int64)

    bad = FramesColumn(tmp_path / "x.frames", ends, column.format, "bomb/pixels", data=data)
    with pytest.raises(CorruptDatasetError, match=r"frame 0 of bomb/pixels .*40000x64 JPEG image"):
        DeviceFrames(bad)[np.array([0])]
    with pytest.raises(IndexError, match="out of range"):
        DeviceFrames(column)[np.array([len(column)])]


def test_decode_says_why_it_cannot(root: Path) -> None:
    with pytest.raises(ValueError, match="decode must be 'auto', 'host' or 'device', not 'gpu'"):
        Loader("rgb", root=root, decode="gpu")
    with pytest.raises(ValueError, match="needs a CUDA device, not 'cpu'"):
        Loader("rgb", root=root, device="cpu", decode="device")
    if not CUDA:  # a CUDA machine has a device; the other refusals are checked with the stand-in
        return
    with pytest.raises(ValueError, match=r"only JPEG frames.*webp"):
        Loader("webp", root=root, device="cuda", decode="device")


def test_device_refusals_with_a_device(root: Path, host_decoder_as_torchvision: None) -> None:
    with pytest.raises(ValueError, match=r"FrameStack.*reads numpy arrays on the host"):
        Loader("rgb", root=root, device="cpu", decode="device", transform=FrameStack(2, keys=("pixels",)))
    with pytest.raises(ValueError, match="no frame columns among the keys read"):
        Loader("rgb", root=root, device="cpu", decode="device", keys=["action"])
    with pytest.raises(ValueError, match="in_memory='device' holds the frames decoded"):
        Loader("rgb", root=root, device="cpu", decode="device", in_memory="device")
    source = HostSource(open_dataset("rgb", root))
    source.num_steps, source.episodes = source.dataset.num_steps, Episodes.of(source.dataset)  # type: ignore[misc]
    with pytest.raises(ValueError, match="decodes a dataset's frame columns, not a source of rows"):
        Loader(source, device="cpu", decode="device")  # type: ignore[arg-type]


def test_auto_stays_on_the_host_off_cuda(root: Path) -> None:
    loader = Loader("rgb", root=root, device="cpu", batch_size=4, seed=0)
    assert loader._device_decoded == frozenset()
    assert loader.sample()["pixels"].shape == (4, 48, 64, 3)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize(
    "options",
    [
        {"sampler": "uniform", "batch_size": 16},
        {"sampler": "slice", "batch_size": 8, "slice_len": 4},
        {"sampler": "uniform", "batch_size": 8, "in_memory": True},
        {"sampler": "epoch", "batch_size": 8, "prefetch": 2},
    ],
    ids=["uniform", "slice", "in-memory", "epoch-prefetch"],
)
def test_device_batches_equal_the_hosts(
    root: Path, host_decoder_as_torchvision: None, name: str, options: dict[str, Any]
) -> None:
    host = Loader(name, root=root, seed=5, decode="host", **options)
    dev = Loader(name, root=root, seed=5, device="cpu", decode="device", **options)
    assert dev._device_decoded == frozenset({"pixels"})
    for a, b in itertools.islice(zip(host, dev, strict=False), 3):
        assert set(a) == set(b)
        for key in a:
            np.testing.assert_array_equal(b[key].numpy(), a[key].numpy(), err_msg=key)


def test_views_and_growing_datasets_decode_on_the_host(
    root: Path, host_decoder_as_torchvision: None, tmp_path: Path
) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "seed": 4, "episodes": [0, 2, 4]}
    host = Loader("rgb", root=root, decode="host", **kw)
    dev = Loader("rgb", root=root, device="cpu", decode="device", **kw)
    for a, b in itertools.islice(zip(host, dev, strict=False), 2):
        np.testing.assert_array_equal(b["pixels"].numpy(), a["pixels"].numpy())
    from rlds_cli import DatasetWriter
    from tests.frames_fixtures import frame_rows

    with DatasetWriter("g", root=tmp_path, frames="jpeg", grace_seconds=0) as writer:
        for i, length in enumerate([5, 3, 7]):
            frames = frame_rows(length + 1, (48, 64, 3), 10 * i)
            done = np.zeros(length, bool)
            done[-1] = True
            writer.add_episode(
                {
                    "observation": frames[:-1],
                    "next/observation": frames[1:],
                    "action": np.zeros((length, 1), np.float32),
                    "next/reward": np.ones(length, np.float32),
                    "next/terminated": np.zeros(length, bool),
                    "next/truncated": done,
                }
            )
            writer.flush()  # a segment each: the column is a concatenation of three
    host = Loader("g", root=tmp_path, decode="host", batch_size=8, seed=1, refresh=1)
    dev = Loader("g", root=tmp_path, device="cpu", decode="device", batch_size=8, seed=1, refresh=1)
    for a, b in itertools.islice(zip(host, dev, strict=False), 2):
        np.testing.assert_array_equal(b["observation"].numpy(), a["observation"].numpy())
        np.testing.assert_array_equal(b["next/observation"].numpy(), a["next/observation"].numpy())


def test_image_transforms_run_on_device_frames(root: Path, host_decoder_as_torchvision: None) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "seed": 2}
    host = Loader("rgb", root=root, decode="host", transform=RandomShift(4, seed=1), **kw)
    dev = Loader("rgb", root=root, device="cpu", decode="device", transform=RandomShift(4, seed=1), **kw)
    a, b = host.sample(), dev.sample()
    np.testing.assert_array_equal(b["pixels"].numpy(), a["pixels"].numpy())


def test_empty_rows_decode_to_an_empty_batch(root: Path, host_decoder_as_torchvision: None) -> None:
    column = open_dataset("rgb", root).column("pixels")
    out = DeviceFrames(column)[np.zeros((0, 2), np.int64)].to_device("cpu")
    assert tuple(out.shape) == (0, 2, 48, 64, 3) and out.dtype == torch.uint8


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and torchvision (nvJPEG)")
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_nvjpeg_batches_match_the_host_decoder(root: Path, name: str) -> None:
    host = Loader(name, root=root, seed=9, batch_size=32, decode="host")
    dev = Loader(name, root=root, seed=9, batch_size=32, device="cuda", decode="auto")
    assert dev._device_decoded == frozenset({"pixels"})
    for a, b in itertools.islice(zip(host, dev, strict=False), 4):
        for key in a:
            assert b[key].device.type == "cuda", key
            assert b[key].shape == a[key].shape and b[key].dtype == a[key].dtype, key
            if b[key].dtype == torch.uint8:
                diff = (b[key].cpu().int() - a[key].int()).abs()
                assert int(diff.max()) <= 8 and float(diff.float().mean()) < 1.0, key
            else:
                assert torch.equal(b[key].cpu(), a[key]), key


def test_a_file_without_its_end_marker_is_refused_as_the_host_refuses_it(root: Path, tmp_path: Path) -> None:
    # nvJPEG decodes a zeroed scan without an error (seen on an H200): such a file never reaches it
    column = open_dataset("rgb", root).column("pixels")
    good = bytes(column.frame_bytes(0))
    damaged = good[: len(good) // 2] + bytes(len(good) - len(good) // 2)  # the scan's second half zeroed
    data = np.frombuffer(good + damaged, np.uint8)
    ends = np.array([len(good), len(good) + len(damaged)], np.int64)
    bad = FramesColumn(tmp_path / "x.frames", ends, column.format, "bad/pixels", data=data)
    with pytest.raises(CorruptDatasetError, match=r"frame 1 of bad/pixels .*damaged"):
        bad[np.array([0, 1])]  # the host path
    with pytest.raises(CorruptDatasetError, match=r"frame 1 of bad/pixels .*damaged"):
        DeviceFrames(bad)[np.array([0, 1])]
    trailing = good + b"\x00" * 7  # bytes after the end marker: libjpeg-turbo reads it, so may nvJPEG
    data = np.frombuffer(good + trailing, np.uint8)
    ends = np.array([len(good), 2 * len(good) + 7], np.int64)
    padded = FramesColumn(tmp_path / "y.frames", ends, column.format, "padded/pixels", data=data)
    encoded = DeviceFrames(padded)[np.array([1, 0])]
    assert encoded.data[encoded.offsets[1] :].tobytes() == trailing
