"""A growing dataset's settings (capacity, min_size, min_total, grace_seconds): fixed by its
creator in the head manifest's ``source.growing``, read by every writer, reader and ``rlds gc``;
checked in one place, so a bad value is one clear error wherever it is met (a writer's argument,
or a manifest edited or damaged outside rlds), never a ``TypeError`` deep in a collection.

``capacity`` and ``min_size`` count the same steps: the unprotected ones (protected episodes,
demonstrations, are never evicted and never make a dataset ready on their own); ``min_total``
counts every step. A manifest written before ``min_total`` existed has a ``min_size`` that
counted every step: it is read as that dataset's ``min_total`` (and ``min_size`` 0), so such a
dataset becomes ready exactly as it did when it was made."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlds_cli.cache.manifest import Manifest
from rlds_cli.errors import CorruptDatasetError

#: How long the files of evicted or compacted segments stay for readers of older views.
DEFAULT_GRACE_SECONDS = 60.0


def _whole(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def settings_problem(got: dict[str, Any]) -> str | None:
    """What is wrong with the settings ``got`` (the keys of ``source.growing``), or ``None``."""
    for key in ("capacity", "capacity_episodes"):
        value = got.get(key)
        if value is not None and not (_whole(value) and value > 0):
            return f"{key} must be a whole number above 0 (or None: no capacity), not {value!r}"
    for key in ("min_size", "min_total"):
        value = got.get(key, 0)
        if value is not None and not (_whole(value) and value >= 0):
            return f"{key} must be a whole number of 0 or more, not {value!r}"
    value = got.get("grace_seconds", DEFAULT_GRACE_SECONDS)
    number = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        return f"grace_seconds must be a number of 0 or more seconds, not {value!r}"
    return None


def growing_settings(manifest: Manifest) -> dict[str, Any]:
    """The head manifest's settings (capacity, capacity_episodes, min_size, min_total,
    grace_seconds), with defaults (a manifest without ``min_total``: see the module docstring).
    Raises :class:`CorruptDatasetError` naming the dataset and the key when one is not a value
    rlds writes."""
    got = manifest.source.get("growing", {}) if isinstance(manifest.source, dict) else {}
    problem = "source.growing is not a table" if not isinstance(got, dict) else settings_problem(got)
    if problem is not None:
        raise CorruptDatasetError(
            f"growing dataset {manifest.name!r}: its manifest's {problem}",
            hint="its head manifest was changed outside rlds; restore it from a copy, or copy the "
            "episodes to a new dataset",
        )
    min_size, min_total = int(got.get("min_size", 0) or 0), int(got.get("min_total", 0) or 0)
    if "min_total" not in got:  # written before min_total: its min_size counted every step
        min_size, min_total = 0, min_size
    return {
        "capacity": None if got.get("capacity") is None else int(got["capacity"]),
        "capacity_episodes": None if got.get("capacity_episodes") is None else int(got["capacity_episodes"]),
        "min_size": min_size,
        "min_total": min_total,
        "grace_seconds": float(got.get("grace_seconds", DEFAULT_GRACE_SECONDS)),
    }


def is_ready(settings: dict[str, Any], steps: int, protected_steps: int) -> bool:
    """Whether a view of ``steps`` steps, ``protected_steps`` of them protected, is ready under
    ``settings`` (:func:`growing_settings`): it holds a step, at least ``min_size`` unprotected
    steps (the steps ``capacity`` counts) and at least ``min_total`` steps in all."""
    return steps > 0 and steps - protected_steps >= settings["min_size"] and steps >= settings["min_total"]
