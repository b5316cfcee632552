"""Atari DQN replay logs: conversion rate (frames/s, MB/s of decoded frames) and peak memory.

Writes a logged run the way batch_rl does (``tests/atari_dqn_fixtures.write_run``: Dopamine's
buffer, zero padding, gzip'd ``np.save`` at gzip's default level 9) with 84x84 uint8 game-like
frames (:func:`sprite_frame`), then measures, each in a fresh process:

* ``reader``: the reader alone (inflate, rotate, decide, pack; no cache writes), for checkpoint 1
  alone (its head is not continued: one pass over its files) and for checkpoints 0 and 1 together
  (checkpoint 1 continues 0, so its oldest row, at the end of its files, is needed first: two
  passes over checkpoint 1);
* ``convert``: ``rlds_cli.convert.convert`` of both checkpoints (memmap backend; hashing the
  source files and the content digest included).

Peak RSS is the child's ``VmHWM``. A real checkpoint is 1,000,000 rows (7.06 GB of frames).

    .venv/bin/python benchmarks/atari_dqn_bench.py [--rows 60000]

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.atari_dqn_fixtures import write_run  # noqa: E402

FRAME = (84, 84)


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


_CHILD = """
import json, sys, time
mode, src, home, checkpoints = sys.argv[1:5]
checkpoints = [int(c) for c in checkpoints.split(",")]
t = time.perf_counter()
if mode == "reader":
    from rlds_cli.formats.atari_dqn.reader import AtariDQNReader
    with AtariDQNReader(src, checkpoints=checkpoints) as reader:
        steps = sum(block.num_steps for block in reader.blocks())
        rows = reader.report.source_rows
else:
    from rlds_cli.convert import convert
    m = convert(src, "bench", root=home, backend="memmap", options={"checkpoints": checkpoints}).manifest
    steps, rows = m.num_steps, m.conversion["source_rows"]
seconds = time.perf_counter() - t
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "peak_kb": peak, "steps": steps, "rows": rows}))
"""


def child(mode: str, src: Path, home: Path, checkpoints: str) -> dict[str, float]:
    """One measurement in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(src), str(home), checkpoints],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"RLDS_SOURCE_MAX_RATIO": "1000", "PATH": ""},
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000, help="buffer capacity (rows per checkpoint)")
    args = parser.parse_args()
    frame_mb = np.prod(FRAME) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "Pong" / "1" / "replay_logs"
        t = time.perf_counter()
        lengths = np.random.default_rng(0).integers(400, 2500, size=4 * args.rows // 1000).tolist()
        # episodes up to about 2.2 x capacity of adds: checkpoints 0 and 1 are logged
        lengths = lengths[: int(np.searchsorted(np.cumsum(np.array(lengths) + 3), 2.2 * args.rows))]
        run = write_run(
            logs, capacity=args.rows, episode_lengths=lengths, frame=sprite_frame, final_buffer=False
        )
        assert run.checkpoints == [0, 1], run.checkpoints
        wrote = time.perf_counter() - t
        gz = sum(p.stat().st_size for p in logs.glob("$store$_observation_ckpt.*.gz"))
        decoded = len(run.checkpoints) * args.rows * frame_mb
        print(
            f"source: {len(run.checkpoints)} checkpoints of {args.rows:,} rows, {decoded:,.0f} MB of frames "
            f"in {gz / 1e6:,.1f} MB of gzip (ratio {decoded * 1e6 / gz:.0f}), written in {wrote:.0f} s\n"
        )
        print("| what | checkpoints | passes | rows | s | frames/s | MB/s decoded | peak RSS MB |")
        print("|---|---|---|---|---|---|---|---|")
        cases = [
            ("reader", "0", "1"),
            ("reader", "1", "1"),
            ("reader", "0,1", "1 + 2"),
            ("convert", "0,1", "1 + 2"),
        ]
        for k, (mode, checkpoints, passes) in enumerate(cases):
            r = child(mode, logs.parent, Path(tmp) / f"home-{k}", checkpoints)
            rate = r["rows"] / r["seconds"]
            print(
                f"| {mode} | {checkpoints} | {passes} | {int(r['rows']):,} | {r['seconds']:.2f} | "
                f"{rate:,.0f} | {rate * frame_mb:,.0f} | {r['peak_kb'] / 1024:,.0f} |"
            )


if __name__ == "__main__":
    main()
