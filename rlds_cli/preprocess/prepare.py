"""What a preprocessing job is: arguments checked, source opened, chunks planned, function resolved,
identity hashed (the job id ``--resume`` matches), output schema inferred on a first small chunk.

:mod:`rlds_cli.preprocess.job` coordinates a job from the :class:`Job` made here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlds_cli._version import __version__
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import SEGMENTED_LAYOUT, is_url
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.snapshot import fixed_copy_hint
from rlds_cli.errors import PreprocessError
from rlds_cli.loader.opening import open_dataset
from rlds_cli.preprocess import fnref, schema
from rlds_cli.preprocess.plan import (
    Plan,
    default_chunk_steps,
    inference_stop,
    make_plan,
    needs_whole_episodes,
    plan_digest,
    read_chunk,
)

FnLike = str | Callable[..., Any]


@dataclass
class Job:
    """One preprocessing job: its source, function, chunk plan and identity (``lineage``)."""

    cache: CacheRoot
    src: Dataset
    fn: FnLike
    ref: str
    plan: Plan
    keys: list[str] | None
    storage: str
    stats: bool
    lineage: dict[str, Any]
    #: The source's URL (read where it lies), or ``None`` for a dataset of the cache.
    source_url: str | None = None
    #: The output's URL (pushed there, not published in the cache), or ``None``.
    out_url: str | None = None

    @property
    def job_id(self) -> str:
        """The job's id: a hash of everything that changes its output."""
        return self.lineage["job"]


def prepare(
    source_name: str,
    fn: FnLike,
    *,
    by: str,
    chunk_steps: int | None,
    keys: Sequence[str] | None,
    stats_: bool,
    num_frames: int | None,
    storage: str | None,
    root: Any,
    on_plan: Callable[[Plan], None] | None = None,
    out_url: str | None = None,
) -> Job:
    """Check the arguments, open the source, plan the chunks, resolve the function.

    ``on_plan`` is called with the plan before the function is resolved (which imports its module):
    :func:`rlds_cli.preprocess.job.run` starts its worker processes there.
    """
    if by not in ("step", "episode"):
        raise PreprocessError(f"--by must be 'step' or 'episode', not {by!r}")
    if chunk_steps is not None and chunk_steps < 1:
        raise PreprocessError(f"--chunk-steps must be at least 1, not {chunk_steps}")
    if num_frames is not None and num_frames < 1:
        raise PreprocessError(f"--num-frames must be at least 1, not {num_frames}")
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    src = open_dataset(source_name, cache)
    if src.manifest.layout == SEGMENTED_LAYOUT:  # its workers read one version, chunk by chunk
        raise PreprocessError(
            f"dataset {source_name!r} is a growing dataset (written by DatasetWriter): a preprocess "
            "job reads a converted dataset, whose arrays stay as they are for the whole job",
            hint=f"{fixed_copy_hint(source_name)}; then preprocess that",
        )
    storage = storage or src.manifest.backend
    get_backend(storage)
    key_list = sorted(set(keys)) if keys is not None else None
    unknown = sorted(set(key_list or ()) - set(src.fields) - {"index"})
    if unknown:
        raise PreprocessError(
            f"dataset {source_name!r} has no keys {unknown}", hint=f"it has {sorted(src.fields)}"
        )
    chunk_steps = chunk_steps or default_chunk_steps(src.num_steps)
    plan = make_plan(src.episode_index, by, chunk_steps, num_frames)
    if on_plan is not None:
        on_plan(plan)
    ref, fn_sha = fnref.describe(fn)
    if by == "step" and needs_whole_episodes(fnref.get(fn)):
        # an episode-wise function: per-step chunks that never cut an episode (chunks may merge:
        # the workers started above may be more than needed)
        plan = make_plan(src.episode_index, by, chunk_steps, num_frames, whole_episodes=True)
    args = {
        "by": by,
        "chunk_steps": chunk_steps,
        "keys": key_list,
        "num_frames": num_frames,
        "stats": stats_,
        "storage": storage,
    }
    # "name" and "digest" identify the parent (``rlds rm`` looks for "name" in lineage entries)
    identity = {
        "name": src.name,
        "digest": src.manifest.digest(),
        "fn": ref,
        "fn_sha256": fn_sha,
        "args": args,
        "chunks": plan_digest(plan),  # a resume continues with the very chunks it started with
    }
    source_url = source_name.rstrip("/") if is_url(source_name) else None
    if source_url is not None:
        identity["url"] = source_url
    if out_url is not None:
        identity["to"] = out_url
    job_id = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    lineage = {
        **identity,
        "created_at": src.manifest.created_at,  # the parent's version in words (not in the job id)
        "rlds_version": __version__,
        "job": job_id,
        "parent_lineage": src.manifest.lineage,
    }
    return Job(cache, src, fn, ref, plan, key_list, storage, stats_, lineage, source_url, out_url)


def infer(job: Job) -> tuple[schema.Schema, int, int]:
    """Run the function on a small first chunk: its output's schema, and rows in and out."""
    plan = job.plan
    stop = inference_stop(plan, job.src.episode_index)
    batch = read_chunk(job.src, 0, stop, job.keys, plan.limit)
    where = f"function {job.ref}, schema inference on steps 0-{stop - 1}"
    out = fnref.call_user(fnref.get(job.fn), batch, where)
    arrays = schema.normalize(out, batch, where)
    return schema.infer(arrays), stop, len(arrays["action"])
