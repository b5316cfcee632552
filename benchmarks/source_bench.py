"""Source readers: how fast each pixel source converts, and its peak memory as the source grows.

For each source it writes synthetic data in the upstream layout (the test suite's writers in
``tests/*_fixtures.py``, or this file's), then measures, each in a fresh process, the reader alone
(``blocks()`` of the format's reader: decode and pack, no cache writes; best of ``--repeats``
passes) and a whole conversion (``rlds_cli.sources.convert.convert``, memmap backend, fsync on, source
hashing and content digests included): seconds, frames and MB of decoded frames per second, and
the peak RSS (``VmHWM``), which should not grow with the source (every reader streams its blocks).

* ``lerobot``: LeRobot v3.0 trees, one AV1 camera encoded with PyAV's libsvtav1 as lerobot does
  (moving gradients: compressible, but every frame differs), 6-d state and action, fps 30;
  sizes in frames. Needs the ``lerobot`` extra (pyarrow, av).
* ``rlds_tfrecord``: an OXE-shaped dataset (``tests/rlds_tfrecord_fixtures.py``: a PNG camera of
  random noise, PNG's worst case, and a JPEG wrist camera; episodes of 100 steps over 4 shards),
  read and converted with 1 and 2 worker processes (``--workers``); sizes in steps. Needs the
  ``rlds`` extra and ``tfrecord``.
* ``vd4rl``: a folder of Dreamer ``.npz`` episodes (64x64x3, 501 rows each) and a drqbc
  ``data.hdf5`` shard of half as many (3x84x84, gzip, as V-D4RL's ``npz_to_hdf5.py`` writes it);
  frames of 5-bit noise (deflate gains about 1.5x, so inflating them costs about what real DMC
  frames cost); sizes in episodes.
* ``atari_dqn``: a logged run as batch_rl writes it (Dopamine's buffer, gzip'd ``np.save`` at level
  9) of game-like 84x84 frames (gzip ratio about 40), checkpoints 0 and 1; the reader for
  checkpoint 0, for 1 and for both (1 continues 0, so its oldest row, at the end of its files, is
  needed first: two passes over checkpoint 1), the conversion of both; sizes in rows a checkpoint
  (a real checkpoint is 1,000,000 rows, 7.06 GB of frames).
* ``gen_dgrl``: Procgen ``<game>.tar.xz`` archives (float32 64x64 CHW frames as gen_dgrl's collector
  stores them; a scrolling noise texture, or flat backgrounds with ``--flat``; episodes of 500
  steps, ``.npz`` and pickled ``.npy`` members alternating); sizes in frames. The reader's MB count
  the float32 frames it decodes, the conversion's the uint8 frames it writes.

Usage::

    python benchmarks/source_bench.py [--source lerobot ...] [--sizes N ...] [--quick]

Prints a Markdown table per source.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import _harness
import numpy as np

sys.path.insert(0, str(_harness.REPO))  # tests/*_fixtures.py write the sources

#: The child: ``passes`` of ``convert`` of the source, or of ``blocks()`` of the reader class
#: ``module:Class``; prints its best seconds, the rows it read and its peak RSS (``VmHWM``).
_CHILD = """
import importlib, json, sys, time
what, src, home, options, passes = sys.argv[1:4] + [json.loads(sys.argv[4]), int(sys.argv[5])]
best, rows = float("inf"), 0
for _ in range(passes):
    t = time.perf_counter()
    if what == "convert":
        from rlds_cli.sources.convert import convert
        convert(src, "bench", root=home, backend="memmap", options=options)
    else:
        module, name = what.split(":")
        with getattr(importlib.import_module(module), name)(src, **options) as reader:
            steps = sum(block.num_steps for block in reader.blocks())
            rows = reader.report.source_rows or steps
    best = min(best, time.perf_counter() - t)
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": best, "rows": rows, "peak_kb": peak}))
"""


@dataclass
class Case:
    """One source written for a run, the reader's options for it and what the table says of it."""

    label: str
    path: Path
    decoded: float  # bytes of the frames the reader decodes
    on_disk: float
    options: dict[str, Any] = field(default_factory=dict)
    convert: bool = True
    cameras: int = 1  # frames a source row holds
    written: float = 0.0  # bytes of the frames a conversion writes, when not ``decoded``


def measure(what: str, case: Case, home: Path, passes: int, env: dict[str, str]) -> dict[str, float]:
    """One measurement in a fresh interpreter."""
    path = os.pathsep.join(filter(None, [str(_harness.REPO), os.environ.get("PYTHONPATH")]))
    args = [
        sys.executable,
        "-c",
        _CHILD,
        what,
        str(case.path),
        str(home),
        json.dumps(case.options),
        str(passes),
    ]
    out = subprocess.run(
        args, capture_output=True, text=True, cwd=_harness.REPO, env={**os.environ, "PYTHONPATH": path, **env}
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return dict(json.loads(out.stdout.splitlines()[-1]))


# ----------------------------------------------------------------------------- the sources


def write_lerobot(tmp: Path, frames: int, args: argparse.Namespace) -> list[Case]:
    """A LeRobot v3.0 tree of ``frames`` frames in episodes of 200, one camera of ``--side``."""
    import av
    import pyarrow as pa
    import pyarrow.parquet as pq

    fps, length, side = 30, 200, args.side
    episodes = frames // length
    n = episodes * length
    root = tmp / f"lerobot-{frames}"
    video = root / "videos/observation.image/chunk-000/file-000.mp4"
    for folder in ("meta/episodes/chunk-000", "data/chunk-000", video.parent):
        (root / folder).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def fixed(a: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])

    ep, fi = np.repeat(np.arange(episodes), length), np.tile(np.arange(length), episodes)
    data = {
        "observation.state": fixed(rng.standard_normal((n, 6)).astype(np.float32)),
        "action": fixed(rng.standard_normal((n, 6)).astype(np.float32)),
        "next.reward": pa.array(np.zeros(n, np.float32)),
        "next.done": pa.array(fi == length - 1),
        "timestamp": pa.array((fi / fps).astype(np.float32)),
        "frame_index": pa.array(fi),
        "episode_index": pa.array(ep),
        "index": pa.array(np.arange(n)),
        "task_index": pa.array(np.zeros(n, np.int64)),
    }
    pq.write_table(pa.table(data), root / "data/chunk-000/file-000.parquet")
    with av.open(str(video), "w") as out:
        stream = out.add_stream("libsvtav1", rate=fps)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        yy, xx = np.mgrid[0:side, 0:side]
        for i in range(n):
            img = np.stack([(xx + i) % 256, (yy + 2 * i) % 256, ((xx + yy) // 2 + 3 * i) % 256], -1)
            frame = av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    span = np.arange(episodes + 1) * length / fps
    col = "videos/observation.image/"
    zeros = np.zeros(episodes, np.int64)
    table = {
        "episode_index": np.arange(episodes),
        "tasks": [["move"]] * episodes,
        "length": np.full(episodes, length),
        "data/chunk_index": zeros,
        "data/file_index": zeros,
        "dataset_from_index": np.arange(episodes) * length,
        "dataset_to_index": np.arange(1, episodes + 1) * length,
        col + "chunk_index": zeros,
        col + "file_index": zeros,
        col + "from_timestamp": span[:-1],
        col + "to_timestamp": span[1:],
    }
    pq.write_table(pa.table(table), root / "meta/episodes/chunk-000/file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["move"]}), root / "meta/tasks.parquet")
    scalars = {"next.reward": "float32", "next.done": "bool", "timestamp": "float32"}
    scalars |= dict.fromkeys(("frame_index", "episode_index", "index", "task_index"), "int64")
    features: dict[str, Any] = {
        key: {"dtype": dtype, "shape": [1], "names": None} for key, dtype in scalars.items()
    }
    features |= {
        key: {"dtype": "float32", "shape": [6], "names": None} for key in ("observation.state", "action")
    }
    features["observation.image"] = {
        "dtype": "video",
        "shape": [side, side, 3],
        "names": ["height", "width", "channels"],
    }
    info = {
        "codebase_version": "v3.0",
        "robot_type": "sim",
        "total_episodes": episodes,
        "total_frames": n,
        "total_tasks": 1,
        "chunks_size": 1000,
        "fps": fps,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features,
    }
    (root / "meta/info.json").write_text(json.dumps(info))
    return [Case(f"{n:,} frames {side}x{side}", root, n * side * side * 3, video.stat().st_size)]


def write_rlds_tfrecord(tmp: Path, steps: int, args: argparse.Namespace) -> list[Case]:
    """An OXE-shaped dataset of ``steps`` steps, two cameras of ``--side``."""
    from tests.rlds_tfrecord_fixtures import write_rlds_dataset

    fx = write_rlds_dataset(tmp / f"oxe-{steps}", [100] * (steps // 100), side=args.side, shards=4)
    frames = 2 * sum(ep.steps for ep in fx.episodes)
    decoded, on_disk = frames * args.side**2 * 3, sum(p.stat().st_size for p in fx.shards)
    label = f"{frames // 2:,} steps {args.side}x{args.side}"
    return [
        Case(f"{label}, {w} worker{'s' * (w > 1)}", fx.root, decoded, on_disk, {"workers": w}, cameras=2)
        for w in args.workers
    ]


def _noise_episode(index: int, side: int) -> dict[str, np.ndarray]:
    from tests.vd4rl_fixtures import dreamer_episode

    episode = dreamer_episode(501, side=side, seed=index, frames="zeros")
    episode["image"] = np.random.default_rng(index).integers(0, 32, episode["image"].shape, dtype=np.uint8)
    return episode


def write_vd4rl(tmp: Path, episodes: int, args: argparse.Namespace) -> list[Case]:
    """``episodes`` Dreamer ``.npz`` episodes of 64x64x3, and a drqbc shard of half as many of
    3x84x84 written 5 episodes at a time (so this script's own memory stays small)."""
    import h5py

    from tests.vd4rl_fixtures import dreamer_name, drqbc_arrays, save_episode

    folder, shard = tmp / f"npz-{episodes}", tmp / f"hdf5-{episodes}" / "data.hdf5"
    for i in range(episodes):
        save_episode(folder / dreamer_name(i, 501), _noise_episode(i, 64))
    shard.parent.mkdir(parents=True)
    with h5py.File(shard, "w") as f:
        for first in range(0, episodes // 2, 5):
            arrays = drqbc_arrays(
                [_noise_episode(i, 84) for i in range(first, min(first + 5, episodes // 2))]
            )
            for key, value in arrays.items():
                if key not in f:
                    f.create_dataset(
                        key,
                        (0, *value.shape[1:]),
                        value.dtype,
                        maxshape=(None, *value.shape[1:]),
                        compression="gzip",
                    )
                f[key].resize(f[key].shape[0] + len(value), axis=0)
                f[key][-len(value) :] = value
    npz_rows, hdf5_rows = episodes * 501, episodes // 2 * 501
    return [
        Case(
            "Dreamer .npz, 64x64x3",
            folder,
            npz_rows * 64 * 64 * 3,
            sum(p.stat().st_size for p in folder.iterdir()),
        ),
        Case("drqbc .hdf5, 3x84x84", shard, hdf5_rows * 84 * 84 * 3, shard.stat().st_size),
    ]


def sprite_frame(step: int, shape: tuple[int, ...]) -> np.ndarray:
    """A game-like frame (gzip ratio about 40, below a static game's): a textured background, a
    band scrolling one row per frame, eight sprites that jump every 4 frames, a paddle and a
    score strip."""
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    frame = (((xx // 7 + yy // 5) % 3) * 23 + 61).astype(np.uint8)
    band = np.sin((yy[20:70] + step) / 3.0) * 20 + np.cos(xx[20:70] / 5.0) * 15 + 100
    frame[20:70] = band.astype(np.uint8)
    rng = np.random.default_rng(step // 4)
    for k in range(8):
        x, y = int(rng.integers(0, 78)), int(rng.integers(20, 66))
        frame[y : y + 4, x : x + 6] = 180 + 9 * k
    p = int(36 + 30 * np.sin(step / 17))
    frame[p : p + 12, 4:7] = 200
    frame[0:8, 30:54] = (step // 300) % 200 + 20
    return frame


def write_atari_dqn(tmp: Path, rows: int, args: argparse.Namespace) -> list[Case]:
    """A run whose buffer of ``rows`` rows logged checkpoints 0 and 1 (about 2.2 x ``rows`` adds)."""
    from tests.atari_dqn_fixtures import write_run

    logs = tmp / f"Pong-{rows}" / "1" / "replay_logs"
    # episodes of 400-2,500 steps for 60,000 rows (the same share of a checkpoint at any size)
    lengths = np.random.default_rng(0).integers(rows // 150, rows // 24, size=240).tolist()
    lengths = lengths[: int(np.searchsorted(np.cumsum(np.array(lengths) + 3), 2.2 * rows))]
    run = write_run(logs, capacity=rows, episode_lengths=lengths, frame=sprite_frame, final_buffer=False)
    assert run.checkpoints == [0, 1], run.checkpoints
    on_disk = sum(p.stat().st_size for p in logs.glob("$store$_observation_ckpt.*.gz"))
    cases = [("checkpoint 0", [0], False), ("checkpoint 1", [1], False), ("checkpoints 0 + 1", [0, 1], True)]
    return [
        Case(label, logs.parent, len(cks) * rows * 84 * 84, on_disk, {"checkpoints": cks}, convert)
        for label, cks, convert in cases
    ]


def write_gen_dgrl(tmp: Path, frames: int, args: argparse.Namespace) -> list[Case]:
    """An archive of about ``frames`` steps in episodes of 500."""
    from tests.gen_dgrl_fixtures import gen_dgrl_archive

    path = tmp / f"bigfish-{frames}.tar.xz"
    episodes = max(frames // 500, 1)
    _, trajectories = gen_dgrl_archive(path, episodes=episodes, steps=500, textured=not args.flat, preset=1)
    steps = sum(t.steps for t in trajectories)
    decoded = sum(t.arrays["observations"].nbytes for t in trajectories)
    kind = "flat backgrounds" if args.flat else "noise texture"
    return [
        Case(
            f"{steps:,} frames 3x64x64, {kind}",
            path,
            decoded,
            path.stat().st_size,
            written=steps * 3 * 64 * 64,
        )
    ]


@dataclass(frozen=True)
class Source:
    """A source kind: its reader, how to write one of a size, its default and quick sizes."""

    reader: str
    write: Callable[[Path, int, argparse.Namespace], list[Case]]
    sizes: tuple[int, ...]
    quick: tuple[int, ...]
    env: dict[str, str] = field(default_factory=dict)


SOURCES = {
    "lerobot": Source("rlds_cli.formats.lerobot.reader:LeRobotReader", write_lerobot, (2000, 8000), (400,)),
    "rlds_tfrecord": Source(
        "rlds_cli.formats.rlds_tfrecord.reader:RldsTFRecordReader", write_rlds_tfrecord, (3000,), (200,)
    ),
    "vd4rl": Source("rlds_cli.formats.vd4rl:VD4RLReader", write_vd4rl, (60,), (4,)),
    # the sprite frames compress 40-fold, past the reader's guard against decompression bombs
    "atari_dqn": Source(
        "rlds_cli.formats.atari_dqn.reader:AtariDQNReader",
        write_atari_dqn,
        (60_000,),
        (5_000,),
        {"RLDS_SOURCE_MAX_RATIO": "1000"},
    ),
    "gen_dgrl": Source("rlds_cli.formats.gen_dgrl:GenDGRLReader", write_gen_dgrl, (5000, 20000), (1000,)),
}


def run_source(name: str, args: argparse.Namespace) -> list[str]:
    """Write each size of source ``name``, measure its cases; the table."""
    source = SOURCES[name]
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"source-bench-{name}-") as tmp:
        for size in args.sizes or (source.quick if args.quick else source.sizes):
            for i, case in enumerate(source.write(Path(tmp), size, args)):
                read = measure(source.reader, case, Path(tmp) / "home", args.repeats, source.env)
                frames = read["rows"] * case.cameras
                cells = [case.label, f"{frames:,}", f"{case.decoded / 1e6:,.0f} ({case.on_disk / 1e6:,.1f})"]
                cells += [f"{read['seconds']:.2f}", f"{frames / read['seconds']:,.0f}"]
                cells.append(f"{case.decoded / 1e6 / read['seconds']:,.0f}")
                peak = f"{read['peak_kb'] / 1024:,.0f} / "
                if case.convert:
                    conv = measure("convert", case, Path(tmp) / f"home-{size}-{i}", 1, source.env)
                    written = (case.written or case.decoded) / 1e6
                    cells += [f"{conv['seconds']:.2f}", f"{frames / conv['seconds']:,.0f}"]
                    cells += [f"{written / conv['seconds']:,.0f}", peak + f"{conv['peak_kb'] / 1024:,.0f}"]
                else:
                    cells += ["-", "-", "-", peak + "-"]
                rows.append(cells)
    head = ["case", "frames", "decoded MB (on disk)", "reader s", "reader frames/s", "reader MB/s"]
    head += ["convert s", "convert frames/s", "convert MB/s", "peak RSS MB: reader / convert"]
    return [f"### {name}", "", *_harness.table(head, rows), ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", nargs="+", choices=list(SOURCES), default=list(SOURCES), help="(default: all)")
    p.add_argument("--sizes", type=int, nargs="+", help="sizes of each source (default: the source's own)")
    p.add_argument("--quick", action="store_true", help="one small size of each source (a smoke test)")
    p.add_argument("--repeats", type=int, default=2, help="passes of the reader alone (best kept)")
    p.add_argument("--side", type=int, default=128, help="LeRobot and TFRecord frame side")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="TFRecord reader processes")
    p.add_argument("--flat", action="store_true", help="Gen-DGRL: flat backgrounds (xz packs them ~600-fold)")
    args = p.parse_args(argv)
    if args.quick:
        args.side, args.repeats = min(args.side, 64), 1
    for name in args.source:
        print("\n".join(run_source(name, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
