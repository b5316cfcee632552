"""A preprocessing job's directory across runs, and the job's end.

**Across runs.** The job directory is fresh, or resumed with the chunks an interrupted run of the
same job finished (each checked on disk); it is discarded so that no crash can leave part of it
looking resumable. Its names are :mod:`rlds_cli.cache.layout`'s.

**The end.** Check that every chunk finished and that chunk boundaries agree, merge the chunks'
statistics, write the episode index and the content digest, and publish the output (commit its cache
transaction, or push it to its URL).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache import digest, stats
from rlds_cli.cache.card import dataset_card
from rlds_cli.cache.episodes import build_index, write_index
from rlds_cli.cache.layout import JOB_CHUNKS_DIR, JOB_FILE, JOB_OUTPUT_DIR
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.transaction import CacheTransaction, seal
from rlds_cli.errors import OutputSchemaError, PreprocessError
from rlds_cli.preprocess import output, schema
from rlds_cli.preprocess.prepare import Job
from rlds_cli.preprocess.worker import data_path, read_npz, summary_path

logger = logging.getLogger(__name__)


def job_path(job: Job, out_name: str) -> Path:
    """Where the job whose output is ``out_name`` keeps its files."""
    return job.cache.layout.job_dir(job.cache.dataset_dir(out_name).name, job.job_id)


def discard_job_dir(job: Job, out_name: str) -> None:
    """Remove a job directory so that no crash can leave part of it looking resumable: it is renamed
    out of reach first (a ``.trash`` entry, which the stale-build cleanup removes)."""
    path = job_path(job, out_name)
    if path.exists():
        trash = job.cache.layout.trash_dir(job.cache.dataset_dir(out_name).name)
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def job_dir(job: Job, out_name: str, resume: bool) -> tuple[Path, dict[str, Any] | None]:
    """The job directory (fresh unless resuming) and the saved job description, if resumed."""
    path = job_path(job, out_name)
    saved = None
    if resume and (path / JOB_FILE).is_file():
        try:
            saved = json.loads((path / JOB_FILE).read_text())
        except (OSError, ValueError):
            saved = None
        if saved is not None and (saved.get("job") != job.job_id or not output_intact(path, saved, job)):
            logger.info("the output of job %s is incomplete on disk: starting it over", job.job_id)
            saved = None
    if saved is None and path.exists():
        discard_job_dir(job, out_name)
    (path / JOB_CHUNKS_DIR).mkdir(parents=True, exist_ok=True)
    return path, saved


def output_intact(path: Path, saved: dict[str, Any], job: Job) -> bool:
    """Whether the preallocated output of a per-step job still has every column at full size (chunk
    files are checked in :func:`finished_chunks`)."""
    if saved.get("mode") != "direct":
        return True
    inferred = schema.schema_from_json(saved["schema"])
    return output.preallocated_intact(path / JOB_OUTPUT_DIR, inferred, job.plan, job.storage)


def finished_chunks(job_dir: Path, num_chunks: int) -> list[int]:
    """Chunks whose results are all on disk: a summary (the done-marker, written after the chunk's
    data), and the chunk's file while the summary says it wrote rows, so a half-deleted job never
    passes for a finished one. Unreadable or orphaned summaries are removed (the chunk runs again)."""
    done = []
    for i in range(num_chunks):
        marker = summary_path(job_dir, i)
        if not marker.is_file():
            continue
        try:
            meta, _ = read_npz(marker)
        except (OSError, ValueError, KeyError):
            marker.unlink(missing_ok=True)  # unreadable: run the chunk again
            continue
        if meta.get("data_file") and not data_path(job_dir, i).is_file():
            marker.unlink()
            continue
        done.append(i)
    return done


def finish(
    job: Job,
    out_name: str,
    job_dir: Path,
    inferred: schema.Schema,
    assembler: output.Assembler | None,
    txn: CacheTransaction,
) -> Manifest:
    """Check chunk boundaries, merge statistics, write the episode index, commit the output's
    transaction (or push it, for an output at a URL)."""
    plan = job.plan
    fsync = txn.fsync
    missing = sorted(set(range(plan.num_chunks)) - set(finished_chunks(job_dir, plan.num_chunks)))
    if missing:
        raise PreprocessError(
            f"job {job.job_id}: chunks {missing[:5]} have no result on disk; nothing was published",
            hint="run the same command again with --resume: only the missing chunks are computed",
        )
    summaries = [read_npz(summary_path(job_dir, i)) for i in range(plan.num_chunks)]
    check_boundaries(job, summaries, inferred)
    rows_in = sum(int(meta["rows_in"]) for meta, _ in summaries)
    rows_out = sum(int(meta["rows_out"]) for meta, _ in summaries)
    if rows_in != plan.limit:
        raise PreprocessError(f"job {job.job_id}: its chunks read {rows_in} steps, expected {plan.limit}")
    out = job_dir / JOB_OUTPUT_DIR
    if assembler is not None:
        assembler.pump()
        steps, ends, ids, known = assembler.close(fsync)
        if steps != rows_out:
            raise PreprocessError(
                f"job {job.job_id}: assembled {steps} steps but the chunks wrote {rows_out}; "
                "nothing was published",
                hint="run the same command again without --resume",
            )
        if steps == 0:
            raise OutputSchemaError(f"function {job.ref} dropped every step: there is nothing to write")
    else:
        steps = plan.limit
        index = job.src.episode_index[: plan.num_episodes]
        ends = (index["start"] + index["length"] - 1).astype(np.int64)
        ends[-1] = min(int(ends[-1]), steps - 1)
        ids, known = index["source_id"].astype(np.int64), index["final_known"].astype(bool)
        if plan.cut:
            known[-1] = True  # the cut episode's last next/observation is real data
    index = build_index(ends, ids, known)
    write_index(out, index, fsync=fsync)
    # chunks were written by several workers: the digests are read back from the finished output
    content = digest.digest_directory(out, job.storage, list(inferred), index)
    manifest = Manifest(
        name=out_name,
        backend=job.storage,
        num_steps=steps,
        num_episodes=len(ends),
        fields=dict(inferred),
        source={
            "format": "rlds-preprocess",
            "id": job.src.name,
            "path": job.source_url or str(job.src.directory),
            "sha256": job.lineage["digest"],  # of the parent's manifest, which pins its files
        },
        conversion={"rules": f"preprocess by {plan.by}", "source_rows": plan.limit, "notes": []},
        lineage=[job.lineage],
        stats=merge_stats(summaries, inferred) if job.stats else {},
        content_digest=content,
        card=dataset_card(job.src),  # the data's licence and citation hold for what is made of it
    )
    if job.out_url is not None:  # files, index, then the manifest: as rlds push
        from rlds_cli.remote.transfer import push_directory

        seal(out, manifest, fsync=fsync)
        push_directory(out, job.out_url, cache=job.cache, force=txn.replace)
    else:
        txn.adopt(out)
        txn.commit(manifest)
    return manifest


def check_boundaries(job: Job, summaries: list[Any], inferred: schema.Schema) -> None:
    """Across chunk boundaries inside an episode: ``next/K`` of a chunk's last step must be
    ``K`` of the next chunk's first step."""
    flat = [k for k, s in inferred.items() if s.storage == "flat"]
    for i in range(len(summaries) - 1):
        meta, arrays = summaries[i]
        if meta["ends_done"] or not meta["rows_out"]:
            continue
        nxt = summaries[i + 1][1]
        for key in flat:
            if schema.row_bytes(arrays[f"last/{key}"]) != schema.row_bytes(nxt[f"first/{key}"]):
                step = int(job.plan.bounds[i + 1])
                raise OutputSchemaError(
                    f"function {job.ref}, chunks {i} and {i + 1}: next/{key} at step {step - 1} differs "
                    f"from {key} at step {step} inside one episode, so they cannot be stored once (flat)",
                    hint=f"return the same transform for {key} and next/{key} (a function of the step alone)",
                )


def merge_stats(summaries: list[Any], inferred: schema.Schema) -> dict[str, Any]:
    """The manifest's statistics: every chunk's partial statistics merged, per output key."""
    keys: dict[str, Any] = {}
    for key, spec in inferred.items():
        merged = None
        for _, arrays in summaries:
            if f"stats/{key}/count" in arrays:
                merged = stats.merge(merged, stats.Partial.from_arrays(arrays, f"stats/{key}/"))
        if merged is not None:
            keys[key] = stats.finalize(merged, spec.shape)
    return {"method": stats.METHOD, "quantile_rank_error": 1 / (len(stats.GRID) - 1), "keys": keys}
