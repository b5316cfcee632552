"""A preprocessing job's directory across runs: fresh, or resumed with the chunks an interrupted
run of the very same job finished (each checked on disk), and discarded so that no crash can leave
part of it looking resumable. The directory's names are :mod:`rlds_cli.cache.layout`'s.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rlds_cli.cache.layout import JOB_CHUNKS_DIR, JOB_FILE, JOB_OUTPUT_DIR
from rlds_cli.preprocess import output, schema
from rlds_cli.preprocess.prepare import Job
from rlds_cli.preprocess.worker import data_path, read_npz, summary_path

logger = logging.getLogger(__name__)


def job_path(job: Job, out_name: str) -> Path:
    """Where the job whose output is ``out_name`` keeps its files."""
    return job.cache.layout.job_dir(job.cache.dataset_dir(out_name).name, job.job_id)


def discard_job_dir(job: Job, out_name: str) -> None:
    """Remove a job directory so that no crash can leave part of it looking resumable: it is
    first renamed out of reach (a ``.trash`` entry, which the stale-build cleanup removes)."""
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
    """Whether the preallocated output of a per-step job is still all there (every column at
    its full size); chunk files are checked one by one in :func:`finished_chunks`."""
    if saved.get("mode") != "direct":
        return True
    inferred = schema.schema_from_json(saved["schema"])
    return output.preallocated_intact(path / JOB_OUTPUT_DIR, inferred, job.plan, job.storage)


def finished_chunks(job_dir: Path, num_chunks: int) -> list[int]:
    """Chunks whose results are all on disk. A summary (the done-marker, written after the
    chunk's data) says how many rows the chunk wrote; a chunk that wrote rows to a chunk file
    counts only while that file exists, so a half-deleted job never passes for a finished one."""
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
