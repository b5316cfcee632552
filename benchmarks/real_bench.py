"""Real-frames section of ``make bench``: pixel batches on real Atari frames, every store side by side.

Data: ``benchmarks/real_frames.py`` (ale-py, a random policy over four games, DQN preprocessing),
100,000 gray 84x84 and 30,000 RGB 84x84x3 frames (quick: a tenth), the real-data counterpart of
the pixel and zarr sections' generated frames. Per frame kind: rates and paired ratios of the
lean raw gather, rlds memmap and zarr (on disk and in RAM), TorchRL and cpprb (uniform, slices
8x32, ``FrameStack(4)``); disk bytes per store; and the fresh-process batch-size sweep
(``fault_bench``'s worker, as shipped against its warmed reference). Needs ale-py, cpprb and
torchrl. Usage: ``python benchmarks/real_bench.py [--write FILE] [--quick]``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import _harness
import fault_bench
import framestack_bench
import loader_bench
import numpy as np
import pixel_bench
import real_frames

SECTION = "real"
BATCH = pixel_bench.BATCH
K = 4
MODES = ("gray", "rgb")
#: Batch sizes of the sweeps (quick: three of them).
SIZES = ((32, 128, 256, 1024, 2048, 4096, 8192), (32, 256, 4096))
PAIRS = _harness.pairs(
    "rlds-mm/raw-mm rlds-zarr/rlds-mm rlds-zarr-ram/rlds-mm rlds-mm/trl rlds-mm/cpprb "
    "rlds-slice/raw-slice rlds-zarr-slice/rlds-slice rlds-slice/trl-slice rlds-fs/raw-4x "
    "rlds-zarr-fs/rlds-fs rlds-zarr-py/rlds-mm"
)
MB = 1e6


_log = _harness.logger("real")


def cpprb_fill(source: Path, rows: int = pixel_bench.FILL_ROWS) -> Any:
    """A cpprb ``ReplayBuffer(next_of="obs")`` holding the D4RL file, added episode by episode
    (``on_episode_end`` after each, so no next frame crosses an episode)."""
    import h5py
    from cpprb import ReplayBuffer  # type: ignore[import-not-found]

    with h5py.File(source, "r") as f:
        n = int(f["observations"].shape[0])
        env = {
            "obs": {"shape": f["observations"].shape[1:], "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {},
            "done": {},
            "trunc": {},
        }
        rb = ReplayBuffer(n, env, next_of="obs")
        ends = (np.flatnonzero(f["terminals"][:] | f["timeouts"][:]) + 1).tolist()
        start = 0
        for end in ends:
            for a in range(start, end, rows):
                b = min(a + rows, end)
                rb.add(
                    obs=f["observations"][a:b],
                    next_obs=f["next_observations"][a:b],
                    act=f["actions"][a:b],
                    rew=f["rewards"][a:b],
                    done=f["terminals"][a:b].astype(np.float32),
                    trunc=f["timeouts"][a:b].astype(np.float32),
                )
            rb.on_episode_end()
            start = end
    assert rb.get_stored_size() == n
    return rb


def python_loop(sample: Any) -> Any:
    """``sample`` with zarr's chunks decoded by the Python loop, as without the ``fast`` extra
    (the compiled loop is put back after each call, so the other cases keep it)."""
    from rlds_cli.cache import zarr_blosc

    def call() -> Any:
        compiled = zarr_blosc.compiled_decode()
        zarr_blosc._compiled = None
        try:
            return sample()
        finally:
            zarr_blosc._compiled = compiled

    return call


def cases_for(mm: Any, zr: Any, trl: Any, trl_slice: Any, cpprb: Any) -> list[Any]:
    """The rate cases of one frame kind."""
    from rlds_cli.loader import FrameStack, Loader

    raw = loader_bench.Raw(mm)
    stacks = framestack_bench.Raw(mm)
    slc: dict[str, Any] = {"sampler": "slice", "slice_len": loader_bench.SLICE_LEN}
    fs = {"transform": FrameStack(K)}
    return [
        _harness.Case(*c)
        for c in [
            ("raw-mm", "lean raw gather (`np.take`, memmap)", raw.uniform_memmap),
            ("rlds-mm", "rlds `Loader`, memmap", Loader(mm, BATCH, seed=0).sample),
            (
                "rlds-zarr",
                "rlds `Loader`, zarr on disk (`in_memory=False`)",
                Loader(zr, BATCH, seed=0, in_memory=False).sample,
            ),
            (
                "rlds-zarr-py",
                "rlds `Loader`, zarr on disk, Python decode loop (no `fast` extra)",
                python_loop(Loader(zr, BATCH, seed=0, in_memory=False).sample),
            ),
            (
                "rlds-zarr-ram",
                "rlds `Loader`, zarr decoded into RAM (`in_memory=True`)",
                Loader(zr, BATCH, seed=0, in_memory=True).sample,
            ),
            ("trl", "TorchRL `RandomSampler`, `LazyMemmapStorage`", trl.sample),
            ("cpprb", 'cpprb `ReplayBuffer(next_of="obs")` (RAM)', lambda: cpprb.sample(BATCH)),
            ("raw-slice", "lean raw gather, slices 8x32, memmap", raw.slices_memmap),
            ("rlds-slice", "rlds slices 8x32, memmap", Loader(mm, BATCH, seed=0, **slc).sample),
            (
                "rlds-zarr-slice",
                "rlds slices 8x32, zarr on disk",
                Loader(zr, BATCH, seed=0, in_memory=False, **slc).sample,
            ),
            ("trl-slice", "TorchRL `SliceSampler(cache_values=True)`", trl_slice.sample),
            ("raw-4x", "raw `np.take` of 4x the frames, memmap", stacks.gather(stacks.memmap, K)),
            ("rlds-fs", "rlds `FrameStack(4)`, memmap", Loader(mm, BATCH, seed=0, **fs).sample),
            (
                "rlds-zarr-fs",
                "rlds `FrameStack(4)`, zarr on disk",
                Loader(zr, BATCH, seed=0, in_memory=False, **fs).sample,
            ),
        ]
    ]


def sweep(
    mode: str,
    root: Path,
    frame: tuple[int, ...],
    sizes: tuple[int, ...],
    repeats: int,
    work: Path,
    quick: bool,
) -> list[dict[str, Any]]:
    """Fresh-process batches per size: as shipped (buffers reused) and warmed as fault_bench
    defines it (no buffer reuse, glibc keeping freed batches for reuse)."""
    modes = {"shipped": (True, {}), "warmed": (False, fault_bench.WARM_ENV)}
    frames = 20_000 if quick else 200_000
    return fault_bench.sweep(
        root, list(sizes), modes, repeats, frames, work, _log, name="bench", frame=list(frame)
    )


def run_mode(bench: _harness.Run, mode: str) -> dict[str, Any]:
    """Generate (or reuse), convert, fill the peers, measure one frame kind."""

    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.convert import convert

    steps = real_frames.STEPS[mode][1 if bench.quick else 0]
    source = real_frames.ensure(mode, steps, log=_log)
    work = bench.work / mode
    out: dict[str, Any] = {"steps": steps, "source": source.name, "disk": {}}
    for backend in ("memmap", "zarr"):
        root = work / backend
        bench.remove(root)
        t = time.perf_counter()
        convert(source, "bench", format="d4rl", root=root, backend=backend)
        _log(f"{mode}: converted to {backend} ({time.perf_counter() - t:.1f} s)")
        out["disk"][f"rlds {backend}"] = _harness.disk_usage(root)["allocated"]
    mm, zr = open_dataset("bench", work / "memmap"), open_dataset("bench", work / "zarr")
    first = np.asarray(mm.column("observation")[0])
    frame, out["frame_bytes"] = tuple(first.shape), int(first.nbytes)
    for ds in (mm, zr):
        _harness.warm_dataset(ds)
    rbs = pixel_bench.torchrl_buffers(source, steps, work / "torchrl")
    trl, trl_slice = rbs["uniform"], rbs["slice"]
    out["disk"]["TorchRL LazyMemmapStorage"] = _harness.disk_usage(work / "torchrl")["allocated"]
    cpprb = cpprb_fill(source)
    out["disk"]["cpprb (RAM: one frame a step)"] = steps * out["frame_bytes"]
    out["disk"]["source HDF5 (obs + next obs)"] = source.stat().st_size
    cases = cases_for(mm, zr, trl, trl_slice, cpprb)
    _log(f"{mode}: {bench.repeats} rounds of rates, then paired ratios:")
    _harness.rounds(
        cases,
        bench.repeats,
        bench.seconds,
        _log,
        settle=framestack_bench.SETTLE,
        calls=framestack_bench.TIMED,
    )
    pairs = _harness.measure_pairs({c.key: c for c in cases}, PAIRS, bench.repeats, bench.seconds, _log)
    out["rates"] = {c.key: (c.label, c.rates) for c in cases}
    out["pairs"] = {f"{a}/{b}": v for (a, b), v in pairs.items()}
    _log(f"{mode}: fresh-process sweep:")
    out["sweep"] = sweep(
        mode, work / "memmap", frame, SIZES[1 if bench.quick else 0], bench.repeats, work, bench.quick
    )
    return out


# ----------------------------------------------------------------------------- report


def _ratio(values: list[float]) -> str:
    return _harness.span(values, ".2f", "x")


#: The issue's goals on real frames: zarr on disk against memmap (batches, slices, stacks), the
#: disk saved on gray frames, fresh-process batches against the warmed rate.
ZARR_GOAL, DISK_GOAL, FRESH_GOAL = 0.5, 10.0, 0.9


def goals(mode: str, r: dict[str, Any]) -> list[str]:
    """The goal lines of one frame kind, each with its measured median and met / not met."""

    def line(what: str, value: float, goal: float, shown: str) -> str:
        return f"- {what}: {shown} (goal >= {goal:g}x): **{'met' if value >= goal else 'not met'}**"

    out = []
    for pair, what in (
        ("rlds-zarr/rlds-mm", "zarr on disk / memmap, uniform batches"),
        ("rlds-zarr-slice/rlds-slice", "zarr on disk / memmap, slices 8x32"),
        ("rlds-zarr-fs/rlds-fs", "zarr on disk / memmap, `FrameStack(4)`"),
    ):
        values = r["pairs"][pair]
        out.append(line(what, statistics.median(values), ZARR_GOAL, _ratio(values)))
    saved = r["disk"]["rlds memmap"] / r["disk"]["rlds zarr"]
    if mode == "gray":
        out.append(line("memmap / zarr on disk", saved, DISK_GOAL, f"{saved:.1f}x"))
    for row in r["sweep"]:
        if row["batch"] in (256, 4096):
            values = row["shipped_ratios"]
            what = f"fresh process, {row['batch']:,} frames a batch, shipped / warmed"
            out.append(line(what, statistics.median(values), FRESH_GOAL, _ratio(values)))
    return out


def compiled_note() -> str:
    """Whether zarr reads took the compiled decode loop (the ``fast`` extra) in this run."""
    from rlds_cli.cache import zarr_blosc

    if zarr_blosc.compiled_decode() is not None:
        numba = _harness.version("numba")
        return f"zarr chunks decoded by the compiled loop (numba {numba}, the `fast` extra)"
    return "zarr chunks decoded by the Python loop (no numba, or `RLDS_NUMBA=0`)"


def render(results: dict[str, Any], info: dict[str, Any]) -> str:
    """The Markdown section."""
    steps = {mode: f"{r['steps']:,}" for mode, r in results.items()}
    lines = [
        *_harness.opening(SECTION, "Real frames: pixel batches on real Atari frames", info["quick"]),
        f"Data: `benchmarks/real_frames.py`, ale-py {_harness.version('ale-py')} (ROMs from the wheel): a "
        f"random policy over {', '.join(real_frames.GAMES)} (equal shares), sticky actions "
        f"{real_frames.STICKY}, frame skip {real_frames.FRAME_SKIP} with the max of the last two screens, "
        f"area-resized (PIL `BOX`) to 84x84 gray ({steps.get('gray', '-')} frames) and 84x84x3 RGB "
        f"({steps.get('rgb', '-')} frames); episodes end at the game's end or are cut. Converted with "
        "`rlds convert --format d4rl` (memmap and zarr, defaults). The pixel and zarr sections' noise "
        "frames stay as the compression worst case; these are the real-data figures.",
        "",
        *_harness.header(
            info,
            f"TorchRL {_harness.version('torchrl')}, tensordict {_harness.version('tensordict')}, "
            f"cpprb {_harness.version('cpprb')}",
        ),
        f"- Batches of {BATCH} with every key (obs, next obs, action, reward, flags); {info['repeats']} "
        f"rounds of {info['seconds']:g} s per configuration, interleaved; rates are the median over rounds "
        "(range); "
        "ratios come from calls alternating one by one (median call times), median (range) over rounds; "
        "GB/s counts the 2 x 256 frames of obs and next obs (not given for stacks); "
        f"{compiled_note()}.",
        "",
    ]
    for mode, r in results.items():
        rates = {k: statistics.median(v[1]) for k, v in r["rates"].items()}
        gbps = r["frame_bytes"] * 2 * BATCH / 1e9
        lines += [
            f"### {mode}: {r['steps']:,} frames of {r['frame_bytes']:,} bytes",
            "",
            "| configuration | batches/s (range) | ms a batch | obs + next obs GB/s |",
            "|---|---:|---:|---:|",
        ]
        for key, (label, values) in r["rates"].items():
            stack = key.endswith(("fs", "4x"))  # 4 frames a step: not the 2 x 256 frames of the others
            lines.append(
                f"| {label} | {statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f}) | "
                f"{1e3 / rates[key]:.2f} | {'-' if stack else f'{gbps * rates[key]:.2f}'} |"
            )
        lines += [
            "",
            *_harness.table(["paired ratio", "value"], [[p, _ratio(v)] for p, v in r["pairs"].items()]),
        ]
        base = r["disk"]["rlds memmap"]
        lines += ["", "| store | disk MB | memmap / store |", "|---|---:|---:|"]
        for store, nbytes in r["disk"].items():
            if nbytes:
                lines.append(f"| {store} | {nbytes / MB:,.0f} | {base / nbytes:.1f}x |")
        lines += [
            "",
            "Fresh process per configuration, rlds memmap `Loader.sample()` (fault_bench's worker): "
            "steady = median batch after the first two; shipped = output buffers reused (as shipped); "
            "warmed = fault_bench's reference, no reuse with glibc's thresholds raised (above 32 MiB a "
            "batch glibc maps every allocation whatever the settings); the last column is the shipped "
            "steady rate over the warmed one, per round.",
            "",
            "| batch | ns a step shipped | ns a step warmed | first batch ms shipped / warmed "
            "| faults/batch | shipped / warmed |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for row in r["sweep"]:
            b = row["batch"]
            lines.append(
                f"| {b:,} | {row['shipped'] / b * 1e9:,.0f} | {row['warmed'] / b * 1e9:,.0f} | "
                f"{row['shipped_first'] * 1e3:.2f} / {row['warmed_first'] * 1e3:.2f} | "
                f"{row['shipped_faults']:.0f} | {_ratio(row['shipped_ratios'])} |"
            )
        lines += ["", "Goals (paired ratios of this run):", "", *goals(mode, r), ""]
    lines.append(_harness.bench_doc.markers(SECTION)[1])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = _harness.parser(__doc__.splitlines()[0], SECTION, work="real", repeats=3, seconds=(2.0, 0.3))
    p.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="frame kinds (default both)"
    )
    args = p.parse_args(argv)
    import importlib.util

    missing = [m for m in ("ale_py", "cpprb", "torchrl") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(
            f"real_bench: {', '.join(missing)} not installed; create the bench environment with "
            "`bash benchmarks/setup_env.sh VENV TORCH_VERSION` and run with its python"
        )
    bench = _harness.start(args)
    results = {mode: run_mode(bench, mode) for mode in args.modes}
    info = bench.info()
    _harness.save_json(bench.work / "results.json", results)
    bench.publish(SECTION, render(results, info), _log)
    for mode in args.modes:
        bench.remove(bench.work / mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
