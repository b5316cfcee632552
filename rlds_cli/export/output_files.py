"""Pieces every exporter shares: chunked reads and atomic output paths."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rlds_cli._util.io import atomic_path
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import ExportError

#: Steps per chunk when streaming a dataset out.
CHUNK_STEPS = 1 << 16


def iter_chunks(dataset: Dataset, keys: list[str] | None = None) -> Iterator[tuple[int, TedBatch]]:
    """``(start, batch)`` for consecutive step ranges of at most :data:`CHUNK_STEPS`."""
    for start in range(0, dataset.num_steps, CHUNK_STEPS):
        stop = min(start + CHUNK_STEPS, dataset.num_steps)
        yield start, dataset.gather(np.arange(start, stop), keys)


@contextmanager
def atomic_target(out: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary path beside ``out`` (a file or a folder); on success it replaces ``out``."""
    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists", hint="pass --force to replace it, or pick another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, suffix=".partial") as tmp:
        yield tmp
        if out.is_dir():  # a rename cannot replace a folder, nor a file by a folder
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()


def step_keys(dataset: Dataset) -> list[str]:
    """Stored per-step keys other than the TED core ones (``info/...`` and friends)."""
    core = {"action", "next/reward", "next/terminated", "next/truncated"}
    return [k for k, s in dataset.stored_fields.items() if s.storage == "step" and k not in core]


def flat_keys(dataset: Dataset) -> list[str]:
    """Observation-like keys (stored once, read as ``key`` and ``next/key``)."""
    return [k for k, s in dataset.stored_fields.items() if s.storage == "flat"]
