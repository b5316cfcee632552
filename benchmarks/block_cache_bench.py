"""Bigger than the disk: epoch-order batches of a dataset read from S3 through the bounded block
cache (``cache_limit`` at 10% of the dataset) with reads planned ahead, against the same Loader
on a pulled local copy.

The store is moto (S3 on 127.0.0.1) in its own process, behind a WSGI wrapper that adds a fixed
latency to every GET request (``--latency-ms``, default 30) and holds each response for its
size over ``--mbps`` (default 400 MB/s per request). The server is threaded, so concurrent
requests wait their latency at the same time, as on a real object store; uploads (the push) get
no delay.

Data: ``--steps`` (default 30,000) steps of 64x64x3 uint8 frames (random: zarr cannot compress
them, so the bytes fetched are the frames' bytes), 6 float32 actions, 500-step episodes, zarr.

Cases, each one epoch of batches of 256 in order (``sampler="epoch", shuffle=False``,
``in_memory=False``), with ``--step-ms`` of simulated training per batch (0: the loader alone):

* ``local``: the pulled copy in the cache;
* ``remote read_ahead=0``: from S3, cache limited to 10% of the dataset, a batch's missing blocks
  fetched when it is gathered;
* ``remote read_ahead=N``: the same with the next N batches' blocks fetched in the background.

Usage (needs the ``remote`` extra and ``moto[server]``)::

    python benchmarks/block_cache_bench.py [--steps N] [--latency-ms 30] [--step-ms 0] [--read-ahead 4]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 256
EPISODE = 500


def serve(port_file: str, latency: float, bandwidth: float) -> None:
    """Run moto with the delays (the child process's entry point)."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    inner = DomainDispatcherApplication(create_backend_app)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") != "GET":
            return inner(environ, start_response)
        t0 = time.perf_counter()
        body = b"".join(inner(environ, start_response))
        wait = latency + len(body) / bandwidth - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
        return [body]

    server = make_server("127.0.0.1", 0, app, threaded=True)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


def build(name: str, steps: int) -> None:
    import data as bench_data  # benchmarks/data.py: builder blocks

    from rlds_cli.cache.builder import DatasetBuilder

    rng = np.random.default_rng(0)
    block = min(5_000, steps)
    with DatasetBuilder(name, backend="zarr", replace=True) as builder:
        for start in range(0, steps, block):
            n = min(block, steps - start)
            ends = np.arange(EPISODE - 1, n, EPISODE)
            frames = rng.integers(0, 256, (n + len(ends), 64, 64, 3), dtype=np.uint8)
            action = rng.standard_normal((n, 6), dtype=np.float32)
            reward = np.zeros((n, 1), np.float32)
            builder.append(bench_data.step_block(action, reward, frames, ends, terminated=True))
        builder.commit()


def epoch(loader: Any, step_s: float) -> tuple[float, int]:
    """Seconds of one epoch and its batch count."""
    t0 = time.perf_counter()
    count = 0
    for _ in loader:
        count += 1
        if step_s:
            time.sleep(step_s)
    return time.perf_counter() - t0, count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--latency-ms", type=float, default=30.0)
    p.add_argument("--mbps", type=float, default=400.0, help="MB/s per request")
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated training per batch")
    p.add_argument("--read-ahead", type=int, default=8)
    p.add_argument("--prefetch", type=int, default=0, help="the Loader's prefetch (every case alike)")
    p.add_argument("--block-mib", type=float, nargs="+", default=[8.0], help="block sizes to push with")
    p.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve[0], float(args.serve[1]), float(args.serve[2]))
        return 0
    work = Path(tempfile.mkdtemp(prefix="rlds-blockcache-"))
    port_file = work / "port"
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(port_file),
            str(args.latency_ms / 1000),
            str(args.mbps * 1e6),
        ]
    )
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        os.environ.update(
            RLDS_HOME=str(work / "home"), RLDS_FSYNC="0", RLDS_MEMORY_BUDGET="0",
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port_file.read_text()}", AWS_EC2_METADATA_DISABLED="true",
        )  # fmt: skip
        import s3fs

        from rlds_cli import Loader, open_dataset
        from rlds_cli.remote import store
        from rlds_cli.remote.pull import pull
        from rlds_cli.remote.push import push

        s3fs.S3FileSystem().mkdir("bench")
        build("frames", args.steps)
        mib = 2**20
        common = dict(
            sampler="epoch",
            shuffle=False,
            in_memory=False,
            seed=0,
            keys=["observation", "action"],
            prefetch=args.prefetch,
        )
        step_s = args.step_ms / 1000
        local = 0.0
        for block_mib in args.block_mib:
            store.INDEX_BLOCK_BYTES = int(block_mib * mib)  # what the push records, the cache's unit
            url = f"s3://bench/frames-{block_mib:g}m"
            push("frames", url)
            size = open_dataset(url).size_bytes()
            limit = size // 10
            if not local:
                pull(url, "pulled")
                print(f"dataset: {args.steps:,} steps, {size / mib:,.0f} MiB on the store; "
                      f"cache_limit {limit / mib:,.0f} MiB (10%); latency {args.latency_ms:g} ms per GET, "
                      f"{args.mbps:g} MB/s per request; training step {args.step_ms:g} ms, "
                      f"prefetch={args.prefetch}")  # fmt: skip
                runs = [epoch(Loader("pulled", BATCH, **common), step_s) for _ in range(3)]
                seconds, batches = sorted(runs)[1]  # the median epoch (page cache warm)
                local = batches / seconds
                print(f"local (pulled copy), median of 3 epochs : {local:7.1f} batches/s ({seconds:.2f} s)")
            for depth in (0, args.read_ahead):
                cache = work / f"cache-{block_mib:g}-{depth}"
                loader = Loader(url, BATCH, cache=cache, cache_limit=limit, read_ahead=depth, **common)
                seconds, batches = epoch(loader, step_s)
                used = sum(f.stat().st_size for f in (cache / "blocks").rglob("*") if f.is_file())
                ds = loader.dataset
                print(f"remote {block_mib:g} MiB blocks, read_ahead={depth:<2}: {batches / seconds:7.1f} "
                      f"batches/s ({seconds:.1f} s), {batches / seconds / local:.2f}x local; "
                      f"{ds.requests:,} requests, {ds.bytes_fetched / mib:,.0f} MiB fetched; "
                      f"cache {used / mib:.0f} MiB on disk <= {limit / mib:.0f} MiB")  # fmt: skip
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
