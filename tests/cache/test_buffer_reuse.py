"""Output buffers reused across batches (rlds_cli/cache/buffers.py): a buffer is handed out again
only once nothing references the batch that used it; a kept batch (arrays, views, tensors) is
never overwritten; values are those of the path that allocates new arrays."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rlds_cli.cache.buffers import BufferPool, gather_into
from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader.loader import Loader
from rlds_cli.loader.sources import HostSource
from tests.loader_fixtures import make_pixels, make_ted

LENGTHS = [40, 13, 77, 5, 64, 1, 50]
FRAME = (16, 16, 16)  # 4 KiB a row: a batch of 64 or more is pooled
BATCH = 96


@pytest.fixture(scope="module")
def pix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    """Random-byte frames (a misplaced or overwritten row shows) and low-dim keys."""
    root = tmp_path_factory.mktemp("reuse")
    yield make_pixels(root, LENGTHS, FRAME, "tests/cache/test_buffer_reuse.py")


# ----------------------------------------------------------------------------- the pool


def test_small_arrays_are_not_pooled() -> None:
    pool = BufferPool(min_bytes=1024)
    a = pool.empty((10, 10), np.float32)
    assert a.shape == (10, 10) and a.dtype == np.float32 and len(pool) == 0


def test_a_freed_buffer_is_reused_and_a_held_one_never() -> None:
    pool = BufferPool(min_bytes=1024)
    a = pool.empty((64, 64), np.uint8)
    a[...] = 1
    b = pool.empty((64, 64), np.uint8)  # a is held: another buffer
    assert not np.shares_memory(a, b) and len(pool) == 2
    b[...] = 2
    a_ptr = a.ctypes.data
    del a
    c = pool.empty((32, 128), np.uint8)  # a's buffer, free again
    assert c.ctypes.data == a_ptr and len(pool) == 2
    assert (b == 2).all()


@pytest.mark.parametrize("keep", ["view", "tensor", "view_of_view"])
def test_anything_derived_from_a_batch_holds_its_buffer(keep: str) -> None:
    pool = BufferPool(min_bytes=1024)
    a = pool.empty((64, 64), np.uint8)
    a[...] = 7
    held: object
    if keep == "view":
        held = a[3:5]
    elif keep == "tensor":
        held = torch.from_numpy(a)
    else:
        held = a.reshape(-1)[100:200].view(np.int16)
    ptr = a.ctypes.data
    del a
    gc.collect()
    for _ in range(3):
        d = pool.empty((64, 64), np.uint8)
        assert d.ctypes.data != ptr
        d[...] = 0
    del held
    assert pool.empty((64, 64), np.uint8).ctypes.data == ptr


def test_a_full_pool_allocates_and_grows_for_larger_batches() -> None:
    pool = BufferPool(min_bytes=1024, max_buffers=2)
    held = [pool.empty((2048,), np.uint8) for _ in range(3)]  # the third one is not pooled
    assert len(pool) == 2 and len({h.ctypes.data for h in held}) == 3
    del held
    big = pool.empty((8192,), np.uint8)  # larger than both free buffers: one is replaced
    assert len(pool) == 2
    ptr = big.ctypes.data
    del big
    assert pool.empty((4096,), np.uint8).ctypes.data == ptr  # the larger one serves smaller too


@pytest.mark.parametrize(
    "rows", [np.array([3, 0, 9, 9, 1]), np.arange(12).reshape(3, 4) % 10, np.array([-1, -10, 2])]
)
def test_gather_into_is_take(rows: np.ndarray) -> None:
    column = np.random.default_rng(1).standard_normal((10, 40, 3)).astype(np.float32)
    pool = BufferPool(min_bytes=64)
    np.testing.assert_array_equal(gather_into(column, rows, pool), column.take(rows, axis=0))
    np.testing.assert_array_equal(gather_into(column, rows, None), column.take(rows, axis=0))


@pytest.mark.parametrize("bad", [10, -11])
def test_gather_into_out_of_range_raises(bad: int) -> None:
    column = np.zeros((10, 400), np.float32)
    with pytest.raises(IndexError, match="out of bounds"):
        gather_into(column, np.array([0, bad]), BufferPool(min_bytes=64))


# ----------------------------------------------------------------------------- the loader


def _draws(n: int, size: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, steps, size).astype(np.int64) for _ in range(n)]


@pytest.mark.parametrize("in_memory", [False, True])
def test_kept_batches_keep_their_values(pix: Dataset, in_memory: bool) -> None:
    """Every batch of a run kept in a list equals, at the end, what the allocating path gives."""
    reusing = HostSource(pix, in_memory=in_memory)
    plain = HostSource(pix, in_memory=in_memory, reuse_buffers=False)
    assert plain.pool is None and reusing.pool is not None
    draws = _draws(12, BATCH, pix.num_steps)
    kept = [reusing.gather(idx) for idx in draws]
    # and batches dropped at once in between, which recycle buffers without touching the kept ones
    for idx in _draws(6, BATCH, pix.num_steps, seed=1):
        reusing.gather(idx)
    for idx, batch in zip(draws, kept, strict=True):
        want = plain.gather(idx)
        assert list(batch) == list(want)
        for key in want:
            np.testing.assert_array_equal(batch[key], want[key], err_msg=key)


def test_dropped_batches_recycle_buffers(pix: Dataset) -> None:
    """A loop that drops each batch after the next one is drawn runs on a few buffers."""
    loader = Loader(pix, batch_size=BATCH, sampler="uniform", seed=0, in_memory=False, epochs=None)
    pointers = set()
    batch = None
    for _ in range(10):
        batch = loader.sample()
        pointers.add(batch["observation"].data_ptr())
    assert batch is not None
    assert len(pointers) == 2  # this batch's and the previous one's (held while this was drawn)
    host = loader._host
    assert host is not None and host.pool is not None and len(host.pool) == 4  # 2 keys x 2 batches


def test_loader_values_equal_the_allocating_path(pix: Dataset) -> None:
    a = Loader(pix, batch_size=BATCH, sampler="uniform", seed=3, in_memory=False, epochs=None)
    b = Loader(pix, batch_size=BATCH, sampler="uniform", seed=3, in_memory=False, epochs=None)
    assert b._host is not None
    plain = HostSource(pix, reuse_buffers=False)
    b._host = plain
    b._gather = plain.gather
    for _ in range(5):
        x, y = a.sample(), b.sample()
        assert list(x) == list(y)
        for key in x:
            assert torch.equal(x[key], y[key]), key


def test_packed_low_dim_blocks_reuse_too(tmp_path: Path) -> None:
    """In RAM, packed: a large batch's block is pooled and its values are the allocating path's."""
    ds = make_ted(tmp_path, "low", [300, 200, 500])
    reusing = HostSource(ds, in_memory=True)
    plain = HostSource(ds, in_memory=True, reuse_buffers=False)
    idx = _draws(1, 8192, ds.num_steps)[0]  # rows r and r + 1: ~500 KB
    got = reusing.gather(idx)
    assert reusing.pool is not None and len(reusing.pool) == 1
    want = plain.gather(idx)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
