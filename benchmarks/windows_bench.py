"""Windows benchmark: ``Loader(..., windows=...)`` ACT-style batches against a lean numpy gather.

Data: a generated state/action dataset (float32 observations of 14 values, actions of 7, episodes
of 50-500 steps drawn from a fixed seed) written into an rlds memmap cache with
:class:`~rlds_cli.cache.builder.DatasetBuilder`.

A batch is 256 sampled steps, each with 2 observations (``t-1, t``) and 50 actions
(``t .. t+49``), LeRobot's padding rule (steps clamped to the episode, ``<key>_is_pad`` masks).

Compared, in one process, cases visited in turn (a few calls each) so that contention on a shared
machine hits each alike; a round's rate is one over the median call, the report gives the median
over rounds (range in brackets):

* **lean numpy**: the same rows by hand: uniform indices, ``searchsorted`` for the episode, the
  clamped steps and pad masks, ``np.take`` of the observation rows (flat rows: ``step + episode``)
  and of the action rows, from the same arrays (the memmaps, or plain in-RAM copies);
* **rlds**: ``Loader(ds, 256, keys=["observation", "action"], windows=...).sample()``, as torch
  tensors, on the memmap and with ``in_memory=True``;
* **LeRobot** (only where ``lerobot`` imports; ``--lerobot`` adds it): the dataset exported with
  ``rlds export --to lerobot``, read by ``LeRobotDataset(root, delta_timestamps=...)``: 256
  ``dataset[i]`` and ``torch.utils.data.default_collate``, what a ``DataLoader`` batch costs it
  in one process.

Usage::

    python benchmarks/windows_bench.py [--steps 200000] [--rounds 7] [--quick]

Work data goes to ``benchmarks/_work/windows`` (git-ignored) and is deleted unless ``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import data as bench_data  # noqa: E402  (benchmarks/data.py: builder blocks, datasets built once)

BATCH, OBS, ACT = 256, 14, 7
WINDOWS = {"observation": range(-1, 1), "action": range(0, 50)}
TARGET = 0.8  # the goal: windowed batches at this fraction of the lean gather, or better
CALLS = 20


def blocks(steps: int) -> Any:
    """One builder block per episode of 50-500 steps of random states and actions."""
    rng = np.random.default_rng(0)
    done = 0
    while done < steps:
        n = min(int(rng.integers(50, 501)), steps - done)
        action, reward = rng.standard_normal((n, ACT), np.float32), rng.standard_normal((n, 1), np.float32)
        yield bench_data.step_block(action, reward, rng.standard_normal((n + 1, OBS), np.float32), [n - 1])
        done += n


def build(steps: int, work: Path) -> Any:
    return bench_data.ensure(work / "root", f"states-{steps}", lambda: blocks(steps))


def lean(ds: Any, in_memory: bool) -> Callable[[], Any]:
    """The hand-written numpy gather of the same rows (see the module docs)."""
    obs = np.asarray(ds.column("observation")[:] if in_memory else ds.column("observation"))
    act = np.asarray(ds.column("action")[:] if in_memory else ds.column("action"))
    lengths = np.asarray(ds.episodes["length"], np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    rng = np.random.default_rng(0)
    d_obs, d_act = np.arange(-1, 1), np.arange(0, 50)

    def call() -> Any:
        idx = rng.integers(0, ds.num_steps, BATCH)
        e = np.searchsorted(ends, idx, side="right")
        lo, hi = starts[e][:, None], ends[e][:, None] - 1
        want_o, want_a = idx[:, None] + d_obs, idx[:, None] + d_act
        rows_o = np.clip(want_o, lo, hi) + e[:, None]  # flat rows: one final observation per episode
        out = {
            "observation": obs.take(rows_o, axis=0),
            "action": act.take(np.clip(want_a, lo, hi), axis=0),
            "observation_is_pad": (want_o < lo) | (want_o > hi),
            "action_is_pad": (want_a < lo) | (want_a > hi),
        }
        return out

    return call


def rlds(ds: Any, in_memory: bool) -> Callable[[], Any]:
    from rlds_cli.loader import Loader

    loader = Loader(ds, BATCH, keys=["observation", "action"], seed=0, in_memory=in_memory, windows=WINDOWS)
    return loader.sample


def lerobot(ds: Any, work: Path) -> Callable[[], Any]:
    """256 items of ``LeRobotDataset`` over the same data (exported), collated."""
    import torch.utils.data
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from rlds_cli.export import export_dataset

    out = work / "lerobot"
    if not out.exists():
        export_dataset(ds, out, "lerobot")
    fps = 30  # what the export writes for a source without a frame rate
    delta = {"observation.state": [-1 / fps, 0.0], "action": [i / fps for i in range(50)]}
    theirs = LeRobotDataset("local/windows-bench", root=out, delta_timestamps=delta)
    rng = np.random.default_rng(0)

    def call() -> Any:
        idx = rng.integers(0, len(theirs), BATCH)
        return torch.utils.data.default_collate([theirs[int(i)] for i in idx])

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--lerobot", action="store_true", help="also time LeRobotDataset (needs lerobot)")
    p.add_argument("--quick", action="store_true", help="20,000 steps, 1 round (a smoke test)")
    args = p.parse_args()
    if args.quick:
        args.steps, args.rounds = 20_000, 1
    work = HERE / "_work" / "windows"
    ds = build(args.steps, work)
    cases = {
        (kind, mem): make(ds, mem)
        for mem in (False, True)
        for kind, make in (("lean numpy", lean), ("rlds", rlds))
    }
    if args.lerobot:
        cases[("lerobot", False)] = lerobot(ds, work)
    for call in cases.values():  # warm up: page cache, allocator
        for _ in range(5):
            call()
    rates: dict[Any, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for key, call in cases.items():
            times = []
            for _ in range(CALLS):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            rates[key].append(1.0 / statistics.median(times))
    print(f"steps={ds.num_steps} episodes={len(ds.episodes['length'])} batch={BATCH} "
          "windows: 2 observations (14 float32) + 50 actions (7 float32)")  # fmt: skip
    print("| storage | lean numpy (batches/s) | rlds windows (batches/s) | rlds / lean |")
    print("|---|---|---|---|")
    if args.lerobot:
        a, b = rates[("lean numpy", False)], rates[("lerobot", False)]
        ratio = [y / x for x, y in zip(a, b, strict=True)]
        print(
            f"LeRobotDataset + default_collate: {statistics.median(b):,.1f} batches/s "
            f"[{min(b):,.1f}-{max(b):,.1f}], {statistics.median(ratio):.4f}x the lean memmap gather"
        )
    for mem in (False, True):
        a, b = rates[("lean numpy", mem)], rates[("rlds", mem)]
        ratio = [y / x for x, y in zip(a, b, strict=True)]
        print(
            f"| {'in RAM' if mem else 'memmap'} | {statistics.median(a):,.0f} [{min(a):,.0f}-{max(a):,.0f}] "
            f"| {statistics.median(b):,.0f} [{min(b):,.0f}-{max(b):,.0f}] "
            f"| {statistics.median(ratio):.2f}x [{min(ratio):.2f}-{max(ratio):.2f}] (goal >= {TARGET}x) |"
        )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
