"""``make bench``'s driver: runs the sections' scripts in turn, each with the shared options
(``--write``, ``--quick``, ``--repeats``, ``--keep``; its work directory under ``--work``).

Usage::

    python benchmarks/run_all.py [--write docs/benchmarks.md] [--quick] [--only pixel loader]

``--only NAME...`` picks some sections; the extra sections run only when named.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import _harness

HERE = Path(__file__).resolve().parent

#: What ``make bench`` runs, in this order (``--only`` picks some): section -> script and its flags.
SECTIONS = {
    "conversion": "conversion_bench",  # D4RL file -> cache, rlds vs TorchRL's Minari cache build
    "minari": "conversion_bench --minari",  # rlds reading a Minari dataset itself vs TorchRL
    "preprocess": "preprocess_bench",  # rlds preprocess vs TorchRL preprocess
    "cli": "cli_bench",  # CLI start-up time
    "pixel": "pixel_bench",  # conversion, disk and every sampling path on pixels
    "real": "real_bench",  # pixel batches on real Atari frames, every store side by side
    "zarr": "zarr_bench",  # zarr against memmap: conversion CPU, pixel and low-dim random access
    "loader": "loader_bench",  # rlds loader vs TorchRL vs the lean raw gather
    "tensordict": "tensordict_bench",  # as_tensordict=True batches vs the plain batches (issue 38)
    "mixture": "mixture_bench",  # MixtureLoader(pad=True) over 3 robots vs single-source Loaders (issue 41)
    "first-download": "download_bench",  # `rlds download ./file.hdf5` as a whole process vs TorchRL
    "frames": "frames_bench",  # compressed frames: disk, PSNR, conversion, batches vs decoder and LeRobot
    # epoch batches from a slow S3, bounded cache, vs Mosaic (issue 42); each reader on one core, the
    # store (moto, the link) on the others: a store that does not share the learner's cores
    "remote": "remote_scale_bench --learner-cpus 1",
}
#: Sections run only when named: the before/after records of issue 14's frame-stack and DataLoader
#: changes (the pixel section measures both paths again, as they are now, in every ``make bench``),
#: the recording overhead against Minari's DataCollector (issue 25), and the batches at 50M and
#: 200M steps (issue 42; 10 GB of datasets).
EXTRA_SECTIONS = {
    "framestack": "before_after_bench",
    "dataloader": "before_after_bench --dataloader",
    "record": "record_bench",
    "scale": "scale_bench",  # uniform memmap batches vs the bare gather at 1M, 50M and 200M steps (10 GB)
}
_log = _harness.logger("run_all")


def main(argv: Iterable[str] | None = None) -> int:
    """Run the chosen sections; each prints (and with ``--write`` writes) its Markdown."""
    parser = argparse.ArgumentParser(description="rlds vs its peers: every section of docs/benchmarks.md")
    _harness.add_common_flags(
        parser,
        write="Markdown file whose sections are replaced",
        quick="small data, 1 repeat (a smoke test)",
        repeats="rounds per configuration (default: each section's own)",
        work=HERE / "_work",
    )
    everything = SECTIONS | EXTRA_SECTIONS
    parser.add_argument(
        "--only", nargs="+", choices=list(everything), help=f"run only these (default: {', '.join(SECTIONS)})"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    shared = (["--quick"] if args.quick else []) + (["--keep"] if args.keep else [])
    shared += (["--write", str(args.write)] if args.write else []) + (
        ["--repeats", str(args.repeats)] if args.repeats else []
    )
    t0, status = time.perf_counter(), 0
    chosen = [name for name in everything if name in (args.only or SECTIONS)]
    for name in chosen:
        t = time.perf_counter()
        _log(f"== {name}")
        script, *flags = everything[name].split()
        work = ["--work", str(args.work.resolve() / name)]
        status |= importlib.import_module(script).main([*flags, *shared, *work]) or 0
        _log(f"== {name} took {(time.perf_counter() - t) / 60:.1f} min")
    _log(f"all sections ({', '.join(chosen)}) took {(time.perf_counter() - t0) / 60:.1f} min")
    return status


if __name__ == "__main__":
    sys.exit(main())
