"""Cutting a dataset into chunks, and reading one chunk as a full TED view.

A chunk is a run of consecutive steps ``[start, stop)``. Per-step chunks hold up to ``chunk_steps``
steps and end on the last episode boundary inside that window, so an episode is cut only when it is
longer than a chunk (never for a function marked with :func:`whole_episodes`: the chunk grows to the
episode's end). Per-episode chunks hold whole episodes only (as many as fit in ``chunk_steps``, at
least one). The plan is a pure function of the source's episode index and the job's arguments: every
process, and a resumed job, computes the same chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from rlds_cli.cache.compose import copied_step_column
from rlds_cli.cache.dataset import Dataset, Instructions
from rlds_cli.cache.reader import DONE_FLAGS
from rlds_cli.cache.ted import TedBatch

#: Most steps per chunk by default: large enough that per-chunk overhead vanishes for cheap
#: vectorized functions, small enough that a chunk of 100-float observations stays ~50 MB.
MAX_DEFAULT_CHUNK_STEPS = 131_072
MIN_DEFAULT_CHUNK_STEPS = 4096


def default_chunk_steps(num_steps: int) -> int:
    """About 16 chunks (up to 16 busy workers), within [4096, 131072] steps. Independent of the
    number of workers: a job resumed with other ``--workers`` has the same chunks."""
    return int(min(MAX_DEFAULT_CHUNK_STEPS, max(MIN_DEFAULT_CHUNK_STEPS, -(-num_steps // 16))))


#: Steps the schema is inferred from in per-step mode (whole episodes: up to the episode's end).
INFER_STEPS = 256

#: The attribute :func:`whole_episodes` sets on a function.
WHOLE_EPISODES_ATTR = "rlds_needs_whole_episodes"

F = TypeVar("F", bound=Callable[..., Any])


def whole_episodes(fn: F) -> F:
    """Mark a preprocessing function as episode-wise (returns-to-go, n-step returns, ...): in
    per-step mode (``--by step``, the default) its chunks never cut an episode.

    Same as setting ``fn.rlds_needs_whole_episodes = True`` (which needs no rlds import)::

        from rlds_cli.preprocess import whole_episodes

        @whole_episodes
        def returns_to_go(batch): ...
    """
    setattr(fn, WHOLE_EPISODES_ATTR, True)
    return fn


def needs_whole_episodes(fn: Any) -> bool:
    """Whether ``fn`` says it needs whole episodes (see :func:`whole_episodes`)."""
    return getattr(fn, WHOLE_EPISODES_ATTR, False) is True


@dataclass(frozen=True)
class Plan:
    """The chunks of one job.

    Attributes:
        by: ``"step"`` or ``"episode"``.
        bounds: ``(num_chunks + 1,)`` step offsets; chunk ``i`` is ``[bounds[i], bounds[i+1])``.
        limit: Steps processed (``num_frames`` applied: whole episodes in per-episode mode).
        num_episodes: Episodes touched by the processed steps (the last one may be cut).
        cut: Whether the last processed episode is cut short by ``num_frames``.
        whole_episodes: No chunk cuts an episode (per-episode mode, or a function marked with
            :func:`whole_episodes`).
    """

    by: str
    bounds: np.ndarray
    limit: int
    num_episodes: int
    cut: bool
    whole_episodes: bool = False

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, i: int) -> tuple[int, int]:
        return int(self.bounds[i]), int(self.bounds[i + 1])


def make_plan(
    episodes: np.ndarray,
    by: str,
    chunk_steps: int,
    num_frames: int | None,
    *,
    whole_episodes: bool = False,
) -> Plan:
    """Chunks over the episode index ``episodes`` (the cache's ``episodes.npy``).

    Args:
        episodes: The episode index.
        by: ``"step"`` or ``"episode"``.
        chunk_steps: Most steps per chunk (exceeded only to keep a long episode whole).
        num_frames: Steps to process (``None``: all).
        whole_episodes: Per-step chunks never cut an episode (a chunk holds at least one whole
            episode, however long).
    """
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
        return Plan(by, bounds, limit, last, False, True)
    bounds = _step_bounds(ends, limit, chunk_steps, whole_episodes)
    num_episodes = int(np.searchsorted(starts, limit, side="left"))
    cut = limit < total and not np.isin(limit, ends)
    return Plan(by, bounds, limit, num_episodes, bool(cut), whole_episodes)


def _step_bounds(ends: np.ndarray, limit: int, chunk_steps: int, whole: bool) -> np.ndarray:
    """Per-step chunk bounds, strictly increasing: each chunk ends at the last episode end within
    ``chunk_steps`` of its start; with none there (a longer episode), after ``chunk_steps`` steps,
    or with ``whole`` at that episode's end."""
    inner = ends[ends < limit]  # episode ends before the limit (the limit closes the last chunk)
    cuts = [0]
    at = 0
    while at + chunk_steps < limit:
        k = int(np.searchsorted(inner, at + chunk_steps, side="right"))  # inner[:k] <= window end
        if k and int(inner[k - 1]) > at:
            at = int(inner[k - 1])
        elif whole:  # the episode running at `at` is longer than a chunk: all of it
            k = int(np.searchsorted(inner, at, side="right"))
            if k == len(inner):
                break
            at = int(inner[k])
        else:
            at += chunk_steps
        cuts.append(at)
    cuts.append(limit)
    return np.asarray(cuts, np.int64)


def inference_stop(plan: Plan, episodes: np.ndarray) -> int:
    """Where the schema-inference chunk (which starts at step 0) stops: the first episode in
    per-episode mode; in per-step mode :data:`INFER_STEPS` steps, extended to the end of the
    episode they cut when the function needs whole episodes."""
    ends = (episodes["start"] + episodes["length"]).astype(np.int64)
    if plan.by == "episode":
        return int(ends[0])
    stop = min(INFER_STEPS, plan.limit)
    if plan.whole_episodes:
        k = int(np.searchsorted(ends, stop, side="left"))  # the first episode ending at or after stop
        stop = min(int(ends[k]) if k < len(ends) else plan.limit, plan.limit)
    return stop


def plan_digest(plan: Plan) -> str:
    """A short digest of the chunk bounds: part of a job's identity, so a job is only resumed with
    the chunks it started with."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(plan.bounds, np.int64).tobytes()).hexdigest()[:16]


def read_chunk(
    ds: Dataset,
    start: int,
    stop: int,
    keys: list[str] | None,
    limit: int,
    instructions: Instructions | None = None,
) -> TedBatch:
    """The TED view of steps ``[start, stop)``, with ``index``; numpy arrays (``instructions``:
    whose step column is given as indices of their texts, :func:`~rlds_cli.cache.compose.copied_metadata`).

    Read with :meth:`~rlds_cli.cache.reader.TedReader.range`: observation-like keys as one
    contiguous slab of flat rows, the others as read-only views where the backend allows (memmap: no
    copy; writing into one in place raises instead of touching the source). When ``limit`` (below
    the dataset's size) cuts an episode, its last processed step is marked truncated, so the chunk
    is a valid TED on its own.
    """
    out = ds.reader(_wanted(ds, keys)).range(start, stop)
    last = int(out["episode"][-1])
    if stop == limit and limit < ds.num_steps and int(ds.episode_bounds.ends[last]) != stop:
        # cut by num_frames: the step is the last one processed (so its episode is done)
        for flag in ("next/truncated", "next/done"):
            out[flag] = out[flag].copy()
            out[flag][-1] = True
    out["index"] = np.arange(start, stop, dtype=np.int64)
    key = None if instructions is None else instructions.step_key
    if key is not None and key in out:
        assert instructions is not None
        out[key] = copied_step_column(ds, instructions, start, np.asarray(out[key]))
    return out


def _wanted(ds: Dataset, keys: list[str] | None) -> list[str]:
    """The keys of a chunk, in a stable order: stored keys in manifest order (a flat key followed by
    its ``next/`` key), then ``next/done`` and ``episode``. The flags are always read: they define
    the episode structure the output must keep."""
    wanted = set(ds.fields) if keys is None else {*keys, *DONE_FLAGS}
    order: list[str] = []
    for key, spec in ds.manifest.fields.items():
        names = [key, f"next/{key}"] if spec.storage == "flat" else [key]
        order += [name for name in names if name in wanted]
    return [*order, "next/done", "episode"]


def describe_input(ds: Dataset) -> dict[str, Any]:
    """Input keys -> ``{"shape", "dtype"}`` as the function sees them (``index`` added)."""
    out = {k: {"shape": list(shape), "dtype": dtype} for k, (shape, dtype) in ds.fields.items()}
    out["index"] = {"shape": [], "dtype": "int64"}
    return out
