"""Block shuffle benchmark: how random ``sampler="blocks"`` is against a full shuffle
(``sampler="epoch"``), as a function of ``shuffle_window``, and what each rank reads.

Only the samplers run (no files): the figures are properties of the index order. Data: episodes
of 50-500 steps (a fixed seed), grouped into blocks of ``--block-rows`` rows (a zarr shard's rows
of a wide column are of this order).

Measured over one epoch of one rank, in batches of 256:

* **lag-1 corr.**: Pearson correlation of consecutive samples' step positions (a full shuffle:
  about 0; steps in storage order: 1);
* **same episode**: share of consecutive samples from the same episode;
* **episodes / batch**: distinct episodes in a batch (the mean);
* **blocks / batch**: distinct blocks a batch reads (what a remote read fetches);
* **order ms**: time to make the rank's epoch order.

And for ``--world`` ranks: the rows of the blocks each rank reads in an epoch, as a share of the
dataset (the bound is ``1/N + 5%``; a full shuffle reads everything on every rank). With
``--store``, the bytes each of 2 and 4 ranks fetches in an epoch from a pushed zarr dataset
(``memory://``, a file cache per rank; 200 episodes of 20-80 steps of 768-byte random frames,
zarr's shard size set to 64 frame rows so that a small dataset spans many shards).

Usage::

    python benchmarks/shuffle_bench.py [--episodes 4000] [--block-rows 4096] [--world 8] [--store]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlds_cli.loader.block_shuffle import BlockSampler  # noqa: E402
from rlds_cli.loader.epoch import EpochSampler  # noqa: E402
from rlds_cli.loader.samplers import Episodes  # noqa: E402

BATCH = 256
WINDOWS = (1, 2, 4, 8, 16, 32, 64)


def _stats(order: np.ndarray, episodes: Episodes, block_of: np.ndarray) -> dict[str, float]:
    ep = episodes.episode_of(order)
    usable = len(order) // BATCH * BATCH
    by_batch = ep[:usable].reshape(-1, BATCH)
    blocks = block_of[:usable].reshape(-1, BATCH)
    return {
        "corr": float(np.corrcoef(order[:-1], order[1:])[0, 1]),
        "same": float((ep[1:] == ep[:-1]).mean()),
        "episodes": float(np.mean([len(np.unique(b)) for b in by_batch])),
        "blocks": float(np.mean([len(np.unique(b)) for b in blocks])),
    }


def store_bytes(work: Path) -> None:
    """Print the share of a pushed dataset's bytes each rank fetches in an epoch (see --store)."""
    import os

    os.environ["RLDS_HOME"] = str(work / "home")
    from rlds_cli.cache import DatasetBuilder
    from rlds_cli.cache.backends.zarr import write as zarr_write
    from rlds_cli.formats.base import StepBlock
    from rlds_cli.loader import Loader
    from rlds_cli.remote.push import push
    from rlds_cli.remote.reader import RemoteDataset

    zarr_write.ZARR_CHUNK_BYTES, zarr_write.ZARR_SHARD_BYTES = 6144, 6144 * 8
    zarr_write.ZARR_IN_RAM_BYTES = 0  # every column read from its chunks
    rng = np.random.default_rng(0)
    with DatasetBuilder("pix", backend="zarr", replace=True) as builder:
        for n in rng.integers(20, 80, 200):
            ends = np.zeros((n, 1), bool)
            ends[-1] = True
            steps = {
                "action": rng.standard_normal((n, 2)).astype(np.float32),
                "next/terminated": ends & False,
            }
            steps |= {"next/reward": rng.standard_normal((n, 1)).astype(np.float32), "next/truncated": ends}
            pixels = rng.integers(0, 256, (n + 1, 3, 16, 16), dtype=np.uint8)
            builder.append(StepBlock(steps=steps, observations={"pixels": pixels}, ends=np.array([n - 1])))
        builder.commit()
    url = "memory://bench/pix"
    push("pix", url)
    print("\n| sampler | ranks | bytes fetched per rank (share of the dataset) | bound 1/N + 5% |")
    print("|---|---:|---:|---:|")
    for world in (2, 4):
        for sampler in ("blocks", "epoch"):
            got = []
            for r in range(world):
                ds = RemoteDataset(url, cache=work / f"files-{world}-{sampler}-{r}")
                loader = Loader(ds, 64, sampler=sampler, seed=0, rank=r, world_size=world, in_memory=False)
                for _ in loader:
                    pass
                got.append(ds.bytes_fetched / ds.size_bytes())
            print(f"| `{sampler}` | {world} | {min(got):.3f}-{max(got):.3f} | {1 / world + 0.05:.3f} |")
    print(f"\n({ds.num_steps:,} steps, {ds.size_bytes() / 1e6:.1f} MB on the store)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--block-rows", type=int, default=4096)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--store", action="store_true", help="also the bytes fetched per rank")
    args = parser.parse_args(argv)
    lengths = np.random.default_rng(0).integers(50, 501, args.episodes)
    episodes = Episodes(lengths)
    n = episodes.num_steps
    probe = BlockSampler(lengths, BATCH, 0, block_rows=args.block_rows)
    print(
        f"{n:,} steps, {len(lengths):,} episodes, {probe.num_blocks:,} blocks of about "
        f"{args.block_rows:,} rows; batches of {BATCH}\n"
    )
    print("| order | lag-1 corr. | same episode | episodes / batch | blocks / batch | order ms |")
    print("|---|---:|---:|---:|---:|---:|")
    rows: list[tuple[str, np.ndarray, float]] = []
    t0 = time.perf_counter()
    full = EpochSampler(n, BATCH, 0).order()
    rows.append(("`epoch` (full shuffle)", full, time.perf_counter() - t0))
    for w in WINDOWS:
        s = BlockSampler(lengths, BATCH, 0, block_rows=args.block_rows, shuffle_window=w)
        t0 = time.perf_counter()
        order = s.order()
        rows.append((f"`blocks`, shuffle_window={w}", order, time.perf_counter() - t0))
    rows.append(("storage order (no shuffle)", np.arange(n, dtype=np.int64), 0.0))
    for name, order, seconds in rows:
        st = _stats(order, episodes, probe.block_of(order))
        print(
            f"| {name} | {st['corr']:.3f} | {st['same']:.3f} | {st['episodes']:.0f} | "
            f"{st['blocks']:.0f} | {seconds * 1e3:.0f} |"
        )
    world = args.world
    print(f"\nRows of the blocks each of {world} ranks reads in an epoch (share of the dataset):\n")
    print("| order | least | most | bound 1/N + 5% |")
    print("|---|---:|---:|---:|")
    reads = []
    for r in range(world):
        s = BlockSampler(lengths, BATCH, 0, block_rows=args.block_rows, rank=r, world_size=world)
        blocks = np.unique(s.block_of(s.order()))
        reads.append(s.lengths[blocks].sum() / n)
    bound = 1 / world + 0.05
    print(f"| `blocks` | {min(reads):.3f} | {max(reads):.3f} | {bound:.3f} |")
    full_reads = []
    for r in range(world):
        mine = EpochSampler(n, BATCH, 0, rank=r, world_size=world).order()
        blocks = np.unique(probe.block_of(mine))
        full_reads.append(probe.lengths[blocks].sum() / n)
    print(f"| `epoch` | {min(full_reads):.3f} | {max(full_reads):.3f} | {bound:.3f} |")
    if args.store:
        import shutil
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="shuffle-bench-"))
        try:
            store_bytes(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
