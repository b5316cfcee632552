"""Options that pick numbers: ``A:B`` ranges (episodes of a conversion or a view) and number
selections (checkpoints of a run, files of a registry entry).

:func:`parse_range` parses every ``"A:B"`` of rlds. A selection (:func:`parse_numbers`) is
``"A:B"`` (``A <= N < B``; either side may be empty), ``"3,5,9"``, one number, or a list of
numbers; the ``atari_dqn`` reader and the registry's file sets both parse it here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from numbers import Integral
from typing import Any

import numpy as np

from rlds_cli.errors import InvalidSelectionError

__all__ = ["NumberSelection", "parse_numbers", "parse_range"]

#: A predicate on numbers (``None``: every number) and the numbers named one by one (``None``
#: for a range), which a caller may require to exist.
NumberSelection = tuple[Callable[[int], bool] | None, set[int] | None]


def parse_numbers(spec: object) -> NumberSelection:
    """``spec`` -> (predicate, named numbers); ``None`` selects everything.

    Raises:
        ValueError: ``spec`` is none of the accepted shapes or names a negative number; for a
            range, :func:`parse_range`'s :class:`~rlds_cli.errors.InvalidSelectionError` (a
            ``ValueError``).
    """
    if spec is None:
        return None, None
    if isinstance(spec, str) and ":" in spec:
        start, stop = parse_range(spec, negative=False)
        lo = start or 0
        return (lambda n: n >= lo and (stop is None or n < stop)), None
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


def parse_range(spec: object, *, negative: bool) -> tuple[int | None, int | None]:
    """``"A:B"`` -> ``(A, B)`` (``None`` for an empty side), or ``[A, B]`` as a manifest stores
    it (``A`` an int, ``B`` an int or ``None``).

    ``negative=True`` allows any values, read as a Python slice (views); ``negative=False``
    requires ``0 <= A < B`` (conversions and selections, whose count is not known in advance).

    Raises:
        InvalidSelectionError: ``spec`` is not of that form, or breaks those rules.
    """
    parts: list[Any] = []
    if isinstance(spec, str):
        with contextlib.suppress(ValueError):  # a side that is no integer: not of the form
            parts = [int(p) if p.strip() else None for p in spec.split(":")]
    elif isinstance(spec, tuple | list) and spec and isinstance(spec[0], Integral):
        parts = list(spec)
    if len(parts) != 2 or not all(p is None or isinstance(p, Integral) for p in parts):
        raise InvalidSelectionError(
            f"episode range {spec!r} is not of the form A:B",
            # a conversion's stream cannot count from the end: its hint gives no negative example
            hint=None if negative else "episode ranges are A:B with 0 <= A < B, e.g. 0:500 or 100:",
        )
    start, stop = (None if p is None else int(p) for p in parts)
    if not negative and ((start or 0) < 0 or (stop is not None and stop <= (start or 0))):
        raise InvalidSelectionError(
            f"episode range {spec!r} must be A:B with 0 <= A < B (B empty: to the end)",
            hint="for a range counted from the end, convert everything and make a view ('rlds view')",
        )
    return start, stop
