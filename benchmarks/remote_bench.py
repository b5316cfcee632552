"""Push/pull throughput: a ~85 MB dataset (memmap, then zarr) to ``file://`` and to a local
S3-compatible server (moto, on 127.0.0.1 with dummy credentials), then back.

Data: 200,000 steps of 100 float32 observations and 6 float32 actions (random, so zarr does not
compress them), 1,000-step episodes, written with :class:`~rlds_cli.cache.builder.DatasetBuilder`.
A pull's time includes every check it makes (sha256 of each file, the content digests
recomputed) and the atomic publish. Work data goes to a temporary directory, removed at the end.

Usage (needs the ``remote`` extra and ``moto[server]``)::

    python benchmarks/remote_bench.py
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np


def build(name: str, backend: str, steps: int = 200_000, obs_dim: int = 100, episode: int = 1000) -> None:
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.formats.base import StepBlock

    rng = np.random.default_rng(0)
    block = 20_000
    with DatasetBuilder(name, backend=backend, replace=True) as builder:
        for _ in range(0, steps, block):
            ends = np.arange(episode - 1, block, episode)
            terminated = np.zeros((block, 1), bool)
            terminated[ends] = True
            observations = rng.standard_normal((block + len(ends), obs_dim), dtype=np.float32)
            builder.append(
                StepBlock(
                    steps={
                        "action": rng.standard_normal((block, 6), dtype=np.float32),
                        "next/reward": rng.standard_normal((block, 1), dtype=np.float32),
                        "next/terminated": terminated,
                        "next/truncated": np.zeros((block, 1), bool),
                    },
                    observations={"observation": observations},
                    ends=ends,
                )
            )
        builder.commit()


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="rlds-remote-bench-"))
    os.environ["RLDS_HOME"] = str(work / "home")
    os.environ["RLDS_FSYNC"] = "0"
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

    from rlds_cli.remote.pull import pull
    from rlds_cli.remote.push import push

    s3fs.S3FileSystem().mkdir("bench")
    try:
        print("| storage | store | files | MB | push s | push MB/s | pull s | pull MB/s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for backend in ("memmap", "zarr"):
            name = f"big-{backend}"
            build(name, backend)
            for store, url in (
                ("file://", f"file://{work}/bucket/{name}"),
                ("moto S3", f"s3://bench/{name}"),
            ):
                pushed = push(name, url)
                pulled = pull(url, name=f"{name}-{store[:4].strip(':/ ')}", force=True)
                mb = pushed.bytes_total / 1e6
                print(
                    f"| {backend} | {store} | {pushed.files} | {mb:.1f} | {pushed.seconds:.2f} | "
                    f"{mb / pushed.seconds:.0f} | {pulled.seconds:.2f} | {mb / pulled.seconds:.0f} |",
                    flush=True,
                )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
