"""Running a job's chunks: the :class:`Executor` plug point and its registry.

Every executor runs :func:`rlds_cli.preprocess.worker.run_chunk` on the job's chunks and hands each
result to ``on_done`` in the coordinator, exactly once, in any order; ``on_done`` raising stops the
job. :data:`EXECUTORS` names them:

* ``"inline"``: in this process (:class:`InlineExecutor`);
* ``"local"``: spawned worker processes, the coordinator working as one more
  (:class:`rlds_cli.preprocess.pool.LocalPool`), or inline when one process is enough;
* ``"ray"``: Ray tasks (:class:`RayExecutor`), at most two chunks per Ray worker in flight (bounded
  memory whatever the dataset size).

The job starts its executor with :func:`start` as soon as it knows the number of chunks (local
workers then import the user's module while the coordinator plans), runs it once, and closes it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rlds_cli._util.lazy import resolve
from rlds_cli.errors import PreprocessError, WorkerLostError
from rlds_cli.preprocess import fnref
from rlds_cli.preprocess.worker import run_chunk

#: A chunk to run: its index, first step and stop step (``run_chunk``'s arguments after the spec).
Task = tuple[int, int, int]
#: Called in the coordinator with each chunk's result (``run_chunk``'s dict); raising stops the job.
OnDone = Callable[[dict[str, Any]], None]
logger = logging.getLogger(__name__)


@runtime_checkable
class Executor(Protocol):
    """Runs one job's chunks. Made by a factory of :data:`EXECUTORS`; :meth:`run` once, then
    :meth:`close` (also when the job stopped before it ran)."""

    def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
        """Run ``run_chunk(spec, *task)`` for every task and give each result to ``on_done``
        here, exactly once; an exception of ``on_done`` stops the job and propagates."""
        ...

    def close(self) -> None:
        """Release what the executor holds (worker processes); safe to call twice."""
        ...


#: Executors by name: ``"module:Class"``, imported when used. A class's ``for_job(*, workers,
#: num_chunks, preload, address)`` makes the executor of one job (see :func:`start`).
EXECUTORS: dict[str, str] = {
    "inline": "rlds_cli.preprocess.executors:InlineExecutor",
    "local": "rlds_cli.preprocess.pool:LocalPool",
    "ray": "rlds_cli.preprocess.executors:RayExecutor",
}


def start(
    name: str, *, workers: int | None, num_chunks: int, preload: str | None = None, address: str | None = None
) -> Executor:
    """The executor ``name`` for a job of ``num_chunks`` chunks.

    Args:
        name: A key of :data:`EXECUTORS`.
        workers: Processes (local) or CPUs of a local Ray instance; ``None``: all cores.
        num_chunks: The job's chunks (no more local processes than chunks are started).
        preload: The function reference, imported by local workers as soon as they start.
        address: The Ray cluster's address (``None``: ``RAY_ADDRESS``, else a local instance).
    """
    factory = resolve(EXECUTORS, name, what="executor", error=PreprocessError)
    executor: Executor = factory.for_job(
        workers=workers, num_chunks=num_chunks, preload=preload, address=address
    )
    return executor


class InlineExecutor:
    """One worker, this process: no process start-up for small jobs and cheap functions."""

    @classmethod
    def for_job(cls, **_: Any) -> InlineExecutor:
        return cls()

    def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
        for i, first, stop in tasks:
            on_done(run_chunk(spec, i, first, stop))

    def close(self) -> None:
        pass


#: Ray's retries of a chunk after a system failure (its worker process or node died). A chunk is
#: idempotent (same bytes, done-marker last), so a retry never mixes two attempts. The user's
#: function failing comes back as data, or is not retried (``retry_exceptions=False``), and stops
#: the job.
RAY_MAX_RETRIES = 3


def ray_init_kwargs(address: str | None, workers: int | None) -> dict[str, Any]:
    """The arguments of ``ray.init``.

    With ``--address`` or ``RAY_ADDRESS``: connect to that cluster, passing no resources (Ray
    refuses ``num_cpus`` when connecting). Otherwise: a local instance of the job's own with
    ``workers`` CPUs (``address="local"``; without it Ray would join a cluster ``ray start`` left
    running).
    """
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address == "local" or (address is None and not os.environ.get("RAY_ADDRESS")):
        kwargs["address"] = "local"
        if workers:
            kwargs["num_cpus"] = workers
    else:
        kwargs["address"] = address  # None: Ray reads RAY_ADDRESS
    return kwargs


def _ray_options(spec: Mapping[str, Any], shipped: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Task options, and what the function needs on a node without the caller's files: a file
    function's bytes go into ``shipped`` (the spec); a module found outside the installed
    packages (the working directory, ``PYTHONPATH``) is returned, for Ray's ``py_modules``."""
    options: dict[str, Any] = {"num_cpus": 1, "max_retries": RAY_MAX_RETRIES, "retry_exceptions": False}
    fn = spec["fn"]
    if not isinstance(fn, str):
        return options, None  # a callable from Python: pickled by reference, its module must import
    source = fnref.file_source(fn)
    if source is not None:
        if spec.get("fn_sha256") and source["sha256"] != spec["fn_sha256"]:
            raise PreprocessError(
                f"--fn {fn!r}: the file changed since the job started (its sha256 is in the lineage)",
                hint="run the same command again",
            )
        shipped["fn_source"] = source
    return options, fnref.module_root(fn)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def run_ray(
    spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone, workers: int | None, address: str | None
) -> None:
    """Run ``tasks`` as Ray tasks, at most two per CPU in flight; Ray is started here (and shut
    down) unless already initialized."""
    try:
        import ray
        from ray.exceptions import RayError, RayTaskError
    except ImportError:
        raise PreprocessError(
            "--executor ray needs Ray, which is not installed", hint="pip install 'rlds-cli[ray]'"
        ) from None
    shipped: dict[str, Any] = dict(spec)  # a plain dict for Ray to serialise
    shipped["on_cluster"] = True  # tasks check that their node sees the cache before any work
    options, module_root = _ray_options(spec, shipped)
    started = False
    if not ray.is_initialized():
        kwargs = ray_init_kwargs(address, workers)
        if module_root is not None:
            # Ray uploads local modules only for a whole job (ray.init), never for one task; in
            # a Ray session of the caller's own, its runtime_env says what the nodes import
            kwargs["runtime_env"] = {"py_modules": [module_root]}
        ray.init(**kwargs)
        started = True
    elif module_root is not None:
        logger.info(
            "Ray is already initialized: %s is not shipped to the nodes (add it to the runtime_env's "
            "py_modules of your ray.init, or install it on every node)",
            module_root,
        )
    running: dict[Any, Task] = {}
    try:
        remote = ray.remote(**options)(run_chunk)
        typed: Mapping[str, Any] = shipped  # typed as run_chunk's parameter, for Ray's stubs
        spec_ref = ray.put(typed)
        window = 2 * max(1, workers or int(ray.cluster_resources().get("CPU", 1)))
        queue = list(reversed(tasks))
        while queue or running:
            while queue and len(running) < window:
                task = queue.pop()
                running[remote.remote(spec_ref, *task)] = task
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                i, start, stop = running.pop(ref)
                where = f"chunk {i} (steps {start}-{stop - 1})"
                try:
                    result = ray.get(ref)
                except RayTaskError as exc:  # rlds's own code raised in the task (not retried)
                    cause = exc.cause if exc.cause is not None else exc
                    what = f"{type(cause).__name__}: {_first_line(cause)}"
                    result = {
                        "ok": False,
                        "type": "PreprocessError",
                        "message": f"a worker failed in {where}: {what}",
                        "hint": "--resume keeps the finished chunks",
                        "traceback": str(exc),
                    }
                except RayError as exc:  # a system failure, still there after the retries
                    raise WorkerLostError(
                        f"{where} failed {RAY_MAX_RETRIES + 1} times on Ray, its worker process or node "
                        f"lost: {type(exc).__name__}: {_first_line(exc)}"
                    ) from None
                on_done(result)
    except BaseException:
        for ref in list(running):
            ray.cancel(ref)
        raise
    finally:
        if started:
            ray.shutdown()


class RayExecutor:
    """Ray tasks writing to the cache path, which every node must see (a shared filesystem), or
    to the job's area on object storage. Ray starts (or is joined) in :meth:`run`."""

    def __init__(self, workers: int | None, address: str | None) -> None:
        self.workers = workers
        self.address = address

    @classmethod
    def for_job(cls, *, workers: int | None, address: str | None, **_: Any) -> RayExecutor:
        return cls(workers, address)

    def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
        run_ray(spec, tasks, on_done, self.workers, self.address)

    def close(self) -> None:
        pass  # run shuts down a Ray instance it started
