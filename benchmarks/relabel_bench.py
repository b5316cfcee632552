"""Goal-relabeling benchmark: ``Loader(..., transform=GoalRelabel())`` against a lean numpy
statement of OGBench's ``GCDataset.sample`` on the same data.

OGBench's own ``GCDataset`` (``impls/utils/datasets.py``) needs flax (its ``Dataset`` is a
``FrozenDict``) and jax, and flax is not installed here, so the reference is its ``sample`` and
``sample_goals`` restated with numpy alone: uniform step indices, the batch's arrays gathered
from in-RAM arrays, value and actor goals by the same rules (``np.random`` calls in OGBench's
order), the goal observations gathered, ``successes``, ``masks`` and ``rewards``. That is the
cost floor of the rules in Python; OGBench's own code pays at least the same gathers.

Data: an OGBench-like dataset (29-d float32 observations as antmaze's, 8-d actions, episodes of
1,000 steps, reward 0), ``--steps`` steps, in an rlds memmap cache built here. Batch 256; the
rlds loader on the memmap and with ``in_memory=True``, no prefetch. Each configuration runs
``--batches`` batches per round, the rounds alternate, and the report gives the median per-batch
time of the rounds.

Usage::

    python benchmarks/relabel_bench.py [--steps 1000000] [--batches 200] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import data as bench_data  # benchmarks/data.py: builder blocks, datasets built once
import numpy as np

OBS, ACT, EPISODE = 29, 8, 1000


def build(root: Path, steps: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)

    def blocks():  # type: ignore[no-untyped-def]
        for start in range(0, steps, EPISODE):
            n = min(EPISODE, steps - start)
            action = rng.uniform(-1, 1, (n, ACT)).astype(np.float32)
            obs = rng.standard_normal((n + 1, OBS)).astype(np.float32)
            yield bench_data.step_block(action, np.zeros((n, 1), np.float32), obs, [n - 1])

    return bench_data.ensure(root, "ogb", blocks)


class LeanOGBench:
    """OGBench's ``GCDataset.sample`` with numpy alone (defaults: value 0.2 / 0.5 / 0.3
    geometric, actor trajectory goals only, uniform; discount 0.99; gc_negative)."""

    def __init__(self, ds) -> None:  # type: ignore[no-untyped-def]
        b = ds[:]
        self.data = {
            "observations": np.asarray(b["observation"]),
            "next_observations": np.asarray(b["next/observation"]),
            "actions": np.asarray(b["action"]),
            "rewards": np.asarray(b["next/reward"])[:, 0],
        }
        self.size = len(self.data["actions"])
        self.terminal_locs = np.asarray(ds.episodes["length"], np.int64).cumsum() - 1
        self.discount = 0.99

    def sample_goals(self, idxs: np.ndarray, p_cur: float, p_traj: float, geom: bool) -> np.ndarray:
        n = len(idxs)
        random_goal_idxs = np.random.randint(0, self.size, n)
        final = self.terminal_locs[np.searchsorted(self.terminal_locs, idxs)]
        if geom:
            offsets = np.random.geometric(p=1 - self.discount, size=n)
            traj = np.minimum(idxs + offsets, final)
        else:
            d = np.random.rand(n)
            traj = np.round(np.minimum(idxs + 1, final) * d + final * (1 - d)).astype(int)
        if p_cur == 1.0:
            return idxs
        goal = np.where(np.random.rand(n) < p_traj / (1.0 - p_cur), traj, random_goal_idxs)
        return np.where(np.random.rand(n) < p_cur, idxs, goal)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        idxs = np.random.randint(0, self.size, batch_size)
        batch = {k: v[idxs] for k, v in self.data.items()}
        value = self.sample_goals(idxs, 0.2, 0.5, True)
        actor = self.sample_goals(idxs, 0.0, 1.0, False)
        batch["value_goals"] = self.data["observations"][value]
        batch["actor_goals"] = self.data["observations"][actor]
        successes = (idxs == value).astype(float)
        batch["masks"] = 1.0 - successes
        batch["rewards"] = successes - 1.0
        return batch


def per_batch(fn: Callable[[], object], batches: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(batches):
        fn()
    return (time.perf_counter() - t0) / batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="20,000 steps, 20 batches, 1 round (a smoke test)")
    args = p.parse_args()
    if args.quick:
        args.steps, args.batches, args.rounds = 20_000, 20, 1
    from rlds_cli.loader import Loader
    from rlds_cli.loader.relabel import GoalRelabel, GoalRule

    with tempfile.TemporaryDirectory(prefix="relabel-bench-") as work:
        ds = build(Path(work), args.steps)
        lean = LeanOGBench(ds)
        np.random.seed(0)
        actor = GoalRule(0.0, 1.0, 0.0, geom_sample=False)
        cases: dict[str, Callable[[], object]] = {"lean numpy OGBench rules": lambda: lean.sample(256)}
        for label, kw in (("rlds Loader + GoalRelabel (memmap)", {}),
                          ("rlds Loader + GoalRelabel (in_memory)", {"in_memory": True})):  # fmt: skip
            loader = Loader(ds, 256, seed=0, epochs=None, transform=GoalRelabel(actor=actor, seed=0), **kw)
            cases[label] = loader.sample
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):
            for k, fn in cases.items():
                times[k].append(per_batch(fn, args.batches))
        base = statistics.median(times["lean numpy OGBench rules"])
        print(f"{args.steps:,} steps, batch 256, {args.rounds} rounds x {args.batches} batches")
        for k, ts in times.items():
            m = statistics.median(ts)
            print(f"{k:40s} {m * 1e6:8.0f} us/batch  {base / m:5.2f}x the lean statement")


if __name__ == "__main__":
    main()
