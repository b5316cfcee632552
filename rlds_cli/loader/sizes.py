"""How much memory a loader takes: one batch's bytes checked before anything is allocated, and
whether it copies its columns into RAM.

**Batch size.** Per row (a step; ``num_slices * slice_len`` of them for slices) a batch holds every
served key, its ``index`` and the sampler's extras; a windowed key (``windows=``) holds its values
at every offset plus an ``_is_pad`` flag and two int64 step indices. :func:`check_batch_memory`
refuses a batch larger than :func:`batch_limit` (a quarter of physical memory) with one
``ValueError`` naming the argument at fault (``batch_size``, ``slice_len``, ``num_slices`` or
``windows``).

**in_memory="auto".** A memory-mapped dataset stays on disk (page-cache speed). A zarr dataset
whose needed columns fit the memory budget is loaded into RAM (a low-dim one samples ~300x slower
from disk); a larger one is read from disk. The budget is ``$RLDS_MEMORY_BUDGET`` (bytes, or with
a ``K``/``M``/``G``/``T`` suffix; ``0`` never loads), else a quarter of the memory available now,
at most :data:`MAX_DEFAULT_BUDGET`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader.protocols import Epochal
from rlds_cli.loader.sources import resolve_keys
from rlds_cli.loader.windows import Windows

logger = logging.getLogger("rlds_cli.loader")

BUDGET_ENV = "RLDS_MEMORY_BUDGET"
#: Cap of the default budget, however much memory is free.
MAX_DEFAULT_BUDGET = 8 << 30


def memory_budget() -> int:
    """Bytes a loader may copy into RAM on its own (see the module docs)."""
    budget = settings.memory_budget()
    if budget is not None:
        return budget
    return min(MAX_DEFAULT_BUDGET, _available_memory() // 4)


def _available_memory() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (free + reclaimable), else total physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def stored_bytes(dataset: Dataset, keys: Iterable[str] | None) -> int:
    """Bytes of the stored columns behind the TED ``keys`` (``None``: every stored column); a
    ``next/`` key of an observation-like column is the same stored column as its root key."""
    wanted = None if keys is None else set(keys)
    rows = {"step": dataset.num_steps, "flat": dataset.num_steps + dataset.num_episodes}
    total = 0
    for key, spec in dataset.manifest.fields.items():
        if wanted is not None and key not in wanted and f"next/{key}" not in wanted:
            continue
        per_row = np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64))
        total += rows[spec.storage] * per_row
    return total


def auto_in_memory(dataset: Dataset, keys: Iterable[str] | None) -> bool:
    """Whether ``in_memory="auto"`` loads ``dataset``'s columns behind ``keys`` into RAM."""
    if dataset.manifest.backend != "zarr":
        return False
    need, budget = stored_bytes(dataset, keys), memory_budget()
    load = need <= budget
    logger.info(
        "in_memory='auto': dataset %r (zarr) needs %.1f MB, budget %.1f MB (%s): %s",
        dataset.name,
        need / 1e6,
        budget / 1e6,
        f"${BUDGET_ENV}" if settings.memory_budget() is not None else "a quarter of the free memory",
        "loaded into RAM" if load else "read from disk",
    )
    return load


#: One batch may take 1/MEMORY_SHARE of physical memory (a batch is held several times over:
#: gather, device tensors, prefetch queue).
MEMORY_SHARE = 4
#: The limit where the machine's physical memory cannot be read (no ``os.sysconf``).
UNKNOWN_MEMORY_LIMIT = 16 << 30
#: Bytes a row costs whatever the keys: its int64 ``index``.
INDEX_BYTES = 8
#: Per offset of a windowed key: its ``_is_pad`` flag and the int64 wanted and clamped steps.
WINDOW_OFFSET_BYTES = 1 + 8 + 8


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (``None``: it cannot be read here)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def batch_limit() -> tuple[int, str]:
    """The bytes one batch may take, and how that limit was set (for the error message)."""
    total = physical_memory()
    if not total or total <= 0:
        return UNKNOWN_MEMORY_LIMIT, "the limit where the machine's memory is unknown"
    return total // MEMORY_SHARE, f"a quarter of this machine's {gib(total)} of memory"


def gib(n: float) -> str:
    """Bytes as GiB (or TiB past 1024 GiB), one decimal."""
    g = n / (1 << 30)
    return f"{g / 1024:.1f} TiB" if g >= 1024 else f"{g:.1f} GiB"


def key_bytes(shape: Sequence[int], dtype: Any) -> int:
    """Bytes of one row of a key of this per-step ``shape`` and ``dtype``."""
    return int(np.dtype(dtype).itemsize) * int(np.prod(shape, dtype=np.int64))


@dataclass(frozen=True)
class BatchShape:
    """What one batch holds, before any of it is made.

    Attributes:
        rows: Rows (steps) of the batch.
        arg: The argument that sets ``rows`` (``"batch_size"``, or ``"slice_len"`` /
            ``"num_slices"`` for slices), named when the batch is too large.
        slice_len: Steps per slice, for slices (``None``: rows are single steps).
        num_slices: Slices per batch, for slices.
        extra_bytes: Bytes per row of the sampler's extras (``mask``, ``weight``).
    """

    rows: int
    arg: str = "batch_size"
    slice_len: int | None = None
    num_slices: int | None = None
    extra_bytes: int = 0


def check_batch_memory(
    batch: BatchShape,
    fields: Mapping[str, tuple[Sequence[int], Any]],
    keys: Sequence[str],
    windows: Mapping[str, int],
    longest_episode: int | None,
) -> None:
    """Refuse a batch that needs more than :func:`batch_limit`, naming the argument at fault.

    Args:
        batch: Its rows and extras.
        fields: Per key, ``(per-step shape, dtype)`` (a key not in it counts 0 bytes).
        keys: The keys read per row (windowed keys excluded).
        windows: Per windowed key, its number of offsets.
        longest_episode: Steps of the dataset's longest episode, said in the message when known.

    Raises:
        ValueError: one line naming the argument, the bytes needed and the limit.
    """
    plain = INDEX_BYTES + batch.extra_bytes + sum(key_bytes(*fields[k]) for k in keys if k in fields)
    windowed = sum(
        n * (WINDOW_OFFSET_BYTES + (key_bytes(*fields[k]) if k in fields else 0)) for k, n in windows.items()
    )
    per_row = plain + windowed
    need = batch.rows * per_row
    limit, why = batch_limit()
    if need <= limit:
        return
    longest = f"; the longest episode has {longest_episode} steps" if longest_episode is not None else ""
    if windowed > plain:  # the offsets, not the rows, make it large
        counts = ", ".join(f"{k!r}: {n}" for k, n in windows.items())
        raise ValueError(
            f"windows: one batch of {batch.rows} rows needs {gib(need)} ({per_row} bytes a row, "
            f"{windowed} of them the windows' offsets {{{counts}}}), over the {gib(limit)} a batch "
            f"may take ({why}){longest}; give windows fewer offsets"
        )
    shape = f"{batch.rows} rows"
    if batch.slice_len is not None:
        shape = f"{batch.num_slices} slice(s) of {batch.slice_len} steps"
    values = {"batch_size": batch.rows, "slice_len": batch.slice_len, "num_slices": batch.num_slices}
    value = values[batch.arg]
    if batch.arg != "slice_len":  # the episodes' lengths bound a slice, not the other arguments
        longest = ""
    raise ValueError(
        f"{batch.arg}={value}: one batch of {shape} needs {gib(need)} ({per_row} bytes a row), over "
        f"the {gib(limit)} a batch may take ({why}){longest}; lower {batch.arg}"
    )


def _positive(value: Any) -> bool:
    """Whether ``value`` is a positive integer (the samplers' rule, ``positive_int``)."""
    return not isinstance(value, bool) and isinstance(value, int | np.integer) and bool(value > 0)


def slice_shape(
    slice_len: Any,
    num_slices: Any,
    batch_size: int,
    longest_episode: int,
    extra_bytes: int,
    short: Any = "pad",
) -> BatchShape | None:
    """The batch of a slice sampler's options (``None``: options the sampler refuses itself). The
    argument blamed for a batch too large is ``slice_len`` when slices are longer than every
    episode, else ``num_slices`` when given, else ``batch_size``."""
    if not (_positive(slice_len) and (num_slices is None or _positive(num_slices))):
        return None
    length = int(slice_len)
    count = int(num_slices) if num_slices is not None else batch_size // length
    if count == 0:  # batch_size < slice_len: the factory refuses it (not a multiple)
        return None
    if length > longest_episode and short != "pad":
        return None  # no episode holds a slice and none is padded: the sampler says so
    if length > longest_episode:
        arg = "slice_len"
    else:
        arg = "num_slices" if num_slices is not None else "batch_size"
    rows = count * length
    return BatchShape(rows, arg, length, count, extra_bytes)


def check_loader_batch(loader: Any, given: Any, sampler: Any, options: dict[str, Any]) -> None:
    """Refuse the batches of a :class:`~rlds_cli.loader.loader.Loader` being made (``given``: its
    source, or ``None``) when one exceeds :func:`batch_limit` (``ValueError`` naming the
    argument), from sizes alone: no row is read and no index array made."""
    if given is not None:
        fields: Mapping[str, Any] = getattr(given, "fields", {})
        keys = [str(k) for k in getattr(given, "keys", ())]
        lengths = given.episodes.lengths
        num_steps = given.num_steps
    else:
        assert loader.dataset is not None
        fields, keys = loader.dataset.fields, resolve_keys(loader.dataset, loader.keys)
        lengths, num_steps = np.asarray(loader.dataset.episode_index["length"]), loader.dataset.num_steps
    longest = int(lengths.max()) if len(lengths) else None
    first = loader.transforms[0] if loader.transforms else None
    made = getattr(first, "__self__", first)  # a mixture's windows come as their bound __call__
    offsets = {k: len(v) for k, v in made.offsets.items()} if isinstance(made, Windows) else {}
    keys = [k for k in keys if k not in offsets]  # a windowed key is read by the windows
    share = -(-num_steps // loader.world_size)  # an epoch's batch is at most the rank's steps
    shape: BatchShape | None = BatchShape(loader.batch_size)
    if isinstance(sampler, str):
        slices = sampler in ("slice", "prioritized") and "slice_len" in options
        extra = (1 if slices else 0) + (4 if sampler == "prioritized" else 0)  # mask, weight
        if slices:
            shape = slice_shape(
                options["slice_len"],
                options.get("num_slices"),
                loader.batch_size,
                longest or 0,
                extra,
                options.get("short", "pad"),
            )
        elif sampler == "epoch":
            shape = BatchShape(min(loader.batch_size, max(share, 1)))
        else:
            shape = BatchShape(loader.batch_size, extra_bytes=extra)
    elif isinstance(sampler, Epochal):
        shape = BatchShape(min(int(getattr(sampler, "batch_size", loader.batch_size)), max(share, 1)))
    else:
        shape = BatchShape(int(getattr(sampler, "batch_size", loader.batch_size)))
    if shape is not None:  # None: slice options the sampler refuses with its own message
        check_batch_memory(shape, fields, keys, offsets, longest)
