"""A growing dataset's settings (capacity, min_size, grace_seconds): fixed by its creator in the
head manifest's ``source.growing``, read by every writer, reader and ``rlds gc``; checked in one
place, so a bad value is one clear error wherever it is met (a writer's argument, or a manifest
edited or damaged outside rlds), never a ``TypeError`` deep in a collection."""

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
    value = got.get("min_size", 0)
    if value is not None and not (_whole(value) and value >= 0):
        return f"min_size must be a whole number of 0 or more, not {value!r}"
    value = got.get("grace_seconds", DEFAULT_GRACE_SECONDS)
    number = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        return f"grace_seconds must be a number of 0 or more seconds, not {value!r}"
    return None


def growing_settings(manifest: Manifest) -> dict[str, Any]:
    """The head manifest's settings (capacity, capacity_episodes, min_size, grace_seconds), with
    defaults. Raises :class:`CorruptDatasetError` naming the dataset and the key when one is not
    a value rlds writes."""
    got = manifest.source.get("growing", {}) if isinstance(manifest.source, dict) else {}
    problem = "source.growing is not a table" if not isinstance(got, dict) else settings_problem(got)
    if problem is not None:
        raise CorruptDatasetError(
            f"growing dataset {manifest.name!r}: its manifest's {problem}",
            hint="its head manifest was changed outside rlds; restore it from a copy, or copy the "
            "episodes to a new dataset",
        )
    return {
        "capacity": None if got.get("capacity") is None else int(got["capacity"]),
        "capacity_episodes": None if got.get("capacity_episodes") is None else int(got["capacity_episodes"]),
        "min_size": int(got.get("min_size", 0) or 0),
        "grace_seconds": float(got.get("grace_seconds", DEFAULT_GRACE_SECONDS)),
    }
