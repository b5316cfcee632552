"""UMI replay buffers (issue 41, item 2): why rlds decodes UMI's JPEG-XL camera chunks at conversion
instead of keeping them as a ``jxl`` frame codec, and what converting one costs.

Frames: 224x224 RGB crops panning over a real photograph (matplotlib's sample
``grace_hopper.jpg``, 512x600), one step to the right or down per frame: photographic content
as UMI's GoPro frames are (the MuJoCo renders of ``frames_bench.py`` need mujoco, absent here).

* **Codecs, one core**: bytes per frame and single-thread decode rate of each codec, JPEG-XL
  encoded as UMI's ``07_generate_replay_buffer.py`` writes it (``JpegXl(level=99, numthreads=1)``,
  the ``imagecodecs.jpegxl_encode`` call of its numcodecs codec), against the frame codecs of the
  cache (rlds's own encoders and decoders: ``jpeg`` at quality 93, ``webp`` and ``png`` lossless).
* **Conversion**: a UMI-layout ``.zarr.zip`` (two cameras of JPEG-XL chunks, one frame a chunk,
  and the low-dim robot arrays; written with zarr-python 3 in zarr v2 format, byte-compatible
  with UMI's) converted with ``--frames keep`` (raw arrays), ``webp`` (lossless: the decoded
  pixels exactly) and ``jpeg``: wall seconds, frames per second and the dataset's size on disk.

Usage::

    python benchmarks/replay_buffer_bench.py [--frames 600] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZE = 224


def photo_frames(count: int) -> np.ndarray:
    """``count`` 224x224 crops panning over matplotlib's sample photograph."""
    import matplotlib
    from PIL import Image

    path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    photo = np.asarray(Image.open(path).convert("RGB"))
    h, w = photo.shape[:2]
    out = np.empty((count, SIZE, SIZE, 3), np.uint8)
    for i in range(count):
        y, x = (i // (w - SIZE)) % (h - SIZE), i % (w - SIZE)
        out[i] = photo[y : y + SIZE, x : x + SIZE]
    return out


def jxl_encode(frame: np.ndarray) -> bytes:
    """UMI's ``JpegXl(level=99, numthreads=1).encode`` (its numcodecs codec's call)."""
    import imagecodecs

    return bytes(
        imagecodecs.jpegxl_encode(
            frame, level=99, effort=None, distance=None, lossless=False, decodingspeed=None,
            photometric=None, planar=None, usecontainer=None, numthreads=1,
        )
    )  # fmt: skip


def best_rate(work: list[bytes], decode: object, repeats: int) -> float:
    """Frames decoded per second on one thread, the best of ``repeats`` passes."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for data in work:
            decode(data)  # type: ignore[operator]
        best = max(best, len(work) / (time.perf_counter() - start))
    return best


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def codec_rows(frames: np.ndarray, repeats: int) -> list[str]:
    """One row per codec: JPEG-XL of the photo crops as UMI writes them (PSNR against the
    crops), then each cache codec fed the JPEG-XL-decoded frames, as a conversion feeds it (PSNR
    against those: what transcoding loses)."""
    import imagecodecs

    from rlds_cli.frames.codecs import decode, encode, frame_format

    rows = []
    raw = frames[0].nbytes
    jxl = [jxl_encode(f) for f in frames]
    decoded = np.stack([imagecodecs.jpegxl_decode(d) for d in jxl])
    out = np.empty_like(frames[0])
    rate = best_rate(jxl, lambda d: imagecodecs.jpegxl_decode(d, numthreads=1, out=out), repeats)
    size = statistics.mean(map(len, jxl))
    rows.append(
        f"| JPEG-XL as UMI writes it (imagecodecs) | {size:,.0f} | {raw / size:.1f}x | "
        f"{psnr(decoded, frames):.1f} dB (vs the camera) | {rate:,.0f} |"
    )
    for codec in ("jpeg", "webp", "png"):
        fmt = frame_format(frames.shape[1:], np.uint8, codec)
        assert fmt is not None
        data = [encode(f, fmt) for f in decoded]
        again = np.stack([decode(d, fmt) for d in data])
        rate = best_rate(data, lambda d, fmt=fmt: decode(d, fmt), repeats)
        size = statistics.mean(map(len, data))
        label = {"jpeg": "jpeg q93", "webp": "webp lossless", "png": "png"}[codec]
        quality = psnr(again, decoded)
        shown = "exact" if quality == float("inf") else f"{quality:.1f} dB"
        rows.append(
            f"| {label} (cache), from the decoded JPEG-XL | {size:,.0f} | {raw / size:.1f}x | {shown} | "
            f"{rate:,.0f} |"
        )
    return rows


def write_umi_zip(path: Path, frames: np.ndarray, episode: int = 200) -> None:
    """A UMI-layout ``.zarr.zip``: ``camera0_rgb``/``camera1_rgb`` one JPEG-XL frame a chunk,
    ``robot0_*`` low-dim arrays, ``meta/episode_ends``."""
    import imagecodecs.numcodecs
    import zarr
    from zarr.storage import ZipStore

    imagecodecs.numcodecs.register_codecs(verbose=False)
    n = len(frames)
    ends = np.arange(episode, n + episode, episode).clip(max=n)
    rng = np.random.default_rng(0)
    with ZipStore(path, mode="w") as store:
        root = zarr.open_group(store, mode="w", zarr_format=2)
        root.create_array("meta/episode_ends", data=ends.astype(np.int64), compressors=None)
        for key, width in (("eef_pos", 3), ("eef_rot_axis_angle", 3), ("gripper_width", 1)):
            root.create_array(f"data/robot0_{key}", data=rng.normal(size=(n, width)).astype(np.float32))
        # UMI's JpegXl(level=99, numthreads=1) encodes with lossless=False; imagecodecs' own
        # numcodecs class defaults to lossless, so it is said here
        codec = imagecodecs.numcodecs.Jpegxl(level=99, lossless=False, numthreads=1)
        for cam in range(2):
            array = root.create_array(
                f"data/camera{cam}_rgb", shape=frames.shape, chunks=(1, SIZE, SIZE, 3), dtype=np.uint8,
                compressors=codec,
            )  # fmt: skip
            array[:] = frames if cam == 0 else frames[::-1]


def conversion_rows(frames: np.ndarray, repeats: int, work: Path) -> list[str]:
    from rlds_cli.cache import CacheRoot
    from rlds_cli.sources.convert import convert

    source = work / "umi.zarr.zip"
    write_umi_zip(source, frames)
    rows = [f"source: {len(frames)} steps x 2 cameras, {source.stat().st_size / 2**20:.1f} MiB (JPEG-XL)"]
    for mode in ("keep", "webp", "jpeg"):
        times = []
        for i in range(repeats):
            root = CacheRoot(work / f"cache-{mode}-{i}")
            start = time.perf_counter()
            result = convert(source, "umi", root=root, frames=mode)
            times.append(time.perf_counter() - start)
            disk = sum(p.stat().st_size for p in result.path.rglob("*") if p.is_file())
            shutil.rmtree(root.path)
        best = min(times)
        rows.append(
            f"| `--frames {mode}` | {best:.2f} | {2 * len(frames) / best:,.0f} | {disk / 2**20:.1f} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=600)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    os.environ["RLDS_FSYNC"] = "0"
    frames = photo_frames(a.frames)
    print("| codec | bytes a frame | vs raw | fidelity | decodes a second, 1 thread |")
    print("|---|---|---|---|---|")
    print("\n".join(codec_rows(frames, a.repeats)))
    work = Path(tempfile.mkdtemp(prefix="rlds-replay-bench-"))
    try:
        head, *rows = conversion_rows(frames, a.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{head}\n")
    print("| conversion | best s | camera frames a second | dataset MiB |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
