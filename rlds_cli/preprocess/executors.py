"""Running a job's chunks: in this process, in spawned worker processes, or as Ray tasks.

Every executor runs :func:`rlds_cli.preprocess.worker.run_chunk` on the same chunks and hands
each result to ``on_done`` in the coordinator, which raises to stop the job. At most two chunks
per worker are in flight, so memory stays bounded whatever the dataset size.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rlds_cli.errors import PreprocessError
from rlds_cli.preprocess.worker import run_chunk

Task = tuple[int, int, int]  # chunk index, first step, stop step
OnDone = Callable[[dict[str, Any]], None]

_SPEC: dict[str, Any] = {}


def run_inline(spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
    """One worker: no process to spawn, so small jobs and cheap functions pay no start-up."""
    for i, start, stop in tasks:
        on_done(run_chunk(spec, i, start, stop))


def _init(spec: dict[str, Any]) -> None:
    # Ctrl-C reaches the whole process group: the coordinator stops the job, workers stay quiet
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _SPEC.clear()
    _SPEC.update(spec)


def _pool_task(i: int, start: int, stop: int) -> dict[str, Any]:
    return run_chunk(_SPEC, i, start, stop)


def run_pool(spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone, workers: int) -> None:
    """``workers - 1`` spawned processes (never forked: safe with threads, torch and any
    platform), and this process as the last worker: it runs chunks itself between collecting
    results, so the seconds a spawned interpreter needs to start are not lost."""
    ctx = multiprocessing.get_context("spawn")
    queue = deque(tasks)
    procs = workers - 1
    pool = ProcessPoolExecutor(procs, mp_context=ctx, initializer=_init, initargs=(dict(spec),))
    running: dict[Future[dict[str, Any]], Task] = {}
    try:
        while queue or running:
            while queue and len(running) < 2 * procs:  # one running and one queued per process
                task = queue.popleft()
                running[pool.submit(_pool_task, *task)] = task
            if queue:
                i, start, stop = queue.popleft()
                on_done(run_chunk(spec, i, start, stop))
                finished = [f for f in running if f.done()]
            else:
                finished = list(wait(running, return_when=FIRST_COMPLETED)[0])
            for future in sorted(finished, key=lambda f: running[f][0]):
                task = running.pop(future)
                try:
                    result = future.result()
                except BrokenProcessPool:
                    raise PreprocessError(
                        f"a worker process died in chunk {task[0]} (steps {task[1]}-{task[2] - 1})",
                        hint="it may have run out of memory (try a smaller --chunk-steps); "
                        "--resume keeps the finished chunks",
                    ) from None
                on_done(result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_ray(
    spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone, workers: int | None, address: str | None
) -> None:
    """Ray tasks writing to the cache path, which every node must see (a shared filesystem)."""
    try:
        import ray
    except ImportError:
        raise PreprocessError(
            "--backend ray needs Ray, which is not installed", hint="pip install 'rlds-cli[ray]'"
        ) from None
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None and workers:
            kwargs["num_cpus"] = workers
        ray.init(address=address, **kwargs)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_chunk)
        spec_ref = ray.put(dict(spec))
        window = 2 * max(1, workers or int(ray.cluster_resources().get("CPU", 1)))
        queue = list(reversed(tasks))
        running: dict[Any, Task] = {}
        while queue or running:
            while queue and len(running) < window:
                task = queue.pop()
                running[remote.remote(spec_ref, *task)] = task
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                running.pop(ref)
                on_done(ray.get(ref))
    except BaseException:
        for ref in list(locals().get("running", {})):
            ray.cancel(ref)
        raise
    finally:
        if started:
            ray.shutdown()
