"""The CPUs this process may run on: one count for every pool that sizes itself to the machine."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the platform has one, else
    ``os.cpu_count()`` (at least 1)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: What sizes OpenBLAS's thread pool (numpy's BLAS); OpenBLAS reads it once, when numpy is imported.
OPENBLAS_THREADS = "OPENBLAS_NUM_THREADS"
#: Whether :func:`quiet_blas` set :data:`OPENBLAS_THREADS` (so that :func:`unquiet_blas` takes back
#: only its own setting, never the user's).
_quieted: list[bool] = [False]


def quiet_blas() -> None:
    """Have OpenBLAS start one thread in this process (and the processes it starts) unless the user
    sized it: its pool of a thread per core costs ~50 ms of CPU at numpy's import and spins a core
    ~0.1 s after it (``import numpy``: 134 -> 85 ms of CPU on 2 cores), and rlds's commands make no
    call that BLAS's threads speed up. Takes effect only before numpy's import."""
    if OPENBLAS_THREADS not in os.environ:
        os.environ[OPENBLAS_THREADS] = "1"
        _quieted[0] = True


def unquiet_blas() -> None:
    """Undo :func:`quiet_blas`, before numpy's import, for a command that runs the user's code (their
    BLAS calls keep a thread per core)."""
    if _quieted[0]:
        os.environ.pop(OPENBLAS_THREADS, None)
        _quieted[0] = False
