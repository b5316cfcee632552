"""LeRobot conversion: frames per second and peak memory as the video grows.

Writes synthetic LeRobot v3.0 trees (one 128x128 AV1 camera encoded with PyAV's libsvtav1, as
lerobot does; 6-d state and action; fps 30) of two sizes, then converts each in a fresh process
(``rlds_cli.convert.convert``, memmap backend) and reports its wall time and peak RSS
(``VmHWM``), and the reader alone (decode + parquet, no cache writes) in frames per second. The
peak RSS should not grow with the video: frames are decoded one at a time into ~8 MB blocks.

    .venv/bin/python benchmarks/lerobot_bench.py [--frames 2000 8000] [--side 128]

Needs the ``lerobot`` extra (pyarrow, av). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
from _harness import convert_in_child, read_seconds

FPS = 30
EPISODE = 200


def write_tree(root: Path, frames: int, side: int) -> int:
    """A LeRobot v3.0 tree of ``frames`` frames in episodes of :data:`EPISODE`; mp4 bytes."""
    import av
    import pyarrow as pa
    import pyarrow.parquet as pq

    episodes = frames // EPISODE
    n = episodes * EPISODE
    video = root / "videos/observation.image/chunk-000/file-000.mp4"
    for folder in ("meta/episodes/chunk-000", "data/chunk-000", video.parent):
        (root / folder).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def fixed(a: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])

    ep, fi = np.repeat(np.arange(episodes), EPISODE), np.tile(np.arange(EPISODE), episodes)
    data = {
        "observation.state": fixed(rng.standard_normal((n, 6)).astype(np.float32)),
        "action": fixed(rng.standard_normal((n, 6)).astype(np.float32)),
        "next.reward": pa.array(np.zeros(n, np.float32)),
        "next.done": pa.array(fi == EPISODE - 1),
        "timestamp": pa.array((fi / FPS).astype(np.float32)),
        "frame_index": pa.array(fi),
        "episode_index": pa.array(ep),
        "index": pa.array(np.arange(n)),
        "task_index": pa.array(np.zeros(n, np.int64)),
    }
    pq.write_table(pa.table(data), root / "data/chunk-000/file-000.parquet")
    with av.open(str(video), "w") as out:
        stream = out.add_stream("libsvtav1", rate=FPS)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        yy, xx = np.mgrid[0:side, 0:side]
        for i in range(n):  # moving gradients: compressible, but every frame differs
            img = np.stack([(xx + i) % 256, (yy + 2 * i) % 256, ((xx + yy) // 2 + 3 * i) % 256], -1)
            frame = av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, FPS)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    span = np.arange(episodes + 1) * EPISODE / FPS
    col = "videos/observation.image/"
    zeros = np.zeros(episodes, np.int64)
    table = {
        "episode_index": np.arange(episodes),
        "tasks": [["move"]] * episodes,
        "length": np.full(episodes, EPISODE),
        "data/chunk_index": zeros,
        "data/file_index": zeros,
        "dataset_from_index": np.arange(episodes) * EPISODE,
        "dataset_to_index": np.arange(1, episodes + 1) * EPISODE,
        col + "chunk_index": zeros,
        col + "file_index": zeros,
        col + "from_timestamp": span[:-1],
        col + "to_timestamp": span[1:],
    }
    pq.write_table(pa.table(table), root / "meta/episodes/chunk-000/file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["move"]}), root / "meta/tasks.parquet")

    def feat(dtype: str, shape: list[int], names: list[str] | None = None) -> dict[str, object]:
        return {"dtype": dtype, "shape": shape, "names": names}

    info = {
        "codebase_version": "v3.0",
        "robot_type": "sim",
        "total_episodes": episodes,
        "total_frames": n,
        "total_tasks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {
            "observation.state": feat("float32", [6]),
            "observation.image": feat("video", [side, side, 3], ["height", "width", "channels"]),
            "action": feat("float32", [6]),
            "next.reward": feat("float32", [1]),
            "next.done": feat("bool", [1]),
            "timestamp": feat("float32", [1]),
            "frame_index": feat("int64", [1]),
            "episode_index": feat("int64", [1]),
            "index": feat("int64", [1]),
            "task_index": feat("int64", [1]),
        },
    }
    (root / "meta/info.json").write_text(json.dumps(info))
    return video.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--side", type=int, default=128)
    args = parser.parse_args()
    side = f"{args.side}x{args.side}"
    print(f"| frames ({side}) | mp4 KB | reader frames/s | convert s | frames/s | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for frames in args.frames:
            src = Path(tmp) / f"src-{frames}"
            size = write_tree(src, frames, args.side)
            from rlds_cli.formats.lerobot.reader import LeRobotReader

            seconds, rows = read_seconds(LeRobotReader, src, 3)
            rate = rows / seconds
            run = convert_in_child(src, Path(tmp) / f"home-{frames}")
            n = frames // EPISODE * EPISODE
            print(
                f"| {n:,} | {size / 1024:,.0f} | {rate:,.0f} | {run['seconds']:.2f} | "
                f"{n / run['seconds']:,.0f} | {run['peak_kb'] / 1024:,.0f} |"
            )


if __name__ == "__main__":
    main()
