"""Sampling section: the rlds loader vs TorchRL 0.14.1 replay buffers vs the lean raw gather, on
the same generated low-dim data (``benchmarks/data.py``), batch 256: uniform, slices, prioritized
and epochs, memmap and in RAM, side by side and as paired ratios, then batch rates against the
dataset's size. Usage: ``python benchmarks/loader_bench.py [--write FILE] [--quick]`` (in the
bench environment). TorchRL's prioritized sampler needs its C++ extension, whose prebuilt binary
does not load against torch 2.13; ``--build-extension-only`` (and, unless
``--no-build-extension``, every run) rebuilds it from the sources the wheel ships into the
running environment.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness
import _sides
import data as bench_data
import numpy as np
import torch
from _harness import Case
from _sides import BATCH, NUM_SLICES, SLICES, Raw

SECTION = "loader"
#: A rate measurement's windows: its value is the fastest window's rate (see :func:`run_case`).
WINDOWS = 10
#: Ratios also measured paired (calls alternating), with their goals: issue 14's against the lean
#: raw gather, the loader issue's against TorchRL.
PAIRED = (
    "rlds-mm/raw-mm>=0.9 rlds-ram-unpacked/raw-ram rlds-ram/raw-packed>=0.8 rlds-ram/raw-ram>=0.8 "
    "rlds-slice/raw-slice>=0.9 rlds-slice-ram/raw-slice-ram rlds-mm/trl-uniform>=5 "
    "rlds-ram/trl-uniform>=5 rlds-slice/trl-slice-cached>=10 rlds-slice/trl-compat-slice "
    "rlds-prio/trl-prio>=4 rlds-prio-np/trl-prio"
)
#: Ratios of the rates alone. TorchRL's ``SliceSampler`` over rlds's ``make_replay_buffer`` must
#: stay within 10x of rlds's slices (issue 16).
RATES = (
    "rlds-mm-pf/raw-mm rlds-mm-pf/trl-uniform rlds-ram-unpacked/trl-uniform rlds-dev/raw-packed "
    "rlds-dev/trl-uniform rlds-slice/trl-slice rlds-slice-ram/trl-slice-cached "
    "trl-compat-slice/rlds-slice>=0.1 rlds-prio-ram/trl-prio rlds-epoch/trl-epoch>=3 "
    "rlds-epoch/raw-epoch rlds-epoch-ram/trl-epoch rlds-epoch-ram/raw-epoch-ram"
)
_log = _harness.logger("loader")


def ensure_dataset(steps: int, work: Path) -> Any:
    """An rlds memmap cache of ``steps`` benchmark steps (built once, kept in ``work``)."""
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.errors import DatasetNotFoundError
    from rlds_cli.sources.convert import convert

    root, name = work / "root", f"bench-{steps}"
    try:
        return open_dataset(name, root)
    except DatasetNotFoundError:
        pass
    src = bench_data.write_d4rl(work / f"d4rl_{steps}.hdf5", steps)
    os.environ.setdefault("RLDS_FSYNC", "0")
    convert(src, name, format="d4rl", root=root, backend="memmap")
    src.unlink()
    return open_dataset(name, root)


# ----------------------------------------------------------------------------- TorchRL


def ensure_torchrl_extension(work: Path) -> bool:
    """Make ``torchrl._torchrl`` (the segment trees) load, rebuilding it if needed; whether it
    loads in this process (a rebuilt one loads in a fresh process only)."""
    try:
        from torchrl._torchrl import SumSegmentTreeFp32  # noqa: F401

        return True
    except ImportError:
        pass
    import torchrl

    pkg = Path(torchrl.__file__).parent
    src = pkg / "csrc"
    if not (src / "pybind.cpp").exists():
        _log("torchrl C++ sources missing; prioritized comparison skipped")
        return False
    build = work / "torchrl-ext"
    build.mkdir(parents=True, exist_ok=True)
    (build / "setup.py").write_text(
        "from setuptools import setup\n"
        "from torch.utils.cpp_extension import BuildExtension, CppExtension\n"
        f"src = {str(src)!r}\n"
        "setup(name='torchrl_ext_rebuild', ext_modules=[CppExtension('_torchrl', "
        "[src + '/pybind.cpp', src + '/utils.cpp'], include_dirs=[src])], "
        "cmdclass={'build_ext': BuildExtension})\n"
    )
    _log("rebuilding torchrl's C++ extension against the installed torch (a few minutes)...")
    cmd = [sys.executable, "setup.py", "build_ext", "--inplace"]
    proc = subprocess.run(cmd, cwd=build, capture_output=True, text=True)
    built = sorted(build.glob("_torchrl*.so"))
    if proc.returncode != 0 or not built:
        _log(f"extension build failed:\n{proc.stderr[-2000:]}")
        return False
    for old in pkg.glob("_torchrl*.so"):
        if not old.with_suffix(".so.orig").exists():
            shutil.copy2(old, old.with_suffix(".so.orig"))
    shutil.copy2(built[0], pkg / built[0].name)
    _log(f"installed {built[0].name} into {pkg}")
    return False


def extension_loads() -> bool:
    """Whether torchrl's C++ extension loads in a fresh process."""
    check = [sys.executable, "-c", "from torchrl._torchrl import SumSegmentTreeFp32"]
    return subprocess.run(check, capture_output=True).returncode == 0


def compat_slice(ds: Any) -> Callable[[], Any]:
    """``rb.sample`` of TorchRL's ``SliceSampler`` over rlds's TorchRL storage (no copy of the data)."""
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    sampler = SliceSampler(num_slices=NUM_SLICES, traj_key="episode")
    return make_replay_buffer(ds, batch_size=BATCH, sampler=sampler).sample  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- measuring


def run_case(case: Case, seconds: float) -> float:
    """One rate of ``case``: batches per second over about ``seconds`` (epoch cases: seconds per epoch).

    The time is cut into :data:`WINDOWS` windows and the run's rate is that of the fastest
    window: on a machine shared with other jobs, the least disturbed stretch is the closest to
    what the code costs, and every configuration is measured the same way.
    """
    if case.epoch:
        t = time.perf_counter()
        case.fn()
        value = time.perf_counter() - t
    else:
        for _ in range(10):
            case.fn()
        value, end = 0.0, time.perf_counter() + seconds
        while True:
            calls, t = 0, time.perf_counter()
            while True:
                for _ in range(10):
                    case.fn()
                calls += 10
                elapsed = time.perf_counter() - t
                if elapsed >= seconds / WINDOWS:
                    break
            value = max(value, calls / elapsed)
            if t + elapsed >= end:
                break
    case.rates.append(value)
    return value


def interleave(cases: list[Case], repeats: int, seconds: float) -> None:
    """Run every case ``repeats`` times, all cases per round."""
    for rep in range(repeats):
        for case in cases:
            value = run_case(case, seconds)
            unit = "s/epoch" if case.epoch else "batches/s"
            _log(f"  [{rep + 1}/{repeats}] {case.label}: {value:,.2f} {unit}")


def sample_update(owner: Any, rng: np.random.Generator, trl: bool = False) -> Callable[[], None]:
    """A prioritized draw and the update of its priorities: ``owner`` a ``Loader`` (its batch's
    ``index``), a sampler alone (its draw's ``indices``) or a TorchRL buffer (``trl``)."""

    def step() -> None:
        drawn = owner.sample()
        index = drawn.indices if hasattr(drawn, "indices") else drawn["index"]
        new = rng.random(len(index)) + 0.01
        owner.update_priority(index, torch.from_numpy(new).float() if trl else new)

    return step


def epoch(loader: Any) -> Callable[[], int]:
    return lambda: sum(1 for _ in loader)


def build_cases(ds: Any, work: Path, torchrl: bool, prioritized: bool) -> list[Case]:
    """The side-by-side cases on the main dataset."""
    from rlds_cli.loader import Loader, PrioritizedSampler

    loader = functools.partial(Loader, ds, BATCH)  # labels are for the log: the table has its own
    ram = loader(in_memory=True)
    raw = Raw(ds, ram._host._packed, ram._host._block_plan)
    rng = np.random.default_rng(1)
    numpy_tree = PrioritizedSampler(ds.num_steps, BATCH, compiled=False)
    cases = [
        Case("raw-mm", "lean raw gather, memmap (plain views)", raw.uniform_memmap),
        Case("rlds-mm", "rlds, memmap", loader().sample),
        Case("rlds-mm-pf", "rlds, memmap, prefetch=2", loader(prefetch=2).sample),
        Case("raw-ram", "lean raw gather, RAM, one take per key", raw.uniform_ram),
        Case(
            "rlds-ram-unpacked", "rlds, in_memory=True, pack=False", loader(in_memory=True, pack=False).sample
        ),
        Case("raw-packed", "lean raw gather, RAM, rlds packed layout", raw.uniform_packed),
        Case("rlds-ram", "rlds, in_memory=True (packed)", ram.sample),
        Case("rlds-dev", "rlds, in_memory='device' (CPU tensors)", loader(in_memory="device").sample),
        Case("raw-slice", "lean raw gather, slices, memmap", raw.slices_memmap),
        Case("raw-slice-ram", "lean raw gather, slices, RAM", raw.slices_ram),
        Case("rlds-slice", "rlds slices, memmap", loader(**SLICES).sample),
        Case("rlds-slice-ram", "rlds slices, in_memory=True", loader(**SLICES, in_memory=True).sample),
        Case("rlds-prio", "rlds prioritized, memmap", sample_update(loader(sampler="prioritized"), rng)),
        Case(
            "rlds-prio-np", "rlds prioritized, numpy kernels", sample_update(loader(sampler=numpy_tree), rng)
        ),
        Case(
            "rlds-prio-ram",
            "rlds prioritized, RAM",
            sample_update(loader(sampler="prioritized", in_memory=True), rng),
        ),
        Case("raw-epoch", "lean raw gather epoch, memmap", lambda: raw.epoch(raw.cols), epoch=True),
        Case("raw-epoch-ram", "lean raw gather epoch, RAM", lambda: raw.epoch(raw.ram), epoch=True),
        Case("rlds-epoch", "rlds epoch, memmap", epoch(loader(sampler="epoch")), epoch=True),
        Case(
            "rlds-epoch-ram",
            "rlds epoch, in_memory=True",
            epoch(loader(sampler="epoch", in_memory=True)),
            epoch=True,
        ),
    ]
    if torchrl:
        from torchrl.data import PrioritizedSampler as TorchRLPrioritized
        from torchrl.data import RandomSampler, SamplerWithoutReplacement, SliceSampler

        samplers: dict[str, Callable[[], Any]] = {}
        if prioritized:  # first: its sampler must see the extends
            samplers["prioritized"] = lambda: TorchRLPrioritized(ds.num_steps, alpha=0.6, beta=0.4)
        samplers |= {
            "uniform": RandomSampler,
            "slice": lambda: SliceSampler(num_slices=NUM_SLICES, traj_key="episode"),
            "slice-cached": lambda: SliceSampler(
                num_slices=NUM_SLICES, traj_key="episode", cache_values=True
            ),
            "epoch": lambda: SamplerWithoutReplacement(drop_last=False),
        }
        rbs = _sides.torchrl_buffers(ds, samplers, work / "torchrl")
        cases += [
            Case("trl-uniform", "TorchRL `RandomSampler`", rbs["uniform"].sample),
            Case("trl-slice", "TorchRL `SliceSampler`", rbs["slice"].sample),
            Case("trl-slice-cached", "TorchRL `SliceSampler(cache_values=True)`", rbs["slice-cached"].sample),
            Case("trl-epoch", "TorchRL `SamplerWithoutReplacement` epoch", epoch(rbs["epoch"]), epoch=True),
            Case(
                "trl-compat-slice", "TorchRL `SliceSampler` over rlds `make_replay_buffer`", compat_slice(ds)
            ),
        ]
        if prioritized:
            update = sample_update(rbs["prioritized"], rng, trl=True)
            cases.append(Case("trl-prio", "TorchRL `PrioritizedSampler` sample+update", update))
    return cases


def scaling_cases(datasets: dict[int, Any]) -> list[Case]:
    """rlds batch rates at each dataset size, with raw numpy on the same layout for reference, and
    the samplers alone (indices, no data): what "sampling cost" is, without the memory system's
    cost of fetching random rows from a larger array."""
    from rlds_cli.loader import Loader

    rng = np.random.default_rng(2)
    cases = []
    for steps, ds in datasets.items():
        tag = f"{steps:.0e}".replace("+0", "")
        loader = functools.partial(Loader, ds, BATCH)
        ram = loader(in_memory=True)
        raw = Raw(ds, ram._host._packed, ram._host._block_plan)
        cases += [
            Case(f"{key}-{steps}", f"{label} {tag}", fn)
            for key, label, fn in [
                ("raw-mm", "lean raw memmap", raw.uniform_memmap),
                ("raw-packed", "lean raw packed", raw.uniform_packed),
                ("uniform-mm", "uniform memmap", loader().sample),
                ("uniform-ram", "uniform RAM", ram.sample),
                ("slice-mm", "slice memmap", loader(**SLICES).sample),
                ("prio-mm", "prioritized s+u memmap", sample_update(loader(sampler="prioritized"), rng)),
                ("idx-uniform", "uniform indices", loader().sampler.sample),
                ("idx-slice", "slice indices", loader(**SLICES).sampler.sample),
                (
                    "idx-prio",
                    "prioritized indices + update",
                    sample_update(loader(sampler="prioritized").sampler, rng),
                ),
            ]
        ]
    return cases


# ----------------------------------------------------------------------------- report


def render(
    c: dict[str, Case], scaling: list[Case], info: dict[str, Any], paired: dict[tuple[str, str], list[float]]
) -> str:
    """The Markdown section."""
    lines = [
        *_harness.opening(
            SECTION, "Sampling: rlds loader vs TorchRL replay buffers vs raw numpy", info["quick"]
        ),
        f"Workload: {info['steps']:,} steps (observation {bench_data.OBS_DIM} float32, action "
        f"{bench_data.ACT_DIM} float32, {bench_data.EPISODE_LEN}-step episodes), batch {BATCH}, slices "
        f"{NUM_SLICES}x{_sides.SLICE_LEN}. Every case returns the full TED transition (rlds: observation, "
        "action, episode, next/observation, next/reward, next/done, next/terminated, next/truncated, index, "
        f"as torch tensors; TorchRL: the same as a TensorDict). Medians of {info['repeats']} interleaved "
        "runs in one process (range in brackets); batches/s unless marked seconds. The raw reference is the "
        "**lean raw gather**: `np.take` per key with one index vector on plain ndarrays (plain views of the "
        "memory maps, not `np.memmap` objects, whose subclass hooks run on every gather; plain arrays in "
        "RAM; for the packed layout, one take of the packed rows and a view per key), the same keys as rlds "
        "(next/observation rebuilt from the flat rows, next/done, episode, index, the slices' mask), then "
        "one `torch.from_numpy` per key: no "
        'dict, no checks. Every "x of raw" below is against it.',
        "",
        *_harness.header(info, info["versions"]),
        "",
        *_harness.rates_table(c.values()),
        "",
        *_harness.ratios_table(c, _harness.ratio_goals(PAIRED + " " + RATES), paired),
        "",
        f"- Prioritized sampling: {info['kernels']}.",
        "- Note: with one intra-op thread TorchRL runs about twice as fast here as the orientation figures "
        "of the loader issue (uniform 1,450-2,200 batches/s, prioritized 870-1,040 it/s, epoch 2.0-2.3 s, "
        "measured with torch's default threads), so these ratios are against a faster peer.",
    ]
    if "trl-uniform" not in c:
        lines.append("- TorchRL was not installed in this environment: no ratios to TorchRL.")
    elif not info["prioritized"]:
        lines.append("- TorchRL's prioritized sampler could not run (its C++ extension did not load).")
    lines += ["", "### Batch rate vs dataset size (rlds)", "", *render_scaling(scaling, paired)]
    notes = [
        "- Data: `benchmarks/data.py` converted with `rlds_cli.sources.convert.convert` (memmap); TorchRL's "
        "buffers "
        "hold the same transitions (`rb.extend` of the full TED TensorDict into one `LazyMemmapStorage`, "
        "which every sampler's buffer shares). Every file is read once before timing.",
        "- rlds: `Loader(ds, 256, sampler=..., in_memory=...).sample()`; prioritized: then "
        "`loader.update_priority(batch['index'], new)`; epoch: `for b in loader` (3,907 batches). TorchRL: "
        "`rb.sample()`, `rb.update_priority(td['index'], new)`, `for td in rb` with "
        "`SamplerWithoutReplacement`"
        + (
            "; its prioritized sampler on the C++ extension rebuilt against torch 2.13."
            if info["prioritized"]
            else "; its prioritized sampler did not run (its prebuilt C++ extension does not load "
            "against torch 2.13, and `--no-build-extension` kept it from being rebuilt)."
        ),
        f"- torch intra-op threads: {info['threads']} for every configuration (see `_harness.start`).",
        f"- Rates: 10 warm-up calls, then calls for about {info['seconds']} s in {WINDOWS} windows, the "
        "run's rate its fastest window's (the least disturbed stretch of this shared machine); "
        f"{info['repeats']} rounds, each configuration once a round; median round (range).",
        _harness.PAIRED_NOTE.format(seconds=2 * info["seconds"])
        + " Alternating with TorchRL's calls, which touch far more memory a batch, slows the rlds calls "
        "after them, so the paired ratios to TorchRL come out lower; the goals against TorchRL are judged "
        "on the rates, those against the lean raw gather (the same footprint) on the pairs.",
    ]
    return "\n".join(lines + _harness.closing(SECTION, info["command"], notes))


def render_scaling(scaling: list[Case], paired: dict[tuple[str, str], list[float]]) -> list[str]:
    """The batch rate vs dataset size table and its goals."""
    sizes = sorted({int(k.key.rsplit("-", 1)[1]) for k in scaling})
    by_key = {k.key: k for k in scaling}
    kinds = {
        "raw-mm": "lean raw gather, memmap (reference)",
        "raw-packed": "lean raw gather, RAM packed (reference)",
        "uniform-mm": "uniform, memmap",
        "uniform-ram": "uniform, RAM",
        "slice-mm": "slice 8x32, memmap",
        "prio-mm": "prioritized sample+update, memmap",
        "idx-uniform": "uniform sampler alone (indices)",
        "idx-slice": "slice sampler alone (indices)",
        "idx-prio": "prioritized sampler alone (indices + update)",
    }
    rows = []
    change: dict[str, float] = {}
    relative: dict[str, float] = {}
    for kind, label in kinds.items():
        values = [by_key[f"{kind}-{s}"] for s in sizes]
        change[kind] = values[-1].median / values[0].median
        rows.append([label, *(v.fmt() for v in values), f"{change[kind]:.2f}"])
    for kind, ref, label in [
        ("uniform-mm", "raw-mm", "uniform memmap / raw"),
        ("uniform-ram", "raw-packed", "uniform RAM / raw"),
    ]:
        pairs = [(f"{kind}-{s}", f"{ref}-{s}") for s in sizes]
        shares = [
            statistics.median(paired[p]) if p in paired else by_key[p[0]].median / by_key[p[1]].median
            for p in pairs
        ]
        relative[kind] = shares[-1] / shares[0]
        rows.append([f"{label} (paired)", *(f"{v:.2f}x" for v in shares), f"{relative[kind]:.2f}"])
    ok = _harness.verdict
    batches = ("uniform-mm", "uniform-ram", "slice-mm", "prio-mm")
    return [
        *_harness.table(["sampler", *(f"{s:,} steps" for s in sizes), "largest / smallest"], rows),
        "",
        "- Sampling cost (the samplers alone, no data) the same at every size (largest/smallest >= 0.7): "
        f"uniform {change['idx-uniform']:.2f}, slice {change['idx-slice']:.2f}: "
        f"{ok(min(change['idx-uniform'], change['idx-slice']) >= 0.7)} (O(batch): a draw per index, a "
        f"`searchsorted` over per-episode window counts for slices). Prioritized {change['idx-prio']:.2f}: "
        f"{ok(change['idx-prio'] >= 0.7)}: its work grows only with the tree's depth (log32 N), but each "
        "draw and update reads a random row of a tree holding 8 bytes a step (80 MB at 10^7 steps): in the "
        "CPU caches at 10^5 steps, a cache miss a row at 10^7, as for any sum tree (TorchRL's included) and "
        "for the data rows below.",
        f"- Whole batches the same at every size: {ok(all(change[k] >= 0.7 for k in batches))} (uniform "
        f"memmap {change['uniform-mm']:.2f}, uniform RAM {change['uniform-ram']:.2f}, slice "
        f"{change['slice-mm']:.2f}, prioritized {change['prio-mm']:.2f}). Raw numpy on the same arrays loses "
        f"as much ({change['raw-mm']:.2f} on memmap, {change['raw-packed']:.2f} in RAM): random rows of 10^5 "
        "steps (7 MB) stay in the CPU caches, those of 10^7 steps (680 MB) miss the caches and the TLB. The "
        "loader's share of raw numpy falls by at most 15% from the smallest size to the largest: "
        f"{ok(all(v >= 0.85 for v in relative.values()))}.",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown section."""
    p = _harness.parser(
        "rlds loader vs TorchRL vs raw numpy sampling",
        SECTION,
        work="loader",
        repeats=(5, 2),
        seconds=(0.5, 0.2),
    )
    p.add_argument("--no-torchrl", action="store_true", help="skip the TorchRL side")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--no-build-extension", action="store_true", help="never rebuild torchrl's extension")
    p.add_argument(
        "--build-extension-only",
        action="store_true",
        help="make torchrl's C++ extension load (rebuild it if needed), then exit: 0 if it loads",
    )
    args = p.parse_args(argv)
    if args.build_extension_only:
        ensure_torchrl_extension(args.work.resolve())
        loads = extension_loads()
        _log(f"torchrl's C++ extension {'loads' if loads else 'does NOT load'}")
        return 0 if loads else 1
    from rlds_cli.loader.prioritized import compiled_kernels

    run = _harness.start(args, threads=args.torch_threads)
    sizes = [10_000, 100_000, 1_000_000] if args.quick else [100_000, 1_000_000, 10_000_000]
    main_steps = sizes[-1] if args.quick else 1_000_000
    torchrl = not args.no_torchrl and importlib.util.find_spec("torchrl") is not None
    if not torchrl:
        _log("TorchRL skipped or not installed here: rlds and raw numpy only")
    build = torchrl and not args.no_build_extension
    prioritized = build and ensure_torchrl_extension(run.work)
    if build and not prioritized and extension_loads():  # a fresh build loads in a new process only
        os.execv(sys.executable, [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])])

    datasets = {}
    for steps in sizes:
        t = time.perf_counter()
        datasets[steps] = ensure_dataset(steps, run.work)
        _harness.warm_dataset(datasets[steps])
        _log(f"dataset of {steps:,} steps ready ({time.perf_counter() - t:.1f} s)")
    cases = build_cases(datasets[main_steps], run.work, torchrl, prioritized)
    _log(f"side by side on {main_steps:,} steps, {run.repeats} rounds:")
    interleave(cases, run.repeats, run.seconds)
    _log(f"paired ratios, {run.repeats} rounds:")
    paired = _harness.measure_pairs(
        {c.key: c for c in cases}, _harness.pairs(PAIRED), run.repeats, 2 * run.seconds, _log
    )
    scaling = scaling_cases(datasets)
    _log("batch rate vs dataset size:")
    interleave(scaling, run.repeats, run.seconds)
    size_pairs = [
        (f"{k}-{s}", f"{ref}-{s}")
        for s in sizes
        for k, ref in (("uniform-mm", "raw-mm"), ("uniform-ram", "raw-packed"))
    ]
    paired |= _harness.measure_pairs(
        {c.key: c for c in scaling}, size_pairs, run.repeats, 2 * run.seconds, _log
    )
    shutil.rmtree(run.work / "torchrl", ignore_errors=True)
    info = run.info(
        versions=_harness.versions("rlds-cli", "torchrl", "tensordict", "numpy")
        + f", torch {torch.__version__}",
        steps=main_steps,
        prioritized=prioritized or not torchrl,
        threads=torch.get_num_threads(),
        command="python benchmarks/loader_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        kernels="compiled sum tree, the `fast` extra"
        if compiled_kernels() is not None
        else "numpy sum tree: numba is not installed",
    )
    run.publish(SECTION, render({c.key: c for c in cases}, scaling, info, paired), _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
