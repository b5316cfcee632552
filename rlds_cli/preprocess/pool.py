"""Local worker processes of a job: spawned first, then fed from a shared chunk counter; and the
guard against a caller's script without a main guard.

* **Started before the job is known.** A spawned interpreter takes about 0.15 s to start and import
  numpy, rlds's read path and the user's module. :func:`rlds_cli.preprocess.job.run` creates the
  pool as soon as the chunks are planned, so the workers start while the coordinator resolves the
  function, infers the schema and preallocates the output; the job is sent to them afterwards.
* **Chunks are claimed, not dealt.** Every process, the coordinator included, takes the next
  unclaimed chunk from a shared counter whenever it is free: no worker waits for the coordinator to
  hand out work, no chunk waits behind a busy worker, and all processes finish within one chunk of
  each other. Each process holds one chunk at a time (bounded memory).
* **A light import.** A spawned process imports this module and :mod:`~rlds_cli.preprocess.worker`
  (numpy and the cache's read path), not the coordinator's modules.
* **Scripts without a main guard.** Spawning imports the parent's ``__main__`` script again in each
  child (as ``__mp_main__``), so a script that calls :func:`rlds_cli.preprocess.run` at its top
  level, outside ``if __name__ == "__main__":``, would start a job in every worker. The worker
  detects that (:func:`stop_if_reimported`) and exits with :data:`REIMPORTED_EXIT`; the coordinator
  turns that exit code into a :class:`~rlds_cli.errors.PreprocessError` that says what to do.

Chunk results come back through one pipe per worker; the coordinator hands them to ``on_done``
between its own chunks.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any

from rlds_cli._util.cpus import usable_cpus
from rlds_cli.errors import FunctionImportError, PreprocessError
from rlds_cli.preprocess import fnref
from rlds_cli.preprocess.executors import Executor, InlineExecutor, OnDone, Task
from rlds_cli.preprocess.worker import forget, run_chunk

NOT_STARTED = -2  # a worker's slot in LocalPool._held before it runs _serve


#: Thread-pool sizes of the numerical libraries a worker may load (OpenBLAS, OpenMP as torch uses
#: it, MKL): left alone, each of N workers starts a thread per core, oversubscribing them, and
#: OpenBLAS's threads spin ~0.1 s after numpy's import, taking a core from the coordinator.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def _thread_limits(threads: int) -> Iterator[None]:
    """Processes started inside get ``threads`` threads per library, unless the user set the
    variable (children copy ``os.environ`` when they start)."""
    added = [name for name in THREAD_VARIABLES if name not in os.environ]
    for name in added:
        os.environ[name] = str(threads)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT blocked in this thread (a process started meanwhile inherits the block); one that
    arrived meanwhile is delivered (raised) when the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _claim(counter: Any, num_tasks: int, held: Any = None, slot: int = 0) -> int:
    """Position of the next unclaimed task, or -1 when none is left; recorded in ``held[slot]``
    under the same lock, so a worker that dies can be named with its chunk."""
    with counter.get_lock():
        j = int(counter.value)
        if j >= num_tasks:
            j = -1
        else:
            counter.value = j + 1
        if held is not None:
            held[slot] = j
    return j


def _serve(conn: Connection, counter: Any, held: Any, slot: int, preload: str | None) -> None:
    """A spawned worker: import the user's module, wait for the job, then run claimed chunks until
    none is left or the coordinator says stop (a message, or its end of the pipe closing)."""
    # Ctrl-C reaches the whole process group: the coordinator stops the job, workers stay quiet
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    held[slot] = -1  # started: past the import of the caller's main script (see stop_if_reimported)
    # what the user's function prints is a log, never the command's output (which may be JSON)
    os.dup2(2, 1)
    if preload is not None:
        # a failure is reported by the coordinator's own import, or else by this worker's first chunk
        with contextlib.suppress(Exception):
            fnref.get(preload)
    try:
        job = conn.recv()
    except EOFError:
        return
    if job is None:
        return
    spec, tasks = job
    j = _claim(counter, len(tasks), held, slot)
    while j >= 0:
        try:
            result = run_chunk(spec, *tasks[j])
        except Exception as exc:  # not an RldsError (run_chunk returns those): e.g. a full disk
            result = _failure(tasks[j], exc)
            held[slot] = j = -1  # reported as a result, not as a dead worker; the job stops
            forget()
            with contextlib.suppress(OSError):
                conn.send(result)
            return
        if conn.poll():  # stop
            held[slot] = j = -1
        else:
            j = _claim(counter, len(tasks), held, slot)
        if j < 0:
            # unmap the output before the last result: the coordinator publishes (renames) the
            # output once it has every result, and some platforms refuse to rename mapped files
            forget()
        try:
            conn.send(result)
        except OSError:  # the coordinator is gone
            return


class LocalPool:
    """``procs`` spawned worker processes for one job (spawned, never forked: safe with threads,
    torch and any platform). They start at once; :meth:`run` gives them the job.

    Args:
        procs: Worker processes to spawn (the coordinator works as one more).
        preload: The job's function reference, imported by each worker as soon as it starts.
    """

    def __init__(self, procs: int, preload: str | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._counter = ctx.Value("q", 0)  # the next unclaimed task; its lock serializes claims
        # per worker: the task it holds, -1 none, NOT_STARTED until it runs _serve
        self._held = ctx.RawArray("q", [NOT_STARTED] * procs)
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._job_sent = False
        try:
            with _thread_limits(max(1, usable_cpus() // (procs + 1))):
                for slot in range(procs):
                    ours, theirs = ctx.Pipe()
                    proc = ctx.Process(
                        target=_serve,
                        args=(theirs, self._counter, self._held, slot, preload),
                        name=f"rlds-preprocess-{slot + 1}",
                    )
                    # started with Ctrl-C held back: it reaches the whole process group, and a
                    # worker still importing would print its traceback (the worker ignores it,
                    # once started); here it is delivered once the worker is one close() stops
                    with sigint_held():
                        proc.start()
                        self._conns.append(ours)
                        self._procs.append(proc)
                    theirs.close()
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_job(
        cls, *, workers: int | None, num_chunks: int, preload: str | None = None, **_: Any
    ) -> Executor:
        """The ``"local"`` executor of :data:`~rlds_cli.preprocess.executors.EXECUTORS`:
        ``workers`` processes (default: all cores) counting the coordinator, at most one per
        chunk; inline when that is the coordinator alone."""
        procs = min(workers or usable_cpus(), num_chunks) - 1
        return cls(procs, preload=preload) if procs > 0 else InlineExecutor()

    def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
        """Run ``tasks`` on the workers and in this process, once per pool (a single task runs here
        alone).

        Args:
            spec: The job's spec (plain data, see :func:`~rlds_cli.preprocess.worker.run_chunk`).
            tasks: The chunks to run.
            on_done: Called here with every chunk's result (in the order they finish); raising stops
                the job: workers finish the chunk they hold and exit.
        """
        if self._job_sent:
            raise RuntimeError("a LocalPool runs one job")
        tasks = list(tasks)
        if len(tasks) <= 1:
            InlineExecutor().run(spec, tasks, on_done)
            return
        self._job_sent = True
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a worker that died starting up is reported below
                conn.send((dict(spec), tasks))
        pending = len(tasks)
        while pending:
            j = _claim(self._counter, len(tasks))
            if j >= 0:
                on_done(run_chunk(spec, *tasks[j]))
                pending -= 1
            # between two chunks of its own, or, with none left, waiting for the workers'
            pending -= self._collect(on_done, tasks, block=j < 0)
        self._await_start()

    def _await_start(self) -> None:
        """Wait until every worker has started (or exited), and raise for one that died before, so
        that a script's missing main guard (stop_if_reimported) is reported even when the coordinator ran
        every chunk before the workers were up."""
        for k, proc in enumerate(self._procs):
            while int(self._held[k]) == NOT_STARTED and proc.exitcode is None:
                wait([proc.sentinel], timeout=0.05)
            if int(self._held[k]) == NOT_STARTED and proc.exitcode:
                raise _died(proc.exitcode, None)

    def _collect(self, on_done: OnDone, tasks: Sequence[Task], block: bool) -> int:
        """Hand the results that have arrived to ``on_done`` (with ``block``, wait for at least
        one) and return how many; raise when a worker process died holding a chunk."""
        live = [k for k, proc in enumerate(self._procs) if proc.exitcode is None]
        waitables = [c for c in self._conns if not c.closed] + [self._procs[k].sentinel for k in live]
        if waitables:
            wait(waitables, timeout=None if block else 0)
        got = 0
        for conn in self._conns:
            while not conn.closed and conn.poll():
                try:
                    result = conn.recv()
                except EOFError:  # the worker has exited and everything it sent is read
                    conn.close()
                    break
                got += 1
                on_done(result)
        for k, proc in enumerate(self._procs):
            held = int(self._held[k])
            if proc.exitcode is not None and (held >= 0 or proc.exitcode != 0):
                raise _died(proc.exitcode, tasks[held] if held >= 0 else None)
        if block and not got and not waitables:
            raise PreprocessError("the worker processes exited before every chunk was done")
        return got

    def close(self) -> None:
        """Stop the workers and wait for them; each finishes the chunk it holds. Workers that
        never got a job are terminated (they are at most importing)."""
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if not self._job_sent:
                proc.terminate()
            elif not conn.closed:
                with contextlib.suppress(OSError):  # it has exited already
                    conn.send(None)
        for conn, proc in zip(self._conns, self._procs, strict=True):
            while proc.exitcode is None:
                # a result nobody waits for any more is read, so that no worker blocks on a full pipe
                if conn in wait([proc.sentinel] + ([] if conn.closed else [conn])):
                    try:
                        conn.recv()
                    except (EOFError, OSError):
                        conn.close()
            conn.close()
            proc.close()
        self._conns, self._procs = [], []


def _failure(task: Task, exc: Exception) -> dict[str, Any]:
    """A chunk's error result (as :func:`run_chunk` returns for RldsErrors) for any exception."""
    return {
        "ok": False,
        "type": "PreprocessError",
        "message": f"a worker failed in chunk {task[0]} (steps {task[1]}-{task[2] - 1}): "
        f"{type(exc).__name__}: {exc}",
        "hint": "--resume keeps the finished chunks",
        "traceback": traceback.format_exc(),
    }


def _died(exitcode: int, task: Task | None) -> PreprocessError:
    if exitcode == REIMPORTED_EXIT:
        return PreprocessError(MESSAGE, hint=HINT)
    where = f" in chunk {task[0]} (steps {task[1]}-{task[2] - 1})" if task else ""
    if exitcode < 0:  # killed by a signal, most often the kernel's out-of-memory killer
        hint = (
            "it may have run out of memory (try a smaller --chunk-steps); --resume keeps the finished chunks"
        )
    elif exitcode == 0:  # no error, no traceback: something in the chunk's code ended the process
        hint = (
            "the process ended itself without an error (os._exit or a library that exits): check what "
            "the function calls; --resume keeps the finished chunks"
        )
    else:
        hint = "its traceback is printed above; --resume keeps the finished chunks"
    return PreprocessError(f"a worker process died{where} (exit code {exitcode})", hint=hint)


#: Exit code of a worker whose import of the caller's script called ``preprocess.run``.
REIMPORTED_EXIT = 86


MESSAGE = (
    "the script that called preprocess.run has no main guard: each worker process re-runs it "
    "(worker processes are spawned, which imports the main script again) and started the job again"
)


HINT = 'put the call under `if __name__ == "__main__":`, or pass workers=1 (no worker processes)'


def reimported() -> bool:
    """Whether this process is a spawned child importing its parent's main script (as ``__mp_main__``)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        return True  # multiprocessing's own flag while a spawned child prepares (3.8 - 3.13)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:  # a frame running the re-imported script's top level
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def stop_if_reimported() -> None:
    """In a worker re-importing the caller's script, exit with :data:`REIMPORTED_EXIT`; elsewhere, nothing."""
    if reimported():
        raise SystemExit(REIMPORTED_EXIT)


def check_sendable(fn: Any) -> None:
    """Refuse a function that cannot travel to worker processes, before the job makes anything:
    pickle sends a function by its module and name, which a lambda or a function defined inside
    another has none of."""
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise FunctionImportError(
            f"the function cannot be sent to worker processes ({type(exc).__name__}: {exc})",
            hint="define it at the top level of a module (or pass it as 'module:function'), or run "
            "with workers=1",
        ) from None
