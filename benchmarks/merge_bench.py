"""``rlds merge``, ``drop``, ``trim`` and ``downsample`` on 1M-step low-dim datasets: the time
each takes beside the data files, and what reading the result costs (issue 43)::

    python benchmarks/merge_bench.py --steps 1000000 --repeats 5

Two datasets of ``--steps`` steps each (:func:`data.lowdim_blocks`: 17 float32 observations, 6
float32 actions, 1000-step episodes, memmap) are written once under a temporary cache root
(``RLDS_FSYNC=0`` for the inputs). Each operation then runs ``--repeats`` times in this process
with ``RLDS_FSYNC=1`` (the default: the result is made durable), each into a fresh name, and the
median wall time is printed: the merge without and with ``verify`` (the parents' content
digests, one read of every array), a drop of 10% of the merged dataset's episodes, a trim of 5
steps at each end, and a downsample by 4 (which writes its rows). The last table compares
uniform batches of 256 (``Dataset.gather`` of every key) on the merged dataset and on one
parent. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data import ensure, lowdim_blocks


def timed(fn: Callable[[int], Any], repeats: int) -> tuple[float, float, float]:
    """Median, min and max wall seconds of ``fn(i)`` over ``repeats`` calls."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def gather_rate(ds: Any, seconds: float = 2.0) -> float:
    """Uniform batches of 256 steps a second, every key."""
    import numpy as np

    rng = np.random.default_rng(0)
    ds.gather(rng.integers(0, ds.num_steps, 256))  # columns opened, not timed
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        ds.gather(rng.integers(0, ds.num_steps, 256))
        count += 1
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--root", type=Path, default=None, help="cache root (default: a temp dir)")
    a = p.parse_args(argv)
    from rlds_cli.cache.compose import downsample_dataset, merge_datasets, trim_dataset
    from rlds_cli.cache.derive import drop_episodes
    from rlds_cli.cache.opening import open_dataset

    root = a.root or Path(tempfile.mkdtemp(prefix="rlds-merge-bench-"))
    try:
        os.environ["RLDS_FSYNC"] = "0"
        ensure(root, "a", lambda: lowdim_blocks(a.steps))
        ensure(root, "b", lambda: lowdim_blocks(a.steps))
        os.environ["RLDS_FSYNC"] = "1"
        rows = [
            ("merge a b (no verify)", lambda i: merge_datasets(["a", "b"], f"m{i}", root=root, verify=False)),
            ("merge a b (verify digests)", lambda i: merge_datasets(["a", "b"], f"v{i}", root=root)),
        ]
        results = [(label, timed(fn, a.repeats)) for label, fn in rows]
        episodes = open_dataset("m0", root).num_episodes
        dropped = list(range(0, episodes, 10))
        more = [
            (
                f"drop {len(dropped)} of {episodes} episodes",
                lambda i: drop_episodes("m0", dropped, f"d{i}", root=root),
            ),
            ("trim --start 5 --end 5", lambda i: trim_dataset("m0", f"t{i}", start=5, end=5, root=root)),
            (
                "downsample --every 4 (writes N/4 rows)",
                lambda i: downsample_dataset("m0", f"s{i}", 4, root=root),
            ),
        ]
        results += [(label, timed(fn, a.repeats)) for label, fn in more]
        print(f"| operation ({a.steps:,} + {a.steps:,} steps) | wall s, median (range) |")
        print("|---|---|")
        for label, (med, lo, hi) in results:
            print(f"| {label} | {med:.3f} ({lo:.3f}-{hi:.3f}) |")
        print()
        print("| dataset | uniform batches of 256 a second (every key) |")
        print("|---|---|")
        for name in ("a", "m0", "t0"):
            print(f"| {name} | {gather_rate(open_dataset(name, root)):,.0f} |", flush=True)
    finally:
        if a.root is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
