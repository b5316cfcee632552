"""DataLoader section: ``TedDataLoader`` with 0, 1 and 2 fork workers, with the shared-memory batch
ring and without it (torch's own transfer, the "before" figures), against the in-process
``Loader`` (and its ``prefetch=2`` thread), on framestack_bench's pixel dataset; the ring's stream
is checked to equal the stream without workers first. The section's "How it is measured" says
how. Usage: ``python benchmarks/dataloader_bench.py [--write FILE] [--quick]``.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import _harness
import framestack_bench as fsb

SECTION = "dataloader"
BATCH = 256
#: The issue's goal: a DataLoader with 2 workers at this fraction of the in-process loader.
TARGET = 0.5
#: Calls per visit: untimed ones (a DataLoader's prefetched batches drained, the allocator
#: settled after the other cases), then timed ones.
SETTLE, TIMED = 6, 8


_log = _harness.logger("dataloader")
Case = _harness.Case


def measure(cases: list[Case], repeats: int, seconds: float) -> None:
    """``repeats`` rounds: the cases visited in turn, ``SETTLE`` untimed calls (a DataLoader's
    prefetched batches drained) then ``TIMED`` timed ones a visit. A visit's rate is its timed
    calls over their total time (not one over the median call: with workers, a call that finds a
    batch ready returns at once, so only the total is a throughput); a round's, the median visit's."""
    _harness.rounds(cases, repeats, seconds, _log, settle=SETTLE, calls=TIMED, per_visit=True)


def _dataloader(ds: Any, workers: int, ring_slots: int | None) -> Any:
    from rlds_cli.loader import TedDataLoader, TedIterableDataset

    data = TedIterableDataset(ds, BATCH, shuffle="uniform", seed=0)
    kw: dict[str, Any] = {"multiprocessing_context": "fork", "persistent_workers": True} if workers else {}
    return TedDataLoader(data, num_workers=workers, ring_slots=ring_slots, **kw)


def build_cases(ds: Any) -> tuple[list[Case], list[Any]]:
    from rlds_cli.loader import Loader

    loaders = {(w, r): _dataloader(ds, w, r) for w, r in [(0, None), (1, 0), (2, 0), (1, None), (2, None)]}
    cases = [
        Case("inproc", "in-process `Loader` (the reference)", Loader(ds, BATCH, seed=0).sample),
        Case(
            "prefetch",
            "in-process `Loader`, `prefetch=2` (a background thread)",
            Loader(ds, BATCH, seed=0, prefetch=2).sample,
        ),
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


def check_same(ds: Any) -> None:
    """The ring's batches equal those made without workers (same seed, same stream)."""
    ref = _dataloader(ds, 0, None)
    ring = _dataloader(ds, 2, None)
    for _, a, b in zip(range(6), ref, ring, strict=False):
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and bool((a[key] == b[key]).all()), key
    assert ring._ring is not None  # the batches did come through the ring
    ring.close()


def render(ds: Any, cases: list[Case], info: dict[str, Any]) -> str:
    by = {c.key: c.median for c in cases}
    ref = by["inproc"]
    gib = (ds.num_steps + ds.num_episodes) * 3 * 84 * 84 / 2**30
    now, before = by["w2"] / ref, by["w2-old"] / ref
    lines = [
        *_harness.opening(
            SECTION, "DataLoader workers: `TedDataLoader` vs the in-process `Loader`, on pixels", False
        ),
        f"Workload: {ds.num_steps:,} steps of uint8 (3, 84, 84) observations in {ds.num_episodes} "
        f"episodes ({gib:.2f} GiB of frames, memmap backend, in the page cache), batch {BATCH}, "
        "uniform sampling, every TED key (10.8 MB of observations and next observations a batch). "
        f"Batches/s: {TIMED} consecutive `next(...)` in the training process over their time, median "
        f"over the visits of a round, median of {info['repeats']} rounds in one process (range in "
        "brackets). Workers: fork, persistent, `prefetch_factor=2`.",
        "",
        *_harness.header(info, _harness.versions("numpy", "torch") + " (1 intra-op thread)"),
        "",
        *_harness.table(
            ["workload", "batches/s", "ms/batch", "page faults/batch (training process)", "/ in-process"],
            [
                [c.label, c.fmt(), c.ms(), f"{statistics.median(c.faults):,.0f}", f"{c.median / ref:.2f}x"]
                for c in cases
            ],
        ),
        "",
        "### Goal (ratios measured in this run)",
        "",
        f"- `TedDataLoader` with 2 workers at >= {TARGET}x of the in-process loader: {now:.2f}x "
        f"-> {_harness.verdict(now >= TARGET)} (without the ring: {before:.2f}x; 1 worker "
        f"{by['w1'] / ref:.2f}x, "
        f"before {by['w1-old'] / ref:.2f}x).",
    ]
    notes = [
        "- Without the ring, torch pickles each batch a worker returns: every tensor is copied into "
        "a fresh shared-memory segment, whose file descriptor the main process receives and maps "
        "(a page fault per 4 KiB page), then unmaps once the batch is dropped. With the ring, the "
        "workers gather the observation keys straight into preallocated shared slots "
        "(`np.take(..., out=)`) and return a slot number plus the small keys; the main process "
        "wraps the slot as tensors without a copy, and the slot is reused once every tensor of the "
        "batch is freed (`rlds_cli/loader/ring.py`).",
        "- The training loop here does nothing with a batch; a real training step runs in the same "
        "process as the in-process loader's gather (and its `prefetch` thread, which also holds "
        "the GIL between numpy calls), while workers gather on other cores.",
        f"- Each round visits the configurations in turn, {SETTLE} untimed calls (a DataLoader's "
        f"prefetched batches drained) then {TIMED} timed ones a visit, for about {info['seconds']} s "
        "per configuration; minor page faults are those of the training process "
        "(`getrusage(RUSAGE_SELF)`), not of the workers.",
    ]
    command = ".venv-bench/bin/python benchmarks/dataloader_bench.py --write docs/benchmarks.md"
    return "\n".join(lines + _harness.closing(SECTION, command, notes))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown section."""
    p = _harness.parser(
        "TedDataLoader workers vs the in-process Loader", SECTION, work="dataloader", steps=(30_000, 5_000)
    )
    run = _harness.start(p.parse_args(argv))
    run.need_disk(1.2 * run.steps * 3 * 84 * 84)
    ds = fsb.ensure_dataset(run.steps, run.work)
    _harness.warm_dataset(ds)
    _log(f"{ds.num_steps:,} steps, {ds.num_episodes} episodes ready")
    loaders: list[Any] = []
    try:
        check_same(ds)
        cases, loaders = build_cases(ds)
        measure(cases, run.repeats, run.seconds)
        section = render(ds, cases, run.info())
    finally:
        for loader in loaders:
            loader.close()
        run.remove(run.work / "root")
    run.publish(SECTION, section, _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
