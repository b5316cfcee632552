"""The loader's argument checks that need no dataset: each bad value is one ``ValueError``
naming the argument and what it accepts, raised before anything is opened or read."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def _count(value: Any) -> bool:
    """An integer >= 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_counts(*, in_memory: Any, prefetch: Any, num_batches: Any, epochs: Any) -> None:
    """``in_memory`` one of its four values; ``prefetch`` a count; ``num_batches`` and
    ``epochs`` a count or ``None``."""
    if in_memory not in (False, True, "device", "auto"):
        raise ValueError(f"in_memory must be False, True, 'device' or 'auto', got {in_memory!r}")
    if not _count(prefetch):
        raise ValueError(f"prefetch must be an integer >= 0, got {prefetch!r}")
    if num_batches is not None and not _count(num_batches):
        raise ValueError(f"num_batches must be an integer >= 0 or None, got {num_batches!r}")
    if epochs is not None and not _count(epochs):
        raise ValueError(f"epochs must be an integer >= 0, or None for an endless stream; got {epochs!r}")


def check_source_options(
    *, keys: Iterable[Any] | None, in_memory: Any, pack: bool, root: str | os.PathLike[str] | None
) -> None:
    """A loader given a source (not a dataset) takes none of the options that pick a dataset's
    keys and storage: the source has its own."""
    dataset_only = {"keys": keys is not None, "in_memory": in_memory != "auto", "pack": not pack}
    misplaced = [name for name, set_here in dataset_only.items() if set_here] + (["root"] if root else [])
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)} apply to a dataset; give them to the source instead")
