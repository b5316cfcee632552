"""V-D4RL conversion: frames per second, decoded MB per second and peak memory, both layouts.

Writes a folder of Dreamer ``.npz`` episodes (64x64x3 HWC, 501 rows each, as DreamerV2 saves
them) and one drqbc ``data.hdf5`` (3x84x84 CHW, gzip, as V-D4RL's ``npz_to_hdf5.py`` writes it)
with :mod:`tests.vd4rl_fixtures`, then measures

* the reader alone (``VD4RLReader.blocks()``, no cache writes), best of ``--repeats``, and
* a whole conversion (``rlds_cli.convert.convert``, memmap backend, fsync on) in a fresh
  process, its wall time and peak RSS (``VmHWM``): it should not grow with the source, since
  the reader holds one block (about 8 MB of rows) at a time.

Frames are 5-bit noise (every byte differs, deflate gains about 1.5x), so inflating them costs
about what real DMC frames cost.

    .venv/bin/python benchmarks/vd4rl_bench.py [--npz-episodes 60] [--hdf5-episodes 30]

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _harness import convert_in_child, read_seconds  # noqa: E402 (fresh-process conversion; reader passes)

from tests.vd4rl_fixtures import (  # noqa: E402 - the repository root is put on the path first
    dreamer_episode,
    dreamer_name,
    drqbc_arrays,
    save_episode,
)

ROWS = 501


def _episode(index: int, side: int) -> dict[str, np.ndarray]:
    ep = dreamer_episode(ROWS, side=side, seed=index, frames="zeros")
    rng = np.random.default_rng(index)
    ep["image"] = rng.integers(0, 32, ep["image"].shape, dtype=np.uint8)
    return ep


def write_npz(folder: Path, episodes: int, side: int = 64) -> int:
    """``episodes`` Dreamer episode files; their decoded frame bytes."""
    for i in range(episodes):
        save_episode(folder / dreamer_name(i, ROWS), _episode(i, side))
    return episodes * ROWS * side * side * 3


def write_hdf5(path: Path, episodes: int, side: int = 84, per_write: int = 5) -> int:
    """One drqbc shard of ``episodes`` episodes, written ``per_write`` episodes at a time (so
    this script's own memory stays small); its decoded frame bytes."""
    import h5py

    first = drqbc_arrays([_episode(0, side)])
    with h5py.File(path, "w") as f:
        datasets = {
            k: f.create_dataset(
                k, (0, *v.shape[1:]), v.dtype, maxshape=(None, *v.shape[1:]), compression="gzip"
            )
            for k, v in first.items()
        }
        for a in range(0, episodes, per_write):
            arrays = drqbc_arrays([_episode(i, side) for i in range(a, min(a + per_write, episodes))])
            for k, v in arrays.items():
                d = datasets[k]
                d.resize(d.shape[0] + len(v), axis=0)
                d[-len(v) :] = v
    return episodes * ROWS * side * side * 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz-episodes", type=int, default=60)
    parser.add_argument("--hdf5-episodes", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        sources = []
        if args.npz_episodes:
            folder = base / "64px"
            sources.append(("Dreamer .npz, 64x64x3", folder, write_npz(folder, args.npz_episodes)))
        if args.hdf5_episodes:
            (base / "84px").mkdir()
            path = base / "84px" / "data.hdf5"
            sources.append(("drqbc .hdf5, 3x84x84", path, write_hdf5(path, args.hdf5_episodes)))
        for label, src, decoded in sources:
            on_disk = sum(p.stat().st_size for p in ([src] if src.is_file() else src.iterdir()))
            from rlds_cli.formats.vd4rl import VD4RLReader

            first_key = lambda b: len(next(iter(b.observations.values())))  # noqa: E731
            seconds, frames = read_seconds(VD4RLReader, src, args.repeats, first_key)
            child = convert_in_child(src, base / f"home-{len(rows)}")
            wall, peak_mb = child["seconds"], child["peak_kb"] / 1024
            rows.append(
                f"| {label} | {frames:,} | {decoded / 1e6:,.0f} MB ({on_disk / 1e6:,.0f} MB on disk) | "
                f"{frames / seconds:,.0f} | {decoded / 1e6 / seconds:,.0f} | "
                f"{wall:.1f} s ({frames / wall:,.0f}/s) | {peak_mb:,.0f} MB |"
            )
    print(
        "| source | frames | decoded frames | reader frames/s | reader MB/s | convert (frames/s) | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
