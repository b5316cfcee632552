"""Conversion against TorchRL's memmap fills at small sizes: where the fixed costs show.

For each size, a D4RL-format file (``benchmarks/data.py d4rl``, or ``--pixels``: the pixel file of
``data.write_pixel_d4rl``) goes through three operations, each in a fresh child process
(``_harness.run_once``: source in the page cache, output removed and ``sync()`` first), rounds
interleaved and their order turned every round:

* **rlds**: ``convert`` (memmap backend, defaults: source hashed, content digests, checks,
  files and folders fsynced, atomic publish);
* **TorchRL rb fill**: a ``TensorDictReplayBuffer`` over ``LazyMemmapStorage`` filled from the file
  (``pixel_bench.torchrl_fill``: TED keys, 2,000 rows a ``rb.extend``; no fsync);
* **TensorDict memmap_**: the file's arrays read whole (h5py) as a TED ``TensorDict``, written by
  ``td.memmap_(dir)`` (the bare memmap fill TorchRL's storages build on; no fsync).

Fair and explicit: every side runs **warm**, i.e. everything its timed call needs is imported
before the timer (h5py on all three; torch, tensordict, torchrl for the peers; for rlds its
conversion modules, which it imports lazily, listed in :data:`RLDS_WARM`). Each child reports
the modules its timed call still imported (``imports in timer``: 0 means the sides are measured
alike), and what its imports cost, reported on their own line (a cold process pays them once).
The ratio is per round (peer seconds / rlds seconds, > 1: rlds faster); the table gives the
median and the range over the rounds. Peak RSS is ``VmHWM`` of the child.

Usage::

    python benchmarks/convert_fixed_bench.py [--sizes 100000,1000000] [--repeats 5] [--pixels]
        [--spans N] [--before DIR]

``--spans N``: also convert the first size N times in this process (warm) with perf_counter spans
around the stages (open, HDF5 reads, checks, writes, digests, source hash wait, fsync, manifest,
publish) and print their medians. ``--before DIR``: a checkout of another commit's rlds_cli, run
in the same rounds (a before/after pair).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import data as bench_data  # noqa: E402

#: What rlds's D4RL conversion imports, itself or lazily: imported before its timer, as the peers'
#: h5py, torch, tensordict and torchrl are before theirs.
RLDS_WARM = (
    "h5py",
    "rlds_cli.convert",
    "rlds_cli.formats.d4rl",
    "rlds_cli.formats.select",
    "rlds_cli.cache.views",
    "concurrent.futures.thread",
    "queue",
)
#: What the TorchRL workers import before their timers (tensordict imports orjson, when installed,
#: the first time it writes a memmap's metadata).
TORCHRL_WARM = ("h5py", "numpy", "torch", "tensordict", "torchrl.data", "orjson")
#: Imports that are skipped when not installed.
OPTIONAL = frozenset({"orjson"})


def warm_imports(names: tuple[str, ...]) -> float:
    """Import ``names``; the seconds it took (in a fresh child: the cold import cost)."""
    t0 = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            if name not in OPTIONAL:
                raise
    return time.perf_counter() - t0


def timed_warm(call: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """``_harness.timed(call)``, with the modules the call imported (none when warm)."""
    before = set(sys.modules)
    result, measured = _harness.timed(call)
    imported = sorted(set(sys.modules) - before)
    return result, {**measured, "imports_in_timer": len(imported), "imported": imported[:20]}


def worker_rlds(spec: dict[str, Any]) -> dict[str, Any]:
    """rlds's conversion, warm (:data:`RLDS_WARM` imported first), with the rlds_cli package of
    ``spec["code"]`` (this checkout, or another commit's for ``--before``)."""
    sys.path.insert(0, spec["code"])
    import_seconds = warm_imports(RLDS_WARM)
    import rlds_cli
    from rlds_cli.convert import convert

    assert rlds_cli.__file__.startswith(spec["code"]), rlds_cli.__file__
    result, measured = timed_warm(
        lambda: convert(spec["source"], "bench", format="d4rl", root=spec["root"], backend="memmap")
    )
    return {**measured, "import_seconds": import_seconds, "steps": result.manifest.num_steps}


def worker_rb_fill(spec: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's ``LazyMemmapStorage`` fill (``pixel_bench.torchrl_fill``), warm."""
    import_seconds = warm_imports(TORCHRL_WARM)
    import h5py
    import pixel_bench
    from torchrl.data import LazyMemmapStorage

    with h5py.File(spec["source"], "r") as f:
        n = int(f["observations"].shape[0])
    storage = LazyMemmapStorage(n, scratch_dir=Path(spec["root"]) / "storage")
    rb, measured = timed_warm(lambda: pixel_bench.torchrl_fill(Path(spec["source"]), storage))
    return {**measured, "import_seconds": import_seconds, "steps": len(rb)}


def worker_td_memmap(spec: dict[str, Any]) -> dict[str, Any]:
    """The bare TorchRL memmap fill: the D4RL file's arrays read whole (h5py), as a TED
    ``TensorDict`` (``episode`` and ``next/done`` computed), written by ``td.memmap_(dir)``
    (tensordict's memory-mapped tensors; no fsync), warm."""
    import_seconds = warm_imports(TORCHRL_WARM)
    import h5py
    import numpy as np
    import torch
    from tensordict import TensorDict

    def fill() -> int:
        with h5py.File(spec["source"], "r") as f:
            a = {k: f[k][()] for k in f}
        n = len(a["rewards"])
        term = torch.from_numpy(a["terminals"]).reshape(-1, 1)
        trunc = torch.from_numpy(a["timeouts"]).reshape(-1, 1)
        done = term | trunc
        ends = done.reshape(-1).long()
        td = TensorDict(
            {
                "observation": torch.from_numpy(a["observations"]),
                "action": torch.from_numpy(a["actions"]),
                "episode": torch.cumsum(ends, 0) - ends,
                "next": {
                    "observation": torch.from_numpy(a["next_observations"]),
                    "reward": torch.from_numpy(np.asarray(a["rewards"]).reshape(-1, 1)),
                    "done": done,
                    "terminated": term,
                    "truncated": trunc,
                },
            },
            batch_size=[n],
        )
        td.memmap_(spec["root"])
        return n

    steps, measured = timed_warm(fill)
    return {**measured, "import_seconds": import_seconds, "steps": steps}


WORKERS = {"rlds": worker_rlds, "rb-fill": worker_rb_fill, "td-memmap": worker_td_memmap}


def configs(src: Path, work: Path, n: int, before: Path | None) -> list[_harness.Config]:
    """rlds's conversion of ``src``, TorchRL's replay-buffer fill, the bare memmap fill, and
    rlds's conversion with the code under ``before`` when given."""

    def config(key: str, label: str, kind: str, **extra: str) -> _harness.Config:
        root = work / "out" / f"{key}-{n}"
        spec = {"module": "convert_fixed_bench", "kind": kind, "source": str(src), "root": str(root), **extra}
        return _harness.Config(f"{key}-{n}", f"{label} {n:,}", kind, src, spec, root)

    out = [
        config("rlds", "rlds convert", "rlds", code=str(HERE.parent)),
        config("rb", "TorchRL rb fill", "rb-fill"),
        config("td", "TensorDict memmap_", "td-memmap"),
    ]
    if before is not None:
        out.append(config("before", "rlds before", "rlds", code=str(before.resolve())))
    return out


# ----------------------------------------------------------------------------- spans


def spans(src: Path, work: Path, runs: int) -> dict[str, list[float]]:
    """rlds's conversion of ``src``, warm, ``runs`` times in this process, with perf_counter
    spans (inclusive, in seconds) around its stages; the first run (imports) is left out."""
    import shutil

    warm_imports(RLDS_WARM)
    from rlds_cli import convert as convert_mod
    from rlds_cli.cache import builder, memmap_backend, transaction
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.formats import d4rl

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
        (memmap_backend.NpyColumnWriter, "append", "file writes"),
        (convert_mod.SourceHash, "checked", "wait for the source sha256"),
        (builder.DatasetBuilder, "commit", "commit (all below)"),
        (transaction, "fsync_tree", "fsync files + folders"),
        (transaction, "write_manifest", "manifest (+ fsync)"),
        (CacheRoot, "publish", "publish rename (+ fsync)"),
    ]:
        wrap(owner, attr, span)
    out: dict[str, list[float]] = {}
    for i in range(runs + 1):
        root = work / "out" / "spans"
        shutil.rmtree(root, ignore_errors=True)
        os.sync()
        totals.clear()
        t0 = time.perf_counter()
        convert_mod.convert(src, "bench", format="d4rl", root=root)
        totals["total"] = time.perf_counter() - t0
        if i:
            for span, seconds in totals.items():
                out.setdefault(span, []).append(seconds)
    shutil.rmtree(work / "out" / "spans", ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- report


def ms(values: list[float]) -> str:
    """``median (min-max)`` in milliseconds."""
    return f"{1e3 * statistics.median(values):.1f} ({1e3 * min(values):.1f}-{1e3 * max(values):.1f})"


def report(all_cfgs: list[_harness.Config], sizes: list[int], per: int, pixels: bool) -> list[str]:
    """The result table (wall and CPU seconds, peak RSS, paired ratios to rlds), the imports
    line and the fairness check. A ratio is this row's seconds over rlds's in the same round,
    median (range) over the rounds: > 1, rlds is faster; the before row's is its speed-up."""
    lines = [
        f"| {'pixel' if pixels else 'low-dim'} steps | operation | wall s, median (range) | CPU s | "
        "peak RSS MB | wall / rlds's | CPU / rlds's |",
        "|---|---|---|---|---|---|---|",
    ]
    imports: dict[str, list[float]] = {}
    in_timer: dict[str, int] = {}
    names: set[str] = set()
    for i in range(0, len(all_cfgs), per):
        group = all_cfgs[i : i + per]
        r = group[0]
        for t in group:
            lo, hi = t.span("seconds")
            cells = [
                f"{sizes[i // per]:,}",
                t.label.rsplit(" ", 1)[0],
                f"{t.median('seconds'):.3f} ({lo:.3f}-{hi:.3f})",
                f"{t.median('cpu_seconds'):.3f}",
                f"{t.median('peak_rss_mb'):.0f}",
            ]
            for measure in ("seconds", "cpu_seconds"):
                ratio = [b[measure] / a[measure] for a, b in zip(r.runs, t.runs, strict=True)]
                cells.append(
                    "-" if t is r else f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})"
                )
            lines.append("| " + " | ".join(cells) + " |")
            label = t.label.rsplit(" ", 1)[0]
            imports.setdefault(label, []).extend(run["import_seconds"] for run in t.runs)
            in_timer[label] = max(in_timer.get(label, 0), *(run["imports_in_timer"] for run in t.runs))
            names.update(name for run in t.runs for name in run["imported"])
    lines.append("")
    lines.append(
        "Cold imports (before each timer, not in the table; median (range) ms): "
        + "; ".join(f"{label} {ms(v)}" for label, v in imports.items())
        + "."
    )
    lines.append(
        "Modules imported inside the timer (most in any run): "
        + ", ".join(f"{label} {n}" for label, n in in_timer.items())
        + (f" ({', '.join(sorted(names))})" if names else "")
        + "."
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--work", type=Path, default=HERE / "_work" / "convert_fixed")
    p.add_argument("--spans", type=int, default=0, help="warm in-process runs with stage spans (first size)")
    p.add_argument("--pixels", action="store_true", help="pixel files (data.write_pixel_d4rl) instead")
    p.add_argument("--before", type=Path, help="a folder holding another commit's rlds_cli package")
    args = p.parse_args(argv)
    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    sources = {}
    for n in sizes:
        src = work / f"{'pixels' if args.pixels else 'd4rl'}-{n}.hdf5"
        if not src.exists():
            (bench_data.write_pixel_d4rl if args.pixels else bench_data.write_d4rl)(src, n)
        sources[n] = src
    import datetime
    import platform

    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load0 = os.getloadavg()
    if args.spans:
        found = spans(sources[sizes[0]], work, args.spans)
        print(f"\nrlds warm conversion of {sizes[0]:,} steps, {args.spans} runs, spans (inclusive) in ms:")
        for span, values in sorted(found.items(), key=lambda kv: -statistics.median(kv[1])):
            print(f"  {span}: {ms(values)}")
    all_cfgs: list[_harness.Config] = []
    for n in sizes:
        all_cfgs += configs(sources[n], work, n, args.before)
    loads = []
    for rep in range(args.repeats):  # the order turns every round: no configuration always runs first
        shift = rep % len(all_cfgs)
        loads.append(os.getloadavg()[0])
        _harness.run_configs(all_cfgs[shift:] + all_cfgs[:shift], 1, work, print)
    print(
        f"\nMeasured {date} on {_harness.cpu_model()} ({len(os.sched_getaffinity(0))} usable of "
        f"{os.cpu_count()} CPUs); Python {platform.python_version()}; "
        f"{_harness.versions('torch', 'torchrl', 'tensordict', 'h5py', 'numpy')}; "
        f"rlds commit {_harness.commit()}."
    )
    print(
        f"{args.repeats} rounds; 1-minute load average before: {load0[0]:.1f}, at each round: "
        + ", ".join(f"{x:.1f}" for x in loads)
        + f", after: {os.getloadavg()[0]:.1f}.\n"
    )
    print("\n".join(report(all_cfgs, sizes, 4 if args.before else 3, args.pixels)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
