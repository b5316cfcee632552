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
