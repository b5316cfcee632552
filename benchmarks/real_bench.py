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

import functools
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any

import _harness
import _sides
import fault_bench
import numpy as np
import real_frames
from _child_runs import FILL_ROWS
from _harness import Case
from _sides import BATCH, SLICES, sample

SECTION = "real"
MODES = ("gray", "rgb")
#: Batch sizes of the sweeps (quick: three of them).
SIZES = ((32, 128, 256, 1024, 2048, 4096, 8192), (32, 256, 4096))
#: Ratios measured paired, with the issue's goals on real frames: zarr on disk against memmap.
PAIRED = (
    "rlds-mm/raw-mm rlds-zarr/rlds-mm>=0.5 rlds-zarr-ram/rlds-mm rlds-mm/trl rlds-mm/cpprb "
    "rlds-slice/raw-slice rlds-zarr-slice/rlds-slice>=0.5 rlds-slice/trl-slice rlds-fs/raw-4x "
    "rlds-zarr-fs/rlds-fs>=0.5 rlds-zarr-py/rlds-mm"
)
#: The disk saved on gray frames (memmap / zarr), fresh-process batches against the warmed rate.
DISK_GOAL, FRESH_GOAL = 10.0, 0.9
MB = _harness.MB
_log = _harness.logger("real")


def cpprb_fill(source: Path) -> Any:
    """A cpprb ``ReplayBuffer(next_of="obs")`` holding the D4RL file, added episode by episode
    (``on_episode_end`` after each, so no next frame crosses an episode)."""
    import h5py
    from cpprb import ReplayBuffer  # type: ignore[import-not-found]

    with h5py.File(source, "r") as f:
        n = int(f["observations"].shape[0])
        env = {"obs": {"shape": f["observations"].shape[1:], "dtype": np.uint8}, "act": {"dtype": np.int64}}
        rb = ReplayBuffer(n, env | {"rew": {}, "done": {}, "trunc": {}}, next_of="obs")
        start = 0
        for end in (np.flatnonzero(f["terminals"][:] | f["timeouts"][:]) + 1).tolist():
            for a in range(start, end, FILL_ROWS):
                rows = slice(a, min(a + FILL_ROWS, end))
                rb.add(
                    obs=f["observations"][rows],
                    next_obs=f["next_observations"][rows],
                    act=f["actions"][rows],
                    rew=f["rewards"][rows],
                    done=f["terminals"][rows].astype(np.float32),
                    trunc=f["timeouts"][rows].astype(np.float32),
                )
            rb.on_episode_end()
            start = end
    assert rb.get_stored_size() == n
    return rb


def python_loop(draw: Any) -> Any:
    """``draw`` with zarr's chunks decoded by the Python loop, as without the ``fast`` extra
    (the compiled loop is put back after each call, so the other cases keep it)."""
    from rlds_cli.cache.backends.zarr import codec as zarr_codec

    def call() -> Any:
        compiled = zarr_codec.compiled_decode()
        zarr_codec._compiled = None
        try:
            return draw()
        finally:
            zarr_codec._compiled = compiled

    return call


def run_mode(bench: _harness.Run, mode: str) -> dict[str, Any]:
    """Generate (or reuse), convert, fill the peers, measure one frame kind."""
    from torchrl.data import RandomSampler, SliceSampler

    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.loader import FrameStack
    from rlds_cli.sources.convert import convert

    steps = real_frames.STEPS[mode][1 if bench.quick else 0]
    source = real_frames.ensure(mode, steps, log=_log)
    work = bench.work / mode
    out: dict[str, Any] = {"steps": steps, "disk": {}}
    for backend in ("memmap", "zarr"):
        bench.remove(work / backend)
        t = time.perf_counter()
        convert(source, "bench", format="d4rl", root=work / backend, backend=backend)
        _log(f"{mode}: converted to {backend} ({time.perf_counter() - t:.1f} s)")
        out["disk"][f"rlds {backend}"] = _harness.disk_usage(work / backend)["allocated"]
    mm, zr = open_dataset("bench", work / "memmap"), open_dataset("bench", work / "zarr")
    first = np.asarray(mm.column("observation")[0])
    out["frame_bytes"] = int(first.nbytes)
    for ds in (mm, zr):
        _harness.warm_dataset(ds)
    slices = functools.partial(
        SliceSampler, num_slices=_sides.NUM_SLICES, traj_key="episode", cache_values=True
    )
    rbs = _sides.torchrl_buffers(mm, {"uniform": RandomSampler, "slice": slices}, work / "torchrl")
    out["disk"]["TorchRL LazyMemmapStorage"] = _harness.disk_usage(work / "torchrl")["allocated"]
    cpprb = cpprb_fill(source)
    out["disk"]["cpprb (RAM: one frame a step)"] = steps * out["frame_bytes"]
    out["disk"]["source HDF5 (obs + next obs)"] = source.stat().st_size
    raw = _sides.Raw(mm)
    fs = FrameStack(4)
    cases = [
        Case("raw-mm", "lean raw gather (`np.take`, memmap)", raw.uniform_memmap),
        Case("rlds-mm", "rlds `Loader`, memmap", sample(mm)),
        Case("rlds-zarr", "rlds `Loader`, zarr on disk (`in_memory=False`)", sample(zr, in_memory=False)),
        Case(
            "rlds-zarr-py",
            "rlds `Loader`, zarr on disk, Python decode loop (no `fast` extra)",
            python_loop(sample(zr, in_memory=False)),
        ),
        Case(
            "rlds-zarr-ram",
            "rlds `Loader`, zarr decoded into RAM (`in_memory=True`)",
            sample(zr, in_memory=True),
        ),
        Case("trl", "TorchRL `RandomSampler`, `LazyMemmapStorage`", rbs["uniform"].sample),
        Case("cpprb", 'cpprb `ReplayBuffer(next_of="obs")` (RAM)', lambda: cpprb.sample(BATCH)),
        Case("raw-slice", "lean raw gather, slices 8x32, memmap", raw.slices_memmap),
        Case("rlds-slice", "rlds slices 8x32, memmap", sample(mm, **SLICES)),
        Case("rlds-zarr-slice", "rlds slices 8x32, zarr on disk", sample(zr, in_memory=False, **SLICES)),
        Case("trl-slice", "TorchRL `SliceSampler(cache_values=True)`", rbs["slice"].sample),
        Case("raw-4x", "raw `np.take` of 4x the frames, memmap", raw.stacks(4)),
        Case("rlds-fs", "rlds `FrameStack(4)`, memmap", sample(mm, transform=fs)),
        Case("rlds-zarr-fs", "rlds `FrameStack(4)`, zarr on disk", sample(zr, in_memory=False, transform=fs)),
    ]
    _log(f"{mode}: {bench.repeats} rounds of rates, then paired ratios:")
    _harness.rounds(cases, bench.repeats, bench.seconds, _log)
    out["pairs"] = _harness.measure_pairs(
        {c.key: c for c in cases}, _harness.pairs(PAIRED), bench.repeats, bench.seconds, _log
    )
    out["cases"] = cases
    _log(f"{mode}: fresh-process sweep:")
    # as shipped (buffers reused) against warmed as fault_bench defines it (no buffer reuse, glibc
    # keeping freed batches for reuse)
    modes = {"shipped": (True, {}), "warmed": (False, fault_bench.WARM_ENV)}
    sizes = SIZES[1 if bench.quick else 0]
    frames = 20_000 if bench.quick else 200_000  # drawn a run
    out["sweep"] = fault_bench.sweep(
        work / "memmap",
        list(sizes),
        modes,
        bench.repeats,
        frames,
        work,
        _log,
        name="bench",
        frame=list(first.shape),
    )
    return out


# ----------------------------------------------------------------------------- report


def gbps(frame_bytes: int) -> dict[str, Any]:
    """The GB/s column: the 2 x 256 frames of obs and next obs a batch (stacks gather 4 frames a
    step: not given)."""
    gb = frame_bytes * 2 * BATCH / 1e9
    return {"obs + next obs GB/s": lambda c: "-" if c.key.endswith(("fs", "4x")) else f"{gb * c.rate:.2f}"}


def render(results: dict[str, Any], info: dict[str, Any]) -> str:
    """The Markdown section."""
    from rlds_cli.cache.backends.zarr import codec as zarr_codec

    if zarr_codec.compiled_decode() is not None:
        decode = (
            f"zarr chunks decoded by the compiled loop (numba {_harness.version('numba')}, the `fast` extra)"
        )
    else:
        decode = "zarr chunks decoded by the Python loop (no numba, or `RLDS_NUMBA=0`)"
    steps = {mode: f"{r['steps']:,}" for mode, r in results.items()}
    lines = [
        *_harness.opening(SECTION, "Real frames: pixel batches on real Atari frames", info["quick"]),
        f"Data: `benchmarks/real_frames.py`, ale-py {_harness.version('ale-py')} (ROMs from the wheel): a "
        f"random policy over {', '.join(real_frames.GAMES)} (equal shares), sticky actions "
        f"{real_frames.STICKY}, frame skip {real_frames.FRAME_SKIP} with the max of the last two screens, "
        f"area-resized (PIL `BOX`) to 84x84 gray ({steps.get('gray', '-')} frames) and 84x84x3 RGB "
        f"({steps.get('rgb', '-')} frames); episodes end at the game's end or are cut. Converted with `rlds "
        "convert --format d4rl` (memmap and zarr, defaults). The pixel and zarr sections' noise frames stay "
        "as the compression worst case; these are the real-data figures.",
        "",
        *_harness.header(info, _harness.versions("torchrl", "tensordict", "cpprb")),
        f"- Batches of {BATCH} with every key (obs, next obs, action, reward, flags); {info['repeats']} "
        f"rounds of {info['seconds']:g} s per configuration, interleaved; rates are the median over rounds "
        "(range); ratios come from calls alternating one by one (median call times), median (range) over "
        f"rounds; GB/s counts the 2 x 256 frames of obs and next obs (not given for stacks); {decode}.",
        "",
    ]
    for mode, r in results.items():
        base = r["disk"]["rlds memmap"]
        disk = [[store, f"{n / MB:,.0f}", f"{base / n:.1f}x"] for store, n in r["disk"].items() if n]
        lines += [
            f"### {mode}: {r['steps']:,} frames of {r['frame_bytes']:,} bytes",
            "",
            *_harness.rates_table(r["cases"], gbps(r["frame_bytes"])),
            "",
            *_harness.ratios_table({c.key: c for c in r["cases"]}, _harness.ratio_goals(PAIRED), r["pairs"]),
            "",
            *_harness.table(["store", "disk MB", "memmap / store"], disk),
            "",
            "Fresh process per configuration, rlds memmap `Loader.sample()` (fault_bench's worker): steady "
            "= median batch after the first two; shipped = output buffers reused (as shipped); warmed = "
            "fault_bench's reference, no reuse with glibc's thresholds raised (above 32 MiB a batch glibc "
            "maps every allocation whatever the settings); the last column is the shipped steady rate over "
            "the warmed one, per round.",
            "",
        ]
        rows = []
        for row in r["sweep"]:
            first = f"{row['shipped_first'] * 1e3:.2f} / {row['warmed_first'] * 1e3:.2f}"
            cells = [
                f"{row['batch']:,}",
                *(f"{row[m] / row['batch'] * 1e9:,.0f}" for m in ("shipped", "warmed")),
            ]
            rows.append(
                [
                    *cells,
                    first,
                    f"{row['shipped_faults']:.0f}",
                    _harness.span(row["shipped_ratios"], ".2f", "x"),
                ]
            )
        head = [
            "batch",
            "ns a step shipped",
            "ns a step warmed",
            "first batch ms shipped / warmed",
            "faults/batch",
        ]
        lines += [*_harness.table([*head, "shipped / warmed"], rows), "", "Goals:", ""]
        if mode == "gray":
            saved = base / r["disk"]["rlds zarr"]
            lines.append(_harness.goal("memmap / zarr on disk", f"{saved:.1f}x", saved, DISK_GOAL))
        for row in r["sweep"]:
            if row["batch"] in (256, 4096):
                values = row["shipped_ratios"]
                what = f"fresh process, {row['batch']:,} frames a batch, shipped / warmed"
                shown = _harness.span(values, ".2f", "x")
                lines.append(_harness.goal(what, shown, statistics.median(values), FRESH_GOAL))
        lines.append("")
    return "\n".join(lines + _harness.closing(SECTION, None)[1:])


def main(argv: list[str] | None = None) -> int:
    p = _harness.parser(__doc__.splitlines()[0], SECTION, work="real", repeats=3, seconds=(2.0, 0.3))
    p.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="frame kinds (default both)"
    )
    args = p.parse_args(argv)
    missing = [m for m in ("ale_py", "cpprb", "torchrl") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(
            f"real_bench: {', '.join(missing)} not installed; create the bench environment with `bash "
            "benchmarks/setup_env.sh VENV TORCH_VERSION` and run with its python"
        )
    bench = _harness.start(args)
    results = {mode: run_mode(bench, mode) for mode in args.modes}
    _harness.save_json(bench.work / "results.json", results)
    bench.publish(SECTION, render(results, bench.info()), _log)
    for mode in args.modes:
        bench.remove(bench.work / mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
