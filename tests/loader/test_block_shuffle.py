"""``sampler="blocks"`` (issue 42 items 3-4): whole blocks of episodes, rows shuffled within a
window of blocks, each rank its own share of the blocks, each step once per epoch over all
ranks, the same number of batches on every rank; deterministic in (seed, epoch), resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.errors import LoaderStateError
from rlds_cli.loader import BlockSampler, Loader, make_sampler
from rlds_cli.loader.block_shuffle import storage_block_rows
from rlds_cli.loader.samplers import Episodes, block_starts


def _epoch(samplers: list[BlockSampler]) -> list[list[np.ndarray]]:
    """Every rank's batches of one epoch (every rank runs the same count)."""
    out = []
    for s in samplers:
        batches = []
        while not s.epoch_done():
            batches.append(s.sample())
        out.append(batches)
    return out


def _ranks(lengths: Any, batch: int, world: int, **kw: Any) -> list[BlockSampler]:
    return [BlockSampler(lengths, batch, 11, rank=r, world_size=world, **kw) for r in range(world)]


def test_blocks_are_whole_episodes_aligned_to_chunks() -> None:
    lengths = np.array([30, 50, 10, 100, 5, 5, 200])  # starts 0 30 80 90 190 195 200
    starts = block_starts(Episodes(lengths), 64)
    assert starts.tolist() == [0, 80, 190, 195]  # chunks [0,64) [64,128) [128,192) [192,256)
    s = BlockSampler(lengths, 8, 0, block_rows=64)
    assert s.num_blocks == 4 and s.lengths.sum() == lengths.sum()


def test_each_step_once_per_epoch_deterministic_and_reshuffled() -> None:
    lengths = np.random.default_rng(0).integers(1, 40, 150)
    n = int(lengths.sum())
    a = np.concatenate(_epoch(_ranks(lengths, 32, 1, block_rows=50, shuffle_window=4))[0])
    b = np.concatenate(_epoch(_ranks(lengths, 32, 1, block_rows=50, shuffle_window=4))[0])
    assert sorted(a.tolist()) == list(range(n)) and (a == b).all()
    s = _ranks(lengths, 32, 1, block_rows=50, shuffle_window=4)[0]
    first = np.concatenate(_epoch([s])[0])
    s.sample()  # the next epoch begins
    assert s.epoch == 1 and not (s.order() == first).all()


def test_a_window_holds_rows_of_window_blocks_only() -> None:
    lengths = np.full(64, 10)  # 640 steps, blocks of 20 rows (two episodes)
    s = BlockSampler(lengths, 40, 3, block_rows=20, shuffle_window=2)
    order = s.order()
    blocks = s.block_of(order).reshape(-1, 40)  # each run of 40 rows: two blocks' rows, shuffled
    assert all(len(set(row.tolist())) == 2 for row in blocks)
    assert not all((np.diff(o) == 1).all() for o in order.reshape(-1, 40))  # rows are shuffled


@pytest.mark.parametrize("case", range(40))
def test_ranks_partition_the_epoch_with_equal_batch_counts_and_their_own_blocks(case: int) -> None:
    rng = np.random.default_rng(case)
    lengths = rng.integers(1, 30, rng.integers(200, 600))  # an episode <= 1% of the dataset
    n = int(lengths.sum())
    world = int(rng.integers(1, 9))
    block_rows = int(max(1, n * rng.uniform(0.002, 0.015)))  # so a block is <= 2.5% of it
    batch = int(rng.integers(1, 64))
    window = int(rng.integers(1, 8))
    samplers = _ranks(lengths, batch, world, block_rows=block_rows, shuffle_window=window)
    epochs = _epoch(samplers)
    assert len({len(b) for b in epochs}) == 1  # every rank the same number of batches (DDP)
    steps = [np.concatenate(b) if b else np.zeros(0, np.int64) for b in epochs]
    assert np.sort(np.concatenate(steps)).tolist() == list(range(n))  # each step exactly once
    s = samplers[0]
    for r, mine in enumerate(steps):
        blocks = np.unique(s.block_of(mine))
        # the rows of the blocks it reads: its share plus at most the rest of its two end blocks
        assert s.lengths[blocks].sum() <= -(-n // world) + 2 * (s.lengths.max() - 1)
        assert s.lengths.max() <= 0.025 * n
        assert s.lengths[blocks].sum() <= n / world + 0.05 * n, (r, world)
        sizes = [len(b) for b in epochs[r]]
        assert all(x == batch for x in sizes[:-2]) and min(sizes) >= 1  # only the last 1-2 shorter


def test_state_resumes_mid_epoch_exactly() -> None:
    lengths = np.random.default_rng(1).integers(5, 30, 60)
    a = BlockSampler(lengths, 16, 5, block_rows=40, shuffle_window=3, rank=1, world_size=2)
    for _ in range(7):
        a.sample()
    state = a.state_dict()
    assert set(state) >= {"seed", "epoch", "position", "batch", "history"}
    b = BlockSampler(lengths, 16, 99, block_rows=40, shuffle_window=3, rank=1, world_size=2)
    b.load_state_dict(state)
    assert b.seed == 5
    for _ in range(30):
        assert (a.sample() == b.sample()).all()


def test_refused_states_name_the_field_and_change_nothing() -> None:
    lengths = np.full(20, 10)
    s = BlockSampler(lengths, 8, 5, block_rows=30)
    good = s.state_dict()
    cases = [
        ({**good, "block_rows": 40}, "block_rows=40"),
        ({**good, "position": 10**6}, "position"),
        ({**good, "history": [[2, [1]]]}, "history"),
        ({**good, "history": [[1, [10**6]]]}, "consumed"),
        ({**good, "rank": 1, "world_size": 2}, "rank 1 of 2"),
        ({**good, "num_steps": 7}, "7 steps"),
    ]
    for state, words in cases:
        with pytest.raises(LoaderStateError, match=words):
            s.load_state_dict(state)
        assert s.state_dict() == good


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="shuffle_window must be a positive integer"):
        BlockSampler([10], 4, 0, shuffle_window=0)
    with pytest.raises(ValueError, match="3 ranks"):
        BlockSampler([2], 4, 0, rank=0, world_size=3)
    with pytest.raises(ValueError, match="no option"):
        make_sampler("blocks", Episodes(np.array([10])), 4, 0, slice_len=2)


def test_loader_blocks_default_rows_from_zarr_shards(
    ted_dataset: Any, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # columns read from their chunks, not loaded whole into RAM as small ones are
    monkeypatch.setattr("rlds_cli.cache.backends.zarr.write.ZARR_IN_RAM_BYTES", 0)
    ds = ted_dataset([300, 200, 500], backend="zarr")
    rows = storage_block_rows(ds)
    widest = max(ds.stored_fields, key=lambda k: ds.stored_fields[k].row_bytes)
    assert rows == ds.column(widest).chunk_rows > 1
    loader = Loader(ds, batch_size=64, sampler="blocks", seed=0, shuffle_window=2)
    assert loader.sampler.block_rows == rows  # type: ignore[attr-defined]
    seen = np.concatenate([b["index"].numpy() for b in loader])
    assert np.sort(seen).tolist() == list(range(1000)) and len(loader) == 16
    memmap = Loader(ted_dataset([100, 50]), batch_size=16, sampler="blocks", seed=0)
    assert memmap.sampler.block_rows == 65536  # type: ignore[attr-defined]  # 8 MiB of tiny rows, capped


def test_bytes_fetched_per_rank_from_a_store(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of N ranks reading a pushed zarr dataset through its own file cache fetches about
    1/N of the dataset's bytes per epoch with "blocks" (<= 1/N + 5%), all of it with "epoch"."""
    pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    from rlds_cli.cache import DatasetBuilder
    from rlds_cli.cache.backends.zarr import write as zarr_write
    from rlds_cli.formats.base import StepBlock
    from rlds_cli.remote.push import push
    from rlds_cli.remote.reader import RemoteDataset

    # shards of 64 pixel rows, so a few thousand steps span many (the real ones hold 16 MiB)
    monkeypatch.setattr(zarr_write, "ZARR_CHUNK_BYTES", 6144)
    monkeypatch.setattr(zarr_write, "ZARR_SHARD_BYTES", 6144 * 8)
    monkeypatch.setattr(zarr_write, "ZARR_IN_RAM_BYTES", 0)
    rng = np.random.default_rng(0)
    with DatasetBuilder("pix", backend="zarr") as builder:
        for n in rng.integers(20, 80, 100):
            ends = np.zeros((n, 1), bool)
            ends[-1] = True
            steps = {
                "action": rng.standard_normal((n, 2)).astype(np.float32),
                "next/terminated": ends & False,
            }
            steps |= {"next/reward": rng.standard_normal((n, 1)).astype(np.float32), "next/truncated": ends}
            pixels = rng.integers(0, 256, (n + 1, 3, 16, 16), dtype=np.uint8)  # incompressible
            builder.append(StepBlock(steps=steps, observations={"pixels": pixels}, ends=np.array([n - 1])))
        builder.commit()
    url = "memory://bucket/pix"
    push("pix", url)
    try:
        world = 4
        for sampler, low, high in (("blocks", 1 / world, 1 / world + 0.05), ("epoch", 1.0, 1.01)):
            seen = []
            for r in range(world):
                ds = RemoteDataset(url, cache=isolated_cache / f"files-{sampler}-{r}")
                loader = Loader(ds, 64, sampler=sampler, seed=0, rank=r, world_size=world, in_memory=False)
                assert sampler == "epoch" or loader.sampler.block_rows == 64  # type: ignore[attr-defined]
                seen += [i for b in loader for i in b["index"].tolist()]
                assert low <= ds.bytes_fetched / ds.size_bytes() <= high, (sampler, r)
            exact = seen if sampler == "blocks" else set(seen)  # "epoch" pads its shards
            assert sorted(exact) == list(range(ds.num_steps))
    finally:
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]


def test_torch_dataset_adapter_refuses_the_block_order(ted_dataset: Any) -> None:
    from rlds_cli.loader import TedIterableDataset

    with pytest.raises(ValueError, match=r"Loader\(\.\.\., sampler='blocks'\)"):
        TedIterableDataset(ted_dataset([10, 10]), 4, shuffle="blocks", seed=0)


def test_default_rows_of_a_frame_column_follow_its_stored_bytes() -> None:
    """A frame column (one file of image files, no chunks) sizes its blocks by the bytes its rows
    take as stored, not decoded: a block then spans about one remote cache block."""
    from types import SimpleNamespace

    from rlds_cli.loader.block_shuffle import DEFAULT_BLOCK_BYTES

    rows = 5000
    ends = np.cumsum(np.full(rows, 22_000, np.int64))  # JPEGs of 22 KB for 224x224x3 frames
    column = SimpleNamespace(chunk_rows=None, ends=ends)
    ds = SimpleNamespace(
        stored_fields={"pixels": SimpleNamespace(row_bytes=224 * 224 * 3), "a": SimpleNamespace(row_bytes=8)},
        column=lambda key: column,
    )
    assert storage_block_rows(ds) == DEFAULT_BLOCK_BYTES // 22_000
    column.ends = None  # decoded rows: fewer per block
    assert storage_block_rows(ds) == max(64, DEFAULT_BLOCK_BYTES // (224 * 224 * 3))
