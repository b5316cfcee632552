"""Cutting a dataset into chunks, and reading one chunk as a full TED view.

A chunk is a run of consecutive steps ``[start, stop)``. Per-step chunks have a fixed number
of steps and may cut episodes; per-episode chunks hold whole episodes only (as many as fit in
``chunk_steps``, at least one). The plan is a pure function of the source's episode index and
the job's arguments, so every process (and a resumed job) computes the same chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch

#: Most steps per chunk by default: large enough that per-chunk overhead vanishes for cheap
#: vectorized functions, small enough that a chunk of 100-float observations stays ~50 MB.
MAX_DEFAULT_CHUNK_STEPS = 131_072
MIN_DEFAULT_CHUNK_STEPS = 4096


def default_chunk_steps(num_steps: int) -> int:
    """About 16 chunks (so up to 16 workers stay busy), within [4096, 131072] steps. It depends
    on the dataset only, never on the number of workers: a job resumed with other ``--workers``
    has the same chunks."""
    return int(min(MAX_DEFAULT_CHUNK_STEPS, max(MIN_DEFAULT_CHUNK_STEPS, -(-num_steps // 16))))


#: Steps the schema is inferred from in per-step mode.
INFER_STEPS = 256


@dataclass(frozen=True)
class Plan:
    """The chunks of one job.

    Attributes:
        by: ``"step"`` or ``"episode"``.
        bounds: ``(num_chunks + 1,)`` step offsets; chunk ``i`` is ``[bounds[i], bounds[i+1])``.
        limit: Steps processed (``num_frames`` applied: whole episodes in per-episode mode).
        num_episodes: Episodes touched by the processed steps (the last one may be cut).
        cut: Whether the last processed episode is cut short by ``num_frames``.
    """

    by: str
    bounds: np.ndarray
    limit: int
    num_episodes: int
    cut: bool

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, i: int) -> tuple[int, int]:
        return int(self.bounds[i]), int(self.bounds[i + 1])


def make_plan(episodes: np.ndarray, by: str, chunk_steps: int, num_frames: int | None) -> Plan:
    """Chunks over the episode index ``episodes`` (the cache's ``episodes.npy``)."""
    starts = episodes["start"].astype(np.int64)
    lengths = episodes["length"].astype(np.int64)
    total = int(lengths.sum())
    ends = starts + lengths  # exclusive
    limit = total if num_frames is None else max(1, min(int(num_frames), total))
    if by == "episode":
        # whole episodes only: those that end within the limit (at least the first one)
        last = max(1, int(np.searchsorted(ends, limit, side="right")))
        limit = int(ends[last - 1])
        cuts = [0]
        for i in range(last):  # greedy: add episodes while they fit (a chunk holds at least one)
            if int(ends[i]) - cuts[-1] > chunk_steps and int(starts[i]) > cuts[-1]:
                cuts.append(int(starts[i]))
        cuts.append(limit)
        bounds = np.unique(np.asarray(cuts, np.int64))
        return Plan(by, bounds, limit, last, False)
    # strictly increasing as built (np.unique would also import numpy.ma on its first call)
    bounds = np.append(np.arange(0, limit, chunk_steps, dtype=np.int64), limit)
    num_episodes = int(np.searchsorted(starts, limit, side="left"))
    cut = limit < total and not np.isin(limit, ends)
    return Plan(by, bounds, limit, num_episodes, bool(cut))


def read_chunk(ds: Dataset, start: int, stop: int, keys: list[str] | None, limit: int) -> TedBatch:
    """The TED view of steps ``[start, stop)``, with ``index``; numpy arrays in memory.

    Observation-like keys are read as one contiguous slab of flat rows and split into
    ``key`` and ``next/key`` with one gather each. When the job stops early (``limit`` below
    the dataset's size) and cuts an episode, its last processed step is marked truncated, so
    the chunk is a valid TED on its own.
    """
    idx = np.arange(start, stop, dtype=np.int64)
    ep = ds.episode_of(idx)
    e0 = int(ep[0])
    wanted = _wanted(ds, keys)
    out = TedBatch()
    local = (idx - start) + (ep - e0)
    for key, spec in ds.manifest.fields.items():
        if spec.storage == "flat":
            if key not in wanted and f"next/{key}" not in wanted:
                continue
            slab = np.asarray(ds.column(key)[start + e0 : stop + int(ep[-1]) + 1])
            if key in wanted:
                out[key] = slab.take(local, axis=0)
            if f"next/{key}" in wanted:
                out[f"next/{key}"] = slab.take(local + 1, axis=0)
        elif key in wanted:
            # a read-only view where the backend allows it (memmap): no copy for keys the
            # function passes through; writing into it in place raises instead of touching the source
            out[key] = np.asarray(ds.column(key)[start:stop])
    if stop == limit and limit < ds.num_steps:
        last_end = int(ds.episodes["start"][ep[-1]] + ds.episodes["length"][ep[-1]])
        if last_end != stop:  # cut by num_frames: the step is the last one processed
            out["next/truncated"] = out["next/truncated"].copy()
            out["next/truncated"][-1] = True
    out["next/done"] = out["next/terminated"] | out["next/truncated"]
    out["episode"] = ep
    out["index"] = idx
    ds._after_read()
    return out


def _wanted(ds: Dataset, keys: list[str] | None) -> set[str]:
    available = ds.fields
    if keys is None:
        return set(available)
    # the flags are always read: they define the episode structure the output must keep
    return {*keys, "next/terminated", "next/truncated"}


def describe_input(ds: Dataset) -> dict[str, Any]:
    """Input keys -> ``{"shape", "dtype"}`` as the function sees them (``index`` added)."""
    out = {k: {"shape": list(shape), "dtype": dtype} for k, (shape, dtype) in ds.fields.items()}
    out["index"] = {"shape": [], "dtype": "int64"}
    return out
