"""zarr section: zarr against memmap on the same generated data (pixels: ``benchmarks/data.py``'s
patch frames; low-dim: 17 + 6 float32 columns, 1,000-step episodes), written one block at a time
with ``DatasetBuilder``: conversion CPU time and files (the builder alone and the whole
``convert`` of a D4RL file), uniform batches read from the files (``in_memory=False``) with the
layout and reader now and before (512 KiB chunks, zarr's own indexing), and the low-dim in-RAM
loader on zarr against memmap with its load time. Usage: ``python benchmarks/zarr_bench.py
[--write FILE] [--quick]``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _harness
import data as bench_data
import numpy as np

SECTION = "zarr"
BATCH = 256
FRAME = bench_data.FRAME
EPISODE_LENGTHS = bench_data.PIXEL_EPISODE_LENGTHS
#: The issue's goals: zarr uniform pixel batches at this fraction of memmap's rate, conversion
#: CPU within this factor of memmap's.
RATE_TARGET, CONVERSION_TARGET = 0.25, 1.5
#: The note the generated-frame sections open with.
NOISE_NOTE = (
    "Generated frames (a random background per episode and one changing patch a frame): the "
    "worst case for compression and for reads from compressed chunks. The *Real frames* section "
    "measures the same paths on real Atari frames."
)
#: Calls per visit of a case: untimed, then timed.
SETTLE, TIMED = 1, 4


_log = _harness.logger("zarr")


# ----------------------------------------------------------------------------- data


pixel_blocks, lowdim_blocks = bench_data.pixel_blocks, bench_data.lowdim_blocks


@contextlib.contextmanager
def old_layout() -> Iterator[None]:
    """Write zarr as before this change: 512 KiB chunks, one file each, no shards."""
    from rlds_cli.cache import zarr_backend as backends

    saved = backends.ZARR_CHUNK_BYTES, backends.ZARR_SHARD_BYTES, backends.ZARR_MAX_CHUNK_ROWS
    backends.ZARR_CHUNK_BYTES, backends.ZARR_SHARD_BYTES, backends.ZARR_MAX_CHUNK_ROWS = (
        512 * 1024,
        0,
        1 << 16,
    )
    try:
        yield
    finally:
        backends.ZARR_CHUNK_BYTES, backends.ZARR_SHARD_BYTES, backends.ZARR_MAX_CHUNK_ROWS = saved


def build(root: Path, name: str, backend: str, blocks: Callable[[], Iterator[Any]]) -> dict[str, Any]:
    """Write one dataset; the CPU seconds of the builder's work and the files written."""
    return bench_data.build(root, name, blocks(), backend)


def convert_d4rl(work: Path, steps: int, repeats: int) -> dict[str, float]:
    """CPU seconds of ``rlds_cli.convert.convert`` of one generated D4RL file (``benchmarks/
    data.py``, the conversion benchmark's data) per backend, the fewest of ``repeats``: the whole
    conversion (HDF5 reads, source hash, checks, digest, writes), not only the builder."""
    from rlds_cli.convert import convert

    source = work / "d4rl.hdf5"
    if not source.exists():
        _harness.generate("d4rl", source, steps)
    times: dict[str, list[float]] = {"memmap": [], "zarr": [], "zarr-old": []}
    walls: list[float] = []
    for _ in range(repeats):
        for label, cpu in times.items():
            root = work / f"convert-{label}"
            shutil.rmtree(root, ignore_errors=True)
            with old_layout() if label == "zarr-old" else contextlib.nullcontext():
                t, w = time.process_time(), time.perf_counter()
                convert(source, "bench", format="d4rl", root=root, backend=label.split("-")[0])
                cpu.append(time.process_time() - t)
                if label == "zarr":
                    walls.append(time.perf_counter() - w)
            shutil.rmtree(root, ignore_errors=True)
            _log(f"convert {label}: {cpu[-1]:.2f} s CPU")
    source.unlink()
    out = {label: min(cpu) for label, cpu in times.items()}  # least disturbed (see run)
    out["zarr-wall"] = statistics.median(walls)
    return out


Case = _harness.Case


def run_rounds(cases: list[Case], repeats: int, seconds: float) -> None:
    """``repeats`` rounds; in each, the cases are visited in turn until each had ``seconds``."""
    _harness.rounds(cases, repeats, seconds, _log, settle=SETTLE, calls=TIMED, budget=True)


# ----------------------------------------------------------------------------- the run


def run(work: Path, *, pixel_steps: int, lowdim_steps: int, repeats: int, seconds: float) -> dict[str, Any]:
    """Build, check and time everything; returns the figures for :func:`render`."""
    from rlds_cli.cache import backends
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.loader import Loader

    os.environ.setdefault("RLDS_FSYNC", "0")
    root = work / "root"
    out: dict[str, Any] = {"pixel_steps": pixel_steps, "lowdim_steps": lowdim_steps}
    conv: dict[str, dict[str, Any]] = {}
    for label in ("memmap", "zarr"):  # untimed: one-time costs (zarr's import, ...) stay out
        build(root, f"warm-up-{label}", label, lambda: pixel_blocks(200))
    # what every dataset costs whatever its size (creating the arrays and their metadata, the
    # manifest, the publish): a build of 1,000 low-dim steps, the same keys as the low-dim runs
    fixed: dict[str, list[float]] = {"memmap": [], "zarr": []}
    for _ in range(repeats):
        for label, cpus in fixed.items():
            cpus.append(build(root, f"fixed-{label}", label, lambda: lowdim_blocks(1_000))["cpu"])
    out["fixed"] = {label: min(cpus) for label, cpus in fixed.items()}
    for kind, blocks in (
        ("pixels", lambda: pixel_blocks(pixel_steps)),
        ("lowdim", lambda: lowdim_blocks(lowdim_steps)),
    ):
        runs: dict[str, list[dict[str, Any]]] = {"memmap": [], "zarr": [], "zarr-old": []}
        for _ in range(repeats):  # interleaved: a burst of load hits each backend alike
            for label in runs:
                backend = "zarr" if label.startswith("zarr") else "memmap"
                with old_layout() if label == "zarr-old" else contextlib.nullcontext():
                    runs[label].append(build(root, f"{kind}-{label}", backend, blocks))
                _log(f"{kind} {label}: {runs[label][-1]['cpu']:.2f} s CPU")
        conv[kind] = {
            label: {
                # the fewest CPU seconds of the runs: other processes on this shared machine only
                # ever add to a run's CPU time (cache and memory contention), and the first run
                # of a size pays for fresh memory; the median kept 1.6-2.8 s for a 0.8 s build
                "cpu": min(r["cpu"] for r in rs),
                "wall": statistics.median(r["wall"] for r in rs),
                "files": rs[-1]["files"],
                "bytes": rs[-1]["bytes"],
            }
            for label, rs in runs.items()
        }
    out["conversion"] = conv
    out["convert"] = convert_d4rl(work, lowdim_steps, repeats)

    # same values through every path
    pix = {label: open_dataset(f"pixels-{label}", root) for label in ("memmap", "zarr", "zarr-old")}
    rng = np.random.default_rng(3)
    idx = rng.integers(0, pixel_steps, BATCH)
    want = pix["memmap"].gather(idx)
    for ds in (pix["zarr"], pix["zarr-old"]):
        got = ds.gather(idx)
        assert all(np.array_equal(want[k], got[k]) for k in want), ds.name
    for ds in pix.values():
        _harness.warm_dataset(ds)

    # the "before" read path: zarr's own indexing (no chunk reader), on the layout written before;
    # columns small enough are read into RAM when opened (ndarrays), by either read path
    before = open_dataset("pixels-zarr-old", root)
    for key in before.manifest.fields:
        column = before.column(key)
        column = getattr(column, "column", column)  # under the replaced-dataset check's wrapper
        assert isinstance(column, backends.ZarrColumn | np.ndarray), type(column)
        if isinstance(column, backends.ZarrColumn):
            column._reader = None
    zarr_old_before = Loader(before, BATCH, seed=0, in_memory=False)
    cases = [
        Case("mm", "memmap", Loader(pix["memmap"], BATCH, seed=0, in_memory=False).sample),
        Case(
            "z",
            "zarr, layout now (16 KiB chunks, 16 MiB shards), rlds chunk reader",
            Loader(pix["zarr"], BATCH, seed=0, in_memory=False).sample,
        ),
        Case(
            "z-old-new",
            "zarr, layout before (512 KiB chunks), rlds chunk reader",
            Loader(pix["zarr-old"], BATCH, seed=0, in_memory=False).sample,
        ),
        Case("z-old", "zarr, layout before, zarr indexing (before this change)", zarr_old_before.sample),
    ]
    _log("pixels, uniform batches:")
    run_rounds(cases, repeats, seconds)
    out["pixels"] = cases

    low = {label: open_dataset(f"lowdim-{label}", root) for label in ("memmap", "zarr")}
    for ds in low.values():
        _harness.warm_dataset(ds)
    loads: dict[str, list[float]] = {"memmap": [], "zarr": []}
    for _ in range(repeats):
        for label, load in loads.items():
            ds = open_dataset(f"lowdim-{label}", root)  # fresh: nothing read yet
            t = time.perf_counter()
            ram = Loader(ds, BATCH, seed=0, in_memory=True)
            load.append(time.perf_counter() - t)
            if label == "zarr":
                ram_z = ram
    out["lowdim_load"] = statistics.median(loads["zarr"])
    out["lowdim_load_memmap"] = statistics.median(loads["memmap"])
    zarr_disk = Loader(low["zarr"], BATCH, seed=0, in_memory=False)
    cases = [
        Case(
            "mm-ram", "memmap, `in_memory=True`", Loader(low["memmap"], BATCH, seed=0, in_memory=True).sample
        ),
        Case("z-ram", "zarr, `in_memory=True`", ram_z.sample),
        Case("mm", "memmap, on disk", Loader(low["memmap"], BATCH, seed=0, in_memory=False).sample),
        Case("z", "zarr, on disk (rlds chunk reader)", zarr_disk.sample),
    ]
    _log("low-dim, uniform batches:")
    run_rounds(cases, repeats, seconds)
    out["lowdim"] = cases
    return out


# ----------------------------------------------------------------------------- report


def render(r: dict[str, Any], info: dict[str, Any]) -> str:
    conv = r["conversion"]
    pix = {c.key: c for c in r["pixels"]}
    low = {c.key: c for c in r["lowdim"]}
    lines = [
        *_harness.opening(SECTION, "zarr: random access and conversion against memmap", False, NOISE_NOTE),
        f"Workloads: pixels, {r['pixel_steps']:,} steps of uint8 {FRAME} observations in episodes of "
        f"{EPISODE_LENGTHS[0]}-{EPISODE_LENGTHS[1]:,} steps (random background per episode, one "
        f"changing 12 x 12 patch per frame); low-dim, {r['lowdim_steps']:,} steps of 17 float32 "
        "observations and 6 float32 actions in 1,000-step episodes. Batch "
        f"{BATCH}, uniform sampler, every TED key (`Loader(ds, {BATCH}, in_memory=False).sample()`: "
        "the files read at every batch; the default `in_memory='auto'` would load these zarr datasets "
        "into RAM). Batches/s: one "
        f"over the median call time, median of {info['repeats']} interleaved rounds (range in brackets).",
        "",
        *_harness.header(info, _harness.versions("numpy", "zarr", "numcodecs")),
        "",
        "### Conversion (CPU seconds of the builder, fewest of the runs)",
        "",
    ]
    head = ["data", "memmap", "zarr now", "zarr before", "zarr now / memmap", "zarr before / memmap"]
    rows = []
    for kind in ("pixels", "lowdim"):
        c = conv[kind]
        mm, z, old = (c[label]["cpu"] for label in ("memmap", "zarr", "zarr-old"))
        files = " / ".join(str(c[label]["files"]) for label in ("memmap", "zarr", "zarr-old"))
        rows.append(
            [kind, f"{mm:.2f}", f"{z:.2f}", f"{old:.2f}", f"{z / mm:.2f}x", f"{old / mm:.2f}x", files]
        )
    lines += _harness.table([*head, "files: memmap / zarr now / zarr before"], rows)
    full = r["convert"]
    lines += [
        "",
        f"Whole `rlds_cli.convert.convert` of a generated D4RL file of {r['lowdim_steps']:,} steps "
        "(`benchmarks/data.py`, as in the conversion section), CPU seconds: memmap "
        f"{full['memmap']:.2f}, zarr now {full['zarr']:.2f} ({full['zarr'] / full['memmap']:.2f}x), "
        f"zarr before {full['zarr-old']:.2f} ({full['zarr-old'] / full['memmap']:.2f}x).",
        "",
        "### Pixels: uniform batches",
        "",
    ]
    mm, ram = pix["mm"].median, low["mm-ram"].median
    lines += _harness.table(
        ["read path", "batches/s", "/ memmap"],
        [[c.label, c.fmt(1), f"{c.median / mm:.3f}x"] for c in r["pixels"]],
    )
    lines += ["", "### Low-dim: uniform batches", ""]
    lines += _harness.table(
        ["read path", "batches/s", "/ memmap in RAM"],
        [[c.label, c.fmt(1), f"{c.median / ram:.2f}x"] for c in r["lowdim"]],
    )
    rate = pix["z"].median / mm
    conv_pix = conv["pixels"]["zarr"]["cpu"] / conv["pixels"]["memmap"]["cpu"]
    conv_low = conv["lowdim"]["zarr"]["cpu"] / conv["lowdim"]["memmap"]["cpu"]
    fixed = r["fixed"]

    def without_fixed(kind: str) -> float:
        zarr, memmap = (conv[kind][label]["cpu"] - fixed[label] for label in ("zarr", "memmap"))
        return zarr / memmap if memmap > 0 else float("nan")

    per_byte_low, per_byte_pix = without_fixed("lowdim"), without_fixed("pixels")
    z_ram = low["z-ram"].median / ram
    load, build_wall = r["lowdim_load"], r["convert"]["zarr-wall"]
    verdict = _harness.verdict

    lines += [
        "",
        "### Goals (ratios measured in this run)",
        "",
        f"- zarr uniform pixel batches at >= {RATE_TARGET}x of memmap: {rate:.2f}x -> "
        f"{verdict(rate >= RATE_TARGET)} "
        f"(before: {pix['z-old'].median / mm:.3f}x; speed-up {pix['z'].median / pix['z-old'].median:.0f}x).",
        f"- low-dim zarr sampling at the in-RAM rate: `in_memory=True` on zarr at {z_ram:.2f}x of it on "
        f"memmap -> {verdict(z_ram >= 0.9)}; its load (opening the loader) took {load:.2f} s (memmap: "
        f"{r['lowdim_load_memmap']:.2f} s) against {build_wall:.2f} s (wall) to convert the D4RL file "
        f"-> {verdict(load <= build_wall)}.",
        f"- zarr conversion CPU within {CONVERSION_TARGET}x of memmap's: builder, pixels {conv_pix:.2f}x, "
        f"low-dim {conv_low:.2f}x; whole D4RL `convert` {full['zarr'] / full['memmap']:.2f}x -> "
        f"{verdict(max(conv_pix, conv_low, full['zarr'] / full['memmap']) <= CONVERSION_TARGET)}. "
        f"Every dataset has a cost that does not depend on its size (a build of 1,000 low-dim steps: "
        f"memmap {fixed['memmap']:.3f} s, zarr {fixed['zarr']:.3f} s CPU; zarr's part is mostly its "
        "own metadata calls, each a round trip through its event-loop thread); without it the "
        f"low-dim build's zarr/memmap ratio is {per_byte_low:.2f}x and the pixel build's "
        f"{per_byte_pix:.2f}x.",
        "",
    ]
    notes = [
        "- Conversion: `DatasetBuilder(name, backend=...)` fed the same generated blocks, `RLDS_FSYNC=0`; "
        "CPU time (`time.process_time`, all threads) around `append` and `commit` only; runs "
        "interleaved, the fewest CPU seconds of each kept (interference on this shared machine only "
        "ever adds CPU time).",
        '- The page cache holds every file (read once before timing). "Layout before" datasets are '
        'written with 512 KiB chunks and no shards, as rlds wrote zarr before; "zarr indexing" '
        "reads them through zarr's `oindex`, as rlds read them before.",
    ]
    command = "python benchmarks/zarr_bench.py --write docs/benchmarks.md"
    return "\n".join(lines[:-1] + _harness.closing(SECTION, command, notes))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown section."""
    p = _harness.parser(
        "zarr against memmap: random access and conversion", SECTION, work="zarr", seconds=(1.5, 0.3)
    )
    p.add_argument("--pixel-steps", type=int, help="pixel steps (default 30,000; quick: 5,000)")
    p.add_argument("--lowdim-steps", type=int, help="low-dim steps (default 1,000,000; quick: 100,000)")
    args = p.parse_args(argv)
    bench = _harness.start(args)
    pixel_steps = args.pixel_steps or (5_000 if bench.quick else 30_000)
    lowdim_steps = args.lowdim_steps or (100_000 if bench.quick else 1_000_000)
    bench.need_disk(3.5 * pixel_steps * int(np.prod(FRAME)) + 4 * lowdim_steps * 110)
    try:
        results = run(
            bench.work,
            pixel_steps=pixel_steps,
            lowdim_steps=lowdim_steps,
            repeats=bench.repeats,
            seconds=bench.seconds,
        )
    finally:
        bench.remove(bench.work / "root")
    bench.publish(SECTION, render(results, bench.info()), _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
