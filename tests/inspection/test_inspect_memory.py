"""``rlds inspect`` and ``--check`` read every column in bounded blocks
(:mod:`rlds_cli.cache.blocks`): no read is larger than the block budget, whatever the dataset's
size, the results do not depend on the budget, and a memory map's pages are released after each
block. Held by counting bytes (the budget's record, and a spy on every column read), not by
timing anything."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.cache.backends.memmap import load_npy, release_pages
from rlds_cli.cache.blocks import Budget, blocks, read, row_bytes, ted_blocks
from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.inspection.summary import describe
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl
from tests.write.test_writer import episode

#: The small budget of these tests: the datasets below are hundreds of blocks of it.
BUDGET = 4096


def _d4rl(path: Path, steps: int = 30_000, length: int = 250) -> Path:
    """A low-dim D4RL file: 17 float32 observations, episodes of ``length`` steps (~2 MB)."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(steps, 17)).astype(np.float32)
    timeouts = np.zeros(steps, bool)
    timeouts[length - 1 :: length] = True
    return write_d4rl(
        path,
        observations=obs,
        actions=rng.uniform(-1, 1, (steps, 6)).astype(np.float32),
        rewards=rng.normal(size=steps).astype(np.float32),
        terminals=np.zeros(steps, bool),
        timeouts=timeouts,
        next_observations=np.concatenate([obs[1:], obs[:1]]),
    )


class _Spy:
    """A stored column that records the bytes of every read made through it."""

    def __init__(self, column: Any, reads: list[int]) -> None:
        self._column, self._reads = column, reads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._column, name)

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, index: Any) -> Any:
        rows = self._column[index]
        self._reads.append(np.asarray(rows).nbytes)
        return rows


def _spy_on_columns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every read of every column a :class:`Dataset` hands out, in bytes."""
    reads: list[int] = []
    column = Dataset.column
    monkeypatch.setattr(Dataset, "column", lambda self, key: _Spy(column(self, key), reads))
    return reads


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_inspect_and_check_never_read_more_than_a_block(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    convert(_d4rl(tmp_path / "f.hdf5"), "f", backend=backend)
    whole = describe(open_dataset("f"), budget=Budget(1 << 30))  # one block per column
    reads = _spy_on_columns(monkeypatch)
    ds = open_dataset("f")
    # a zarr column is read in whole chunks: its blocks are at least one chunk
    columns = [ds.column(k) for k in ds.stored_fields]
    limit = max(BUDGET, *(int(getattr(c, "chunk_rows", 0) or 0) * row_bytes(c) for c in columns))
    summary, check = Budget(BUDGET), Budget(BUDGET)
    info = describe(ds, budget=summary)
    report = check_dataset(ds, budget=check)
    assert report.ok, [str(v) for v in report.violations]
    assert "digest" in report.checks
    data_bytes = sum(info["stored"][k]["logical_bytes"] for k in info["stored"])
    assert data_bytes > 100 * limit  # the dataset is a hundred blocks or more
    for budget in (summary, check):
        assert 0 < budget.largest <= limit
        assert budget.total >= data_bytes  # every column read whole, block after block
    assert 0 < max(reads) <= limit  # no read of any column past the budget, by any path
    # the blocks change nothing: the same numbers as from one read per column
    assert info["episode_length"] == whole["episode_length"]
    assert info["histograms"]["episode_length"] == whole["histograms"]["episode_length"]
    returns, whole_returns = info["histograms"]["episode_return"], whole["histograms"]["episode_return"]
    assert returns["counts"] == whole_returns["counts"]
    assert returns["edges"] == pytest.approx(whole_returns["edges"], rel=1e-12)
    assert info["episode_return"] == pytest.approx(whole["episode_return"], rel=1e-12)
    for key, entry in info["stored"].items():
        assert entry["stats"] == pytest.approx(whole["stored"][key]["stats"], rel=1e-9), key
    assert (info["episodes_terminated"], info["episodes_truncated"]) == (0, 120)


def test_growing_dataset_is_read_part_by_part(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlds_cli.cache.growing as growing

    monkeypatch.setattr(growing, "SMALL_ROWS", 0)  # every segment a memory map, none in RAM
    with rlds_cli.DatasetWriter("g", mode="append", commit_interval=0) as w:
        for uid in range(6):
            w.add_episode(episode(40 + uid, float(uid), uid=uid))
            w.flush()
    ds = open_dataset("g")
    column = ds.column("observation")
    assert len(column.offsets) > 3  # several segments end to end
    budget = Budget(BUDGET)
    rows = read(column, 0, len(column), budget)
    np.testing.assert_array_equal(rows, np.asarray(column[0 : len(column)]))
    report = check_dataset(ds, budget=budget)
    assert report.ok, [str(v) for v in report.violations]
    info = describe(ds, budget=budget)
    lengths = np.arange(40, 46)
    assert info["episode_length"] == {"min": 40, "max": 45, "mean": 42.5, "std": pytest.approx(lengths.std())}
    assert info["episode_return"]["max"] == 45.0  # a reward of 1 per step


def test_ted_blocks_match_the_reader_across_episode_and_block_ends(tmp_path: Path) -> None:
    convert(_d4rl(tmp_path / "f.hdf5", steps=1000, length=7), "f")
    ds = open_dataset("f")
    keys = ["observation", "next/observation", "next/done", "episode", "action"]
    want = ds.gather(np.arange(ds.num_steps), keys)
    seen = 0
    for start, stop, batch in ted_blocks(ds, keys, Budget(700), overlap=1):
        assert start == seen and stop > start
        end = min(stop + 1, ds.num_steps)
        for key in keys:
            np.testing.assert_array_equal(batch[key], want[key][start:end], err_msg=key)
        seen = stop
    assert seen == ds.num_steps


def test_blocks_follow_the_budget() -> None:
    column = np.arange(1000, dtype=np.float32).reshape(250, 4)  # 16 bytes a row
    budget = Budget(160)
    got = list(blocks(column, budget))
    assert [start for start, _ in got] == list(range(0, 250, 10))
    np.testing.assert_array_equal(np.concatenate([rows for _, rows in got]), column)
    assert (budget.largest, budget.blocks, budget.total) == (160, 25, column.nbytes)
    # sized for a float64 working copy: half the rows
    assert [len(rows) for _, rows in blocks(column, Budget(160), itemsize=8)][:2] == [5, 5]
    assert Budget(10).rows(100) == 1  # a row larger than the budget: one row a block
    assert Budget(1000).rows(10, chunk_rows=30) == 90  # whole chunks
    assert Budget(100).rows(10, chunk_rows=30) == 30  # at least one chunk


def test_a_budget_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="a block budget must be at least 1 byte, got 0"):
        Budget(0)


def test_release_pages_only_of_read_only_maps(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(1 << 16, dtype=np.float64))
    mapped = load_npy(path, mmap=True)
    assert release_pages(np.asarray(mapped[100:5000]))
    assert not release_pages(np.arange(10))  # not a memory map
    assert not release_pages(mapped[:0])  # nothing to release
    own = np.load(path, mmap_mode="c")
    own[3] = -1.0
    assert not release_pages(own[:10])  # a copy-on-write map would lose its changes
    assert own[3] == -1.0


def _resident_bytes() -> int:
    """The process's resident memory (anonymous, file and shared pages), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the resident set from /proc")
def test_a_scan_of_a_memory_map_keeps_the_memory_of_one_block(tmp_path: Path) -> None:
    size = 64 << 20
    path = tmp_path / "big.npy"
    np.save(path, np.ones(size // 8, np.float64))
    scanned = load_npy(path, mmap=True)
    before = _resident_bytes()
    total = sum(float(rows.sum()) for _, rows in blocks(scanned, Budget(1 << 20)))
    assert total == size // 8
    assert _resident_bytes() - before < size // 8  # the pages went after each block
    kept = load_npy(path, mmap=True)  # the same scan without releasing: every page stays
    before = _resident_bytes()
    assert float(np.asarray(kept).sum()) == size // 8
    assert _resident_bytes() - before > size // 2


def test_a_pool_with_size_classes_shares_buffers_of_nearly_one_size() -> None:
    pool = BufferPool(min_bytes=64, size_classes=True)
    a = pool.empty((1000,), np.float64)  # 8,000 bytes: a buffer of 8,192
    b = pool.empty((100,), np.float64)  # 800 bytes: a buffer of 1,024
    assert (a.base.nbytes, b.base.nbytes) == (8192, 1024)
    large, small = id(a.base), id(b.base)  # ids, not references: a reference holds a buffer
    del a, b
    c = pool.empty((120,), np.float64)  # the smallest free buffer that fits, not the first
    d = pool.empty((1020,), np.float64)  # a few bytes more than the first output: its buffer
    assert (id(c.base), id(d.base)) == (small, large)
    assert len(pool) == 2
    exact = BufferPool(min_bytes=64)  # the loader's: buffers of the outputs' own sizes
    assert exact.empty((1000,), np.float64).base.nbytes == 8000
