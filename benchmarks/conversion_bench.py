"""Conversion against TorchRL, every run in a fresh process (``_child_runs``), configurations
interleaved. Three measurements:

* the ``conversion`` section (default): a 1,000,000-step D4RL file (obs 17 float32, action 6
  float32, 1000-step episodes) converted by ``rlds_cli.sources.convert.convert`` (memmap and zarr, fsync
  on: the default) against TorchRL's ``MinariExperienceReplay(..., load_from_local_minari=True)``
  building its TED cache from a Minari dataset of the same episodes, warm and cold source; the
  peak RSS of the rlds conversion at 1e6 and 1e7 steps (is memory flat as the file grows?); the
  disk bytes of each cache;
* the ``minari`` section (``--minari``): rlds converting that Minari dataset itself
  (``format='minari'``, its defaults) against the same TorchRL build; the rlds cache is checked
  against the source, untimed;
* fixed costs at small sizes (``--fixed``, printed; the doc's ``convert-fixed`` section is
  written by hand from it): for each of ``--sizes``, a D4RL file (``--pixels``: the pixel file of
  ``data.write_pixel_d4rl``) through rlds ``convert`` (defaults: source hashed, content digests,
  checks, fsync, atomic publish), TorchRL's replay-buffer fill of a ``LazyMemmapStorage``
  (``_child_runs.torchrl_fill``) and the bare ``TensorDict.memmap_`` of the arrays read whole,
  every side **warm** (what its timed call needs imported first: ``_child_runs.RLDS_WARM`` and
  ``TORCHRL_WARM``; each child counts the modules its timed call still imported), the order of
  the configurations turned every round; ratios paired per round (peer seconds / rlds seconds).
  ``--before DIR``: another commit's ``rlds_cli`` under DIR in the same rounds; ``--spans N``: N
  more warm conversions of the first size in this process with perf_counter spans around the
  stages.

Usage::

    python benchmarks/conversion_bench.py [--write docs/benchmarks.md] [--quick] [--minari]
    python benchmarks/conversion_bench.py --fixed [--sizes 100000 1000000] [--repeats 5] [--pixels]
        [--spans N] [--before DIR]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _harness
import data as bench_data
from _child_runs import DATASET_ID, RLDS_WARM, Config, hwm_mb, warm_imports

#: rlds must convert in at most this fraction of TorchRL's cache-build time (both sections).
TARGET_RATIO = 3.0
#: Peak RSS at 10x the steps may be at most this factor of the 1x peak to count as flat.
FLAT_FACTOR = 1.10
MB = _harness.MB
_log = _harness.logger("conversion")


def seconds_cell(cfg: Config, digits: int = 2) -> str:
    """Median seconds with the range."""
    lo, hi = cfg.span("seconds")
    return f"{cfg.median('seconds'):.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _mb(n: float) -> str:
    return f"{n / MB:,.1f}"


def _steps(n: int) -> str:
    """``1000000`` -> ``1M``, ``100000`` -> ``100k``."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else f"{n:,}"


# ----------------------------------------------------------------------------- conversion section


def conversion(run: _harness.Run) -> str:
    """D4RL file -> cache, rlds vs TorchRL's Minari cache build; the Markdown section."""
    n_main = 100_000 if run.quick else 1_000_000
    n_big = 10 * n_main
    work = run.work
    run.need_disk(2.2 * 166 * n_big + 3 * 166 * n_main)  # the big file, one big cache, the 1x files
    d4rl, d4rl_big, minari = work / f"d4rl_{n_main}.hdf5", work / f"d4rl_{n_big}.hdf5", work / "minari"
    _harness.generate("d4rl", d4rl, n_main)
    _harness.generate("minari", minari, n_main, DATASET_ID)
    trl, rl = _harness.torchrl_config, _harness.rlds_config
    speed = [
        trl("torchrl", "TorchRL `MinariExperienceReplay` build (as shipped)", minari, work),
        trl("torchrl-content", "TorchRL build, written with content", minari, work, with_content=True),
        rl("rlds-memmap", "rlds `convert`, memmap backend", d4rl, work),
        rl("rlds-zarr", "rlds `convert`, zarr backend", d4rl, work, backend="zarr"),
        trl("torchrl-cold", "cold source: TorchRL build (as shipped)", minari, work, cold=True),
        rl("rlds-memmap-cold", "cold source: rlds `convert`, memmap", d4rl, work, cold=True),
    ]
    sources = {"d4rl": d4rl.stat().st_size, "minari": speed[0].source.stat().st_size}
    _log(f"conversion of {n_main:,} steps, {run.repeats} repeats:")
    _harness.run_configs(speed, run.repeats, work, _log)
    _harness.generate("d4rl", d4rl_big, n_big)
    sources["big"] = d4rl_big.stat().st_size
    big = [
        rl(f"rlds-{b}-big", f"rlds {b} {n_big:.0e}", d4rl_big, work, backend=b) for b in ("memmap", "zarr")
    ]
    _log(f"conversion of {n_big:,} steps, {run.repeats} repeats:")
    try:
        _harness.run_configs(big, run.repeats, work, _log)
    finally:
        run.remove(d4rl_big)
    info = run.info()
    run.remove(work / "out", d4rl, minari)
    return render_conversion(info, n_main, speed, big, sources)


def render_conversion(
    info: dict[str, Any], n: int, speed: list[Config], big: list[Config], sources: dict[str, int]
) -> str:
    c = {cfg.key: cfg for cfg in speed}
    trl, mm, zr, patched = c["torchrl"], c["rlds-memmap"], c["rlds-zarr"], c["torchrl-content"]
    loads = [r["load1"] for cfg in speed + big for r in cfg.runs]
    versions = ("rlds-cli", "torch", "torchrl", "tensordict", "minari", "gymnasium", "h5py", "numpy", "zarr")
    lines = [
        *_harness.opening(
            "conversion", "Conversion: rlds vs TorchRL `MinariExperienceReplay`", info["quick"]
        ),
        f"Workload: {n:,} steps, observation {bench_data.OBS_DIM} float32, action {bench_data.ACT_DIM} "
        f"float32, reward float32, {bench_data.EPISODE_LEN}-step episodes ending by timeout "
        f"({n // bench_data.EPISODE_LEN:,} episodes), synthetic data from `benchmarks/data.py`. rlds "
        f"converts the D4RL-format file ({_mb(sources['d4rl'])} MB: observations, actions, rewards, "
        "terminals, timeouts, next_observations; contiguous, uncompressed); TorchRL builds its TED cache "
        f"from a Minari 0.5.x HDF5 dataset with the same episodes ({_mb(sources['minari'])} MB, T+1 "
        f"observations per episode). Each number is the median of {info['repeats']} runs (range in "
        "brackets), each run in a fresh process; the timed part excludes interpreter start and imports (the "
        "process column includes them).",
        "",
        *_harness.header(info, _harness.versions(*versions)),
        _harness.load_note(
            [min(loads), max(loads)],
            "just before the runs, lowest and highest (this benchmark's own previous run adds up to 1)",
            "other processes were competing for the CPUs, so wall times (zarr's, which uses threads, most) "
            "are noisier than the CPU-time column",
        ),
        "",
        "### Time to build the cache",
        "",
    ]
    rows = []
    for cfg in speed:
        ref = c["torchrl-cold"] if cfg.cold else trl
        lo, hi = (f"{100 * v:.0f}" for v in cfg.span("cached"))
        m = cfg.median
        cells = [cfg.label, seconds_cell(cfg), f"{m('cpu_seconds'):.2f}", f"{m('wall'):.2f}"]
        cells += [
            f"{m('rss_before_mb'):,.0f}",
            f"{m('peak_rss_mb'):,.0f}",
            f"{lo}%" if lo == hi else f"{lo}-{hi}%",
        ]
        rows.append([*cells, f"{ref.median('seconds') / m('seconds'):.1f}x"])
    head = ["operation", "seconds, median (range)", "CPU s", "process wall s", "RSS after imports MB"]
    lines += _harness.table([*head, "peak RSS MB", "source in page cache", "TorchRL time / this"], rows)
    r_mm, r_zr = (trl.median("seconds") / x.median("seconds") for x in (mm, zr))
    w_mm, w_zr = (trl.median("wall") / x.median("wall") for x in (mm, zr))
    shipped_zero = all(r.get("observation_all_zero") for r in trl.runs)
    lines += [
        "",
        f"Goal: rlds converts in at most 1/{TARGET_RATIO:.0f} of TorchRL's time. memmap backend: {r_mm:.1f}x "
        f"faster, {_harness.verdict(r_mm >= TARGET_RATIO)}; zarr backend: {r_zr:.1f}x faster, "
        f"{_harness.verdict(r_zr >= TARGET_RATIO)}. Whole processes, imports included: {w_mm:.1f}x and "
        f"{w_zr:.1f}x (TorchRL's imports alone take about "
        f"{statistics.median(r['import_seconds'] for r in trl.runs):.1f} s).",
        "",
        "TorchRL check: the cache TorchRL 0.14.1 writes here "
        + (
            "**holds only zeros** (every run): it builds the TED data in RAM, then calls "
            "`td.memmap_like(path)`, which makes zero-filled (sparse) files of the right shapes and drops "
            "the data. Its time therefore leaves out writing the data, so the ratio above favours TorchRL."
            if shipped_zero
            else "holds the source's data."
        ),
        "The row *with content* swaps `memmap_like` for `memmap` (same TorchRL code otherwise) to show what "
        "a cache that holds the data costs; its first episode "
        f"{'matches' if all(r['content_ok'] for r in patched.runs) else 'does NOT match'} the source.",
        "",
        "### Peak memory as the file grows (rlds)",
        "",
        f"Peak RSS (`VmHWM` of the converting process, interpreter and imports included) for {n:,} and "
        f"{10 * n:,} steps (the larger file is {_mb(sources['big'])} MB, generated in chunks and deleted "
        "afterwards).",
        "",
    ]
    rows = []
    flat = True
    for small, large in zip((mm, zr), big, strict=True):
        growth = large.median("peak_rss_mb") / small.median("peak_rss_mb")
        flat &= growth <= FLAT_FACTOR
        cells = [small.spec.get("backend", "memmap"), f"{small.median('rss_before_mb'):.0f}"]
        cells += [f"{small.median('peak_rss_mb'):.0f}", f"{large.median('peak_rss_mb'):.0f}"]
        rows.append([*cells, f"{100 * (growth - 1):+.1f}%", seconds_cell(small), seconds_cell(large)])
    sizes = _steps(n), _steps(10 * n)
    head = ["backend", "RSS after imports MB", f"peak RSS {sizes[0]} MB", f"peak RSS {sizes[1]} MB", "growth"]
    lines += _harness.table([*head, f"seconds {sizes[0]}", f"seconds {sizes[1]}"], rows)
    nxt = patched.extra_disk.get("next/observation", {}).get("allocated", 0)
    full = patched.disk["allocated"] if patched.disk else 0
    mine = mm.disk["allocated"] if mm.disk else 0
    disk = [
        [x.label, _mb(x.disk["apparent"]), _mb(x.disk["allocated"]), f"{x.disk['files']:.0f}"]
        for x in speed
        if x.disk and not x.cold
    ]
    lines += [
        "",
        f"Goal: peak memory flat from {sizes[0]} to {sizes[1]} steps (growth at most "
        f"{100 * (FLAT_FACTOR - 1):.0f}%): {_harness.verdict(flat)}. For contrast, TorchRL's build peaks at "
        f"{trl.median('peak_rss_mb'):,.0f} MB for {sizes[0]} steps: it reads the whole HDF5 file into memory "
        "(`PersistentTensorDict.from_h5(...).to_tensordict()`) and builds the TED in RAM, so its memory "
        "grows with the dataset.",
        "",
        "### Disk use of the caches",
        "",
        *_harness.table(["cache", "apparent MB", "allocated MB", "files"], disk),
        "",
        f"TorchRL's TED stores observations twice (`observation` and `next/observation`, {_mb(nxt)} MB each) "
        "plus an int64 `episode` column and three done flags. Its cache with content, minus "
        f"`next/observation`, is {_mb(full - nxt)} MB; the rlds memmap cache is {_mb(mine)} MB "
        f"({100 * mine / full:.0f}% of TorchRL's, {100 * mine / (full - nxt):.0f}% of TorchRL's without "
        "`next/observation`): observations once plus one final observation per episode, two flags (`done` "
        "and `episode` are derived at read time), and a small episode index. TorchRL's cache as shipped "
        "allocates almost nothing because its files are never written (see above).",
    ]
    command = "make bench   # = bash benchmarks/setup_env.sh .venv-bench 2.13.0\n             #   "
    command += ".venv-bench/bin/python benchmarks/run_all.py --write docs/benchmarks.md"
    notes = [
        "- rlds, timed: `rlds_cli.sources.convert.convert(path, 'bench', format='d4rl', root=DIR, "
        "backend='memmap'|'zarr')` with `RLDS_FSYNC` unset, i.e. the default: the source is hashed (sha256) "
        "and every file is fsynced before the dataset is published.",
        "- TorchRL, timed: `MinariExperienceReplay('bench/synthetic-v0', batch_size=256, "
        "load_from_local_minari=True, root=DIR)` with `MINARI_DATASETS_PATH` pointing at the generated "
        "Minari root (TorchRL does not fsync).",
        "- Each run: previous output deleted, `sync()`, then the source is read once (warm) or evicted with "
        "`posix_fadvise(POSIX_FADV_DONTNEED)` (cold); the page-cache column is the `mincore` residency of "
        "the source just before the run. Configurations are interleaved across repeats. CPU s is the "
        "child's `process_time()` (all threads) over the timed call.",
        "- Peak RSS is the child's `VmHWM` right after the timed call (interpreter and imports included; "
        "the 'after imports' figure is `VmHWM` just before the call). The child's `ru_maxrss` (from "
        f"`wait4`) agrees where it exceeds the driver's own RSS ({hwm_mb():.0f} MB), which Linux copies into "
        "a spawned child's `ru_maxrss`.",
        "- Disk: apparent = sum of file sizes, allocated = blocks actually used (sparse files count only "
        "what was written).",
    ]
    return "\n".join(lines + _harness.closing("conversion", command, notes))


# ----------------------------------------------------------------------------- minari section


def minari(run: _harness.Run) -> str:
    """A Minari dataset -> cache, rlds vs TorchRL's build; the Markdown section."""
    steps = 100_000 if run.quick else 1_000_000
    work = run.work
    root = _harness.generate("minari", work / "minari", steps, DATASET_ID)
    torchrl = _harness.torchrl_config("torchrl", "TorchRL `MinariExperienceReplay` build", root, work)
    spec = {"kind": "rlds", "source": str(root / DATASET_ID), "format": "minari", "check_minari": True}
    rlds = Config(
        "rlds", "rlds `convert` (format minari, memmap)", torchrl.source, spec, work / "out" / "rlds"
    )
    rlds.spec["root"] = str(rlds.output)
    try:
        _harness.run_configs([torchrl, rlds], run.repeats, work, _log)
    finally:
        run.remove(root)
    info = run.info()
    base = torchrl.median("seconds")
    rows = []
    for cfg in (torchrl, rlds):
        m = cfg.median
        disk = cfg.disk["allocated"] if cfg.disk else 0
        cells = [cfg.label, seconds_cell(cfg), f"{m('cpu_seconds'):.2f}", f"{m('wall'):.2f}"]
        rows.append([*cells, f"{m('peak_rss_mb'):.0f}", _mb(disk), f"{base / m('seconds'):.1f}x"])
    ratio, wall = base / rlds.median("seconds"), torchrl.median("wall") / rlds.median("wall")
    head = ["operation", "seconds, median (range)", "CPU s", "process wall s", "peak RSS MB", "cache MB"]
    lines = [
        *_harness.opening(
            "minari", "Minari dataset -> cache: rlds vs TorchRL `MinariExperienceReplay`", info["quick"]
        ),
        f"Workload: one Minari 0.5.x HDF5 dataset (`benchmarks/data.py minari`), {steps // 1000:,} episodes "
        f"of 1,000 steps ({steps:,} steps), observation 17 float32, action 6 float32, read from the page "
        "cache by both sides. rlds converts it (`convert(<dataset dir>, format='minari')`, with its "
        "defaults: sha256 of the source files, fsync before publishing); TorchRL builds its TED cache "
        f"(`MinariExperienceReplay(id, load_from_local_minari=True)`). Median of {info['repeats']} runs per "
        "side, interleaved, each in a fresh process; the timed part excludes interpreter start and imports "
        "(the process column includes them).",
        "",
        *_harness.header(
            info, _harness.versions("rlds-cli", "torch", "torchrl", "tensordict", "minari", "h5py")
        ),
        "",
        *_harness.table([*head, "TorchRL time / this"], rows),
        "",
        f"Goal: rlds at least {TARGET_RATIO:.0f}x faster than TorchRL: **{ratio:.1f}x**, "
        f"{_harness.verdict(ratio >= TARGET_RATIO)} (whole processes, imports included: {wall:.1f}x).",
        "",
        "Content check (untimed): every episode of the rlds cache equals the source's observations, next "
        "observations, actions and rewards: "
        f"**{'yes' if all(r['content_ok'] for r in rlds.runs) else 'NO'}**. TorchRL's cache holds the data: "
        f"**{'yes' if all(r['content_ok'] for r in torchrl.runs) else 'no'}** (TorchRL 0.14.1 writes its "
        "cache with `memmap_like`, which keeps shapes but not values; see the conversion section above).",
    ]
    command = (
        "python benchmarks/conversion_bench.py --minari --write docs/benchmarks.md   # also run by make bench"
    )
    return "\n".join(lines + _harness.closing("minari", command))


# ----------------------------------------------------------------------------- fixed costs


def spans(src: Path, work: Path, runs: int) -> dict[str, list[float]]:
    """rlds's conversion of ``src``, warm, ``runs`` times in this process, with perf_counter
    spans (inclusive, in seconds) around its stages; the first run (imports) is left out."""
    warm_imports(RLDS_WARM)
    from rlds_cli.cache import builder, transaction
    from rlds_cli.cache.backends import memmap
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.formats import d4rl
    from rlds_cli.sources import convert as convert_mod

    totals: dict[str, float] = {}

    def wrap(owner: Any, attr: str, span: str) -> None:
        inner = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                totals[span] = totals.get(span, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)

    for owner, attr, span in [
        (builder.DatasetBuilder, "__enter__", "lock + build folder"),
        (d4rl.D4RLReader, "__init__", "open + inspect HDF5"),
        (d4rl.D4RLReader, "_read", "HDF5 reads"),
        (d4rl.D4RLReader, "_read_inside", "HDF5 reads"),
        (d4rl, "rows_equal", "check next_obs == obs[t+1]"),
        (d4rl, "insert_rows", "flat layout (final obs)"),
        (convert_mod, "_count_nans", "NaN counts"),
        (builder.DatasetBuilder, "_check_block", "TED checks of a block"),
        (builder.DatasetBuilder, "append", "append (writes + digests)"),
        (memmap.NpyColumnWriter, "append", "file writes"),
        (convert_mod.SourceHash, "checked", "wait for the source sha256"),
        (builder.DatasetBuilder, "commit", "commit (all below)"),
        (transaction, "fsync_tree", "fsync files + folders"),
        (transaction, "write_manifest", "manifest (+ fsync)"),
        (CacheRoot, "publish", "publish rename (+ fsync)"),
    ]:
        wrap(owner, attr, span)
    out: dict[str, list[float]] = {}
    root = work / "out" / "spans"
    for i in range(runs + 1):
        shutil.rmtree(root, ignore_errors=True)
        os.sync()
        totals.clear()
        t0 = time.perf_counter()
        convert_mod.convert(src, "bench", format="d4rl", root=root)
        totals["total"] = time.perf_counter() - t0
        if i:  # the first run pays the imports
            for span, seconds in totals.items():
                out.setdefault(span, []).append(seconds)
    shutil.rmtree(root, ignore_errors=True)
    return out


def ms(values: list[float]) -> str:
    """``median (min-max)`` in milliseconds."""
    return f"{1e3 * statistics.median(values):.1f} ({1e3 * min(values):.1f}-{1e3 * max(values):.1f})"


def fixed(run: _harness.Run, sizes: list[int], pixels: bool, before: Path | None, span_runs: int) -> str:
    """The fixed-cost runs; their report (the result table, paired ratios to rlds per round, the
    cold imports and the modules imported inside the timers)."""
    repeats = run.args.repeats or (1 if run.quick else 5)
    groups: list[list[Config]] = []
    for n in sizes:
        src = run.work / f"{'pixels' if pixels else 'd4rl'}-{n}.hdf5"
        if not src.exists():
            (bench_data.write_pixel_d4rl if pixels else bench_data.write_d4rl)(src, n)
        sides = [("rlds", "rlds convert", "rlds", _harness.REPO), ("rb", "TorchRL rb fill", "rb-fill", None)]
        sides += [("td", "TensorDict memmap_", "td-memmap", None)]
        sides += [("before", "rlds before", "rlds", before.resolve())] if before else []
        group = []
        for key, label, kind, code in sides:
            out = run.work / "out" / f"{key}-{n}"
            spec = {"kind": kind, "source": str(src), "root": str(out), "warm": True}
            group.append(Config(f"{key}-{n}", label, src, spec | ({"code": str(code)} if code else {}), out))
        groups.append(group)
    lines = []
    if span_runs:
        found = spans(groups[0][0].source, run.work, span_runs)
        lines += [f"rlds warm conversion of {sizes[0]:,} steps, {span_runs} runs, spans (inclusive) in ms:"]
        lines += [
            f"  {span}: {ms(v)}"
            for span, v in sorted(found.items(), key=lambda kv: -statistics.median(kv[1]))
        ]
        lines.append("")
    configs = [cfg for group in groups for cfg in group]
    loads = []
    for rep in range(repeats):  # the order turns every round: no configuration always runs first
        shift = rep % len(configs)
        loads.append(os.getloadavg()[0])
        _harness.run_configs(configs[shift:] + configs[:shift], 1, run.work, _log)
    info = run.info()
    lines += [*_harness.header(info, _harness.versions("torch", "torchrl", "tensordict", "h5py", "numpy"))]
    lines += [
        f"- {repeats} rounds; 1-minute load average at each round: {', '.join(f'{x:.1f}' for x in loads)}.",
        "",
    ]
    rows = []
    imports: dict[str, list[float]] = {}
    in_timer: dict[str, int] = {}
    names: set[str] = set()
    for n, group in zip(sizes, groups, strict=True):
        for cfg in group:
            cells = [
                f"{n:,}",
                cfg.label,
                seconds_cell(cfg, 3),
                f"{cfg.median('cpu_seconds'):.3f}",
                f"{cfg.median('peak_rss_mb'):.0f}",
            ]
            for measure in ("seconds", "cpu_seconds"):
                ratio = [b[measure] / a[measure] for a, b in zip(group[0].runs, cfg.runs, strict=True)]
                cells.append("-" if cfg is group[0] else _harness.span(ratio, ".2f", "x"))
            rows.append(cells)
            imports.setdefault(cfg.label, []).extend(r["import_seconds"] for r in cfg.runs)
            in_timer[cfg.label] = max(in_timer.get(cfg.label, 0), *(r["imports_in_timer"] for r in cfg.runs))
            names.update(name for r in cfg.runs for name in r["imported"])
    head = [f"{'pixel' if pixels else 'low-dim'} steps", "operation", "wall s, median (range)", "CPU s"]
    lines += _harness.table([*head, "peak RSS MB", "wall / rlds's", "CPU / rlds's"], rows)
    lines += [
        "",
        "Cold imports (before each timer, not in the table; median (range) ms): "
        + "; ".join(f"{label} {ms(v)}" for label, v in imports.items())
        + ".",
        "Modules imported inside the timer (most in any run): "
        + ", ".join(f"{label} {n}" for label, n in in_timer.items())
        + (f" ({', '.join(sorted(names))})" if names else "")
        + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one of the three measurements; print (and write) its Markdown."""
    p = _harness.parser(__doc__.splitlines()[0], "conversion", work="conversion", repeats=(3, 1))
    p.add_argument("--minari", action="store_true", help="the minari section instead")
    p.add_argument("--fixed", action="store_true", help="fixed costs at small sizes instead (printed)")
    p.add_argument(
        "--sizes", type=int, nargs="+", help="--fixed: steps (default 100000 1000000; quick 10000)"
    )
    p.add_argument("--pixels", action="store_true", help="--fixed: pixel files (data.write_pixel_d4rl)")
    p.add_argument("--spans", type=int, default=0, help="--fixed: warm in-process runs with stage spans")
    p.add_argument("--before", type=Path, help="--fixed: a folder holding another commit's rlds_cli package")
    args = p.parse_args(argv)
    run = _harness.start(args)
    if args.fixed:
        sizes = args.sizes or ([10_000] if run.quick else [100_000, 1_000_000])
        print(fixed(run, sizes, args.pixels, args.before, args.spans))
        run.remove(run.work)
    elif args.minari:
        run.publish("minari", minari(run), _log)
    else:
        run.publish("conversion", conversion(run), _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
