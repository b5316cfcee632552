"""Object storage: push/pull throughput, sampling a zarr dataset where it lies against the same
dataset in the cache, and per-rank throughput of two ranks.

The store is ``file://`` and a local S3-compatible server (moto, on 127.0.0.1 with dummy
credentials): moto is a Python server, so its latency (about a millisecond a request) is far
below a real object store's first-byte latency (tens of milliseconds) while its bandwidth is
lower; the request counts printed let you scale the figures to your store.

Data: 200,000 steps of 100 float32 observations and 6 float32 actions (random, so zarr does not
compress them), 1,000-step episodes, written with :class:`~rlds_cli.cache.builder.DatasetBuilder`
(``--steps`` changes the size). A pull's time includes every check it makes (sha256 of each
file, the content digests recomputed) and the atomic publish.

Sections:

* ``transfer``: push and pull, memmap and zarr, to ``file://`` and to S3;
* ``sampling``: uniform batches of 256 (every TED key) through ``Loader.sample`` on the zarr
  dataset: from the cache, from S3 by ranged reads, from S3 through the file cache (first pass
  and warm), and with ``in_memory=True`` (its load time too);
* ``ranks``: two processes at once, ``rank=0/1, world_size=2`` (what torchrun gives the Loader),
  each drawing the first 100 batches of 256 of its shard of an epoch (epoch sampler): batches/s
  per rank, from the cache and from S3.

Work data goes to ``benchmarks/_work/remote``, removed at the end unless ``--keep``.

Usage (needs the ``remote`` extra and ``moto[server]``)::

    python benchmarks/remote_bench.py [--sections transfer,sampling,ranks] [--steps N] [--seconds S] [--quick]
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _harness
import data as bench_data  # benchmarks/data.py: builder blocks
import numpy as np

BATCH = 256
#: Batches each rank draws (the first of its epoch's shard).
RANK_BATCHES = 100


def build(name: str, backend: str, steps: int = 200_000, obs_dim: int = 100, episode: int = 1000) -> None:
    from rlds_cli.cache.builder import DatasetBuilder

    rng = np.random.default_rng(0)
    block = min(20_000, steps)
    with DatasetBuilder(name, backend=backend, replace=True) as builder:
        for _ in range(0, steps, block):
            ends = np.arange(episode - 1, block, episode)
            obs = rng.standard_normal((block + len(ends), obs_dim), dtype=np.float32)
            action = rng.standard_normal((block, 6), dtype=np.float32)
            reward = rng.standard_normal((block, 1), dtype=np.float32)
            builder.append(bench_data.step_block(action, reward, obs, ends, terminated=True))
        builder.commit()


def rate(loader: Any, seconds: float) -> float:
    """Batches/s of ``loader.sample()``: one over the median call time over ``seconds``."""
    for _ in range(3):
        loader.sample()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        loader.sample()
        times.append(time.perf_counter() - t)
    return 1 / statistics.median(times)


def transfer(work: Path, steps: int) -> None:
    from rlds_cli.remote.pull import pull
    from rlds_cli.remote.push import push

    print("\n### Push and pull\n")
    print("| storage | store | files | MB | push s | push MB/s | pull s | pull MB/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for backend in ("memmap", "zarr"):
        name = f"big-{backend}"
        build(name, backend, steps)
        for store, url in (("file://", f"file://{work}/bucket/{name}"), ("moto S3", f"s3://bench/{name}")):
            pushed = push(name, url)
            pulled = pull(url, name=f"{name}-{store[:4].strip(':/ ')}", force=True)
            mb = pushed.bytes_total / 1e6
            print(
                f"| {backend} | {store} | {pushed.files} | {mb:.1f} | {pushed.seconds:.2f} | "
                f"{mb / pushed.seconds:.0f} | {pulled.seconds:.2f} | {mb / pulled.seconds:.0f} |",
                flush=True,
            )


def sampling(work: Path, steps: int, seconds: float) -> None:
    from rlds_cli import Loader, open_dataset
    from rlds_cli.remote.push import push

    name, url = "sample-zarr", "s3://bench/sample-zarr"
    build(name, "zarr", steps)
    push(name, url, force=True)
    print(f"\n### Sampling ({steps:,} steps, zarr, batches of {BATCH}, every key)\n")
    print("| source | batches/s | vs cache | requests/batch | MB fetched/batch | set-up s |")
    print("|---|---:|---:|---:|---:|---:|")
    local = rate(Loader(name, BATCH, in_memory=False, seed=0), seconds)

    def row(
        label: str, r: float, ds: Any = None, before: tuple[int, int] = (0, 0), n: int = 0, setup: float = 0.0
    ) -> None:
        req = f"{(ds.requests - before[0]) / n:.1f}" if ds is not None and n else "-"
        mb = f"{(ds.bytes_fetched - before[1]) / n / 1e6:.2f}" if ds is not None and n else "-"
        print(f"| {label} | {r:,.0f} | {r / local:.2f}x | {req} | {mb} | {setup:.2f} |", flush=True)

    row("cache, on disk (`in_memory=False`)", local)

    def first_pass(label: str, ds: Any) -> None:
        """Batches/s over the first ``seconds`` of a loader on ``ds`` (every request counted)."""
        loader = Loader(ds, BATCH, in_memory=False, seed=0)
        before = (ds.requests, ds.bytes_fetched)
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            loader.sample()
            n += 1
        row(label, n / (time.perf_counter() - t), ds, before, n)

    first_pass("S3, ranged reads", open_dataset(url))
    cache = work / "remote-cache"
    ds = open_dataset(url, cache=cache)
    first_pass("S3, file cache, first pass (cold)", ds)
    for key in ds.manifest.fields:  # the rest of the files into the cache
        np.asarray(ds.column(key))
    warm = open_dataset(url, cache=cache)
    row(
        "S3, file cache, warm (a new open)", rate(Loader(warm, BATCH, in_memory=False, seed=0), seconds), warm
    )
    t = time.perf_counter()
    ds = open_dataset(url)
    loader = Loader(ds, BATCH, in_memory=True, seed=0)
    setup = time.perf_counter() - t
    row("S3, `in_memory=True`", rate(loader, seconds), setup=setup)
    row("cache, `in_memory=True`", rate(Loader(name, BATCH, in_memory=True, seed=0), seconds))


def _rank(args: tuple[str, int, str, bool, dict[str, str]]) -> tuple[int, int, float, float]:
    source, rank, home, in_memory, env = args
    os.environ.update(env, RLDS_HOME=home)
    from rlds_cli import Loader

    t = time.perf_counter()
    loader = Loader(
        source,
        BATCH,
        sampler="epoch",
        rank=rank,
        world_size=2,
        seed=0,
        in_memory=in_memory,
        num_batches=RANK_BATCHES,
    )
    setup = time.perf_counter() - t
    n = 0
    t = time.perf_counter()
    for _ in loader:
        n += 1
    return rank, n, n / (time.perf_counter() - t), setup


def ranks(work: Path, steps: int) -> None:
    from rlds_cli.remote.push import push

    name, url = "sample-zarr", "s3://bench/sample-zarr"
    if not (Path(os.environ["RLDS_HOME"]) / "datasets" / name).is_dir():
        build(name, "zarr", steps)
        push(name, url, force=True)
    print(f"\n### Two ranks ({RANK_BATCHES} batches of {BATCH} each, epoch sampler)\n")
    print("| source | rank | batches | batches/s | set-up s |")
    print("|---|---:|---:|---:|---:|")
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    ctx = multiprocessing.get_context("spawn")
    for label, source, in_memory in (
        ("cache, on disk", name, False),
        ("S3, ranged reads", url, False),
        ("S3, `in_memory=True`", url, True),
    ):
        with ctx.Pool(2) as pool:
            results = pool.map(_rank, [(source, r, os.environ["RLDS_HOME"], in_memory, env) for r in (0, 1)])
        for rank, n, r, setup in sorted(results):
            print(f"| {label} | {rank} | {n} | {r:,.0f} | {setup:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = _harness.parser(
        "push/pull, remote sampling and per-rank throughput",
        None,
        work="remote",
        steps=(200_000, 20_000),
        seconds=(3.0, 0.5),
    )
    p.add_argument("--sections", default="transfer,sampling,ranks", help="comma-separated")
    run = _harness.start(p.parse_args(argv))
    sections = set(run.args.sections.split(","))
    work = run.work
    os.environ["RLDS_HOME"] = str(work / "home")
    os.environ["RLDS_FSYNC"] = "0"
    os.environ["RLDS_MEMORY_BUDGET"] = "0"  # in_memory is said in each case, never chosen for it
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_EC2_METADATA_DISABLED="true",
    )
    import s3fs

    s3fs.S3FileSystem().mkdir("bench")
    try:
        if "transfer" in sections:
            transfer(work, run.steps)
        if "sampling" in sections:
            sampling(work, run.steps, run.seconds)
        if "ranks" in sections:
            ranks(work, run.steps)
    finally:
        server.stop()
        run.remove(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
