"""The sampling sides the sampling sections (loader, pixel, real, frame-stack, dataloader) build
beside the rlds ``Loader``: the lean raw gather, TorchRL's replay buffers over the same data, and
the ``TedDataLoader`` of the DataLoader cases."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _child_runs import FILL_ROWS, TED_KEYS, ted, warm

BATCH = 256
NUM_SLICES, SLICE_LEN = 8, 32
#: ``Loader`` options of the slice cases.
SLICES = {"sampler": "slice", "slice_len": SLICE_LEN}


def sample(ds: Any, **options: Any) -> Callable[[], Any]:
    """``Loader(ds, 256, seed=0, **options).sample``."""
    from rlds_cli.loader import Loader

    return Loader(ds, BATCH, seed=0, **options).sample  # type: ignore[no-any-return]


def plain(array: np.ndarray) -> np.ndarray:
    """A plain ``np.ndarray`` over ``array``'s buffer (no copy).

    ``np.load(mmap_mode="r")`` returns an ``np.memmap``, a subclass whose ``__array_finalize__``
    and ``__array_wrap__`` hooks run on every gather result: on 256-row batches they cost more than
    the gather itself, so a reference reading through them is slower than the limit it stands for.
    """
    return array.view(np.ndarray)


class Raw:
    """The lean raw gather: the least code that returns what the rlds loader returns, per layout.

    ``np.take`` per key with one index vector on plain ndarrays (plain views of the memory maps of
    a memmap dataset, or plain arrays in RAM), the same keys as the loader (``next/observation``
    rebuilt from the flat observation rows ``t + e(t) + 1``, ``next/done`` as ``terminated |
    truncated``, the episode, the indices, the slices' mask), then one ``torch.from_numpy`` per
    key: no dict, no checks. Every "x of raw" of the benchmarks is against this. For frame
    stacks, :meth:`stacks`: the frames of the observation stacks alone.
    """

    def __init__(self, ds: Any, packed: np.ndarray | None = None, block_plan: list[Any] | None = None):
        arrays = ds.directory / "arrays"
        self.n = ds.num_steps
        self.cols = {k: plain(np.load(arrays / f"{k}.npy", mmap_mode="r")) for k in ds.manifest.fields}
        lengths = np.asarray(ds.episodes["length"], np.int64)
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.windows = np.maximum(lengths - SLICE_LEN + 1, 0)
        self.cum_windows = np.cumsum(self.windows)
        self.packed = packed
        # the packed layout's views: (half, first column, end column) per key, as rlds lays them out
        self.views = [(half, start, end) for _, half, start, end, _ in (block_plan or [])]
        # step -> episode, precomputed (the fastest way), int64 so that no conversion is needed
        self.episode_table = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        self.rng = np.random.default_rng(0)

    @functools.cached_property
    def ram(self) -> dict[str, np.ndarray]:
        """Plain in-RAM copies of the columns (made on first use)."""
        return {k: np.array(v) for k, v in self.cols.items()}

    def draw(self, high: int, size: int) -> np.ndarray:
        """``size`` int64 indices in ``[0, high)``: raw 64-bit words modulo ``high`` (half the cost
        of ``Generator.integers``, whose Python-level argument handling dominates small draws)."""
        words = self.rng.bit_generator.random_raw(size)
        words %= np.uint64(high)
        return words.view(np.int64)

    def gather(self, i: np.ndarray, cols: dict[str, np.ndarray]) -> list[Any]:
        e = self.episode_table.take(i)
        r = i + e
        obs = cols["observation"]
        term, trunc = cols["next/terminated"].take(i, 0), cols["next/truncated"].take(i, 0)
        out = [obs.take(r, 0), obs.take(r + 1, 0), cols["action"].take(i, 0), cols["next/reward"].take(i, 0)]
        return list(map(torch.from_numpy, [*out, term, trunc, term | trunc, e, i]))

    def uniform(self, cols: dict[str, np.ndarray]) -> Any:
        return self.gather(self.draw(self.n, BATCH), cols)

    def uniform_memmap(self) -> Any:
        return self.uniform(self.cols)

    def uniform_ram(self) -> Any:
        return self.uniform(self.ram)

    def uniform_packed(self) -> Any:
        """The packed layout (rows ``r`` and ``r + 1`` in one take), each key a view of the block."""
        assert self.packed is not None
        i = self.draw(self.n, BATCH)
        e = self.episode_table.take(i)
        r = i + e
        block = self.packed.take(np.concatenate([r, r + 1]), 0)
        flags = block.view(np.bool_)
        n = BATCH  # the rows of a half: ``r``, then ``r + 1``
        out = [
            block[h * n : (h + 1) * n, a:b] if h >= 0 else flags[:n, a:b] for h, a, b in self.views if h != -2
        ]
        return [*map(torch.from_numpy, out), torch.from_numpy(e), torch.from_numpy(i)]

    def slices(self, cols: dict[str, np.ndarray]) -> Any:
        k = self.draw(int(self.cum_windows[-1]), NUM_SLICES)
        e = np.searchsorted(self.cum_windows, k, side="right")
        start = self.starts[e] + (k - (self.cum_windows[e] - self.windows[e]))
        out = self.gather(start[:, None] + np.arange(SLICE_LEN), cols)
        out.append(torch.from_numpy(np.ones((NUM_SLICES, SLICE_LEN), np.bool_)))  # the mask
        return out

    def slices_memmap(self) -> Any:
        return self.slices(self.cols)

    def slices_ram(self) -> Any:
        return self.slices(self.ram)

    def epoch(self, cols: dict[str, np.ndarray]) -> int:
        perm = self.rng.permutation(self.n)
        for s in range(0, self.n, BATCH):
            self.gather(perm[s : s + BATCH], cols)
        return -(-self.n // BATCH)

    def stacks(self, k: int, in_ram: bool = False) -> Callable[[], np.ndarray]:
        """One ``np.take`` of the ``256 x k`` frames of the observation stacks (rows ``t-k+1..t``,
        clamped at the episode's first frame; the access pattern of a stack): no next
        observation, no other key, no torch conversion."""
        frames = self.ram["observation"] if in_ram else self.cols["observation"]
        first_row = self.starts + np.arange(len(self.starts))  # an episode's first flat row

        def gather() -> np.ndarray:
            i = self.draw(self.n, BATCH)
            e = self.episode_table.take(i)
            rows = np.maximum((i + e)[:, None] + np.arange(1 - k, 1), first_row.take(e)[:, None])
            return np.take(frames, rows.reshape(-1), axis=0)

        return gather


def torchrl_buffers(ds: Any, samplers: dict[str, Callable[[], Any]], scratch: Path | None) -> dict[str, Any]:
    """TorchRL ``TensorDictReplayBuffer`` s, one per sampler, over one storage holding the whole of
    ``ds`` as full TED (``rb.extend`` of :data:`FILL_ROWS` rows at a time): a
    ``LazyMemmapStorage`` in ``scratch`` (its files then read once), or a ``LazyTensorStorage`` in
    RAM. The first sampler sees the extends (put a ``PrioritizedSampler`` first); the others
    share the filled storage."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer

    n = ds.num_steps
    if scratch is None:
        storage = LazyTensorStorage(n)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
        storage = LazyMemmapStorage(n, scratch_dir=scratch)
    rbs = {
        name: TensorDictReplayBuffer(storage=storage, sampler=make(), batch_size=BATCH)
        for name, make in samplers.items()
    }
    first = next(iter(rbs.values()))
    for start in range(0, n, FILL_ROWS):
        batch = ds.gather(np.arange(start, min(start + FILL_ROWS, n)))
        first.extend(ted({k: batch[k] for k in TED_KEYS}))
    if scratch is not None:
        for path in scratch.rglob("*.memmap"):
            warm(path)
    return rbs


def dataloader(ds: Any, workers: int, ring_slots: int | None) -> Any:
    """A ``TedDataLoader`` of uniform batches (fork workers, persistent); ``ring_slots=0``: no
    shared ring (torch's own transfer of the batches)."""
    from rlds_cli.loader import TedDataLoader, TedIterableDataset

    data = TedIterableDataset(ds, BATCH, shuffle="uniform", seed=0)
    kw: dict[str, Any] = {"multiprocessing_context": "fork", "persistent_workers": True} if workers else {}
    return TedDataLoader(data, num_workers=workers, ring_slots=ring_slots, **kw)


def check_ring(ds: Any) -> None:
    """The ring's batches equal those made without workers (same seed, same stream)."""
    ref, ring = dataloader(ds, 0, None), dataloader(ds, 2, None)
    for _, a, b in zip(range(6), ref, ring, strict=False):
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and bool((a[key] == b[key]).all()), key
    assert ring._ring is not None  # the batches did come through the ring
    ring.close()
