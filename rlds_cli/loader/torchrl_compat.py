"""TorchRL interop: a read-only TorchRL ``Storage`` over an rlds dataset, without copying.

``make_replay_buffer(dataset)`` returns a ``TensorDictReplayBuffer`` whose storage reads the
cache on demand, so any TorchRL sampler (``RandomSampler``, ``SliceSampler(traj_key="episode")``,
``PrioritizedSampler``...) works with no second copy of the data. Needs ``torchrl`` (and
``tensordict``); imported only when used. A ``SliceSampler`` gets its trajectory boundaries once
(:func:`cache_slice_boundaries`) instead of reading ``storage[:]`` at each ``sample()``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.loader.opening import open_dataset
from rlds_cli.loader.run_state import dataset_fingerprint
from rlds_cli.loader.sources import HostSource
from rlds_cli.loader.tensors import to_tensordict, to_torch


def _index_array(index: Any, size: int) -> np.ndarray:
    """Storage positions of ``index`` (an int, a slice, ``...``, a list, an integer or bool array or
    tensor) as int64 in ``[0, size)``, negatives counted from the end as TorchRL's storages do.

    Raises:
        IndexError: A position outside ``[-size, size)``, or a mask of another length.
        TypeError: Positions that are not integers (floats, strings).
    """
    if isinstance(index, tuple):  # TorchRL passes (index,) for one-dimensional storages
        index = index[0] if len(index) == 1 else index
    if index is Ellipsis:
        index = slice(None)
    if isinstance(index, slice):
        return np.arange(*index.indices(size), dtype=np.int64)
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    given = np.asarray(index)
    if given.dtype == bool:  # a mask: the positions it marks
        if given.shape != (size,):
            raise IndexError(f"a mask of {given.shape} rows for a storage of {size}")
        return np.flatnonzero(given).astype(np.int64)
    if given.dtype.kind not in "iu":
        raise TypeError(f"storage positions must be integers, not {given.dtype}")
    idx = given.astype(np.int64)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        bad = int(idx.min()) if idx.min() < -size else int(idx.max())
        raise IndexError(f"position {bad} is outside a storage of {size} steps")
    return np.where(idx < 0, idx + size, idx)


#: The file ``rb.dumps(path)`` writes for an rlds storage (under ``path/storage``).
STORAGE_FILE = "rlds_storage.json"


def _collate_id(batch: Any) -> Any:
    """The storage already returns a batched TensorDict."""
    return batch


def rlds_storage(dataset: Dataset, keys: Iterable[str] | None = None, in_memory: bool = False) -> Any:
    """A read-only ``torchrl.data.Storage`` serving ``dataset``'s steps as TensorDicts (pickled as
    the dataset and these arguments: another process opens it again)."""
    from torchrl.data.replay_buffers.storages import Storage

    keys = list(keys) if keys is not None else None

    class RldsStorage(Storage):
        """Read-only TorchRL storage backed by an rlds dataset (no copy)."""

        def __init__(self) -> None:
            super().__init__(max_size=dataset.num_steps)
            self.dataset = dataset
            self._source = HostSource(dataset, keys, in_memory=in_memory)
            # the steps of the view opened now (a growing dataset's later ones are another view)
            self._steps = dataset.num_steps
            # written up to its last step, never wrapped: TorchRL's slices stop there (without a
            # cursor a full storage is circular, and a slice ran from the last step to step 0)
            self._set_last_cursor(self._steps - 1)

        def get(self, index: Any) -> Any:
            idx = _index_array(index, len(self))
            batch = self._source.gather(idx)
            batch["index"] = idx
            return to_tensordict(to_torch(TedBatch(batch)))

        def __reduce__(self) -> tuple[Any, ...]:  # the class is made per call: pickled by its maker
            return (rlds_storage, (dataset, keys, in_memory))

        def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
            raise TypeError("an rlds dataset is read-only; write a new dataset with rlds instead")

        def __len__(self) -> int:
            return self._steps

        def _len_along_dim0(self) -> int:
            return self._steps

        def state_dict(self) -> dict[str, Any]:
            return {"directory": str(dataset.directory), "dataset": dataset_fingerprint(dataset)}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            saved = state_dict.get("dataset")
            if state_dict.get("directory") != str(dataset.directory) or (
                saved is not None and saved != dataset_fingerprint(dataset)
            ):
                raise ValueError(f"state is for another dataset than {dataset.name!r}")

        def dumps(self, path: Any) -> None:
            """What ``rb.dumps(path)`` keeps of the storage: which dataset it reads (the data
            stays in the cache)."""
            folder = Path(path)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / STORAGE_FILE).write_text(json.dumps(self.state_dict()))

        def loads(self, path: Any) -> None:
            """``rb.loads(path)``: refused unless it was dumped over this dataset."""
            try:
                state = json.loads((Path(path) / STORAGE_FILE).read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"{path} holds no rlds storage state ({STORAGE_FILE}): {exc}") from None
            self.load_state_dict(state if isinstance(state, dict) else {})

        def _empty(self) -> None:
            raise TypeError("an rlds dataset is read-only")

        def contains(self, item: Any) -> Any:
            idx = np.asarray(item.cpu().numpy() if isinstance(item, torch.Tensor) else item, np.int64)
            idx = np.where(idx < 0, idx + len(self), idx)
            return torch.as_tensor((idx >= 0) & (idx < len(self)))

    return RldsStorage()


def cache_slice_boundaries(sampler: Any, storage: Any) -> bool:
    """Give a TorchRL ``SliceSampler`` (or a subclass) over ``storage`` static trajectory boundaries.

    TorchRL 0.14's ``SliceSampler`` reads ``storage[:]`` at every ``sample()`` even with
    ``cache_values=True`` (85-100 ms and ~430 MiB a sample on 1M steps over an rlds storage).
    This reads the one column it needs, once, computes the boundaries as TorchRL would, and
    stores them where TorchRL keeps constructor-given boundaries, with ``cache_values`` on.

    Returns whether the boundaries were installed: ``False`` for other samplers, fragmented
    slice samplers, and keys the storage does not serve (TorchRL's own path, ``cache_values`` on). A
    sampler pickled to another process loses the cache (TorchRL drops it in ``__getstate__``):
    call this again there.
    """
    from torchrl.data import SliceSampler

    if not isinstance(sampler, SliceSampler) or getattr(sampler, "fragmented", False):
        return False
    sampler.cache_values = True  # the storage is read-only: nothing ever invalidates the cache
    if "static-stop-and-length" in sampler._cache:
        return True
    if getattr(sampler, "_traj_key_auto", False):
        sampler._resolve_traj_key(storage)  # reads one row to see the keys, as TorchRL does
    if sampler._fetch_traj:
        key, is_traj = sampler._used_traj_key, True
    elif getattr(sampler, "end_keys", None) is None:
        key, is_traj = sampler._used_end_key, False
    else:
        return False  # several end keys combined: TorchRL's own (cached) path
    source = getattr(storage, "_source", None)
    name = join_key(key) if isinstance(key, (str, tuple)) else None
    if source is None or name is None or name not in {*source.keys, *source.dataset.fields}:
        return False  # (read from the dataset: keys= may leave out the one the slices need)
    column = HostSource(source.dataset, [name]).gather(np.arange(len(storage), dtype=np.int64))[name]
    signal = torch.from_numpy(np.ascontiguousarray(column))
    cursor = getattr(storage, "_last_cursor_index", None)
    if is_traj:
        vals = sampler._find_start_stop_traj(trajectory=signal, at_capacity=storage._is_full, cursor=cursor)
    else:  # as TorchRL does with storage[:][end_key]
        vals = sampler._find_start_stop_traj(
            end=signal.squeeze()[: len(storage)], at_capacity=storage._is_full, cursor=cursor
        )
    sampler._cache["static-stop-and-length"] = vals
    return True


def make_replay_buffer(
    dataset: str | Dataset,
    *,
    batch_size: int = 256,
    sampler: Any = None,
    keys: Iterable[str] | None = None,
    in_memory: bool = False,
    root: Any = None,
    **kwargs: Any,
) -> Any:
    """A TorchRL ``TensorDictReplayBuffer`` over an rlds dataset, without copying it.

    Args:
        dataset: A dataset or its name.
        batch_size: Default batch size of ``rb.sample()``.
        sampler: A TorchRL sampler (default ``RandomSampler()``); for slices use
            ``SliceSampler(num_slices=..., traj_key="episode")`` (its trajectory boundaries are
            computed once: see :func:`cache_slice_boundaries`).
        keys: TED keys to serve (``None``: all).
        in_memory: Load the needed columns into RAM first.
        root: Cache root for a name.
        **kwargs: Passed to ``TensorDictReplayBuffer``.
    """
    from torchrl.data import RandomSampler, TensorDictReplayBuffer

    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, root)
    storage = rlds_storage(ds, keys, in_memory)
    sampler = sampler if sampler is not None else RandomSampler()
    cache_slice_boundaries(sampler, storage)
    return TensorDictReplayBuffer(
        storage=storage,
        sampler=sampler,
        batch_size=batch_size,
        **{"collate_fn": _collate_id, **kwargs},
    )
