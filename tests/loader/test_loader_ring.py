"""TedDataLoader's shared-memory batch ring (rlds_cli/loader/ring.py): workers gather image keys
into preallocated shared slots and return slot numbers. Same values, order and resume as without
workers; a batch the loop holds is never overwritten; crashes are clear; nothing leaks."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.data_loader import TedDataLoader
from rlds_cli.loader.ring import BatchRing
from rlds_cli.loader.torch_data import EpochBatchSampler, TedIterableDataset, TedMapDataset
from tests.loader_fixtures import make_pixels
from tests.waits import settles

LENGTHS = [40, 13, 77, 5, 64, 1, 50]  # 250 steps: not a multiple of the batch size
N = sum(LENGTHS)
FRAME = (4, 16, 16)  # 1,024 bytes a row: goes through the ring
BATCH = 16


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    """Pixel observations (random bytes, so any misplaced row shows) and low-dim keys."""
    root = tmp_path_factory.mktemp("ring")
    yield make_pixels(root, LENGTHS, FRAME, "tests/loader/test_loader_ring.py")


def _iterable(ds: Dataset, workers: int, **kw: Any) -> TedDataLoader:
    shuffle = kw.pop("shuffle", "epoch")
    extra = {"num_batches": kw.pop("num_batches", 12)} if shuffle == "uniform" else {}
    data = TedIterableDataset(ds, BATCH, seed=5, shuffle=shuffle, **extra)
    if workers:
        kw.setdefault("multiprocessing_context", "fork")
    return TedDataLoader(data, num_workers=workers, **kw)


def _mapped(ds: Dataset, workers: int, **kw: Any) -> TedDataLoader:
    sampler = EpochBatchSampler(N, BATCH, seed=5)
    if workers:
        kw.setdefault("multiprocessing_context", "fork")
    return TedDataLoader(TedMapDataset(ds), batch_sampler=sampler, num_workers=workers, **kw)


def _in_ring(loader: TedDataLoader, batch: TedBatch) -> bool:
    """Whether the batch's observations are views of the loader's shared ring."""
    ring = loader._ring
    if ring is None:
        return False
    start = ring.buffers.data_ptr()
    return start <= batch["observation"].data_ptr() < start + ring.buffers.numel()


def _copies(loader: TedDataLoader) -> list[TedBatch]:
    """A pass, each batch checked to come from the ring and copied (so its slot is reused)."""
    out = []
    for batch in loader:
        assert _in_ring(loader, batch)  # no copy on the way: the batch lives in a shared slot
        out.append(TedBatch({key: value.clone() for key, value in batch.items()}))
    return out


def _same(a: list[TedBatch], b: list[TedBatch]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)  # same keys, same order
        for key in x:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key


@pytest.mark.parametrize("make", [_iterable, _mapped])
def test_values_identical_to_in_process(ds: Dataset, make: Any) -> None:
    ref = list(make(ds, 0))
    _same(ref, _copies(make(ds, 2)))
    _same(ref, list(make(ds, 2, ring_slots=0)))  # torch's own transfer: the same stream


def test_uniform_stream_and_spawned_persistent_workers(ds: Dataset) -> None:
    ref = list(_iterable(ds, 0, shuffle="uniform"))
    loader = _iterable(ds, 2, shuffle="uniform", multiprocessing_context="spawn", persistent_workers=True)
    _same(ref, _copies(loader))
    second = _copies(loader)  # the same persistent workers and ring, the next epoch
    assert len(second) == len(ref) and not torch.equal(second[0]["index"], ref[0]["index"])
    loader.close()


def test_low_dim_keys_do_not_use_a_ring(ds: Dataset) -> None:
    data = TedIterableDataset(ds, BATCH, keys=["action", "next/reward"], seed=1)
    loader = TedDataLoader(data, num_workers=1, multiprocessing_context="fork")
    assert len(list(loader)) == len(data) and loader._ring is None  # rows under 1 KiB
    with pytest.raises(ValueError, match="ring_slots"):
        TedDataLoader(data, num_workers=1, ring_slots=-1)


@pytest.mark.parametrize("make", [_iterable, _mapped])
def test_exact_resume(ds: Dataset, make: Any) -> None:
    ref = list(make(ds, 0))
    loader = make(ds, 2)
    it = iter(loader)
    seen = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it, loader  # the "kill": workers and prefetched batches are gone
    resumed = make(ds, 2)
    resumed.load_state_dict(state)
    _same(ref, seen + list(resumed))


@pytest.mark.parametrize("slots", [1, None])
def test_held_batches_are_never_overwritten(ds: Dataset, slots: int | None) -> None:
    """The loop keeps every batch (more than the ring has slots): each keeps its values; the
    workers go the ordinary way while their slots are all held."""
    ref = list(_iterable(ds, 0))
    loader = _iterable(ds, 2, ring_slots=slots, prefetch_factor=2)
    held = list(loader)
    _same(ref, held)
    assert loader._ring is not None and loader._ring.busy_np.all()  # every slot held
    views = [b["observation"][3:5] for b in held[:2]]  # a view keeps its slot too
    del held
    gc.collect()
    assert loader._ring.busy_np.sum() == 2  # the slots of the first two batches
    del views
    gc.collect()
    assert not loader._ring.busy_np.any()  # every slot free again


class _Crashing(TedIterableDataset):
    """Fails at its third batch in a worker: by an exception, or by the process dying."""

    how = "raise"

    def _batch(self, idx: np.ndarray, worker: int = -1) -> Any:
        if worker >= 0 and int(idx[0]) == self._third:
            if self.how == "exit":
                os._exit(3)
            raise OSError("disk gone")
        return super()._batch(idx, worker)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_worker_crash_is_a_clear_error(ds: Dataset, how: str) -> None:
    data = _Crashing(ds, BATCH, seed=5)
    data.how = how
    data._third = int(next(iter(list(TedIterableDataset(ds, BATCH, seed=5))[2:3]))["index"][0])
    loader = TedDataLoader(data, num_workers=2, multiprocessing_context="fork")
    error = (OSError, "disk gone") if how == "raise" else (RuntimeError, "exited unexpectedly")
    got = []
    with pytest.raises(error[0], match=error[1]):
        for batch in loader:
            got.append(batch)
    # the batches before the failure came through (a dead worker may be noticed sooner)
    assert len(got) == 2 if how == "raise" else len(got) <= 2


def _mappings() -> int:
    with open("/proc/self/maps") as fh:
        return sum("torch_" in line for line in fh)


def test_nothing_leaks_after_close(ds: Dataset) -> None:
    gc.collect()
    # sets, not counts: a thread or file of an earlier test that ends meanwhile is no leak here
    fds, maps, threads = set(os.listdir("/proc/self/fd")), _mappings(), set(threading.enumerate())
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    loader = _iterable(ds, 2, persistent_workers=True)
    batches = list(loader)
    ring = weakref.ref(loader._ring)
    assert isinstance(ring(), BatchRing) and _mappings() > maps
    loader.close()
    assert loader._iterator is None and loader._ring is None
    assert batches[0]["observation"].sum() >= 0  # held batches stay readable after close
    del batches, loader
    gc.collect()
    assert ring() is None
    assert _mappings() <= maps
    # a descriptor or thread may outlive close() by a moment: torch's queues close their pipes
    # on feeder threads, and an earlier test's background thread may hold a file meanwhile
    assert not settles(lambda: set(os.listdir("/proc/self/fd")) - fds)
    assert not settles(lambda: set(threading.enumerate()) - threads)
    if shm:
        assert not {n for n in set(os.listdir("/dev/shm")) - shm if "torch" in n}


def test_pass_broken_off_with_persistent_workers(ds: Dataset) -> None:
    """Persistent workers restarted after a pass broken off get a fresh ring; the batches still
    held from the old one keep their values, and the stream goes on exactly."""
    ref = list(_iterable(ds, 0))
    loader = _iterable(ds, 2, persistent_workers=True)
    kept = []
    for batch in loader:
        kept.append(batch)
        if len(kept) == 3:
            break
    old = loader._ring
    rest = _copies(loader)  # the rest of the epoch, from restarted workers
    assert loader._ring is not old
    _same(ref, kept + rest)
    loader.close()
