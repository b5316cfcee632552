"""A ring of preallocated shared-memory batch buffers for DataLoader worker processes.

A batch returned the ordinary way is pickled by torch into a fresh shared-memory segment that the
main process maps and unmaps; on pixel data (10.8 MB a batch of 256 (3, 84, 84) observations and
next observations) one or two workers then run at ~0.05x of the in-process loader.

The main process allocates ``workers x slots`` batch buffers in one shared-memory block (plus a
"busy" flag per slot) before the workers start; they inherit it (fork) or receive its file
descriptor once (spawn, forkserver). Worker ``w`` owns slots ``w * slots .. (w + 1) * slots - 1``:
it gathers the large keys (rows of at least :data:`MIN_ROW_BYTES`) into a free slot with
``np.take(..., out=)`` and returns the slot number plus the small keys. The main process wraps the
slot as tensors without a copy.

Guarantees: **a slot is reused only once every tensor and array built from it (views included)
has been freed** (a ``weakref.finalize`` on their base clears the flag), so a kept batch is never
overwritten; a worker whose slots are all held sends batches the ordinary way. Only the owning
worker sets a flag and only the main process clears it: no lock. torch's ``file_descriptor``
sharing unlinks the segment at creation: nothing is left in ``/dev/shm``, even after a crash.
"""

from __future__ import annotations

import itertools
import os
import weakref
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.sources import HostSource

#: Keys whose rows are at least this many bytes go through the ring; smaller ones are pickled
#: with the slot number.
MIN_ROW_BYTES = 1024

_ALIGN = 64  # each key's region starts on a cache line
_ids = itertools.count(1)
#: Rings created in this process, by id: a :class:`SlotBatch` dropped unwrapped (e.g. by a
#: persistent-workers reset) frees its slot through this.
_OWNED: weakref.WeakValueDictionary[int, BatchRing] = weakref.WeakValueDictionary()


def _free(busy: np.ndarray, slot: int) -> None:
    busy[slot] = 0


class SlotBatch:
    """What a worker returns for a batch gathered into the ring: the ring's id, the slot, the
    batch's leading shape, and the small keys as numpy arrays."""

    __slots__ = ("claimed", "lead", "ring", "slot", "small")

    def __init__(self, ring: int, slot: int, lead: tuple[int, ...], small: dict[str, np.ndarray]) -> None:
        self.ring, self.slot, self.lead, self.small = ring, slot, lead, small
        self.claimed = False

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.ring, self.slot, self.lead, self.small)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.ring, self.slot, self.lead, self.small = state
        self.claimed = False

    def __del__(self) -> None:
        # dropped in the main process without being wrapped: free its slot
        if not getattr(self, "claimed", True):
            ring = _OWNED.get(self.ring)
            if ring is not None and ring.owner_pid == os.getpid():
                ring.busy_np[self.slot] = 0


class BatchRing:
    """Shared-memory batch buffers for the large keys of a dataset's batches (see the module docstring).

    Args:
        dataset: The dataset the batches come from.
        keys: The TED keys of a batch, in the order the in-process gather returns them.
        max_rows: Rows per batch at most (the batch size); a larger batch goes the ordinary way.
        workers: DataLoader workers.
        slots: Slots per worker.
    """

    def __init__(self, dataset: Dataset, keys: list[str], max_rows: int, workers: int, slots: int) -> None:
        self.order = [*sorted(keys, key=lambda k: k == "next/done"), "index"]  # HostSource's order
        self.layout: list[tuple[str, str, str, int, tuple[int, ...], str]] = []
        fields = dataset.manifest.fields
        offset = 0
        for key in keys:
            plan = ring_plan(key, fields)
            if plan is None:
                continue
            stored, kind = plan
            spec = fields[stored]
            dtype = np.dtype(spec.dtype)
            row_bytes = dtype.itemsize * int(np.prod(spec.shape, dtype=np.int64))
            if row_bytes < MIN_ROW_BYTES:
                continue
            offset = -(-offset // _ALIGN) * _ALIGN
            self.layout.append((key, stored, kind, offset, tuple(spec.shape), dtype.str))
            offset += row_bytes * max_rows
        self.slot_bytes = -(-offset // 4096) * 4096
        self.max_rows, self.workers, self.slots = int(max_rows), int(workers), int(slots)
        self.small_keys = [k for k in keys if k not in {entry[0] for entry in self.layout}]
        n = self.workers * self.slots
        # created before the workers start; shared by file descriptor (unlinked at once)
        self.buffers = torch.zeros((n, max(self.slot_bytes, 1)), dtype=torch.uint8).share_memory_()
        self.busy = torch.zeros(n, dtype=torch.int32).share_memory_()
        self.id = next(_ids)
        self.owner_pid = os.getpid()
        _OWNED[self.id] = self
        self._views()

    def _views(self) -> None:
        self.buffers_np = self.buffers.numpy()
        self.busy_np = self.busy.numpy()
        self._sources: tuple[HostSource, HostSource] | None = None  # opened in the worker
        self._next = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("buffers_np", "busy_np", "_sources", "_next"):
            del state[name]
        return state  # the tensors travel by file descriptor (torch's ForkingPickler reductions)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views()

    @property
    def useful(self) -> bool:
        """Whether any key goes through the ring (pixel data: yes; low-dimensional: no)."""
        return bool(self.layout)

    # ------------------------------------------------------------------ worker side

    def _acquire(self, worker: int) -> int | None:
        first = worker * self.slots
        for i in range(self.slots):
            slot = first + (self._next + i) % self.slots
            if self.busy_np[slot] == 0:
                self.busy_np[slot] = 1
                self._next = (self._next + i + 1) % self.slots
                return slot
        return None

    def gather(self, worker: int, dataset: Dataset, idx: np.ndarray) -> SlotBatch | None:
        """In worker ``worker``: gather the batch at step indices ``idx`` into a free slot of its
        own, or return ``None`` (all its slots held, or a batch larger than a slot)."""
        if idx.size > self.max_rows or worker >= self.workers:
            return None
        slot = self._acquire(worker)
        if slot is None:
            return None
        try:
            if self._sources is None:
                big = HostSource(dataset, [entry[0] for entry in self.layout])
                self._sources = (big, HostSource(dataset, self.small_keys))
            big, small_source = self._sources
            rows = None
            buffer = self.buffers_np[slot]
            for _key, stored, kind, offset, shape, dtype in self.layout:
                if kind == "step":
                    where = idx
                else:
                    if rows is None:
                        rows = idx + big.episode_of(idx)
                    where = rows if kind == "flat" else rows + 1
                size = int(np.dtype(dtype).itemsize * np.prod(shape, dtype=np.int64)) * idx.size
                out = buffer[offset : offset + size].view(dtype).reshape(*idx.shape, *shape)
                big.take_rows(stored, where, out=out)
            small = dict(small_source.gather(idx))
            small["index"] = np.array(idx)
        except BaseException:
            self.busy_np[slot] = 0  # never handed out
            raise
        return SlotBatch(self.id, slot, tuple(idx.shape), small)

    # ------------------------------------------------------------------ main side

    def wrap(self, batch: SlotBatch) -> TedBatch:
        """In the main process: the batch of ``batch``'s slot as numpy views (no copy); the slot
        is freed when the last array or tensor derived from them is."""
        batch.claimed = True
        base = np.frombuffer(memoryview(self.buffers_np[batch.slot]), np.uint8)
        weakref.finalize(base, _free, self.busy_np, batch.slot)
        count = int(np.prod(batch.lead, dtype=np.int64))
        big = {}
        for key, _stored, _kind, offset, shape, dtype in self.layout:
            size = int(np.dtype(dtype).itemsize * np.prod(shape, dtype=np.int64)) * count
            big[key] = base[offset : offset + size].view(dtype).reshape(*batch.lead, *shape)
        del base  # the views hold it: the finalizer fires when the last of them goes
        small = batch.small
        return TedBatch({key: big[key] if key in big else small[key] for key in self.order})


def ring_plan(key: str, fields: dict[str, Any]) -> tuple[str, str] | None:
    """Where TED key ``key`` is stored: ``(stored key, kind)`` with kind ``"step"`` (row ``t``),
    ``"flat"`` (row ``t + e(t)``) or ``"next"`` (row ``t + e(t) + 1``); ``None`` for the keys a
    source computes (``episode``, ``next/done``)."""
    if key in fields:
        return key, "flat" if fields[key].storage == "flat" else "step"
    if key.startswith("next/") and key[5:] in fields and fields[key[5:]].storage == "flat":
        return key[5:], "next"
    return None
