"""RLDS / Open X-Embodiment TFRecord conversion: frames and decoded MB per second, and peak memory.

Writes an OXE-shaped dataset with the test suite's writer (``tests/rlds_tfrecord_fixtures.py``:
a PNG camera of random noise, the worst case for PNG, and a JPEG wrist camera, 8-d state, 7-d
action, a 512-d language embedding; episodes of 100 steps over 4 shards), then measures the
reader alone (decode and pack, no cache writes) and a whole conversion in a fresh process
(``rlds_cli.convert.convert``, memmap backend, fsync on) with 1 and 2 worker processes: wall
time, frames per second, MB per second of decoded frames, and the peak RSS (``VmHWM``).

    .venv/bin/python benchmarks/rlds_tfrecord_bench.py [--steps 3000] [--side 128] [--workers 1 2]

Needs the ``rlds`` extra (crc32c, pillow) and, to write the source, the ``tfrecord`` package
(the ``test`` extra). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import convert_in_child, read_seconds

EPISODE = 100


def main() -> None:
    from tests.rlds_tfrecord_fixtures import write_rlds_dataset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--side", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        t = time.perf_counter()
        fx = write_rlds_dataset(src, [EPISODE] * (args.steps // EPISODE), side=args.side, shards=4)
        written = time.perf_counter() - t
        steps = sum(ep.steps for ep in fx.episodes)
        frames = 2 * steps
        frame_mb = frames * args.side * args.side * 3 / 1e6
        shard_mb = sum(p.stat().st_size for p in fx.shards) / 1e6
        print(
            f"source: {steps:,} steps, {frames:,} frames of {args.side}x{args.side}x3 ({frame_mb:,.0f} MB "
            f"decoded), {shard_mb:,.0f} MB of shards, written in {written:.1f} s\n"
        )
        print(
            "| workers | reader s | reader frames/s | reader MB/s "
            "| convert s | frames/s | MB/s | peak RSS MB |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for workers in args.workers:
            from rlds_cli.formats.rlds_tfrecord.reader import RldsTFRecordReader

            seconds, _ = read_seconds(RldsTFRecordReader, src, workers=workers)
            run = convert_in_child(src, Path(tmp) / f"home-{workers}", {"workers": workers})
            print(
                f"| {workers} | {seconds:.2f} | {frames / seconds:,.0f} | {frame_mb / seconds:,.0f} | "
                f"{run['seconds']:.2f} | {frames / run['seconds']:,.0f} | {frame_mb / run['seconds']:,.0f} | "
                f"{run['peak_kb'] / 1024:,.0f} |"
            )


if __name__ == "__main__":
    main()
