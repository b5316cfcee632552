"""``in_memory="auto"``: whether a loader copies the columns it reads into RAM, when not told.

A memory-mapped dataset is read at the page cache's speed already, so it stays on disk. A zarr
dataset decodes chunks at every batch: a low-dim one samples ~300x slower from disk than from RAM,
and its load (every chunk decoded once, in threads) takes less time than its conversion did. So a
zarr dataset whose needed columns fit the memory budget is loaded; a larger one is read from disk.

The budget is ``$RLDS_MEMORY_BUDGET`` (bytes, or with a ``K``/``M``/``G``/``T`` suffix; ``0``
never loads), else a quarter of the memory available now, at most :data:`MAX_DEFAULT_BUDGET`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.dataset import Dataset

logger = logging.getLogger("rlds_cli.loader")

BUDGET_ENV = "RLDS_MEMORY_BUDGET"
#: The default budget never passes this, however much memory is free (other processes, the
#: DataLoader workers and the model need it too).
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
