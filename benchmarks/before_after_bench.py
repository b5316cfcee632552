"""The before/after records of issue 14's two pixel changes, each its own section, on a generated
pixel dataset (random ``uint8`` (3, 84, 84) frames, episodes of 30-2,000 steps, memmap backend);
the pixel section measures both paths again, as they are now, in every ``make bench``:

* ``frame-stack`` (default): ``FrameStack(4)`` now and before its single-gather rewrite (kept here
  as :class:`OldFrameStack`), on memmap and in RAM, against the raw gather of 4x (and 1x) the
  frames and the loader without a transform; the two transforms are checked to give the same
  batches first;
* ``dataloader`` (``--dataloader``): ``TedDataLoader`` with 0, 1 and 2 fork workers, with the
  shared-memory batch ring and without it (torch's own transfer, the "before" figures), against
  the in-process ``Loader`` (and its ``prefetch=2`` thread); the ring's stream is checked to equal
  the stream without workers first.

Rates and page faults per batch; each section's "How it is measured" says how. Usage: ``python
benchmarks/before_after_bench.py [--dataloader] [--write FILE] [--quick]``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import _harness
import _sides
import data as bench_data
import numpy as np
from _harness import Case
from _sides import BATCH, sample

K = 4


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


def frame_stack_cases(ds: Any) -> tuple[list[Case], list[Any]]:
    """The frame-stack cases, after checking that the new and the old transform give the same
    batch (same seed, same indices)."""
    from rlds_cli.loader import FrameStack, Loader

    for in_memory in (False, True):
        a = Loader(ds, BATCH, seed=5, in_memory=in_memory, transform=FrameStack(K)).sample()
        b = Loader(ds, BATCH, seed=5, in_memory=in_memory, transform=OldFrameStack(K)).sample()
        assert set(a) == set(b), (sorted(a), sorted(b))
        for key in a:
            assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
            assert bool((a[key] == b[key]).all()), key
    raw = _sides.Raw(ds)
    cases = [
        Case("raw-mm-4", "raw `np.take` of 4x the frames, `np.memmap`", raw.stacks(K)),
        Case("raw-ram-4", "raw `np.take` of 4x the frames, in RAM", raw.stacks(K, in_ram=True)),
        Case("raw-mm-1", "raw `np.take` of 1x the frames, `np.memmap`", raw.stacks(1)),
        Case("rlds-mm", "rlds `Loader`, memmap, no transform (every TED key)", sample(ds)),
        Case(
            "old-mm", "rlds `Loader`, memmap, `FrameStack(4)` before", sample(ds, transform=OldFrameStack(K))
        ),
        Case("new-mm", "rlds `Loader`, memmap, `FrameStack(4)` now", sample(ds, transform=FrameStack(K))),
        Case(
            "old-ram",
            "rlds `Loader`, `in_memory=True`, `FrameStack(4)` before",
            sample(ds, in_memory=True, transform=OldFrameStack(K)),
        ),
        Case(
            "new-ram",
            "rlds `Loader`, `in_memory=True`, `FrameStack(4)` now",
            sample(ds, in_memory=True, transform=FrameStack(K)),
        ),
    ]
    return cases, []


def dataloader_cases(ds: Any) -> tuple[list[Case], list[Any]]:
    """The DataLoader cases (and their loaders, to close), after checking the ring's stream."""
    _sides.check_ring(ds)
    loaders = {
        (w, r): _sides.dataloader(ds, w, r) for w, r in [(0, None), (1, 0), (2, 0), (1, None), (2, None)]
    }
    cases = [
        Case("inproc", "in-process `Loader` (the reference)", sample(ds)),
        Case("prefetch", "in-process `Loader`, `prefetch=2` (a background thread)", sample(ds, prefetch=2)),
        Case("w0", "`TedDataLoader`, no worker", iter(loaders[0, None]).__next__),
        Case(
            "w1-old",
            "`TedDataLoader`, 1 worker, no ring (torch's transfer; before)",
            iter(loaders[1, 0]).__next__,
        ),
        Case(
            "w2-old",
            "`TedDataLoader`, 2 workers, no ring (torch's transfer; before)",
            iter(loaders[2, 0]).__next__,
        ),
        Case("w1", "`TedDataLoader`, 1 worker, shared ring (now)", iter(loaders[1, None]).__next__),
        Case("w2", "`TedDataLoader`, 2 workers, shared ring (now)", iter(loaders[2, None]).__next__),
    ]
    return cases, list(loaders.values())


@dataclass(frozen=True)
class Section:
    """One of the two sections: its cases, how a visit measures them, its ratios and goals, its text."""

    name: str
    flag: str  # the command-line flag that picks it
    title: str
    steps: tuple[int, int]
    cases: Any
    settle: int
    calls: int
    per_visit: bool
    ratios: str
    workload: str
    notes: tuple[str, ...]
    after: str = ""  # a sentence after the workload's


FRAME_STACK = Section(
    name="frame-stack",
    flag="",
    title="Frame stacking: `FrameStack(4)` vs the raw gather of 4x the frames",
    steps=(60_000, 10_000),
    cases=frame_stack_cases,
    settle=2,
    calls=4,
    per_visit=False,
    # the goal: frame stacking at 0.5x of the raw gather of 4x the frames, or better
    ratios="new-mm/raw-mm-4>=0.5 new-ram/raw-ram-4>=0.5 old-mm/raw-mm-4 old-ram/raw-ram-4 new-mm/old-mm "
    "new-ram/old-ram new-mm/rlds-mm old-mm/rlds-mm raw-ram-4/raw-mm-4 raw-mm-1/raw-mm-4",
    workload="batch 256, `k = 4`, uniform sampler. Every rlds case returns the full TED transition with "
    "`observation` and `next/observation` stacked to `[256, 4, 3, 84, 84]`. Batches/s: one over the median "
    "call time",
    notes=(
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
        "configurations in turn, 2 untimed then 4 timed calls a visit (so a burst of load from the "
        "machine's other users hits all alike, and each is timed once the allocator has settled after "
        "the others' allocations), for about {seconds:g} s per configuration; minor page faults from "
        "`getrusage` around each timed call.",
    ),
)
DATALOADER = Section(
    name="dataloader",
    flag=" --dataloader",
    title="DataLoader workers: `TedDataLoader` vs the in-process `Loader`, on pixels",
    steps=(30_000, 5_000),
    cases=dataloader_cases,
    settle=6,
    calls=8,
    # a visit's rate is its timed calls over their total time, not one over the median call: with
    # workers, a call that finds a batch ready returns at once, so only the total is a throughput
    per_visit=True,
    # the goal: a DataLoader with 2 workers at 0.5x of the in-process loader, or better
    ratios="w2/inproc>=0.5 w2-old/inproc w1/inproc w1-old/inproc w0/inproc prefetch/inproc",
    workload="batch 256, uniform sampling, every TED key (10.8 MB of observations and next observations "
    "a batch). Batches/s: 8 consecutive `next(...)` in the training process over their time, median over "
    "the visits of a round",
    after=" Workers: fork, persistent, `prefetch_factor=2`.",
    notes=(
        "- Without the ring, torch pickles each batch a worker returns: every tensor is copied into a fresh "
        "shared-memory segment, whose file descriptor the main process receives and maps (a page fault per "
        "4 KiB page), then unmaps once the batch is dropped. With the ring, the workers gather the "
        "observation keys straight into preallocated shared slots (`np.take(..., out=)`) and return a slot "
        "number plus the small keys; the main process wraps the slot as tensors without a copy, and the "
        "slot is reused once every tensor of the batch is freed (`rlds_cli/loader/ring.py`).",
        "- The training loop here does nothing with a batch; a real training step runs in the same process "
        "as the in-process loader's gather (and its `prefetch` thread, which also holds the GIL between "
        "numpy calls), while workers gather on other cores.",
        "- Each round visits the configurations in turn, 6 untimed calls (a DataLoader's prefetched "
        "batches drained) then 8 timed ones a visit, for about {seconds:g} s per configuration; minor "
        "page faults are those of the training process (`getrusage(RUSAGE_SELF)`), not of the workers.",
    ),
)


def render(section: Section, ds: Any, cases: list[Case], info: dict[str, Any]) -> str:
    """The Markdown section."""
    gib = (ds.num_steps + ds.num_episodes) * 3 * 84 * 84 / 2**30
    lines = [
        *_harness.opening(section.name, section.title, info["quick"]),
        f"Workload: {ds.num_steps:,} steps of uint8 (3, 84, 84) observations in {ds.num_episodes} episodes "
        f"of {bench_data.PIXEL_EPISODE_LENGTHS[0]}-{bench_data.PIXEL_EPISODE_LENGTHS[1]:,} steps ({gib:.2f} "
        f"GiB of frames, memmap backend, in the page cache), {section.workload}, median of {info['repeats']} "
        f"rounds in one process (range in brackets).{section.after}",
        "",
        *_harness.header(info, _harness.versions("numpy", "torch") + " (1 intra-op thread)"),
        "",
        *_harness.rates_table(cases),
        "",
        *_harness.ratios_table({c.key: c for c in cases}, _harness.ratio_goals(section.ratios), {}),
    ]
    command = (
        f".venv-bench/bin/python benchmarks/before_after_bench.py{section.flag} --write docs/benchmarks.md"
    )
    notes = [note.format(seconds=info["seconds"]) for note in section.notes]
    return "\n".join(lines + _harness.closing(section.name, command, notes))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown section."""
    p = _harness.parser(
        "issue 14's before/after records: frame stacks, DataLoader workers",
        "frame-stack",
        work="before_after",
        steps=(60_000, 10_000),  # the dataloader section's: 30,000, quick 5,000
    )
    p.add_argument("--dataloader", action="store_true", help="the dataloader section (default frame-stack)")
    args = p.parse_args(argv)
    section = DATALOADER if args.dataloader else FRAME_STACK
    args._steps = section.steps
    run = _harness.start(args)
    run.need_disk(1.2 * run.steps * 3 * 84 * 84)
    t = time.perf_counter()
    ds = bench_data.ensure(
        run.work / "root", f"pixels-{run.steps}-memmap", lambda: bench_data.noise_pixel_blocks(run.steps)
    )
    _harness.warm_dataset(ds)
    _harness.logger(section.name)(
        f"{ds.num_steps:,} steps, {ds.num_episodes} episodes ready ({time.perf_counter() - t:.1f} s)"
    )
    loaders: list[Any] = []
    try:
        cases, loaders = section.cases(ds)
        how = {"settle": section.settle, "calls": section.calls, "per_visit": section.per_visit}
        _harness.rounds(cases, run.repeats, run.seconds, _harness.logger(section.name), **how)
        text = render(section, ds, cases, run.info())
    finally:
        for loader in loaders:
            loader.close()
        run.remove(run.work / "root")
    run.publish(section.name, text, _harness.logger(section.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
