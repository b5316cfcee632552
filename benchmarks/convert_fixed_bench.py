"""Conversion against TorchRL's memmap fill at small sizes: where the fixed costs show.

For each size, a D4RL-format low-dim file (``benchmarks/data.py d4rl``) is converted by rlds
(``convert``, memmap backend, defaults: source hashed, files fsynced, verified) and filled into a
TorchRL ``LazyMemmapStorage`` (``pixel_bench.torchrl_fill``: TED keys, bounded chunks), each in a
fresh child process (``_harness.run_once``), rounds interleaved. The time is the operation's own
(imports before it excluded, as in every conversion row); the ratio is TorchRL's median over
rlds's median (> 1: rlds faster). Peak RSS is ``VmHWM`` of the child.

Usage::

    python benchmarks/convert_fixed_bench.py [--sizes 100000,1000000] [--repeats 3] [--profile]

``--profile``: also run rlds's conversion of the first size once under cProfile in this process
and print the top entries (cumulative).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import data as bench_data  # noqa: E402


def worker_td_memmap(spec: dict[str, Any]) -> dict[str, Any]:
    """The plain TorchRL memmap fill: the D4RL file's arrays read whole (h5py), as a TED
    ``TensorDict`` (``episode`` and ``next/done`` computed), written by ``td.memmap_(dir)``
    (tensordict's memory-mapped tensors; no fsync). Imports are not timed."""
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

    steps, measured = _harness.timed(fill)
    return {**measured, "steps": steps}


def worker_rlds_at(spec: dict[str, Any]) -> dict[str, Any]:
    """``_harness.worker_rlds`` with the rlds_cli package of ``spec["code"]`` (a checkout of
    another commit: the before of a before/after pair run in one session)."""
    sys.path.insert(0, spec["code"])
    import rlds_cli

    assert rlds_cli.__file__.startswith(spec["code"]), rlds_cli.__file__
    if spec.get("preimport"):  # what the TorchRL workers import before their timer
        import h5py  # noqa: F401
    return _harness.worker_rlds(spec)


WORKERS = {"td-memmap": worker_td_memmap, "rlds-at": worker_rlds_at}


def configs(src: Path, work: Path, n: int, before: Path | None, preimport: bool) -> list[_harness.Config]:
    """rlds's conversion, TorchRL's replay-buffer fill and the plain memmap fill of ``src``, and
    rlds's conversion with the code under ``before`` when given (``preimport``: rlds's runs
    import h5py before their timer, as the TorchRL ones do)."""
    rlds = _harness.rlds_config(f"rlds-{n}", f"rlds convert {n:,}", src, "memmap", work)
    rlds.spec.update(module="convert_fixed_bench", kind="rlds-at", code=str(HERE.parent), preimport=preimport)
    extra = []
    if before is not None:
        old = _harness.rlds_config(f"before-{n}", f"rlds before {n:,}", src, "memmap", work)
        old.spec.update(module="convert_fixed_bench", kind="rlds-at", code=str(before), preimport=preimport)
        extra.append(old)
    root = work / "out" / f"torchrl-{n}"
    spec = {"module": "pixel_bench", "kind": "torchrl-fill", "source": str(src), "root": str(root)}
    trl = _harness.Config(f"torchrl-{n}", f"TorchRL rb fill {n:,}", "torchrl-fill", src, spec, root)
    root = work / "out" / f"td-{n}"
    spec = {"module": "convert_fixed_bench", "kind": "td-memmap", "source": str(src), "root": str(root)}
    td = _harness.Config(f"td-{n}", f"TensorDict memmap_ {n:,}", "td-memmap", src, spec, root)
    return [rlds, trl, td, *extra]


def profile(src: Path, work: Path) -> None:
    """rlds's conversion of ``src`` under cProfile (imports included: they are in the profile)."""
    import cProfile
    import pstats
    import shutil

    root = work / "out" / "profile"
    shutil.rmtree(root, ignore_errors=True)
    prof = cProfile.Profile()
    prof.enable()
    from rlds_cli.convert import convert

    convert(src, "bench", format="d4rl", root=root)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, default=HERE / "_work" / "convert_fixed")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--pixels", action="store_true", help="pixel files (data.write_pixel_d4rl) instead")
    p.add_argument("--preimport", action="store_true", help="rlds's runs import h5py before the timer")
    p.add_argument("--before", type=Path, help="a folder holding another commit's rlds_cli package")
    args = p.parse_args(argv)
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    sources = {}
    for n in sizes:
        src = work / f"{'pixels' if args.pixels else 'd4rl'}-{n}.hdf5"
        if not src.exists():
            (bench_data.write_pixel_d4rl if args.pixels else bench_data.write_d4rl)(src, n)
        sources[n] = src
    if args.profile:
        profile(sources[sizes[0]], work)
    all_cfgs: list[_harness.Config] = []
    for n in sizes:
        all_cfgs += configs(sources[n], work, n, args.before, args.preimport)
    for rep in range(args.repeats):  # the order turns every round: no configuration always runs first
        shift = rep % len(all_cfgs)
        _harness.run_configs(all_cfgs[shift:] + all_cfgs[:shift], 1, work, print)
    print(
        "\nsteps | rlds s (peak MB) | rb fill s (peak MB), rlds speed | memmap_ s (peak MB), rlds speed"
        + (" | before s (peak MB), speed-up" if args.before else "")
    )
    per = 4 if args.before else 3
    for i in range(0, len(all_cfgs), per):
        r = all_cfgs[i]
        cells = [f"{sizes[i // per]:,} | {r.median('seconds'):.3f} ({r.median('peak_rss_mb'):.0f})"]
        for t in all_cfgs[i + 1 : i + per]:
            ratio = [b["seconds"] / a["seconds"] for a, b in zip(r.runs, t.runs, strict=True)]
            cells.append(
                f"{t.median('seconds'):.3f} ({t.median('peak_rss_mb'):.0f}), "
                f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})"
            )
        print(" | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
