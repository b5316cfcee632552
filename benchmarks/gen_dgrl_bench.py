"""Gen-DGRL conversion: frames per second, MB/s and peak memory as the archive grows.

Writes synthetic Procgen ``<game>.tar.xz`` archives (:mod:`tests.gen_dgrl_fixtures`: 64x64 CHW
frames stored as float32 as gen_dgrl's collector stores them, a noise texture scrolling one pixel
a step with moving blocks on top, or flat backgrounds with ``--flat``; episodes of ``--steps``
steps, ``.npz`` and pickled ``.npy`` members alternating), then measures the reader alone (tar
stream + xz + unpickling / npz inflating + the uint8 cast, no cache writes) and a whole
conversion in a fresh process
(``rlds_cli.convert.convert``, memmap backend, fsync on) with its peak RSS (``VmHWM``). Memory
should not grow with the archive: members are read one at a time.

    .venv/bin/python benchmarks/gen_dgrl_bench.py [--frames 5000 20000] [--steps 500]

Prints a Markdown table. "source MB" is the decoded size of the members' frames (float32);
"frames MB/s" counts the uint8 frames written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _harness import convert_in_child, read_seconds  # noqa: E402 (fresh-process conversion; reader passes)

FRAME_BYTES = 3 * 64 * 64  # one uint8 frame


def write_archive(path: Path, frames: int, steps: int, textured: bool) -> tuple[int, int]:
    """An archive of about ``frames`` steps; (steps written, float32 frame bytes decoded)."""
    from tests.gen_dgrl_fixtures import gen_dgrl_archive

    episodes = max(frames // steps, 1)
    _, trajectories = gen_dgrl_archive(path, episodes=episodes, steps=steps, textured=textured, preset=1)
    written = sum(t.steps for t in trajectories)
    decoded = sum(t.arrays["observations"].nbytes for t in trajectories)
    return written, decoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--steps", type=int, default=500, help="steps per episode")
    parser.add_argument(
        "--flat", action="store_true", help="flat backgrounds (xz packs them ~600-fold) instead of textured"
    )
    args = parser.parse_args()
    print(
        "| frames (3x64x64) | source MB | tar.xz MB | reader frames/s | reader source MB/s | "
        "convert s | frames/s | frames MB/s | peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for frames in args.frames:
            src = Path(tmp) / f"bigfish-{frames}.tar.xz"
            steps, decoded = write_archive(src, frames, args.steps, textured=not args.flat)
            from rlds_cli.formats.gen_dgrl import GenDGRLReader

            seconds, rows = read_seconds(GenDGRLReader, src)
            assert rows == steps, (rows, steps)
            run = convert_in_child(src, Path(tmp) / f"home-{frames}")
            out_mb = steps * FRAME_BYTES / 1e6
            print(
                f"| {steps:,} | {decoded / 1e6:,.0f} | {src.stat().st_size / 1e6:,.1f} | "
                f"{steps / seconds:,.0f} | {decoded / 1e6 / seconds:,.0f} | {run['seconds']:.2f} | "
                f"{steps / run['seconds']:,.0f} | {out_mb / run['seconds']:,.1f} | "
                f"{run['peak_kb'] / 1024:,.0f} |"
            )


if __name__ == "__main__":
    main()
