"""Frame-stack section: ``FrameStack(4)`` now and before its single-gather rewrite (kept here as
:class:`OldFrameStack`), on memmap and in RAM, against the raw gather of 4x (and 1x) the frames
and the loader without a transform, on a generated pixel dataset (random ``uint8`` (3, 84, 84)
frames, episodes of 30-2,000 steps); rates and page faults per batch. The section's "How it is
measured" says how. Usage: ``python benchmarks/framestack_bench.py [--write FILE] [--quick]``.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import _harness
import data as bench_data
import numpy as np

SECTION = "frame-stack"
BATCH = 256
K = 4
FRAME = (3, 84, 84)
#: Episode lengths are drawn uniformly from this range (short and long episodes alike).
EPISODE_LENGTHS = bench_data.PIXEL_EPISODE_LENGTHS
#: The issue's goal: frame stacking at this fraction of the raw gather of 4x the frames.
TARGET = 0.5
#: Calls per visit of a case: untimed ones (the allocator settles), then timed ones.
SETTLE, TIMED = 2, 4


_log = _harness.logger("framestack")


# ----------------------------------------------------------------------------- data


def ensure_dataset(steps: int, work: Path) -> Any:
    """An rlds memmap cache of ``steps`` random-pixel steps (built once, kept in ``work``)."""
    return bench_data.ensure(
        work / "root", f"pixels-{steps}-memmap", lambda: bench_data.noise_pixel_blocks(steps)
    )


# ----------------------------------------------------------------------------- the old transform


class OldFrameStack:
    """``FrameStack`` as it was before the single-gather rewrite (the "before" figures): the
    loader gathers observation and next/observation, this gathers the ``k`` frames of each step
    through ``HostSource.gather`` and throws those away, then builds next/observation with a
    ``take`` of ``k - 1`` frames and a ``concatenate``."""

    needs_host = True

    def __init__(self, k: int, keys: Iterable[str] = ("observation",)) -> None:
        self.k = k
        self.keys = list(keys)
        self._source: Any = None
        self._episodes: Any = None

    def bind(self, dataset: Any) -> None:
        from rlds_cli.loader.samplers import Episodes
        from rlds_cli.loader.sources import HostSource

        self._source = HostSource(dataset, self.keys)
        self._episodes = Episodes.of(dataset)

    def __call__(self, batch: Any) -> Any:
        idx = np.asarray(batch["index"], np.int64)
        first = self._episodes.starts[self._episodes.episode_of(idx)]
        steps = np.maximum(idx[..., None] - np.arange(self.k - 1, -1, -1), first[..., None])
        frames = self._source.gather(steps)
        axis = idx.ndim
        for key in self.keys:
            stack = frames[key]
            nxt = f"next/{key}"
            if nxt in batch:
                newest = np.expand_dims(np.asarray(batch[nxt]), axis)
                batch[nxt] = np.concatenate([np.take(stack, range(1, self.k), axis=axis), newest], axis=axis)
            if key in batch:
                batch[key] = stack
        return batch


# ----------------------------------------------------------------------------- raw numpy


class Raw:
    """The least numpy code for the frames a batch of stacks needs (the limit)."""

    def __init__(self, ds: Any) -> None:
        self.memmap = np.load(ds.directory / "arrays" / "observation.npy", mmap_mode="r")
        lengths = np.asarray(ds.episodes["length"], np.int64)
        self.n = int(lengths.sum())
        self.episode = np.repeat(np.arange(len(lengths)), lengths)
        self.first_row = np.cumsum(lengths) - lengths + np.arange(len(lengths))
        self.rng = np.random.default_rng(1)

    @functools.cached_property
    def ram(self) -> np.ndarray:
        """A plain in-RAM copy of the frames (made on first use)."""
        return np.array(self.memmap)

    def rows(self, k: int) -> np.ndarray:
        """Flat rows of ``k`` frames per sampled step (``t-k+1..t``, clamped at the episode start)."""
        i = self.rng.integers(0, self.n, BATCH)
        e = self.episode.take(i)
        r = i + e
        return np.maximum(r[:, None] + np.arange(1 - k, 1), self.first_row.take(e)[:, None]).reshape(-1)

    def gather(self, frames: np.ndarray, k: int) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            return np.take(frames, self.rows(k), axis=0)

        return run


# ----------------------------------------------------------------------------- measuring


def run_round(cases: list[_harness.Case], seconds: float) -> None:
    """One round of this section's way (and the pixel and real sections'): the cases visited in
    turn, ``SETTLE`` untimed then ``TIMED`` timed calls a visit; a round's rate is one over its
    median call time."""
    _harness.run_round(cases, seconds, settle=SETTLE, calls=TIMED)


def build_cases(ds: Any) -> list[_harness.Case]:
    from rlds_cli.loader import FrameStack, Loader

    raw = Raw(ds)
    Case = _harness.Case
    return [
        Case("raw-mm-4", "raw `np.take` of 4x the frames, `np.memmap`", raw.gather(raw.memmap, K)),
        Case("raw-ram-4", "raw `np.take` of 4x the frames, in RAM", raw.gather(raw.ram, K)),
        Case("raw-mm-1", "raw `np.take` of 1x the frames, `np.memmap`", raw.gather(raw.memmap, 1)),
        Case(
            "rlds-mm", "rlds `Loader`, memmap, no transform (every TED key)", Loader(ds, BATCH, seed=0).sample
        ),
        Case(
            "old-mm",
            "rlds `Loader`, memmap, `FrameStack(4)` before",
            Loader(ds, BATCH, seed=0, transform=OldFrameStack(K)).sample,
        ),
        Case(
            "new-mm",
            "rlds `Loader`, memmap, `FrameStack(4)` now",
            Loader(ds, BATCH, seed=0, transform=FrameStack(K)).sample,
        ),
        Case(
            "old-ram",
            "rlds `Loader`, `in_memory=True`, `FrameStack(4)` before",
            Loader(ds, BATCH, seed=0, in_memory=True, transform=OldFrameStack(K)).sample,
        ),
        Case(
            "new-ram",
            "rlds `Loader`, `in_memory=True`, `FrameStack(4)` now",
            Loader(ds, BATCH, seed=0, in_memory=True, transform=FrameStack(K)).sample,
        ),
    ]


def check_same(ds: Any) -> None:
    """The new and the old transform give the same batch (same seed, same indices)."""
    from rlds_cli.loader import FrameStack, Loader

    for in_memory in (False, True):
        a = Loader(ds, BATCH, seed=5, in_memory=in_memory, transform=FrameStack(K)).sample()
        b = Loader(ds, BATCH, seed=5, in_memory=in_memory, transform=OldFrameStack(K)).sample()
        assert set(a) == set(b), (sorted(a), sorted(b))
        for key in a:
            assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
            assert bool((a[key] == b[key]).all()), key


# ----------------------------------------------------------------------------- report


def render(ds: Any, cases: list[_harness.Case], info: dict[str, Any]) -> str:
    by = {c.key: c.median for c in cases}
    gib = (ds.num_steps + ds.num_episodes) * int(np.prod(FRAME)) / 2**30
    mm, ram = by["raw-mm-4"], by["raw-ram-4"]
    new_mm, new_ram = by["new-mm"] / mm, by["new-ram"] / ram
    lines = [
        *_harness.opening(
            SECTION, "Frame stacking: `FrameStack(4)` vs the raw gather of 4x the frames", False
        ),
        f"Workload: {ds.num_steps:,} steps of uint8 {FRAME} observations in {ds.num_episodes} episodes "
        f"of {EPISODE_LENGTHS[0]}-{EPISODE_LENGTHS[1]:,} steps ({gib:.2f} GiB of frames, memmap "
        f"backend), batch {BATCH}, `k = {K}`, uniform sampler. Every rlds row returns the full TED "
        "transition with `observation` and `next/observation` stacked to "
        f"`[{BATCH}, {K}, 3, 84, 84]`. Batches/s: one over the median call time, "
        f"median of {info['repeats']} rounds in one process (range in brackets).",
        "",
        *_harness.header(info, _harness.versions("numpy", "torch") + " (1 intra-op thread)"),
        "",
        *_harness.table(
            ["workload", "batches/s", "ms/batch", "page faults/batch", "/ raw 4x, memmap", "/ raw 4x, RAM"],
            [
                [
                    c.label,
                    c.fmt(),
                    c.ms(),
                    f"{statistics.median(c.faults):,.0f}",
                    f"{c.median / mm:.2f}x",
                    f"{c.median / ram:.2f}x",
                ]
                for c in cases
            ],
        ),
        "",
        "### Goal (ratios measured in this run)",
        "",
        f"- `FrameStack(4)` at >= {TARGET}x of the raw gather of 4x the frames from the same storage: "
        f"memmap {new_mm:.2f}x, in RAM {new_ram:.2f}x -> {_harness.verdict(min(new_mm, new_ram) >= TARGET)} "
        f"(before: {by['old-mm'] / mm:.2f}x and {by['old-ram'] / ram:.2f}x; speed-up "
        f"{by['new-mm'] / by['old-mm']:.1f}x and {by['new-ram'] / by['old-ram']:.1f}x).",
        f"- Against the loader without a transform: {by['new-mm'] / by['rlds-mm']:.2f}x "
        f"(before {by['old-mm'] / by['rlds-mm']:.2f}x).",
    ]
    notes = [
        "- Now: one gather of each stacked step's `k + 1` flat rows (`t-k+1..t+1`, clamped at the "
        "episode's first frame by index arithmetic) into one preallocated `[256, k + 1, 3, 84, 84]` "
        "array (reused once the batch made from it is dropped: no fresh memory, so no page faults); "
        "`observation` and `next/observation` are views of its first and last `k` frames, and the "
        "loader does not read either observation itself. Before: the loader's gather of both "
        "observations, then a gather of `k` frames, a `take` of `k - 1` and a `concatenate`, each "
        "into fresh memory.",
        "- The raw references gather only the `256 x 4` frames of the observation stacks (their rows "
        "are 4 consecutive frames per step, the access pattern of a stack): no next observation, no "
        "other key, no torch conversion. The stacked loader gathers `k + 1 = 5` frames per step and "
        "the other TED keys, so 0.8x is about its ceiling.",
        "- The page cache holds the whole file (read once before timing). Each round visits the "
        f"configurations in turn, {SETTLE} untimed then {TIMED} timed calls a visit (so a burst of "
        "load from the machine's other users hits all alike, and each is timed once the allocator "
        f"has settled after the others' allocations), for about {info['seconds']} s per "
        "configuration; minor page faults from `getrusage` around each timed call.",
    ]
    command = ".venv-bench/bin/python benchmarks/framestack_bench.py --write docs/benchmarks.md"
    return "\n".join(lines + _harness.closing(SECTION, command, notes))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown section."""
    p = _harness.parser(
        "FrameStack vs the raw gather of 4x the frames", SECTION, work="framestack", steps=(60_000, 10_000)
    )
    run = _harness.start(p.parse_args(argv))
    run.need_disk(1.2 * run.steps * int(np.prod(FRAME)))
    t = time.perf_counter()
    ds = ensure_dataset(run.steps, run.work)
    _harness.warm_dataset(ds)
    _log(f"{ds.num_steps:,} steps, {ds.num_episodes} episodes ready ({time.perf_counter() - t:.1f} s)")
    try:
        check_same(ds)
        cases = build_cases(ds)
        _harness.rounds(cases, run.repeats, run.seconds, _log, settle=SETTLE, calls=TIMED)
        section = render(ds, cases, run.info())
    finally:
        run.remove(run.work / "root")
    run.publish(SECTION, section, _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
