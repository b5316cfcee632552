"""JPEG frames decoded on a CUDA device against the host's threads and nvJPEG's own rate (issue 40)::

    python benchmarks/device_decode_bench.py --build DIR       # here: the dataset, from MuJoCo renders
    python benchmarks/device_decode_bench.py --root DIR        # on a CUDA machine: the figures

``--build`` writes dataset ``jpeg`` under cache root ``DIR``: the 1,200 cached 224x224 MuJoCo
renders of :mod:`camera_frames` stored as JPEG (``--frames jpeg``, quality 93), episodes of 200
steps (about 27 MB: small enough to travel to a GPU machine).

``--root`` times uniform batches of ``--batch`` frames (``keys=["pixels"]``), each case for
``--seconds`` per round, rounds alternated, medians of ``--rounds``, every batch finished on the
device (``torch.cuda.synchronize``) before the next:

* **nvJPEG limit**: ``torchvision.io.decode_jpeg`` of the same 256 stored files (CPU tensors
  made once) on the device, stacked: the device decoder's own rate;
* **rlds, decode on the device**: ``Loader(..., device="cuda", decode="device")``, without and
  with ``prefetch=2`` (the next batches' reads and decodes run on a background thread);
* **rlds, decode on the host**: ``Loader(..., device="cuda", decode="host")`` (libjpeg-turbo on
  every core, then the copy to the device), without and with ``prefetch=2``;
* **host limit**: the host decoder over the same 256 files on the same threads, no copy.

Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

EPISODE = 200


def build(root: Path) -> None:
    import camera_frames

    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.cache.ted import StepBlock

    os.environ["RLDS_FSYNC"] = "0"
    stack = np.load(camera_frames.cached(1200), mmap_mode="r")
    with DatasetBuilder("jpeg", root=root, frames="jpeg", replace=True) as builder:
        for lo in range(0, len(stack) - 1, EPISODE + 1):
            obs = np.asarray(stack[lo : lo + EPISODE + 1])
            n = len(obs) - 1
            done = np.zeros(n, bool)
            done[-1] = True
            steps = {
                "action": np.zeros((n, 1), np.float32),
                "next/reward": np.zeros(n, np.float32),
                "next/terminated": np.zeros(n, bool),
                "next/truncated": done,
            }
            builder.append(StepBlock(steps=steps, observations={"pixels": obs}, ends=np.array([n - 1])))
        builder.commit()


def rate(fn: Callable[[], Any], seconds: float) -> float:
    """Calls of ``fn`` a second over about ``seconds`` (after one warm-up call)."""
    fn()
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        count += 1
    return count / elapsed


def measure(root: Path, batch: int, seconds: float, rounds: int) -> dict[str, Any]:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    from rlds_cli._util.cpus import usable_cpus
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.frames.codecs import decode_many
    from rlds_cli.loader import Loader

    ds = open_dataset("jpeg", root)
    column = ds.column("pixels")
    fmt = ds.stored_fields["pixels"].frame_format
    assert fmt is not None
    rows = np.random.default_rng(0).integers(0, len(column), batch)
    files = [bytes(column.frame_bytes(int(r))) for r in rows]
    tensors = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    out = np.empty((batch, *fmt.shape), np.uint8)

    def nvjpeg() -> None:
        torch.stack(decode_jpeg(tensors, mode=ImageReadMode.RGB, device="cuda"))
        torch.cuda.synchronize()

    def loader_case(decode: str, prefetch: int = 0) -> Callable[[], None]:
        loader = Loader(
            ds, batch, seed=0, keys=["pixels"], device="cuda", decode=decode, epochs=None, prefetch=prefetch
        )
        it = iter(loader)

        def step() -> None:
            next(it)["pixels"].float().mean().item()  # consumed on the device: the batch is whole

        return step

    cases = {
        "nvjpeg_limit": nvjpeg,
        "rlds_device": loader_case("device"),
        "rlds_device_prefetch2": loader_case("device", 2),
        "rlds_host": loader_case("host"),
        "rlds_host_prefetch2": loader_case("host", 2),
        "host_limit": lambda: decode_many(files.__getitem__, batch, fmt, out),
    }
    found: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for key, fn in cases.items():
            found[key].append(rate(fn, seconds))
    med = {k: statistics.median(v) for k, v in found.items()}
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "host_threads": usable_cpus(),
        "batch": batch,
        "frame_bytes_mean": float(np.mean([len(f) for f in files])),
        "batches_per_s": med,
        "rounds": found,
        "device_to_nvjpeg": med["rlds_device"] / med["nvjpeg_limit"],
        "device_prefetch_to_nvjpeg": med["rlds_device_prefetch2"] / med["nvjpeg_limit"],
        "device_prefetch_to_host_prefetch": med["rlds_device_prefetch2"] / med["rlds_host_prefetch2"],
        "device_to_host_loader": med["rlds_device"] / med["rlds_host"],
        "host_loader_to_host_limit": med["rlds_host"] / med["host_limit"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", type=Path, help="write the jpeg dataset under this cache root")
    p.add_argument("--root", type=Path, help="measure the jpeg dataset under this cache root")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.build:
        build(args.build)
        return 0
    if not args.root:
        p.error("give --build DIR or --root DIR")
    res = measure(args.root, args.batch, args.seconds, args.rounds)
    b = res["batch"]
    print(f"{res['device']}, torch {res['torch']}, {res['host_threads']} host threads, batches of {b}")
    print("| case | batches/s | frames/s |\n|---|---:|---:|")
    for key, value in res["batches_per_s"].items():
        print(f"| {key} | {value:.1f} | {value * b:,.0f} |")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
