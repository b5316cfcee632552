"""A preprocessing job: what it is, its coordinator, its directory across runs and its end.

**What a job is** (:class:`Job`, :func:`prepare`): arguments checked, source opened, chunks planned,
function resolved, identity hashed (the job id ``--resume`` matches), output schema inferred on a
first small chunk.

**The coordinator** (:func:`run`): plan, infer the schema, run the chunks, assemble, record lineage
and statistics, publish atomically. Where things live while a job runs (``<entry>`` is the
output's cache entry; the names are :mod:`rlds_cli.cache.layout`'s)::

    tmp/<entry>.job-<id>/job.json            what the job is (its identity) and its schema
    tmp/<entry>.job-<id>/out/                the output dataset being built
    tmp/<entry>.job-<id>/chunks/<i>.done.npz the summary of a finished chunk (its done-marker)
    tmp/<entry>.job-<id>/chunks/<i>.data.npz a finished chunk's rows (per-episode mode, zarr)

``<id>`` hashes the parent's manifest, the function reference and its file's sha256, and the
arguments that change the output, so ``--resume`` only continues the same job. The directory does
not end in ``.incomplete``, so the stale-build cleanup leaves it alone: made once the schema is
inferred, it survives a crash until the job is resumed (or run again without ``--resume``), and is
removed once the output is published. ``out/`` is the build directory of the job's
:class:`~rlds_cli.cache.transaction.CacheTransaction`, published by its commit.

**Across runs.** The job directory is fresh, or resumed with the chunks an interrupted run of the
same job finished (each checked on disk); it is discarded so that no crash can leave part of it
looking resumable.

**The end.** Check that every chunk finished and that chunk boundaries agree, merge the chunks'
statistics, write the episode index and the content digest, and publish the output (commit its cache
transaction, or push it to its URL).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from rlds_cli import settings
from rlds_cli._util.locks import FileLock
from rlds_cli._util.progress import Progress
from rlds_cli._version import __version__
from rlds_cli.cache import digest, stats
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.card import dataset_card
from rlds_cli.cache.compose import copied_metadata, verify_parent
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.episodes import build_index, write_index
from rlds_cli.cache.growing import fixed_copy_hint
from rlds_cli.cache.layout import (
    JOB_CHUNKS_DIR,
    JOB_FILE,
    JOB_ID_DIGITS,
    JOB_OUTPUT_DIR,
    MANIFEST_FILE,
    SEGMENTED_LAYOUT,
    is_url,
    validate_name,
)
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.transaction import CacheTransaction, seal
from rlds_cli.errors import (
    CacheNotVisibleError,
    CorruptDatasetError,
    DatasetExistsError,
    DiskFullError,
    FunctionImportError,
    InvalidNameError,
    OutputSchemaError,
    PreprocessError,
    RemoteExistsError,
    RldsError,
    UserFunctionError,
    is_disk_full,
)
from rlds_cli.loader.opening import open_dataset
from rlds_cli.preprocess import executors, fnref, output, remote_io, schema
from rlds_cli.preprocess.plan import (
    Plan,
    default_chunk_steps,
    describe_input,
    inference_stop,
    make_plan,
    needs_whole_episodes,
    plan_digest,
    read_chunk,
)
from rlds_cli.preprocess.pool import LocalPool, check_sendable, stop_if_reimported
from rlds_cli.preprocess.worker import data_path, disk_full, forget, read_npz, summary_path

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
        raise PreprocessError(
            f"--by must be 'step' or 'episode', not {by!r}",
            hint="--by step hands the function chunks of steps; --by episode, whole episodes",
        )
    if chunk_steps is not None and chunk_steps < 1:
        raise PreprocessError(
            f"--chunk-steps must be at least 1, not {chunk_steps}",
            hint="leave it out for the default (about 16 chunks, 4,096 to 131,072 steps each)",
        )
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
    fnref.check_loaded_code(fn)  # the code that runs is the code the lineage records
    ref, fn_sha = fnref.describe(fn)
    helpers = fnref.helpers_digest(fn)
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
        **({"fn_helpers_sha256": helpers} if helpers else {}),  # absent: a job without keeps its id
        "args": args,
        "chunks": plan_digest(plan),  # a resume continues with the very chunks it started with
    }
    source_url = source_name.rstrip("/") if is_url(source_name) else None
    if source_url is not None:
        identity["url"] = source_url
    if out_url is not None:
        identity["to"] = out_url
    job_id = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:JOB_ID_DIGITS]
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
    batch = read_chunk(job.src, 0, stop, job.keys, plan.limit, copied_metadata(job.src)[1])
    where = f"function {job.ref}, schema inference on steps 0-{stop - 1}"
    out = fnref.call_user(fnref.get(job.fn), batch, where)
    arrays = schema.normalize(out, batch, where)
    return schema.infer(arrays, where), stop, len(arrays["action"])


logger = logging.getLogger(__name__)


# error types a worker's result may name (any other is raised as PreprocessError)
_ERRORS: dict[str, type[RldsError]] = {
    c.__name__: c
    for c in (
        UserFunctionError,
        OutputSchemaError,
        FunctionImportError,
        PreprocessError,
        CacheNotVisibleError,
        DiskFullError,
    )
}


@dataclass
class PreprocessResult:
    """What :func:`run` did.

    Attributes:
        manifest: The output's manifest.
        path: The output's directory.
        reused: The same job had already produced this output: nothing was done.
        num_chunks: Chunks of the job.
        resumed_chunks: Chunks finished by an earlier, interrupted run and kept.
        seconds: Wall time of the job.
        url: Where the output was pushed, for a job whose output is a URL (``path`` is then
            where it would be in the cache, and holds nothing).
    """

    manifest: Manifest
    path: Path
    reused: bool
    num_chunks: int = 0
    resumed_chunks: int = 0
    seconds: float = 0.0
    url: str | None = None


@dataclass
class DryRun:
    """What :func:`dry_run` found: the function's output schema on a first small chunk."""

    input: dict[str, Any]
    output: dict[str, Any]
    by: str
    steps: int
    num_chunks: int
    sample_steps_in: int
    sample_steps_out: int
    lineage: dict[str, Any] = field(default_factory=dict)


def dry_run(
    source_name: str,
    fn: FnLike,
    *,
    by: str = "step",
    chunk_steps: int | None = None,
    keys: Sequence[str] | None = None,
    stats: bool = False,
    num_frames: int | None = None,
    storage: str | None = None,
    root: Any = None,
) -> DryRun:
    """Run ``fn`` on a first small chunk and report the output schema; write nothing.

    Arguments are those of :func:`run`.
    """
    job = prepare(
        source_name, fn, by=by, chunk_steps=chunk_steps, keys=keys, stats_=stats,
        num_frames=num_frames, storage=storage, root=root,
    )  # fmt: skip
    inferred, rows_in, rows_out = infer(job)
    return DryRun(
        describe_input(job.src),
        schema.schema_to_json(inferred),
        by,
        job.plan.limit,
        job.plan.num_chunks,
        rows_in,
        rows_out,
        {k: v for k, v in job.lineage.items() if k != "parent_lineage"},
    )


def run(
    source_name: str,
    fn: FnLike,
    out_name: str,
    *,
    by: str = "step",
    chunk_steps: int | None = None,
    workers: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    keys: Sequence[str] | None = None,
    stats: bool = False,
    resume: bool = False,
    force: bool = False,
    num_frames: int | None = None,
    storage: str | None = None,
    root: Any = None,
    progress: Progress | None = None,
) -> PreprocessResult:
    """Apply ``fn`` to every chunk of ``source_name`` and publish the result as ``out_name``.

    Args:
        source_name: The input dataset (never modified): a name in the cache, or the URL of a zarr
            dataset pushed with ``rlds push`` (read where it lies: the workers need no copy of it).
        fn: ``"package.module:function"``, ``"path/to/file.py:function"``, or (from Python) a
            callable that pickles by reference. It gets a :class:`~rlds_cli.cache.ted.TedBatch` of
            numpy arrays and returns a mapping of TED keys to arrays (see
            ``docs/preprocessing.md``).
        out_name: Name of the derived dataset, or a URL: the output is then pushed there (manifest
            last, as ``rlds push`` does) instead of published in the cache, and the workers write
            their chunks to the store, so Ray nodes need no shared filesystem. Its name is the URL's
            last part.
        by: ``"step"`` (chunks of consecutive steps; the step count is kept) or ``"episode"``
            (chunks of whole episodes; steps and episodes may be dropped).
        chunk_steps: Steps per chunk (per-episode chunks hold whole episodes up to this many steps,
            at least one episode).
        workers: Local processes (default: all cores, at most one per chunk; 1 runs in this
            process). With Ray: the number of CPUs of a local Ray instance started for the job.
        backend: ``"local"`` or ``"ray"``.
        ray_address: Address of a running Ray cluster (``None``: the one already initialized in this
            process, else a new local instance).
        keys: Input keys to read (``None``: all); the flags are always read.
        stats: Compute statistics of every numeric output key into the manifest.
        resume: Continue an interrupted run of the same job, keeping its finished chunks.
        force: Replace an existing ``out_name`` (otherwise only an identical job's output is
            accepted, as a no-op).
        num_frames: Process only the first ``num_frames`` steps (whole episodes in per-episode
            mode), for debugging.
        storage: Storage backend of the output (default: the source's).
        root: Cache root.
        progress: Optional callback (:data:`~rlds_cli._util.progress.Progress`): ``"start"`` (steps
            to process), ``"advance"`` (steps done), ``"resume"`` (steps done by an earlier run of
            the same job).

    Returns:
        A :class:`PreprocessResult`.
    """
    t0 = time.perf_counter()
    stop_if_reimported()  # a worker re-running a script without a main guard: it reports
    out_url = _output_url(out_name)
    if out_url is not None:
        out_name = out_url.rsplit("/", 1)[-1]
    else:
        validate_name(out_name)
    if (out_url or out_name) == source_name.rstrip("/"):
        raise PreprocessError(f"the output name must differ from the source ({source_name!r})")
    if backend not in ("local", "ray"):
        raise PreprocessError(
            f"--executor must be 'local' or 'ray', not {backend!r}",
            hint="--executor local runs processes on this machine; ray, on a Ray cluster",
        )
    if workers is not None and workers < 1:
        raise PreprocessError(f"--workers must be at least 1, not {workers}")
    executor: executors.Executor | None = None

    def start_workers(plan: Plan) -> None:
        # as soon as the chunk count is known: workers start and import the function's module
        # while this process resolves it, hashes its file, infers the schema, preallocates
        nonlocal executor
        executor = executors.start(
            backend, workers=workers, num_chunks=plan.num_chunks,
            preload=fn if isinstance(fn, str) else None, address=ray_address,
        )  # fmt: skip
        if isinstance(executor, LocalPool) and not isinstance(fn, str):
            check_sendable(fn)  # before the job folder is made

    try:
        job = prepare(
            source_name, fn, by=by, chunk_steps=chunk_steps, keys=keys, stats_=stats,
            num_frames=num_frames, storage=storage, root=root, on_plan=start_workers, out_url=out_url,
        )  # fmt: skip
        txn = CacheTransaction(
            out_name, root=job.cache, replace=force, lock_timeout=0, lock=_url_lock(job), what=out_url
        )
        with txn:
            try:
                assert executor is not None  # started by prepare, through on_plan
                result = _run_locked(job, out_name, txn, executor, resume, progress)
            finally:
                if executor is not None:
                    executor.close()  # no worker may write into the job directory once the lock is released
    finally:
        if executor is not None:
            executor.close()  # when the job stopped before taking the lock (a no-op otherwise)
    result.seconds = time.perf_counter() - t0
    return result


def _run_locked(
    job: Job,
    out_name: str,
    txn: CacheTransaction,
    executor: executors.Executor,
    resume: bool,
    progress: Progress | None,
) -> PreprocessResult:
    """The job, once its output is locked: reuse what the very same job published, refuse to
    replace another dataset without ``--force``, else run it."""
    out_url = job.out_url
    existing = _existing_output(job, out_name)
    made_here = bool(existing and existing.lineage and existing.lineage[0].get("job") == job.job_id)
    if existing is not None and made_here and out_url is None:
        try:
            problems = open_dataset(out_name, job.cache).check_files()
        except CorruptDatasetError as exc:
            problems = [exc.message]
        if problems and not txn.replace:
            raise CorruptDatasetError(
                f"dataset {out_name!r}, made by this job before, is damaged: {problems[0]}",
                hint="pass --force to make it again",
            )
        made_here = not problems  # damaged: made again
    if existing is not None and made_here and (resume or not txn.replace):
        # the same job finished before (perhaps killed while cleaning up): its output is complete
        discard_job_dir(job, out_name)
        if out_url is not None:
            remote_io.remove(remote_io.job_url(out_url, job.job_id))
        return PreprocessResult(existing, job.cache.dataset_dir(out_name), True, url=out_url)
    if existing is not None and not txn.replace:
        if out_url is not None:
            raise RemoteExistsError(
                f"{out_url} holds another dataset, not made by this job",
                hint="pass --force to replace it (readers never see a mix: its manifest goes first)",
            )
        raise DatasetExistsError(f"dataset {out_name!r} already exists and was not made by this job")
    return _execute(job, out_name, txn, executor, resume, progress)


def _output_url(out_name: str) -> str | None:
    """The output's URL when ``out_name`` is one (its last part, the name, checked)."""
    if not is_url(out_name):
        return None
    url = out_name.rstrip("/")
    name = url.rsplit("/", 1)[-1]
    if not urlsplit(url).path.strip("/"):  # s3://bucket: the bucket is no dataset's name
        raise PreprocessError(
            f"{out_name}: it names a bucket or host, not a dataset in it",
            hint="end the URL with the new dataset's name, e.g. s3://bucket/prefix/NAME",
        )
    try:
        validate_name(name)
    except InvalidNameError:
        raise PreprocessError(
            f"{out_name}: its last part {name!r} cannot be a dataset name",
            hint="end the URL with the new dataset's name, e.g. s3://bucket/prefix/NAME",
        ) from None
    return url


def _url_lock(job: Job) -> FileLock | None:
    """The lock of an output that goes to a URL (in this cache's locks), or ``None`` for an
    output in the cache (locked by its name)."""
    if job.out_url is None:
        return None
    ident = hashlib.sha256(job.out_url.encode()).hexdigest()[:16]
    return FileLock(job.cache.layout.lock_file(f".preprocess-{ident}"), timeout=0)


def _existing_output(job: Job, out_name: str) -> Manifest | None:
    """The manifest of what is already at the output (in the cache, or at its URL)."""
    if job.out_url is None:
        return job.cache.manifest(out_name) if job.cache.exists(out_name) else None
    from rlds_cli.cache.manifest import parse_manifest
    from rlds_cli.remote import store

    fs, base = store.open_url(job.out_url)
    data = store.read_bytes(fs, store.join(base, MANIFEST_FILE), job.out_url)
    if data is None:
        return None
    try:
        return parse_manifest(data, f"{job.out_url}/{MANIFEST_FILE}")
    except RldsError:
        return None  # unreadable: replaced only with --force, as any other dataset there


def _execute(
    job: Job,
    out_name: str,
    txn: CacheTransaction,
    executor: executors.Executor,
    resume: bool,
    progress: Progress | None,
) -> PreprocessResult:
    job_dir, saved = open_job_dir(job, out_name, resume)
    area = remote_io.job_url(job.out_url, job.job_id) if job.out_url is not None else None
    if area is not None:
        if resume:  # the chunks that finished, wherever the interrupted run was coordinated
            remote_io.fetch_finished(area, job_dir)
        else:
            remote_io.remove(area)
    if saved is None:  # a new run (a resumed one was checked when it began)
        try:
            if job.source_url is None:  # damaged arrays would be published as the output's
                verify_parent(job.src)
            inferred = infer(job)[0]
        except BaseException:
            if not output.finished_chunks(job_dir, job.plan.num_chunks):  # nothing a --resume continues
                shutil.rmtree(job_dir, ignore_errors=True)
            raise
        # an output at a URL: every chunk is a file the workers put on the store (no shared disk)
        direct = job.out_url is None and output.direct_possible(
            job.storage, inferred, job.plan, job.src.episode_index
        )
        mode = "direct" if direct else "files"
        saved = {"job": job.job_id, "mode": mode, "schema": schema.schema_to_json(inferred)}
        try:
            (job_dir / JOB_CHUNKS_DIR).mkdir(parents=True, exist_ok=True)
            if direct:
                output.preallocate(job_dir / JOB_OUTPUT_DIR, inferred, job.plan, job.storage)
            (job_dir / JOB_FILE).write_text(json.dumps(saved, indent=2))
        except BaseException:
            # no job.json: nothing a --resume could continue (a full disk left a folder that
            # 'rlds gc' counted as resumable and never removed)
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
    inferred = schema.schema_from_json(saved["schema"])
    mode = saved["mode"]
    plan = job.plan
    done = output.finished_chunks(job_dir, plan.num_chunks)
    if resume:  # what an earlier run left is checked before it is published
        done = output.intact_chunks(job_dir, done, mode, job.storage)
    tasks = [(i, *plan.chunk(i)) for i in range(plan.num_chunks) if i not in set(done)]
    if progress:
        progress("start", plan.limit)
        if done:
            progress("resume", sum(plan.chunk(i)[1] - plan.chunk(i)[0] for i in done))
    spec = {
        "run_id": uuid.uuid4().hex, "fn": job.fn, "fn_ref": job.ref, "fn_sha256": job.lineage["fn_sha256"],
        "source_dir": str(job.src.directory), "source_url": job.source_url, "job_url": area,
        "source_digest": job.lineage["digest"], "job_dir": str(job_dir), "by": plan.by,
        "keys": job.keys, "limit": plan.limit, "schema": saved["schema"], "mode": mode,
        "stats": job.stats, "fsync": settings.fsync_enabled(), "cwd": os.getcwd(),
        "storage": job.storage,
    }  # fmt: skip
    assembler = output.Assembler(job_dir, inferred, job.storage, plan.num_chunks) if mode == "files" else None

    def on_done(res: dict[str, Any]) -> None:
        if not res["ok"]:
            cls = _ERRORS.get(res["type"], PreprocessError)
            if cls is UserFunctionError:
                raise UserFunctionError(res["message"], res["hint"], user_traceback=res["traceback"])
            if res.get("traceback"):  # rlds's own error in a worker: its traceback, for -vv
                logger.debug("traceback of the worker:\n%s", res["traceback"])
            raise cls(res["message"], res["hint"])
        if area is not None:  # the chunk's files, from the store into the local job directory
            names = [summary_path(job_dir, res["i"]).name]
            if res.get("data_file"):
                names.append(data_path(job_dir, res["i"]).name)
            remote_io.fetch(area, job_dir, names)
        if progress:
            progress("advance", res["rows_in"])
        if assembler is not None:
            assembler.pump()

    if assembler is not None:
        assembler.pump()
    try:
        try:
            executor.run(spec, tasks, on_done)
        finally:
            forget()  # this process ran chunks too: unmap the output before it is published
        manifest = finish(job, out_name, job_dir, inferred, assembler, txn)
    except OSError as exc:  # the chunks' and the assembled output's writes name no file
        if not isinstance(exc, RldsError) and is_disk_full(exc):
            raise disk_full(job_dir) from exc
        raise
    discard_job_dir(job, out_name)
    if area is not None:
        remote_io.remove(area)
    return PreprocessResult(
        manifest, job.cache.dataset_dir(out_name), False, plan.num_chunks, len(done), url=job.out_url
    )


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


def open_job_dir(job: Job, out_name: str, resume: bool) -> tuple[Path, dict[str, Any] | None]:
    """The job directory (fresh unless resuming) and the saved job description, if resumed."""
    path = job_path(job, out_name)
    saved = None
    if resume and (path / JOB_FILE).is_file():
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads((path / JOB_FILE).read_text())
        if saved is not None and (saved.get("job") != job.job_id or not output_intact(path, saved, job)):
            logger.info("the output of job %s is incomplete on disk: starting it over", job.job_id)
            saved = None
    if saved is None and path.exists():
        discard_job_dir(job, out_name)
    if resume:  # a new run makes it once the schema is inferred (a failing function leaves none)
        (path / JOB_CHUNKS_DIR).mkdir(parents=True, exist_ok=True)
    return path, saved


def output_intact(path: Path, saved: dict[str, Any], job: Job) -> bool:
    """Whether the preallocated output of a per-step job still has every column at full size (chunk
    files are checked in :func:`rlds_cli.preprocess.output.finished_chunks`)."""
    if saved.get("mode") != "direct":
        return True
    inferred = schema.schema_from_json(saved["schema"])
    return output.preallocated_intact(path / JOB_OUTPUT_DIR, inferred, job.plan, job.storage)


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
    missing = sorted(set(range(plan.num_chunks)) - set(output.finished_chunks(job_dir, plan.num_chunks)))
    if missing:
        raise PreprocessError(
            f"job {job.job_id}: chunks {missing[:5]} have no result on disk; nothing was published",
            hint="run the same command again with --resume: only the missing chunks are computed",
        )
    rows_in, rows_out, partials = read_summaries(job, job_dir, inferred)
    if rows_in != plan.limit:
        raise PreprocessError(f"job {job.job_id}: its chunks read {rows_in} steps, expected {plan.limit}")
    out = job_dir / JOB_OUTPUT_DIR
    if assembler is not None:
        assembler.pump()
        steps, ends, parents, ids, known = assembler.close(fsync)
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
        parents = np.arange(len(index), dtype=np.int64)
        ids, known = index["source_id"].astype(np.int64), index["final_known"].astype(bool)
        if plan.cut:
            known[-1] = True  # the cut episode's last next/observation is real data
    index = build_index(ends, ids, known)
    write_index(out, index, fsync=fsync)
    # chunks were written by several workers: the digests are read back from the finished output
    # the source's per-episode facts (RoboCasa's lang, seeds), each output episode its parent's
    arrays = output.copy_source_arrays(out, job.src, parents)
    content = digest.digest_directory(out, job.storage, list(inferred), index, arrays)
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
            # what the source said of its data (task texts, text tables, spaces) holds for the
            # copy's keys where they stay (each reader of it checks the keys it applies to)
            **({"metadata": meta} if (meta := copied_metadata(job.src)[0]) else {}),
        },
        conversion={"rules": f"preprocess by {plan.by}", "source_rows": plan.limit, "notes": []},
        lineage=[job.lineage],
        stats=finalize_stats(partials, inferred) if job.stats else {},
        content_digest=content,
        card=dataset_card(job.src),  # the data's licence and citation hold for what is made of it
    )
    if job.out_url is not None:  # files, index, then the manifest: as rlds push
        from rlds_cli.remote.push import push_directory

        seal(out, manifest, fsync=fsync)
        push_directory(out, job.out_url, cache=job.cache, force=txn.replace)
    else:
        txn.adopt(out)
        txn.commit(manifest)
    return manifest


def read_summaries(
    job: Job, job_dir: Path, inferred: schema.Schema
) -> tuple[int, int, dict[str, stats.Partial]]:
    """One pass over the chunks' summaries, in chunk order, one held at a time (a job of many
    chunks held every chunk's quantile sketches at once): the steps read and written, and each
    key's partial statistics merged.

    Raises:
        OutputSchemaError: Across a chunk boundary inside an episode, ``next/K`` of a chunk's last
            step is not ``K`` of the next chunk's first step.
    """
    flat = [k for k, s in inferred.items() if s.storage == "flat"]
    rows_in = rows_out = 0
    partials: dict[str, stats.Partial] = {}
    last: dict[str, np.ndarray] | None = None  # the previous chunk's, when it ended inside an episode
    for i in range(job.plan.num_chunks):
        meta, arrays = read_npz(summary_path(job_dir, i))
        rows_in, rows_out = rows_in + int(meta["rows_in"]), rows_out + int(meta["rows_out"])
        if last is not None:
            _check_boundary(job, i, last, arrays)
        ended = meta["ends_done"] or not meta["rows_out"]
        last = None if ended else {key: arrays[f"last/{key}"] for key in flat}
        for key in inferred:
            if f"stats/{key}/count" in arrays:
                merged = stats.merge(partials.get(key), stats.Partial.from_arrays(arrays, f"stats/{key}/"))
                if merged is not None:
                    partials[key] = merged
    return rows_in, rows_out, partials


def _check_boundary(job: Job, i: int, last: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> None:
    """Chunk ``i`` (its summary's ``arrays``) begins inside the episode chunk ``i - 1`` ended in
    (that chunk's last ``next/K`` rows, ``last``): each ``K`` of its first step must be one."""
    for key, row in last.items():
        first = arrays.get(f"first/{key}")
        if first is not None and schema.row_bytes(row) != schema.row_bytes(first):
            step = int(job.plan.bounds[i])
            raise OutputSchemaError(
                f"function {job.ref}, chunks {i - 1} and {i}: next/{key} at step {step - 1} differs "
                f"from {key} at step {step} inside one episode, so they cannot be stored once (flat)",
                hint=f"return the same transform for {key} and next/{key} (a function of the step alone)",
            )


def finalize_stats(partials: dict[str, stats.Partial], inferred: schema.Schema) -> dict[str, Any]:
    """The manifest's statistics: each output key's merged partial statistics (in chunk order)."""
    keys = {
        key: stats.finalize(partials[key], spec.shape) for key, spec in inferred.items() if key in partials
    }
    return {"method": stats.METHOD, "quantile_rank_error": 1 / (len(stats.GRID) - 1), "keys": keys}
