"""robomimic HDF5: rlds's conversion against robomimic's own load of the same file.

Writes a synthetic robomimic image dataset in the layout of robomimic's
``dataset_states_to_obs.py`` (``tests/fixtures/robomimic/make_fixtures.py``: an ``agentview_image``
camera of random bytes, two low-dim observations, ``next_obs``, states, filter keys), then times

* ``rlds``: ``rlds_cli.sources.convert.convert`` of the file into a fresh cache (memmap backend:
  source hashing, cache writes, fsync and content digests included), and
* ``robomimic``: ``SequenceDataset(hdf5_cache_mode="all")`` (robomimic 0.3.0) of the same file:
  what a robomimic training run does before its first batch (it loads every demo into memory and
  caches every item).

Both read the file from the page cache (one read first); each figure is the best of
``--repeats``. Needs robomimic (``make install-test`` installs 0.3.0 with ``--no-deps``).

Usage::

    python benchmarks/robomimic_bench.py [--demos 200] [--steps 150] [--size 84] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import _harness

sys.path.insert(0, str(_harness.REPO))  # the fixture writer


def _best(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def _observation_bytes(path: Path) -> int:
    """Bytes of every demo's ``obs`` arrays (what the cache stores of the observations)."""
    import h5py

    with h5py.File(path, "r") as f:
        return sum(node.nbytes for demo in f["data"].values() for node in demo["obs"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demos", type=int, default=200)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument(
        "--size", type=int, default=84, help="camera height and width (0: low-dim, no camera)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import robomimic.utils.obs_utils as ObsUtils
    from robomimic.utils.dataset import SequenceDataset

    from rlds_cli.sources.convert import convert
    from tests.fixtures.robomimic.make_fixtures import write_robomimic_image

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "image.hdf5"
        lengths = {i: args.steps for i in range(args.demos)}
        write_robomimic_image(path, lengths, size=args.size)
        path.read_bytes()  # into the page cache: both sides read it from there
        mb = path.stat().st_size / 1e6
        os.environ["RLDS_HOME"] = str(Path(tmp) / "home")

        def ours() -> None:
            convert(path, "bench", force=True)

        rgb = ["agentview_image"] if args.size else []
        obs_keys = [*rgb, "object", "robot0_eef_pos"]
        specs = {"obs": {"low_dim": ["object", "robot0_eef_pos"], "rgb": rgb}}

        def theirs() -> None:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):  # its tqdm bars
                ObsUtils.initialize_obs_utils_with_obs_specs(obs_modality_specs=specs)
                SequenceDataset(
                    hdf5_path=str(path),
                    obs_keys=obs_keys,
                    dataset_keys=("actions", "rewards", "dones"),
                    hdf5_cache_mode="all",
                )

        stored = _observation_bytes(path)
        block = os.urandom(1 << 20)

        def disk() -> None:  # the floor: the bytes the cache stores, written and synced
            out = Path(tmp) / "floor.bin"
            with open(out, "wb") as fh:
                for _ in range(0, stored, len(block)):
                    fh.write(block)
                fh.flush()
                os.fdatasync(fh.fileno())
            out.unlink()

        rlds_s = _best(ours, args.repeats)
        robomimic_s = _best(theirs, args.repeats)
        disk_s = _best(disk, args.repeats)
    steps = args.demos * args.steps
    print("| file | rlds convert | robomimic SequenceDataset(hdf5_cache_mode='all') | speed-up |")
    print("|---|---|---|---|")
    print(
        f"| {args.demos} demos x {args.steps} steps, "
        f"{f'{args.size}x{args.size} camera' if args.size else 'low-dim'}, {mb:.0f} MB "
        f"| {rlds_s:.2f} s ({steps / rlds_s:,.0f} steps/s) | {robomimic_s:.2f} s ({steps / robomimic_s:,.0f} "
        f"steps/s) | {robomimic_s / rlds_s:.1f}x |"
    )
    print(
        f"\nwriting and syncing the {stored / 1e6:.0f} MB the cache stores (observations once), alone: "
        f"{disk_s:.2f} s ({stored / disk_s / 1e6:,.0f} MB/s)"
    )


if __name__ == "__main__":
    main()
