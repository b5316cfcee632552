"""One rule for options that pick numbers (checkpoints of a run, files of a registry entry).

A selection is ``"A:B"`` (``A <= N < B``; either side may be empty), ``"3,5,9"``, one number,
or a list of numbers. The format reader (``checkpoints`` of ``atari_dqn``) and the registry's
file sets (which files to download) parse it here, so both always pick the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["NumberSelection", "parse_numbers"]

#: A predicate on numbers (``None``: every number) and the numbers named one by one (``None``
#: for a range), which a caller may require to exist.
NumberSelection = tuple[Callable[[int], bool] | None, set[int] | None]


def parse_numbers(spec: object) -> NumberSelection:
    """``spec`` -> (predicate, named numbers); ``None`` selects everything.

    Raises:
        ValueError: ``spec`` is none of the accepted shapes, names a negative number, or is an
            empty range.
    """
    if spec is None:
        return None, None
    if isinstance(spec, str) and ":" in spec:
        return _parse_range(spec), None
    parts: list[Any]
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
    elif isinstance(spec, int | np.integer) and not isinstance(spec, bool):
        parts = [spec]
    elif isinstance(spec, list | tuple):
        parts = list(spec)
    else:
        raise ValueError(spec)
    if any(isinstance(p, bool | float) for p in parts):
        raise ValueError(spec)
    try:
        wanted = {int(p) for p in parts}
    except (TypeError, ValueError):
        raise ValueError(spec) from None
    if not wanted or min(wanted) < 0:
        raise ValueError(spec)
    return wanted.__contains__, wanted


def _parse_range(spec: str) -> Callable[[int], bool]:
    left, _, right = spec.partition(":")
    try:
        lo = int(left) if left.strip() else 0
        hi = int(right) if right.strip() else None
    except ValueError:
        raise ValueError(spec) from None
    if lo < 0 or (hi is not None and hi <= lo):
        raise ValueError(spec)
    return lambda n: n >= lo and (hi is None or n < hi)
