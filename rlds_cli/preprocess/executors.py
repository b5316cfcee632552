"""Running a job's chunks: in this process, or as Ray tasks (spawned local worker processes are
:class:`rlds_cli.preprocess.pool.LocalPool`).

Every executor runs :func:`rlds_cli.preprocess.worker.run_chunk` on the same chunks and hands
each result to ``on_done`` in the coordinator, which raises to stop the job. At most two chunks
per Ray worker are in flight, so memory stays bounded whatever the dataset size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlds_cli.errors import PreprocessError
from rlds_cli.preprocess.worker import run_chunk

Task = tuple[int, int, int]  # chunk index, first step, stop step
OnDone = Callable[[dict[str, Any]], None]


def run_inline(spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
    """One worker: no process to spawn, so small jobs and cheap functions pay no start-up."""
    for i, start, stop in tasks:
        on_done(run_chunk(spec, i, start, stop))


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
